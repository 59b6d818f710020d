"""CPU check of cuda_src/gemv.cu's dense launches and norm folding in the host emulation of tests/gemv_lanes_emu.py:
the dense products (K splits summed by the last block with 16-byte loads of 4 lanes, several lane blocks side by
side) each row bitwise the same with 8 lanes per block and with one and against the NumPy reference; norm folding
(the producer's residual update and partial sums of squares, the consumers' product of the normed residual) the
same way; both with their K splits as thread-block clusters bitwise the arrival-counter path. The GPU tests
(tests/test_cuda_gemv_cluster.py, tests/test_cuda_normfold.py) check the kernels on the device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gemv_lanes_emu import F32, dense_case, fold_case, fold_id

# fmt, activation type, N, K, rows, K-splits
DENSE_CASES = [
    ("NVFP4G16_E4M3S", "float", 300, 1032, 10, 2),  # 3 row blocks (last partial) x 9 tiles, two lane blocks
    ("NVFP4G16_E4M3S", "bf16", 600, 256, 3, 1),  # 5 row blocks x 2 tiles, no split
    ("BF16", "float", 70, 520, 9, 2),  # 64-row blocks
    ("FP8E4M3_F32ROW", "bf16", 200, 384, 1, 3),
]


@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-n{c[2]}-k{c[3]}-r{c[4]}-s{c[5]}")
def test_dense_lanes_match_one_lane_and_reference(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    """gemv.cu's dense launches (K splits summed by the last block with 16-byte loads of 4 lanes, several lane
    blocks side by side): each row bitwise the same with 8 lanes per block and with one, and both against the
    NumPy reference."""
    dense_case(lanes_emu, tmp_path, case, cluster=False)


# the K splits as thread-block clusters (gv_store_cl): 1-16 tiles per split, 1 to 16 splits (a cluster of 16 is
# the non-portable maximum), partial row blocks, 1 to 10 rows (one and two lane blocks)
CLUSTER_DENSE_CASES = [
    ("NVFP4G16_E4M3S", "float", 300, 1032, 10, 9),  # 1 tile per split (9 tiles)
    ("NVFP4G16_E4M3S", "bf16", 130, 2048, 5, 16),  # 16 splits of one tile
    ("BF16", "float", 70, 520, 1, 2),  # 64-row blocks, 5 tiles as 3 + 2
    ("FP8E4M3_F32ROW", "bf16", 200, 1536, 4, 12),
    ("NVFP4G16_E4M3S", "float", 40, 640, 2, 5),
    ("BF16", "bf16", 100, 896, 8, 7),
]


@pytest.mark.parametrize(
    "case", CLUSTER_DENSE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-n{c[2]}-k{c[3]}-r{c[4]}-s{c[5]}"
)
def test_dense_cluster_bitwise_counter(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    """The dense launches with their splits reduced through distributed shared memory (each block's partial tile
    in its own shared memory, rank 0 adding them in split order): every output bitwise the counter path's (8 lanes
    and one per block), and against the reference."""
    dense_case(lanes_emu, tmp_path, case, cluster=True)


# producer fmt, activation type, N (hidden), K, rows, producer splits, consumer N2, consumer splits, offset
FOLD_CASES = [
    (
        "NVFP4G16_E4M3S",
        "float",
        300,
        1032,
        10,
        2,
        200,
        1,
        True,
    ),  # 3 row blocks (last partial), two lane blocks
    ("BF16", "float", 136, 256, 3, 1, 300, 2, False),  # 64-row blocks, no producer split; a split consumer
    ("FP8E4M3_F32ROW", "bf16", 264, 384, 8, 3, 100, 2, True),
]


def _fold_id(c: tuple) -> str:
    return f"{c[0]}-{c[1]}-n{c[2]}-r{c[4]}-s{c[5]}{c[7]}-{'off' if c[8] else 'w'}"


@pytest.mark.parametrize("case", FOLD_CASES, ids=fold_id)
def test_norm_fold_producer_and_consumer(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    """Norm folding (gemv.cu GvFold / GV_NORM): the producer's residual update and partial sums of squares, and the
    consumer's product of the normed residual: 8 lanes per block bitwise one lane, the expert-slot consumer (rows
    by xrow, in reverse) bitwise the dense one, and all against NumPy (rmsnorm of the updated residual)."""
    fold_case(lanes_emu, tmp_path, case, cluster=False)


# producer and consumer (dense and expert slots) with their splits as clusters
CLUSTER_FOLD_CASES = [
    ("NVFP4G16_E4M3S", "float", 300, 1032, 10, 4, 200, 3, True),
    ("BF16", "bf16", 136, 512, 3, 2, 300, 6, False),
]


@pytest.mark.parametrize("case", CLUSTER_FOLD_CASES, ids=fold_id)
def test_norm_fold_cluster_bitwise_counter(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    """Norm folding with the splits reduced by the clusters' rank 0 (the residual update, the partial sums of
    squares from its shared memory, the consumer's products): every output bitwise the counter path's."""
    fold_case(lanes_emu, tmp_path, case, cluster=True)


def test_fold_rows_rule() -> None:
    """Norms fold where every product of a call is a GEMV with float32 activations: decode, and any call in the
    exact mode; not for GEMM prefill, bf16 activations or with folding off."""
    from types import SimpleNamespace

    from ninfer.cuda.model_layers import fold_rows

    def net(**kw: object) -> SimpleNamespace:
        return SimpleNamespace(**({"fold_norms": True, "act": np.dtype(F32), "prefill_gemm": True} | kw))

    assert fold_rows(net(), 1) and fold_rows(net(), 8) and not fold_rows(net(), 9)
    assert fold_rows(net(prefill_gemm=False), 300)
    assert not fold_rows(net(act=np.dtype(np.uint16)), 1)
    assert not fold_rows(net(fold_norms=False), 1)
