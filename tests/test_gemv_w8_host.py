"""CPU check of cuda_src/gemv_w8.cu (gemv.cu with 8 warps per block: 256-row blocks, 128 for BF16; linear.GV_W8),
the 8-lane activation-traffic fix (docs/cuda.md, "Eight lanes"): with the 4-warp plan's split counts it gives the
4-warp kernel's bits, on dense products (1-10 rows, every K order the splits make, float and bf16 activations)
and on norm folding (the residual update, the partial sums of squares, which it writes per 4-warp row group, and
the consumer's product of the normed residual). Host emulation: tests/gemv_lanes_emu.py's emulator and its
dense and fold modes (which also check 8 lanes against one and both against the NumPy reference), the emulator
built from each source. Each case runs the same arguments through both and compares every output file.

The host runs gemv_w8.cu for float activations only: with 8 warps, bf16 rows at 4 lanes leave the fold's residual
buffer too small (its static_assert), so that bound is lifted for the emulator build, which instantiates every
type; the bf16 dense cases below never fold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gemv_lanes_emu import FILES, both_builds, build_lanes_emu, dense_case, fold_case, fold_id

from ninfer.cuda.loader import source_text

# fmt, activations, N, K, rows, splits
DENSE = [
    ("NVFP4G16_E4M3S", "float", 600, 2048, 8, 3),
    ("NVFP4G16_E4M3S", "float", 300, 1032, 1, 9),
    ("Q4G64_F16S", "float", 600, 1024, 1, 3),  # linear.GV_W8_ONE: one lane of a group format
    ("NVFP4G16_E4M3S", "bf16", 520, 1536, 5, 2),
    ("BF16", "float", 300, 896, 10, 4),
    ("FP8E4M3_F32ROW", "float", 400, 1280, 8, 5),
]
# fmt, activations, N, K, rows, producer splits, N2, consumer splits, offset norm: the producer's N an odd number of
# 4-warp row blocks (an 8-warp block whose second group is past N writes no partial), one and two lane blocks
FOLD = [
    ("NVFP4G16_E4M3S", "float", 300, 1032, 10, 2, 200, 1, True),
    ("NVFP4G16_E4M3S", "float", 600, 512, 8, 1, 520, 3, False),
    ("BF16", "float", 136, 256, 3, 1, 300, 2, False),
]
_FOLD_BOUND = "static_assert(32 + ROWS * 8 <= 2"


@pytest.fixture(scope="module")
def emus(lanes_emu: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    w8 = source_text("gemv_w8.cu")
    assert "#define GV_WARPS 8" in w8 and w8.count(_FOLD_BOUND) == 1
    w8 = w8.replace(_FOLD_BOUND, "static_assert(true || 32 + ROWS * 8 <= 2")
    return {"base": lanes_emu, "w8": build_lanes_emu(tmp_path_factory, gemv=w8)}


@pytest.mark.parametrize("case", DENSE, ids=lambda c: f"{c[0]}-{c[1]}-n{c[2]}-k{c[3]}-r{c[4]}-s{c[5]}")
def test_w8_dense_products_are_the_4_warp_bits(emus: dict[str, Any], tmp_path: Path, case: tuple) -> None:
    both_builds(emus, tmp_path, lambda e, d: dense_case(e, d, case, cluster=False), FILES["dense"])


@pytest.mark.parametrize("case", FOLD, ids=fold_id)
def test_w8_norm_folding_is_the_4_warp_bits(emus: dict[str, Any], tmp_path: Path, case: tuple) -> None:
    both_builds(emus, tmp_path, lambda e, d: fold_case(e, d, case, cluster=False), FILES["fold"])
