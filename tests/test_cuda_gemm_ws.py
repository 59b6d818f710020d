"""The warp-specialized fp16 GEMM (``gemm(..., inputs="fp16", variant="ws")``: cuda_src/gemm_sm90_ws.cu
gemm90_f16_ws, TMA tensor maps from ninfer/cuda/tensor_map.py) on the device: bitwise the cp.async kernel's
(``variant="cp"``, gemm90_f16) result on fresh random inputs for every format with the fp16 mode, ragged M / N / K,
strided views, more tiles than SMs (persistent CTAs walking several tiles), chunked scratch; and the NumPy reference
with the same input rounding at the fp32-accumulation tolerance. Each test asserts that the ws kernel actually ran.
Skipped without an sm_90a device.

    python -m pytest -m gpu tests/test_cuda_gemm_ws.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_cuda_gemm_f16 import F16_FMTS, _x
from test_cuda_gemm_pair import TOL, _err, _weight

from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32
# (M, N, K), each into a strided, misaligned output view (the scalar epilogue) and a contiguous one (float2 stores
# where N is even): one row; N below 8; M, N, K off the 128 x 256 x 64 tiles; K wrapping the 4-slot ring many times;
# 9 x 17 = 153 and 16 x 20 = 320 tiles on 132 SMs (CTAs walk several tiles, the ring running on across them)
SHAPES = ((1, 300, 64), (128, 6, 8), (129, 300, 200), (130, 257, 136), (257, 1000, 512), (300, 520, 2056),
          (1100, 4100, 264), (2048, 5120, 1024))  # fmt: skip


@pytest.fixture
def cp() -> Any:
    cupy = pytest.importorskip("cupy")
    from ninfer.cuda.loader import compute_capability, target_arch

    if not target_arch("gemm_sm90_ws.cu", compute_capability()).endswith("a"):
        pytest.skip("the ws kernel needs sm_90a (compute capability 9.0)")
    return cupy


@pytest.fixture
def ws_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts gemm90_f16_ws launches (a test comparing ws with cp must not compare cp with itself)."""
    import ninfer.cuda.gemm_pair as gp

    calls: list[int] = []
    real = gp.launch_ws

    def counted(*a: Any, **k: Any) -> None:
        calls.append(1)
        real(*a, **k)

    monkeypatch.setattr(gp, "launch_ws", counted)
    return calls


@pytest.mark.parametrize("fmt", F16_FMTS)
def test_ws_bitwise_cp_and_reference(cp: Any, ws_calls: list[int], fmt: str) -> None:
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(71)
    for m, n, k in SHAPES:
        w, wf = _weight(rng, fmt, n, k)
        x = _x(rng, m, k)
        xbuf = cp.zeros((m, k + 24), dtype=F32)
        xbuf[:, 8 : 8 + k] = cp.asarray(x)
        xv = xbuf[:, 8 : 8 + k]
        buf = cp.full((m, n + 11), np.nan, dtype=F32)
        before = len(ws_calls)
        gemm(xv, w, buf[:, 3 : 3 + n], impl="pair", inputs="fp16", variant="ws")
        assert len(ws_calls) > before, f"{fmt} {m}x{n}x{k}: the ws kernel did not run"
        got = cp.asnumpy(buf)
        assert np.isnan(got[:, :3]).all() and np.isnan(got[:, 3 + n :]).all(), (
            f"{fmt} {m}x{n}x{k}: wrote outside"
        )
        got = got[:, 3 : 3 + n]
        old = cp.asnumpy(gemm(xv, w, impl="pair", inputs="fp16", variant="cp"))
        dense = cp.asnumpy(gemm(xv, w, impl="pair", inputs="fp16", variant="ws"))
        for name, mine in (("strided out", got), ("contiguous out", dense)):
            assert np.array_equal(mine.view(np.uint32), old.view(np.uint32)), (
                f"{fmt} {m}x{n}x{k} {name}: ws differs from cp in {np.count_nonzero(mine != old)} outputs"
            )
        if m * n * k <= 300 * 520 * 2056:  # the NumPy reference of the largest shapes takes too long
            err = _err(got, ops.linear(ops.round_fp16_rows(x), wf))
            assert err <= TOL, f"{fmt} {m}x{n}x{k}: normalised max error {err:.2e} against the rounded inputs"


