"""The warp-specialized fp16 GEMM (``gemm(..., inputs="fp16", variant="ws")``: cuda_src/gemm_sm90_ws.cu
gemm90_f16_ws, TMA tensor maps from ninfer/cuda/tensor_map.py) on the device: unsplit (``variant="ws1"``) bitwise
the cp.async kernel's (``variant="cp"``, gemm90_f16) result on fresh random inputs for every format with the fp16
mode, ragged M / N / K, strided views, more tiles than SMs (persistent CTAs walking several tiles), chunked scratch;
split-K (``ws<S>`` forced, ``ws`` / ``auto`` by the rule) against the NumPy reference with the same input rounding
at the fp32-accumulation tolerance, deterministic, independent of chunking and of a kept operand, with the SwiGLU
input. Each test asserts that the ws kernel actually ran (with the splits it was meant to). Skipped without an
sm_90a device.

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
    """The splits of every gemm90_f16_ws launch (a test comparing ws with cp must not compare cp with itself)."""
    import ninfer.cuda.gemm_pair as gp

    calls: list[int] = []
    real = gp.launch_ws

    def counted(*a: Any, **k: Any) -> None:
        calls.append(k.get("splits", 1))
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
        gemm(xv, w, buf[:, 3 : 3 + n], impl="pair", inputs="fp16", variant="ws1")
        assert len(ws_calls) > before, f"{fmt} {m}x{n}x{k}: the ws kernel did not run"
        got = cp.asnumpy(buf)
        assert np.isnan(got[:, :3]).all() and np.isnan(got[:, 3 + n :]).all(), (
            f"{fmt} {m}x{n}x{k}: wrote outside"
        )
        got = got[:, 3 : 3 + n]
        old = cp.asnumpy(gemm(xv, w, impl="pair", inputs="fp16", variant="cp"))
        dense = cp.asnumpy(gemm(xv, w, impl="pair", inputs="fp16", variant="ws1"))
        for name, mine in (("strided out", got), ("contiguous out", dense)):
            assert np.array_equal(mine.view(np.uint32), old.view(np.uint32)), (
                f"{fmt} {m}x{n}x{k} {name}: ws differs from cp in {np.count_nonzero(mine != old)} outputs"
            )
        if m * n * k <= 300 * 520 * 2056:  # the NumPy reference of the largest shapes takes too long
            err = _err(got, ops.linear(ops.round_fp16_rows(x), wf))
            assert err <= TOL, f"{fmt} {m}x{n}x{k}: normalised max error {err:.2e} against the rounded inputs"


def test_ws_chunked_scratch_and_rows(cp: Any, ws_calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    import ninfer.cuda.gemm_plan as plan
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(73)
    m, n, k = 300, 700, 1032
    w, _ = _weight(rng, "NVFP4G16_E4M3S", n, k)
    xd = cp.asarray(_x(rng, m, k))
    full = cp.asnumpy(gemm(xd, w, impl="pair", inputs="fp16", variant="ws1"))
    assert ws_calls == [1], "the ws kernel did not run"
    assert np.array_equal(full, cp.asnumpy(gemm(xd, w, impl="pair", inputs="fp16", variant="cp")))
    for a, b in ((100, 260), (1, 129)):
        part = cp.asnumpy(gemm(xd[a:b], w, impl="pair", inputs="fp16", variant="ws1"))
        assert np.array_equal(part, full[a:b]), f"rows {a}..{b - 1} differ when launched as a slice"
    monkeypatch.setattr(plan, "_W_CAP", 2 * 256 * k)
    monkeypatch.setattr(plan, "_X_CAP", 4 * 128 * k)
    chunked = cp.asnumpy(gemm(xd, w, impl="pair", inputs="fp16", variant="ws1"))
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
        import ninfer.cuda.gemm_plan as plan

        mp.setattr(plan, "F16_WS_WIDE_ELEMS", 260 * 256)
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


# (M, N, K, S): one row; 17 K tiles in 3 splits of 5, 6, 6 (N odd: the partials' scalar stores where M N is odd); 33
# K tiles in 4; 3 K tiles in 2 (ragged N); S above the K tiles (an empty split, never chosen by the rule); 9 x 17
# tiles x 2 splits = 306 units on 132 SMs (CTAs walking several units)
SPLIT_SHAPES = ((1, 300, 640, 2), (129, 257, 1032, 3), (300, 520, 2056, 4), (130, 257, 136, 2), (128, 6, 8, 3),
                (1100, 4100, 264, 2))  # fmt: skip


def _ref(x: np.ndarray, wf: np.ndarray) -> np.ndarray:
    return ops.linear(ops.round_fp16_rows(x), wf)


@pytest.mark.parametrize("fmt", F16_FMTS)
def test_ws_split_matches_reference(cp: Any, ws_calls: list[int], fmt: str) -> None:
    """Forced splits: the NumPy reference with the same input rounding at fp32-accumulation tolerance, nothing
    written outside a strided output view, two runs bitwise equal, contiguous and strided outputs bitwise equal."""
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(81)
    for m, n, k, s in SPLIT_SHAPES:
        w, wf = _weight(rng, fmt, n, k)
        x = _x(rng, m, k)
        xd = cp.asarray(x)
        buf = cp.full((m, n + 11), np.nan, dtype=F32)
        gemm(xd, w, buf[:, 3 : 3 + n], impl="pair", inputs="fp16", variant=f"ws{s}")
        assert ws_calls[-1] == s, f"{fmt} {m}x{n}x{k}: launched with {ws_calls[-1:]} splits, not {s}"
        got = cp.asnumpy(buf)
        assert np.isnan(got[:, :3]).all() and np.isnan(got[:, 3 + n :]).all(), (
            f"{fmt} {m}x{n}x{k}: wrote outside"
        )
        got = got[:, 3 : 3 + n]
        again = cp.asnumpy(gemm(xd, w, impl="pair", inputs="fp16", variant=f"ws{s}"))
        assert np.array_equal(got.view(np.uint32), again.view(np.uint32)), (
            f"{fmt} {m}x{n}x{k} S={s}: not repeatable"
        )
        if m * n * k <= 300 * 520 * 2056:
            err = _err(got, _ref(x, wf))
            assert err <= TOL, (
                f"{fmt} {m}x{n}x{k} S={s}: normalised max error {err:.2e} against the rounded inputs"
            )


def test_ws_split_rule_auto_and_chunks(cp: Any, ws_calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` takes the ws kernel with the rule's S where it splits (the 27B's down projection at 256 rows: S = 3),
    bitwise ``ws`` and the forced ``ws3``; a chunked weight scratch keeps the call's S (the same bits); rows
    launched alone get their own S (close, not bitwise)."""
    import ninfer.cuda.gemm_pair as gp
    import ninfer.cuda.gemm_plan as plan
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(83)
    m, n, k = 256, 5120, 17408
    s = gp.splitk_splits(m, n, k)
    assert s == 3 and gp.f16_auto_ws(m, n, k) and m < gp.F16_WS_ROWS
    w, wf = _weight(rng, "NVFP4G16_E4M3S", n, k)
    x = _x(rng, m, k)
    xd = cp.asarray(x)
    auto = cp.asnumpy(gemm(xd, w, inputs="fp16"))
    assert ws_calls == [s], f"auto: {ws_calls}"
    for v in ("ws", f"ws{s}"):
        assert np.array_equal(
            cp.asnumpy(gemm(xd, w, inputs="fp16", variant=v)).view(np.uint32), auto.view(np.uint32)
        )
    assert ws_calls == [s] * 3
    assert _err(auto, _ref(x, wf)) <= TOL
    unsplit = cp.asnumpy(gemm(xd, w, inputs="fp16", variant="ws1"))
    assert np.array_equal(unsplit, cp.asnumpy(gemm(xd, w, inputs="fp16", variant="cp")))
    assert _err(auto, unsplit.astype(np.float64)) <= TOL
    monkeypatch.setattr(
        plan, "_W_CAP", 2 * 256 * 8 * k
    )  # 2048-row weight chunks, each launched with the call's S
    gp.release_scratch()
    chunked = cp.asnumpy(gemm(xd, w, inputs="fp16"))
    assert ws_calls[-3:] == [s] * 3, f"chunks: {ws_calls}"
    assert np.array_equal(chunked.view(np.uint32), auto.view(np.uint32)), (
        "weight chunks changed the split result"
    )
    gp.release_scratch()


