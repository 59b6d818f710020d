"""The group-int decode GEMV with cross-lane code copies (cuda_src/wfrag.cuh ``GV_QG64_XLANE``, off by default) on
the GPU: gemv.cu compiled with the macro gives every output bitwise the default build's, for Q4/Q5/Q6 at one and
eight rows, K split and N off the row blocks, plain and SwiGLU inputs. The host checks are
tests/test_gemv_xlane_host.py; ``python -m perf.gemv_variants --variants base,xlane`` times it.

    python -m pytest -m gpu tests/test_cuda_gemv_xlane.py
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ninfer.formats import FORMATS

pytestmark = pytest.mark.gpu

F32 = np.float32


@pytest.fixture
def xlane(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A switch for gemv.cu's source: ``xlane(True)`` compiles it with the macro (the modules cleared either way)."""
    pytest.importorskip("cupy")
    import ninfer.cuda.loader as loader

    original = loader.source_text

    def patched(name: str) -> str:
        return ("#define GV_QG64_XLANE 1\n" if name == "gemv.cu" else "") + original(name)

    def use(on: bool) -> None:
        monkeypatch.setattr(loader, "source_text", patched if on else original)
        loader.load_module.cache_clear()

    yield use
    monkeypatch.setattr(loader, "source_text", original)
    loader.load_module.cache_clear()


@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S"])
def test_xlane_gemv_is_the_default_bits(xlane: Any, fmt: str) -> None:
    import cupy

    import ninfer.cuda.linear as linear
    from ninfer.cuda.linear import gemv
    from ninfer.cuda.weights import upload_weight

    rng = np.random.default_rng(91)
    w8 = linear.GV_W8
    linear.GV_W8 = False  # 8 rows on gemv.cu's 4-warp blocks too (gemv_w8.cu is another family)
    try:
        for n, k in ((600, 2048), (300, 5128), (40, 1032)):
            wf = (rng.standard_normal((n, k)) * 0.5).astype(F32)
            w = upload_weight(fmt, (n, k), FORMATS[fmt].encode(wf, (n, k)))
            for b in (1, 8):
                x = cupy.asarray((rng.standard_normal((b, 2 * k)) * 2).astype(F32))
                got = {}
                for on in (False, True):
                    xlane(on)
                    got[on] = [cupy.asnumpy(gemv(x[:, :k], w)), cupy.asnumpy(gemv(x, w, swiglu=True))]
                for a, c in zip(got[False], got[True], strict=True):
                    assert np.array_equal(a.view(np.uint8), c.view(np.uint8)), f"{fmt} {n}x{k}, {b} rows"
    finally:
        linear.GV_W8 = w8