def test_ws_chunked_scratch_and_rows(cp: Any, ws_calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    import ninfer.cuda.gemm_pair as gp
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(73)
    m, n, k = 300, 700, 1032
    w, _ = _weight(rng, "NVFP4G16_E4M3S", n, k)
    xd = cp.asarray(_x(rng, m, k))
    full = cp.asnumpy(gemm(xd, w, impl="pair", inputs="fp16", variant="ws"))
    assert ws_calls, "the ws kernel did not run"
    assert np.array_equal(full, cp.asnumpy(gemm(xd, w, impl="pair", inputs="fp16", variant="cp")))
    for a, b in ((100, 260), (1, 129)):
        part = cp.asnumpy(gemm(xd[a:b], w, impl="pair", inputs="fp16", variant="ws"))
        assert np.array_equal(part, full[a:b]), f"rows {a}..{b - 1} differ when launched as a slice"
    monkeypatch.setattr(gp, "_W_CAP", 2 * 256 * k)
    monkeypatch.setattr(gp, "_X_CAP", 4 * 128 * k)
    chunked = cp.asnumpy(gemm(xd, w, impl="pair", inputs="fp16", variant="ws"))
    assert np.array_equal(chunked, full), "chunked scratch changed the result"


def test_ws_dispatch(cp: Any, ws_calls: list[int]) -> None:
    """``variant="auto"`` (the default) takes the ws kernel for fp16-mode scratch GEMMs from F16_WS_ROWS rows and
    the cp.async kernel below, bitwise the same; ``cp`` and ``ws`` force either; the in-loop kernel
    (``impl="wgmma"``), exact inputs and BF16 weights ignore the variant; gemm_pair refuses ws outside the fp16
    mode."""
    from ninfer.cuda.gemm import _sm90_kernel, gemm
    from ninfer.cuda.gemm_pair import F16_WS_ROWS, gemm_pair
    from ninfer.cuda.linear import KernelError

    rng = np.random.default_rng(75)
    w, _ = _weight(rng, "NVFP4G16_E4M3S", 260, 256)
    xd = cp.asarray(_x(rng, F16_WS_ROWS + 5, 256))
    auto = cp.asnumpy(gemm(xd, w, inputs="fp16"))
    assert len(ws_calls) == 1, "auto at F16_WS_ROWS rows and above: the ws kernel"
    assert np.array_equal(auto, cp.asnumpy(gemm(xd, w, inputs="fp16", variant="cp")))
    assert len(ws_calls) == 1, "variant='cp' forces the cp.async kernel"
    xs = cp.asarray(_x(rng, F16_WS_ROWS - 1, 256))
    short = cp.asnumpy(gemm(xs, w, inputs="fp16"))
    assert len(ws_calls) == 1, "auto below F16_WS_ROWS rows: the cp.async kernel"
    assert np.array_equal(short, cp.asnumpy(gemm(xs, w, inputs="fp16", variant="ws")))
    assert len(ws_calls) == 2, "variant='ws' forces the ws kernel"
    with pytest.MonkeyPatch.context() as mp:  # this weight counted as wide: ws from F16_WS_WIDE_ROWS rows
        import ninfer.cuda.gemm_pair as gp

        mp.setattr(gp, "F16_WS_WIDE_ELEMS", 260 * 256)
        assert np.array_equal(cp.asnumpy(gemm(xs, w, inputs="fp16")), short)
        assert len(ws_calls) == 3, "auto: a wide weight takes the ws kernel below F16_WS_ROWS rows"
        xw = cp.asarray(_x(rng, gp.F16_WS_WIDE_ROWS - 1, 256))
        gemm(xw, w, inputs="fp16")
        assert len(ws_calls) == 3, (
            "auto: below F16_WS_WIDE_ROWS rows even a wide weight takes the cp.async kernel"
        )
    for fmt, inputs, impl, m in (
        ("NVFP4G16_E4M3S", "fp16", "wgmma", 400),
        ("NVFP4G16_E4M3S", "exact", "auto", 400),
        ("BF16", "fp16", "auto", 400),
    ):
        w, _ = _weight(rng, fmt, 260, 256)
        xd = cp.asarray(_x(rng, m, 256))
        a = cp.asnumpy(gemm(xd, w, impl=impl, inputs=inputs, variant="ws"))
        b = cp.asnumpy(gemm(xd, w, impl=impl, inputs=inputs, variant="cp"))
        assert np.array_equal(a, b), f"{fmt} {inputs} {impl} M={m}: variant='ws' changed the result"
    assert len(ws_calls) == 3, "the in-loop kernel, exact inputs and BF16 weights do not take the ws kernel"
    out = cp.empty((400, 260), dtype=F32)
    with pytest.raises(KernelError):  # BF16 weights, exact pair mode
        gemm_pair(xd, w, out, (400, 260, 256, 256, 260), _sm90_kernel, f16=False, variant="ws")
