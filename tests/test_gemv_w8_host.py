"""CPU check of cuda_src/gemv_w8.cu (gemv.cu with 8 warps per block: 256-row blocks, 128 for BF16; linear.GV_W8),
the 8-lane activation-traffic fix (docs/cuda.md, "Eight lanes"): with the 4-warp plan's split counts it gives the
4-warp kernel's bits, on dense products (1-10 rows, every K order the splits make, float and bf16 activations)
and on norm folding (the residual update, the partial sums of squares, which it writes per 4-warp row group, and
the consumer's product of the normed residual). Host emulation: tests/test_gemv_lanes_host.py's emulator and its
dense and fold modes (which also check 8 lanes against one and both against the NumPy reference), the emulator
built from each source. Each case runs the same arguments through both and compares every output file.

The host runs gemv_w8.cu for float activations only: with 8 warps, bf16 rows at 4 lanes leave the fold's residual
buffer too small (its static_assert), so that bound is lifted for the emulator build, which instantiates every
type; the bf16 dense cases below never fold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_gemv_lanes_host as lanes

from ninfer.cuda.loader import source_text

# fmt, activations, N, K, rows, splits
DENSE = [
    ("NVFP4G16_E4M3S", "float", 600, 2048, 8, 3),
    ("NVFP4G16_E4M3S", "float", 300, 1032, 1, 9),
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
_FILES = {"dense": ("lanes8", "lanes1"), "fold": ("res8", "part8", "y8", "res1", "part1", "y1", "ye")}


@pytest.fixture(scope="module")
def emus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = lanes.emu.__wrapped__(tmp_path_factory)
    w8 = source_text("gemv_w8.cu")
    assert "#define GV_WARPS 8" in w8 and w8.count(_FOLD_BOUND) == 1
    original = lanes.source_text
    lanes.source_text = lambda n: (
        w8.replace(_FOLD_BOUND, "static_assert(true || 32 + ROWS * 8 <= 2") if n == "gemv.cu" else original(n)
    )
    try:
        return {"base": base, "w8": lanes.emu.__wrapped__(tmp_path_factory)}
    finally:
        lanes.source_text = original


def _both(emus: dict[str, Any], tmp_path: Path, run: Any, files: tuple[str, ...]) -> None:
    out = {}
    for variant, emu in emus.items():
        d = tmp_path / variant
        d.mkdir()
        run(emu, d)
        out[variant] = {m: np.fromfile(d / f"{m}.bin", dtype=np.uint8) for m in files}
    other = next(v for v in emus if v != "base")
    for m in files:
        assert out["base"][m].size > 0
        assert np.array_equal(out["base"][m], out[other][m]), (
            f"{m}: the {other} kernel differs from the base one"
        )


@pytest.mark.parametrize("case", DENSE, ids=lambda c: f"{c[0]}-{c[1]}-n{c[2]}-k{c[3]}-r{c[4]}-s{c[5]}")
def test_w8_dense_products_are_the_4_warp_bits(emus: dict[str, Any], tmp_path: Path, case: tuple) -> None:
    _both(emus, tmp_path, lambda e, d: lanes._dense_case(e, d, case, cluster=False), _FILES["dense"])


@pytest.mark.parametrize("case", FOLD, ids=lanes._fold_id)
def test_w8_norm_folding_is_the_4_warp_bits(emus: dict[str, Any], tmp_path: Path, case: tuple) -> None:
    _both(emus, tmp_path, lambda e, d: lanes._fold_case(e, d, case, cluster=False), _FILES["fold"])
