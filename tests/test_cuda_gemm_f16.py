"""The Hopper prefill GEMM's fp16 mode (``gemm(..., inputs="fp16")``; ninfer/cuda/gemm_pair.py, cuda_src/gemm_sm90.cu
gemm90_f16, split_f16row, dequant90<D, true>) on the device: fresh random inputs against NumPy with the same input
rounding (``ninfer.reference.ops.round_fp16_rows``) at the fp32-accumulation tolerance, every format that has the
mode, strided views, ragged tiles, chunked scratch, row independence (a row's bits depend only on its own values
and K), and the formats and sizes that stay exact (bitwise the ``inputs="exact"`` result). Skipped without an
sm_90a device.

    python -m pytest -m gpu tests/test_cuda_gemm_f16.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_cuda_gemm_pair import SHAPES, TOL, _err, _weight

from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32
F16_FMTS = ("FP8E4M3_F32ROW", "FP8E4M3_F32T", "NVFP4G16_E4M3S", "NVFP4G16_E4M3S_ROWG")


def sm90a_cupy() -> Any:
    """CuPy on a device with the sm_90a wgmma kernels, or the test skipped."""
    cupy = pytest.importorskip("cupy")
    from ninfer.cuda.loader import compute_capability, target_arch

    if not target_arch("gemm_sm90.cu", compute_capability()).endswith("a"):
        pytest.skip("the fp16 mode needs the sm_90a wgmma kernels (compute capability 9.0)")
    return cupy


@pytest.fixture
def cp() -> Any:
    return sm90a_cupy()


def gemm_strided(cp: Any, x: np.ndarray, w: Any, what: str, col0: int = 3, **kw: Any) -> np.ndarray:
    """``gemm(x, w, **kw)`` from a strided view of ``x`` into columns [col0, col0 + N) of a NaN-filled buffer 11
    columns wider (col0 4: 16-byte aligned rows, the ws kernels' paired stores); asserts that nothing was written
    outside the view and returns the view's values."""
    from ninfer.cuda.gemm import gemm

    m, k = x.shape
    n = w.rows
    xbuf = cp.zeros((m, k + 24), dtype=F32)
    xbuf[:, 8 : 8 + k] = cp.asarray(x)
    buf = cp.full((m, n + 8 + col0), np.nan, dtype=F32)
    gemm(xbuf[:, 8 : 8 + k], w, buf[:, col0 : col0 + n], **kw)
    got = cp.asnumpy(buf)
    assert np.isnan(got[:, :col0]).all() and np.isnan(got[:, col0 + n :]).all(), f"{what}: wrote outside"
    return got[:, col0 : col0 + n]


def _x(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    x = (rng.standard_normal((m, k)) * 4).astype(F32)
    x[0, : min(8, k)] = [0, 1e-30, -1e-30, 1e20, -7e3, 2.0**-60, 0.5, -0.25][: min(8, k)]
    x[1 % m] *= 1e-25  # a tiny row: the clamped scale
    x[2 % m] *= 3e5  # a row above fp16's range before scaling
    return x


@pytest.mark.parametrize("fmt", F16_FMTS)
def test_f16_matches_rounded_reference(cp: Any, fmt: str) -> None:
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(61)
    for m, n, k in SHAPES:
        w, wf = _weight(rng, fmt, n, k)
        x = _x(rng, m, k)
        got = gemm_strided(cp, x, w, f"{fmt} {m}x{n}x{k}", inputs="fp16")
        err = _err(got, ops.linear(ops.round_fp16_rows(x), wf))
        assert err <= TOL, f"{fmt} {m}x{n}x{k}: normalised max error {err:.2e} against the rounded inputs"
        for r in range(m):  # per row too: the tiny and huge rows are not hidden by the others' scale
            ref = ops.linear(ops.round_fp16_rows(x[r : r + 1]), wf)
            assert _err(got[r : r + 1], ref) <= TOL, f"{fmt} {m}x{n}x{k}: row {r}"
        exact = cp.asnumpy(gemm(cp.asarray(x), w))
        assert not np.array_equal(exact, got), f"{fmt}: fp16 mode gave the exact result (not taken?)"


@pytest.mark.parametrize("fmt", ("NVFP4G16_E4M3S", "FP8E4M3_F32ROW"))
def test_f16_rows_independent_and_chunked(cp: Any, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's fp16-mode result depends on K and the ws kernel's K splits S only: for every kernel configuration
    (the cp kernel, the ws kernel at the split count ``auto`` takes here) a row alone, a slice of rows and a chunked
    scratch give the full launch's bits. (Under ``auto`` S follows the call's M, N, K: gemm_plan.splitk_splits.)"""
    import ninfer.cuda.gemm_pair as gp
    import ninfer.cuda.gemm_plan as plan
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(63)
    m, n, k = 300, 700, 8200  # K long enough to split (gemm_plan.SPLITK_MIN_KSTEPS)
    w, _ = _weight(rng, fmt, n, k)
    xd = cp.asarray(_x(rng, m, k))
    s = gp.splitk_splits(m, n, k)
    assert s > 1 and gp.f16_auto_ws(m, n, k), "this shape is split under auto"
    auto = cp.asnumpy(gemm(xd, w, inputs="fp16"))
    for variant in ("cp", f"ws{s}"):
        full = cp.asnumpy(gemm(xd, w, inputs="fp16", variant=variant))
        assert variant == "cp" or np.array_equal(full, auto), "auto is the ws kernel with the rule's S"
        for r in (0, 1, 2, 127, 128, 299):
            alone = cp.asnumpy(
                gemm(cp.ascontiguousarray(xd[r : r + 1]), w, impl="pair", inputs="fp16", variant=variant)
            )
            assert np.array_equal(alone[0], full[r]), (
                f"{fmt} {variant}: row {r} alone differs from the full launch"
            )
        for a, b in ((100, 260), (1, 129), (170, 300)):
            part = cp.asnumpy(gemm(xd[a:b], w, inputs="fp16", variant=variant))
            assert np.array_equal(part, full[a:b]), f"{fmt} {variant}: rows {a}..{b - 1} differ as a slice"
        with monkeypatch.context() as mp:
            mp.setattr(plan, "_W_CAP", 2 * 256 * k)
            mp.setattr(plan, "_X_CAP", 4 * 128 * k)
            chunked = cp.asnumpy(gemm(xd, w, inputs="fp16", variant=variant))
        assert np.array_equal(chunked, full), f"{fmt} {variant}: chunked scratch changed the result"
    monkeypatch.setattr(plan, "_W_CAP", 2 * 256 * k)
    monkeypatch.setattr(plan, "_X_CAP", 4 * 128 * k)
    chunked = cp.asnumpy(gemm(xd, w, inputs="fp16"))
    assert np.array_equal(chunked, auto), f"{fmt}: auto, chunked (every chunk keeps the call's S)"


def test_f16_stays_exact_where_it_does_not_apply(cp: Any) -> None:
    """BF16 weights without an operand store (their fp16 operand is kept only: gemm_bf16.py) or under the size floor,
    and GEMMs below PAIR_MIN_ROWS under auto (group-int included): bitwise the exact result. (Group-int weights
    from PAIR_MIN_ROWS rows have the fp16 mode: tests/test_cuda_gemm_group.py.)"""
    from ninfer.cuda.gemm import gemm
    from ninfer.cuda.gemm_pair import PAIR_MIN_ROWS
    from ninfer.cuda.operands import OperandStore

    rng = np.random.default_rng(65)
    w, _ = _weight(rng, "BF16", 260, 256)
    xd = cp.asarray(_x(rng, 300, 256))
    small = cp.asnumpy(gemm(xd, w, inputs="fp16", operands=OperandStore(1 << 30)))
    assert np.array_equal(small, cp.asnumpy(gemm(xd, w))), (
        "BF16 under BF16_F16_MIN_ELEMS: the exact pair mode"
    )
    for fmt, m in (("BF16", 300), ("Q4G64_F16S", PAIR_MIN_ROWS - 1), ("NVFP4G16_E4M3S", PAIR_MIN_ROWS - 1)):
        w, _ = _weight(rng, fmt, 260, 256)
        xd = cp.asarray(_x(rng, m, 256))
        a, b = cp.asnumpy(gemm(xd, w, inputs="fp16")), cp.asnumpy(gemm(xd, w))
        assert np.array_equal(a, b), f"{fmt} M={m}: inputs='fp16' changed a GEMM it must leave exact"


@pytest.mark.parametrize("fmt", F16_FMTS)
def test_f16_in_loop_kernel_equals_scratch_kernel(cp: Any, fmt: str) -> None:
    """gemm90_f16il (weights converted in the main loop; ``impl="wgmma"``) is bitwise gemm90_f16 over the dequant90
    scratch (``impl="pair"``, and ``auto`` where it does not split K) on both sides of the ws kernel's row threshold:
    the same fp16 operands, MMA order and epilogue, so the kernel choice never changes a value. Where ``auto`` splits
    K (the ws kernel's split-K), it is the forced split (``ws<S>``), within fp32 accumulation of the unsplit."""
    from ninfer.cuda.gemm import gemm
    from ninfer.cuda.gemm_pair import F16_WS_ROWS, f16_auto_ws, splitk_splits

    rng = np.random.default_rng(67)
    for m, n, k in (
        (128, 256, 64),
        (200, 300, 200),
        (F16_WS_ROWS - 1, 517, 1032),
        (F16_WS_ROWS + 3, 260, 136),
    ):
        w, _ = _weight(rng, fmt, n, k)
        xd = cp.asarray(_x(rng, m, k))
        inloop = cp.asnumpy(gemm(xd, w, impl="wgmma", inputs="fp16"))
        scratch = cp.asnumpy(gemm(xd, w, impl="pair", inputs="fp16", variant="cp"))
        auto = cp.asnumpy(gemm(xd, w, inputs="fp16"))
        assert np.array_equal(inloop, scratch), f"{fmt} {m}x{n}x{k}: in-loop != scratch kernel"
        s = splitk_splits(m, n, k) if f16_auto_ws(m, n, k) else 1
        if s == 1:
            assert np.array_equal(auto, scratch), f"{fmt} {m}x{n}x{k}: auto != scratch kernel"
        else:
            split = cp.asnumpy(gemm(xd, w, inputs="fp16", variant=f"ws{s}"))
            assert np.array_equal(auto, split), f"{fmt} {m}x{n}x{k}: auto != the ws kernel at S = {s}"
            assert _err(auto, scratch.astype(np.float64)) <= TOL, f"{fmt} {m}x{n}x{k}: split far from unsplit"
        exact = cp.asnumpy(gemm(xd, w, impl="wgmma"))
        assert not np.array_equal(exact, inloop), (
            f"{fmt}: impl='wgmma' with fp16 inputs gave the exact result"
        )


@pytest.mark.parametrize("fmt", ("NVFP4G16_E4M3S", "FP8E4M3_F32ROW", "FP8E4M3_F32T"))
def test_f16_experts_match_rounded_reference(cp: Any, fmt: str) -> None:
    """The MoE prefill GEMM's fp16 mode (gemm90_experts_f16): every slot's row rounded under its own scale, against
    its expert's product in NumPy with the same rounding; empty experts, an expert over two row tiles, one-row
    experts; a slot alone gives its bits in the full launch; the exact mode differs."""
    from test_cuda_ops import _weight as _experts_weight

    from ninfer.cuda.gemm import gemm_experts

    rng = np.random.default_rng(69)
    for n, k, counts in ((130, 136, [0, 150, 1, 0, 64, 65, 3]), (300, 1032, [130, 0, 257])):
        e = len(counts)
        w, wf = _experts_weight(rng, fmt, (e, n, k))
        ids = np.repeat(np.arange(e, dtype=np.int32), counts)
        x = _x(rng, ids.size, k)
        out = cp.full((ids.size, n), np.nan, dtype=F32)
        gemm_experts(cp.asarray(x), w, cp.asarray(ids), n, out, inputs="fp16")
        got = cp.asnumpy(out)
        xr = ops.round_fp16_rows(x)
        for s in range(ids.size):  # per row: the tiny and huge rows are not hidden by the others' scale
            ref = ops.linear(xr[s : s + 1], wf[ids[s]])
            assert _err(got[s : s + 1], ref) <= TOL, f"{fmt} {n}x{k}: slot {s} (expert {ids[s]})"
        for s in (0, int(counts[0]), ids.size - 1):
            alone = gemm_experts(cp.asarray(x[s : s + 1]), w, cp.asarray(ids[s : s + 1]), n, inputs="fp16")
            assert np.array_equal(cp.asnumpy(alone)[0], got[s]), f"{fmt}: slot {s} alone differs"
        exact = cp.asnumpy(gemm_experts(cp.asarray(x), w, cp.asarray(ids), n))
        assert not np.array_equal(exact, got), f"{fmt}: inputs='fp16' gave the exact result (not taken?)"


@pytest.mark.parametrize("fmt", ("NVFP4G16_E4M3S", "FP8E4M3_F32ROW"))
def test_f16_swiglu_input_is_swiglu_then_gemm(cp: Any, fmt: str) -> None:
    """``gemm(gu, w, swiglu=True)`` (the fp16 row split applies the SwiGLU: ``split_f16row_in<false, true>``) is
    bitwise ``gemm(swiglu(gu), w)`` in the fp16 mode, on both sides of the ws threshold and with chunked scratch;
    where the fp16 split does not apply (exact inputs, few rows) the swiglu kernel runs first: the same bits too."""
    import ninfer.cuda.gemm_pair as gp
    import ninfer.cuda.gemm_plan as plan
    from ninfer.cuda.activation import swiglu
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(71)
    for m, n, k in ((300, 260, 136), (gp.F16_WS_ROWS + 5, 517, 1032), (gp.PAIR_MIN_ROWS - 3, 130, 256)):
        w, _ = _weight(rng, fmt, n, k)
        gu = cp.zeros((m, 2 * k + 8), dtype=F32)  # a strided view: rows of 2K inside a wider buffer
        gu[:, : 2 * k] = cp.asarray(_x(rng, m, 2 * k))
        gu = gu[:, : 2 * k]
        for inputs in ("fp16", "exact"):
            fused = cp.asnumpy(gemm(gu, w, inputs=inputs, swiglu=True))
            plain = cp.asnumpy(gemm(swiglu(gu), w, inputs=inputs))
            assert np.array_equal(fused, plain), f"{fmt} {m}x{n}x{k} {inputs}: swiglu=True differs"
    w, _ = _weight(rng, fmt, 517, 1032)
    gu = cp.asarray(_x(rng, 300, 2 * 1032))
    full = cp.asnumpy(gemm(gu, w, inputs="fp16", swiglu=True))
    orig = (plan._W_CAP, plan._X_CAP)
    try:
        plan._W_CAP, plan._X_CAP = 2 * 256 * 1032, 4 * 128 * 1032
        gp.release_scratch()
        assert np.array_equal(cp.asnumpy(gemm(gu, w, inputs="fp16", swiglu=True)), full), "chunked scratch"
    finally:
        plan._W_CAP, plan._X_CAP = orig
        gp.release_scratch()


@pytest.mark.parametrize("fmt", ("NVFP4G16_E4M3S", "FP8E4M3_F32ROW"))
def test_f16_gate_input_is_sigmoid_gate_then_gemm(cp: Any, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gemm(o, w, gate=(qg, D))`` (the fp16 row split applies the attention output gate, read in place from the
    q|gate projection: ``split_f16row_gate``) is bitwise ``gemm(sigmoid_gate(o, qg, heads, D), w)`` in the fp16 mode,
    on both sides of the ws threshold, with strided views of ``o`` and ``qg`` (``qg`` inside a wider q|gate|k|v row,
    as the model holds it) and chunked scratch; where the fp16 split does not apply (exact inputs, few rows, a head
    dimension off the 8-float loads, a gate view not 16-byte aligned) sigmoid_gate runs first: the same bits too."""
    import ninfer.cuda.activation as act
    import ninfer.cuda.gemm_pair as gp
    import ninfer.cuda.gemm_plan as plan
    from ninfer.cuda.gemm import gemm

    calls: list[int] = []
    kernel = act.sigmoid_gate

    def counted(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        return kernel(*a, **kw)

    monkeypatch.setattr(act, "sigmoid_gate", counted)
    rng = np.random.default_rng(75)
    assert 200 < gp.F16_WS_ROWS < 700
    # (rows, heads, D, N, offset of qg in its buffer's rows (floats), whether the row split applies the gate)
    cases = (
        (200, 4, 64, 260, 0, True),
        (700, 3, 256, 517, 8, True),
        (300, 2, 136, 300, 16, True),
        (gp.PAIR_MIN_ROWS - 3, 2, 128, 130, 0, False),  # below the pair threshold
        (300, 2, 12, 260, 0, False),  # D % 8: sigmoid_gate first
        (300, 2, 64, 260, 2, False),  # the gate view 8 bytes off 16-byte alignment
    )
    for m, heads, d, n, off, folds in cases:
        k = heads * d
        w, _ = _weight(rng, fmt, n, k)
        obuf = cp.zeros((m, k + 24), dtype=F32)  # a strided view of the attention output
        obuf[:, 8 : 8 + k] = cp.asarray(_x(rng, m, k))
        o = obuf[:, 8 : 8 + k]
        qkvg = cp.asarray((rng.standard_normal((m, 2 * k + 40)) * 3).astype(F32))  # q|gate, then k|v
        # each head's first gate: sigmoid 1, ~1e-13, ~1/2, 0 (expf overflows)
        qkvg[:, off + d : off + 2 * k : 2 * d] = cp.asarray(
            np.array([30.0, -30.0, 1e-3, -90.0], F32)[np.arange(heads) % 4]
        )
        qg = qkvg[:, off : off + 2 * k]
        for inputs in ("fp16", "exact"):
            calls.clear()
            fused = cp.asnumpy(gemm(o, w, inputs=inputs, gate=(qg, d)))
            assert len(calls) == (0 if folds and inputs == "fp16" else 1), f"{fmt} M={m} D={d} {inputs}: path"
            plain = cp.asnumpy(gemm(kernel(o, qg, heads, d), w, inputs=inputs))
            assert np.array_equal(fused, plain), f"{fmt} {m}x{n}x{k} D={d} {inputs}: gate=(qg, D) differs"
    m, heads, d, n = 300, 4, 256, 517
    k = heads * d
    w, _ = _weight(rng, fmt, n, k)
    o = cp.asarray(_x(rng, m, k))
    qg = cp.asarray((rng.standard_normal((m, 2 * k)) * 3).astype(F32))
    full = cp.asnumpy(gemm(o, w, inputs="fp16", gate=(qg, d)))
    assert np.array_equal(full, cp.asnumpy(gemm(kernel(o, qg, heads, d), w, inputs="fp16")))
    orig = (plan._W_CAP, plan._X_CAP)
    try:  # 128-row chunks: the gate rows sliced with the activation rows
        plan._W_CAP, plan._X_CAP = 2 * 256 * k, 4 * 128 * k
        gp.release_scratch()
        assert np.array_equal(cp.asnumpy(gemm(o, w, inputs="fp16", gate=(qg, d))), full), "chunked scratch"
    finally:
        plan._W_CAP, plan._X_CAP = orig
        gp.release_scratch()


@pytest.mark.parametrize("fmt", ("NVFP4G16_E4M3S", "FP8E4M3_F32T"))
def test_f16_experts_input_transforms(cp: Any, fmt: str) -> None:
    """``gemm_experts(x, ..., rows=r)`` (fp16 mode: the tokens' rows split once, each slot's read in place by
    ``gemm90_experts_f16g``) is bitwise ``gemm_experts(x[r])`` (the per-slot rows of the gathered copy,
    ``gemm90_experts_f16``), ``swiglu=True`` bitwise ``gemm_experts(swiglu(x))``, both together too, in the fp16
    mode and the exact one. Tables with empty experts (first, inner, last), ragged last tiles, more slots than
    tokens and fewer, K off the 64-wide K tile, a row-strided x; the launches counted by kernel."""
    from test_cuda_ops import _weight as _experts_weight

    from ninfer.cuda.activation import swiglu
    from ninfer.cuda.gemm import EXPERTS_LAUNCHES, gemm_experts
    from ninfer.cuda.gemm_pair import PAIR_STRUCTS

    rng = np.random.default_rng(73)
    gathered = f"gemm90_experts_f16g<{PAIR_STRUCTS[fmt][1]}>"
    per_slot = f"gemm90_experts_f16<{PAIR_STRUCTS[fmt][1]}>"
    for n, k, counts, tokens in (
        (130, 136, [0, 150, 1, 0, 64, 65, 3], 97),
        (300, 264, [0, 5, 0, 131, 0, 0], 40),  # the last tile 3 rows, trailing empty experts
        (256, 64, [1, 0, 2], 200),  # fewer slots than tokens
    ):
        e = len(counts)
        w, _ = _experts_weight(rng, fmt, (e, n, k))
        ids = cp.asarray(np.repeat(np.arange(e, dtype=np.int32), counts))
        rows = cp.asarray(rng.integers(0, tokens, ids.size).astype(np.int32))
        xbuf = cp.asarray(np.pad(_x(rng, tokens, k), ((0, 0), (8, 16)), constant_values=np.nan))
        x = xbuf[:, 8 : 8 + k]  # row stride k + 24
        gu = cp.asarray(_x(rng, tokens, 2 * k))
        for inputs in ("fp16", "exact"):
            before = EXPERTS_LAUNCHES.copy()
            cases = (
                (
                    gemm_experts(x, w, ids, n, inputs=inputs, rows=rows),
                    gemm_experts(x[rows], w, ids, n, inputs=inputs),
                ),
                (
                    gemm_experts(gu[rows], w, ids, n, inputs=inputs, swiglu=True),
                    gemm_experts(swiglu(gu[rows]), w, ids, n, inputs=inputs),
                ),
                (
                    gemm_experts(gu, w, ids, n, inputs=inputs, rows=rows, swiglu=True),
                    gemm_experts(swiglu(gu)[rows], w, ids, n, inputs=inputs),
                ),
            )
            for i, (a, b) in enumerate(cases):
                got = cp.asnumpy(a)
                assert np.isfinite(got).all(), f"{fmt} {inputs} {counts}: case {i} not finite"
                assert np.array_equal(got, cp.asnumpy(b)), (
                    f"{fmt} {inputs} {counts}: transform case {i} differs"
                )
            ran = EXPERTS_LAUNCHES - before
            if inputs == "fp16":  # case 0's rows read in place; the others (and the references) per slot
                assert ran == {gathered: 1, per_slot: 5}, f"{fmt} {counts}: launched {dict(ran)}"
            else:
                assert gathered not in ran and per_slot not in ran, f"{fmt} exact: launched {dict(ran)}"
