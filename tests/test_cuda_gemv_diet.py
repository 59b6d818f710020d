"""The decode GEMV's NVFP4 integer-pipe diet on the GPU (docs/cuda.md, "Decode GEMV on tensor cores"): every output
bitwise the output of the decode and tile loop before it (perf/gemv_variants.py ``olddq``: the current gemv.cu with
the old text put back), for the 1-, 4- and 8-row instances, float and bf16 activations, K splits, N off the m-tiles,
a row window (``row0``) and expert slots. The host test tests/test_gemv_nv4_host.py checks the operand formulas;
this one checks the device's instructions (the multiplies by factors from constant memory, the byte loads).

Run: ``python -m pytest -m gpu tests/test_cuda_gemv_diet.py`` (skips without a CUDA device).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer.formats import FORMATS, bf16_encode

pytestmark = pytest.mark.gpu

F32 = np.float32
NVFP4 = "NVFP4G16_E4M3S"


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _products(cp: Any, rng_seed: int, t: str) -> list[np.ndarray]:
    """The GEMV outputs of a fixed set of launches (same inputs every call) with the sources loaded now."""
    from ninfer.cuda.gemv_experts import gemv_experts
    from ninfer.cuda.linear import gemv
    from ninfer.cuda.weights import upload_weight

    rng = np.random.default_rng(rng_seed)
    codec = FORMATS[NVFP4]
    outs = []
    for n, k in ((40, 1032), (300, 5128), (2048, 6144)):
        wf = (rng.standard_normal((n, k)) * 0.5).astype(F32)
        wf[0, :16] *= 1e-3  # e4m3-subnormal block scales
        w = upload_weight(NVFP4, (n, k), codec.encode(wf, (n, k)))
        for b in (1, 2, 4, 5, 8):  # the 1-, 4- and 8-row instances
            x = (rng.standard_normal((b, k)) * 2).astype(F32)
            xd = cp.asarray(bf16_encode(x) if t == "bf16" else x)
            outs.append(cp.asnumpy(gemv(xd, w)))
        if n >= 64:  # a row window
            x = (rng.standard_normal((3, k))).astype(F32)
            xd = cp.asarray(bf16_encode(x) if t == "bf16" else x)
            outs.append(cp.asnumpy(gemv(xd, w, row0=24, n=n - 40)))
    # expert slots: 5 experts of 24 rows (N off the 16-row groups), 7 slots
    e, n, k = 5, 24, 2048
    wf = (rng.standard_normal((e * n, k)) * 0.5).astype(F32)
    w = upload_weight(NVFP4, (e * n, k), codec.encode(wf, (e * n, k)))
    x = (rng.standard_normal((4, k))).astype(F32)
    xd = cp.asarray(bf16_encode(x) if t == "bf16" else x)
    ids = cp.asarray(np.array([4, 0, 2, 2, 1, 3, 0], np.int32))
    xrow = cp.asarray(np.array([0, 1, 2, 3, 3, 0, 2], np.int32))
    outs.append(cp.asnumpy(gemv_experts(xd, w, ids, xrow, n)))
    cp.cuda.Device().synchronize()
    return outs


@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gemv_nvfp4_bitwise_the_pre_diet_decode(cp: Any, t: str) -> None:
    import ninfer.cuda.loader as loader
    from perf.gemv_variants import _source

    new = _products(cp, 3, t)
    original = loader.source_text
    loader.source_text = _source(original, "olddq")
    loader.load_module.cache_clear()
    try:
        old = _products(cp, 3, t)
    finally:
        loader.source_text = original
        loader.load_module.cache_clear()
    assert len(new) == len(old)
    for i, (a, b) in enumerate(zip(new, old, strict=True)):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), (
            f"launch {i} differs"
        )