def test_ws_split_swiglu_and_kept_operand(cp: Any, ws_calls: list[int]) -> None:
    """With splits: the SwiGLU input (``swiglu=True``: the row split applies it) is bitwise the SwiGLU then the GEMM,
    and a kept fp16 operand (``operands=``) bitwise the scratch, for forced and rule splits."""
    from ninfer.cuda.activation import swiglu
    from ninfer.cuda.gemm import gemm
    from ninfer.cuda.operands import OperandStore

    rng = np.random.default_rng(85)
    m, n, k = 200, 520, 8200  # K long enough to split (gemm_plan.SPLITK_MIN_KSTEPS)
    for fmt in ("NVFP4G16_E4M3S", "FP8E4M3_F32ROW"):
        w, wf = _weight(rng, fmt, n, k)
        gu = cp.zeros((m, 2 * k + 8), dtype=F32)
        gu[:, : 2 * k] = cp.asarray(_x(rng, m, 2 * k))
        gu = gu[:, : 2 * k]
        store = OperandStore(1 << 30)
        for v in ("ws3", "ws", "auto"):
            before = len(ws_calls)
            fused = cp.asnumpy(gemm(gu, w, inputs="fp16", swiglu=True, variant=v))
            plain = cp.asnumpy(gemm(swiglu(gu), w, inputs="fp16", variant=v))
            kept = cp.asnumpy(gemm(gu, w, inputs="fp16", swiglu=True, variant=v, operands=store))
            assert len(ws_calls) == before + 3 and min(ws_calls[before:]) > 1, (
                f"{fmt} {v}: {ws_calls[before:]}"
            )
            assert np.array_equal(fused.view(np.uint32), plain.view(np.uint32)), (
                f"{fmt} {v}: swiglu=True differs"
            )
            assert np.array_equal(kept.view(np.uint32), fused.view(np.uint32)), (
                f"{fmt} {v}: kept operand differs"
            )
        assert len(store) == 1
        ref = _ref(cp.asnumpy(swiglu(gu)), wf)
        assert _err(fused, ref) <= TOL
