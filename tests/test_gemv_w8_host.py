"""CPU check of perf/gemv_variants.py's ``w8`` variant (gemv.cu with 8 warps per block: 256-row blocks, the plan's
own split counts), the 8-lane activation-traffic fix timed before it is built (docs/cuda.md, "Eight lanes"): on
dense products it gives the 4-warp kernel's bits, for 1-10 activation rows, every K order the splits make, float
and bf16 activations. Host emulation (tests/test_gemv_lanes_host.py's emulator and dense mode, which also checks
8 lanes against one and both against the NumPy reference), the emulator built from each source.

The fold (a producer's partial sums of squares per row block) and the MoE tails are not adapted in the variant:
only plain products are claimed. Its static_assert on the fold's residual buffer (256 rows of bf16 at 4 lanes do
not fit) is lifted for the build, since dense mode never folds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_gemv_lanes_host as lanes

from ninfer.cuda.loader import source_text
from perf.gemv_variants import _source

# fmt, activations, N, K, rows, splits
CASES = [
    ("NVFP4G16_E4M3S", "float", 600, 2048, 8, 3),
    ("NVFP4G16_E4M3S", "float", 300, 1032, 1, 9),
    ("NVFP4G16_E4M3S", "bf16", 520, 1536, 5, 2),
    ("BF16", "float", 300, 896, 10, 4),
    ("FP8E4M3_F32ROW", "float", 400, 1280, 8, 5),
]
_FOLD_BOUND = "static_assert(32 + ROWS * 8 <= 2"


@pytest.fixture(scope="module")
def emus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = lanes.emu.__wrapped__(tmp_path_factory)
    w8 = _source(source_text, "w8")
    assert "#define GV_WARPS 8" in w8("gemv.cu")
    original = lanes.source_text
    lanes.source_text = lambda n: w8(n).replace(_FOLD_BOUND, "static_assert(true || 32 + ROWS * 8 <= 2")
    try:
        return {"base": base, "w8": lanes.emu.__wrapped__(tmp_path_factory)}
    finally:
        lanes.source_text = original


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-n{c[2]}-k{c[3]}-r{c[4]}-s{c[5]}")
def test_w8_dense_products_are_the_base_kernels_bits(
    emus: dict[str, Any], tmp_path: Path, case: tuple
) -> None:
    out = {}
    for variant, emu in emus.items():
        d = tmp_path / variant
        d.mkdir()
        lanes._dense_case(emu, d, case, cluster=False)
        out[variant] = {m: np.fromfile(d / f"{m}.bin", dtype=np.uint8) for m in ("lanes8", "lanes1")}
    for m in ("lanes8", "lanes1"):
        assert np.array_equal(out["base"][m], out["w8"][m]), f"{m}: w8 differs from the 4-warp kernel"
