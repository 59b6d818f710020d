"""The decode GEMV's cross-lane copies (cuda_src/wfrag.cuh) on the GPU: the default build gives every output bitwise
the builds with ``GV_QG64_XLANE`` (a mask, 5 by default: the codes and Q5 / Q6's high words) at 0 (the per-lane
copies), 1 (the codes only), 3 (the codes and the scale words) and 7 (all) for Q4/Q5/Q6, with ``GV_W8G32_XLANE`` 1
(W8G32's codes, 32 bytes per quad lane) and ``GV_W8G32_FCVT`` 0 (its codes to float by I2F; the default's are a PRMT
and an FADD) for W8G32, and with ``GV_QG64_SWZ`` 1 (the slots placed for the banks) for Q4/Q5/Q6, at one and eight
rows, eight rows on gemv.cu's 4-warp blocks and on gemv_w8.cu's 8-warp ones, K split and N off the row blocks, plain
and SwiGLU inputs (the default build's plain outputs against the NumPy reference too, over the uploaded weight: the
group scales in ninfer/cuda/qg64_layout.py's tiled plane); and with ``GV_GROUP_DEFER`` 1 for Q4 / Q6 / W8G32 (each tile's group partials scaled after the next tile's first products).
Each build compiles only the format's instances (a whole module per build took minutes of NVRTC), all the selected
builds side by side before the first case (``ninfer.cuda.precompile``). The host checks are
tests/test_gemv_xlane_host.py; ``python -m perf.gemv_variants --variants noxlane,base,xl5,xl7,w8x,now8f,swz`` times
them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ninfer.formats import FORMATS
from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32


@pytest.fixture
def xlane(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A switch for the GEMV sources: ``xlane(define)`` compiles every .cu with ``#define <define>`` first,
    ``xlane(None)`` as they are (the modules cleared either way)."""
    pytest.importorskip("cupy")
    import ninfer.cuda.loader as loader

    original = loader.source_text

    def use(define: str | None) -> None:
        def patched(name: str) -> str:
            return (f"#define {define}\n" if name.endswith(".cu") else "") + original(name)

        monkeypatch.setattr(loader, "source_text", original if define is None else patched)
        loader.load_module.cache_clear()

    yield use
    monkeypatch.setattr(loader, "source_text", original)
    loader.load_module.cache_clear()


_BUILDS = [
    *((f, f"GV_QG64_XLANE {m}") for f in ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S") for m in (0, 1, 3, 7)),
    ("W8G32_F16S", "GV_W8G32_XLANE 1"),
    ("W8G32_F16S", "GV_W8G32_FCVT 0"),
    *((f, "GV_QG64_SWZ 1") for f in ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S")),
    # the group partials scaled after the next tile's first products (cuda_src/gemv_products.cuh)
    *((f, "GV_GROUP_DEFER 1") for f in ("Q4G64_F16S", "Q6G64_F16S", "W8G32_F16S")),
]


def _instances(fmt: str) -> dict[str, tuple[str, ...]]:
    """The GEMV families' instances of ``fmt`` alone (each build compiles only these)."""
    import ninfer.cuda.linear as linear

    struct = linear.FRAG_STRUCTS[fmt][0] + ","
    return {
        f: tuple(n for n in linear.SOURCES[f] if struct in n)
        for f in ("gemv.cu", "gemv_w8.cu", "gemv_fused.cu")
    }


@pytest.fixture(scope="module", autouse=True)
def _precompiled(request: pytest.FixtureRequest) -> None:
    """The builds of this session's selected cases (a shard holds some) compiled side by side first, so that the
    cases load them from CuPy's disk cache: one by one, ~20 s of NVRTC per family and build, 23 builds."""
    from ninfer.cuda import compile_workers, precompile

    jobs = set()
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module is not request.module or "define" not in params:
            continue
        for family, names in _instances(params["fmt"]).items():
            jobs |= {("", family, names), (f"#define {params['define']}\n", family, names)}
    precompile(sorted(jobs), compile_workers())


@pytest.mark.parametrize("w8", [False, True])
@pytest.mark.parametrize(("fmt", "define"), _BUILDS)
def test_xlane_builds_are_the_default_bits(
    xlane: Any, monkeypatch: pytest.MonkeyPatch, fmt: str, define: str, w8: bool
) -> None:
    import cupy

    import ninfer.cuda.linear as linear
    from ninfer.cuda.linear import gemv
    from ninfer.cuda.weights import upload_weight

    for family, names in _instances(fmt).items():  # this format's instances only
        monkeypatch.setitem(linear.SOURCES, family, names)
    monkeypatch.setattr(linear, "GV_W8", w8)  # 8 rows on gemv.cu's 4-warp blocks or gemv_w8.cu's 8-warp ones
    rng = np.random.default_rng(91)
    for n, k in ((600, 2048), (300, 5128), (40, 1032)):
        wf = (rng.standard_normal((n, k)) * 0.5).astype(F32)
        enc = FORMATS[fmt].encode(wf, (n, k))
        w = upload_weight(fmt, (n, k), enc)
        wdec = FORMATS[fmt].decode(np.ascontiguousarray(enc.reshape(-1).view(np.uint8)), (n, k))
        for b in (1, 8):
            x = cupy.asarray((rng.standard_normal((b, 2 * k)) * 2).astype(F32))
            got = {}
            for d in (None, define):
                xlane(d)
                got[d] = [cupy.asnumpy(gemv(x[:, :k], w)), cupy.asnumpy(gemv(x, w, swiglu=True))]
            ref = ops.linear(cupy.asnumpy(x[:, :k]), wdec)  # the default build against the reference too
            err = np.max(np.abs(got[None][0].astype(np.float64) - ref), axis=1) / np.max(np.abs(ref), axis=1)
            assert err.max() <= 2e-5, f"{fmt} {n}x{k}, {b} rows: normalised errors {err}"
            for a, c in zip(got[None], got[define], strict=True):
                assert np.array_equal(a.view(np.uint8), c.view(np.uint8)), f"{fmt} {n}x{k}, {b} rows"
