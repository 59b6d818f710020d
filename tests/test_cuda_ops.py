"""Every CUDA kernel against the NumPy reference (ninfer.reference.ops) on fresh random inputs at several shapes.

Weights are encoded with ``ninfer.formats`` and dequantized by the kernels. Outputs are poisoned with NaN before
each launch and must be finite. Errors are max |got - ref| over max |ref| (``_close``); bf16 results get bf16
tolerances, float32 results fp32-accumulation-order tolerances. Skipped without a CUDA device (conftest).
Set NINFER_GPU_REPORT=<path> to collect every comparison's error as JSON (perf/device_check.sh does).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ninfer.formats import FORMATS, bf16_decode, bf16_encode, bf16_round
from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32
TOL = {"float": 2e-5, "bf16": 1.2e-2}  # normalised max error per output dtype
DTYPES = {"float": np.float32, "bf16": np.uint16}
MATRIX_FMTS = (
    "BF16",
    "FP8E4M3_F32ROW",
    "FP8E4M3_F32T",
    "NVFP4G16_E4M3S",
    "Q4G64_F16S",
    "Q5G64_F16S",
    "Q6G64_F16S",
    "W8G32_F16S",
)


@pytest.fixture(scope="session")
def report() -> Any:
    rows: list[dict[str, Any]] = []
    yield rows
    path = os.environ.get("NINFER_GPU_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _dev(cp: Any, x: np.ndarray, t: str) -> Any:
    x = np.asarray(x, dtype=F32)
    return cp.asarray(bf16_encode(x) if t == "bf16" else x)


def _host(cp: Any, a: Any) -> np.ndarray:
    h = cp.asnumpy(a)
    return bf16_decode(h) if h.dtype == np.uint16 else h.astype(F32)


def _poison(cp: Any, shape: tuple[int, ...], t: str) -> Any:
    if t == "bf16":
        return cp.full(shape, 0x7FC0, dtype=np.uint16)
    return cp.full(shape, np.nan, dtype=np.float32)


def _inputs(rng: np.random.Generator, shape: tuple[int, ...], t: str, scale: float = 1.0) -> np.ndarray:
    """Random float32 values, already bf16-representable when the kernel reads bf16 (so both see the same)."""
    x = (rng.standard_normal(shape) * scale).astype(F32)
    return bf16_round(x) if t == "bf16" else x


def _close(report: list, name: str, got: np.ndarray, ref: np.ndarray, tol: float) -> float:
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != {ref.shape}"
    assert np.isfinite(got).all(), f"{name}: non-finite output ({np.count_nonzero(~np.isfinite(got))} values)"
    err = float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
    report.append({"case": name, "err": err, "tol": tol, "ok": err <= tol})
    assert err <= tol, f"{name}: normalised max error {err:.3e} > {tol:.1e}"
    return err


def _weight(rng: np.random.Generator, fmt: str, shape: tuple[int, ...]) -> tuple[Any, np.ndarray]:
    """(DeviceWeight, the float32 weights the codec decodes to)."""
    from ninfer.cuda.weights import upload_weight

    codec = FORMATS[fmt]
    buf = codec.encode((rng.standard_normal(shape) * 0.5).astype(F32), shape)
    return upload_weight(fmt, shape, buf), codec.decode(buf, shape)


# ---- embedding, norms, activations ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["BF16", "W8G32_F16S", "Q6G64_F16S", "NVFP4G16_E4M3S", "FP8E4M3_F32ROW"])
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_embedding(cp: Any, report: list, fmt: str, t: str) -> None:
    from ninfer.cuda.embedding import embed

    rng = np.random.default_rng(1)
    for v, h in ((300, 136), (1000, 512)):
        w, table = _weight(rng, fmt, (v, h))
        ids = rng.integers(0, v, size=17).astype(np.int32)
        out = _poison(cp, (17, h), t)
        embed(w, cp.asarray(ids), dtype=DTYPES[t], out=out)
        ref = ops.embedding(table, ids)
        # dequantization is exact: the float32 rows equal the codec's, bf16 rows its rounding
        got = _host(cp, out)
        _close(report, f"embed {fmt} {t} {v}x{h}", got, bf16_round(ref) if t == "bf16" else ref, 0.0)
    bad = _poison(cp, (1, h), t)
    embed(w, cp.asarray(np.array([v], dtype=np.int32)), dtype=DTYPES[t], out=bad)
    assert np.isnan(_host(cp, bad)).all(), "an out-of-range id must give a NaN row"


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("offset", [True, False])
@pytest.mark.parametrize("fused", [True, False])
def test_rmsnorm(cp: Any, report: list, t: str, offset: bool, fused: bool) -> None:
    from ninfer.cuda.norm import rmsnorm

    rng = np.random.default_rng(2)
    for rows, h in ((1, 64), (5, 1000), (3, 5120)):
        x = _inputs(rng, (rows, h), t, 3.0)
        w = (rng.standard_normal(h) * 0.3).astype(F32)
        res = rng.standard_normal((rows, h)).astype(F32)
        r = ops.add_residual(res, x) if fused else x
        ref = ops.rmsnorm_offset(r, w, 1e-6) if offset else ops.rmsnorm_plain(r, 1e-6) * w
        res_d = cp.asarray(res)
        out = _poison(cp, (rows, h), t)
        rmsnorm(
            _dev(cp, x, t), cp.asarray(w), 1e-6, offset=offset, residual=res_d if fused else None, out=out
        )
        _close(report, f"rmsnorm off={offset} fused={fused} {t} {rows}x{h}", _host(cp, out), ref, TOL[t])
        if fused:
            _close(report, f"rmsnorm residual {t} {rows}x{h}", cp.asnumpy(res_d), r, 1e-7)


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("offset", [True, False])
def test_moe_combine_rmsnorm(cp: Any, report: list, t: str, offset: bool) -> None:
    """The MoE combine fused into the residual add + norm: bitwise the two kernels it replaces, and the reference."""
    from ninfer.cuda.model_layers import combine
    from ninfer.cuda.norm import MoeCombine, moe_combine_rmsnorm, rmsnorm

    rng = np.random.default_rng(12)
    # 1000 with a shared-expert stride of 1003: the scalar instance; 9000 > 8192: the row re-read from the residual
    for rows, h, k, ldsh in ((1, 64, 8, 64), (3, 1000, 4, 1003), (5, 5120, 8, 5120), (2, 9000, 2, 9000)):
        slots = rows * k + 3
        dn = _inputs(rng, (slots, h), t)
        where = rng.permutation(slots)[: rows * k].reshape(rows, k).astype(np.int32)
        ew = rng.random((rows, k)).astype(F32)
        sh_full = _inputs(rng, (rows, ldsh), t)
        sh = sh_full[:, :h]
        rg = rng.standard_normal((rows, 5)).astype(F32)  # the gate is column 4 of a [rows, 5] product
        w = (rng.standard_normal(h) * 0.3).astype(F32)
        res = rng.standard_normal((rows, h)).astype(F32)
        c = MoeCombine(_dev(cp, dn, t), cp.asarray(where), cp.asarray(ew), _dev(cp, sh_full, t)[:, :h],
                       cp.asarray(rg).reshape(-1)[4:], 5)  # fmt: skip
        got_res, want_res = cp.asarray(res), cp.asarray(res)
        got = moe_combine_rmsnorm(c, cp.asarray(w), 1e-6, residual=got_res, offset=offset)
        want = rmsnorm(combine(c), cp.asarray(w), 1e-6, residual=want_res, offset=offset)
        assert cp.array_equal(got_res, want_res) and cp.array_equal(got, want), f"{t} {rows}x{h}: not bitwise"
        gate = 1 / (1 + np.exp(-rg[:, 4:5].astype(np.float64)))
        y = np.einsum("tk,tkh->th", ew.astype(np.float64), dn[where].astype(np.float64)) + gate * sh
        y = bf16_round(y.astype(F32)) if t == "bf16" else y.astype(F32)
        r = ops.add_residual(res, y)
        ref = ops.rmsnorm_offset(r, w, 1e-6) if offset else ops.rmsnorm_plain(r, 1e-6) * w
        _close(report, f"moe_combine_rmsnorm off={offset} {t} {rows}x{h} k={k}", _host(cp, got), ref, TOL[t])


@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gated_rmsnorm(cp: Any, report: list, t: str) -> None:
    from ninfer.cuda.norm import gated_rmsnorm

    rng = np.random.default_rng(3)
    for rows, d in ((6, 16), (96, 128)):
        o, z = _inputs(rng, (rows, d), t, 2.0), _inputs(rng, (rows, d), t, 2.0)
        w = (1 + rng.standard_normal(d) * 0.2).astype(F32)
        out = _poison(cp, (rows, d), t)
        gated_rmsnorm(_dev(cp, o, t), _dev(cp, z, t), cp.asarray(w), 1e-6, out=out)
        _close(
            report, f"gated_rmsnorm {t} {rows}x{d}", _host(cp, out), ops.gated_rmsnorm(o, w, z, 1e-6), TOL[t]
        )


@pytest.mark.parametrize("t", ["float", "bf16"])
def test_swiglu_and_gate(cp: Any, report: list, t: str) -> None:
    from ninfer.cuda.activation import sigmoid_gate, swiglu

    rng = np.random.default_rng(4)
    # (600, 17408): more rows than the launch's row blocks (activation._grid: 17 x 481), so the row loop strides
    for rows, i in ((1, 32), (7, 1000), (33, 512), (600, 17408)):
        gu = _inputs(rng, (rows, 2 * i), t, 3.0)
        out = _poison(cp, (rows, i), t)
        swiglu(_dev(cp, gu, t), out=out)
        _close(report, f"swiglu {t} {rows}x{i}", _host(cp, out), ops.swiglu(gu[:, :i], gu[:, i:]), TOL[t])
    # row strides other than the width: columns of wider arrays
    gu = _inputs(rng, (9, 2 * 300 + 40), t, 3.0)
    out = _poison(cp, (9, 320), t)
    swiglu(_dev(cp, gu, t)[:, 40:], out=out[:, :300])
    ref = ops.swiglu(gu[:, 40:340], gu[:, 340:])
    _close(report, f"swiglu {t} strided", _host(cp, out)[:, :300], ref, TOL[t])
    assert np.isnan(_host(cp, out)[:, 300:]).all(), "swiglu wrote past its output columns"
    for rows, heads, d in ((3, 4, 32), (5, 24, 256)):
        x = _inputs(rng, (rows, heads * d), t)
        qg = _inputs(rng, (rows, heads * 2 * d), t, 3.0)
        _, gate = ops.split_q_gate(qg, heads, d)
        out = _poison(cp, (rows, heads * d), t)
        sigmoid_gate(_dev(cp, x, t), _dev(cp, qg, t), heads, d, out=out)
        ref = ops.sigmoid_gate(x, gate.reshape(rows, heads * d))
        _close(report, f"sigmoid_gate {t} {rows}x{heads}x{d}", _host(cp, out), ref, TOL[t])


# ---- matrix products -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", MATRIX_FMTS)
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gemv(cp: Any, report: list, fmt: str, t: str) -> None:
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(5)
    for n, k in ((64, 64), (300, 1000), (512, 5120)):
        w, wf = _weight(rng, fmt, (n, k))
        for b in (1, 3, 4, 5, 8):  # the 1-, 4- and 8-row instances
            x = _inputs(rng, (b, k), t)
            out = _poison(cp, (b, n), t)
            gemv(_dev(cp, x, t), w, out)
            _close(report, f"gemv {fmt} {t} b={b} {n}x{k}", _host(cp, out), ops.linear(x, wf), TOL[t])


@pytest.mark.parametrize("fmt", MATRIX_FMTS)
def test_gemv_rows_independent_of_batch(cp: Any, fmt: str) -> None:
    """A row computed alone, among 2-7 or among 8 (the 1-, 4- and 8-row instances) has the same bits (fixed
    reduction order)."""
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(6)
    w, _ = _weight(rng, fmt, (256, 2048))
    for t in ("float", "bf16"):
        x = _dev(cp, _inputs(rng, (8, 2048), t), t)
        full = cp.asnumpy(gemv(x, w))
        again = cp.asnumpy(gemv(x, w))  # split-K arrival counters reset themselves
        assert np.array_equal(again, full), f"{fmt} {t}: a second launch differs"
        for b in range(8):
            alone = cp.asnumpy(gemv(cp.ascontiguousarray(x[b : b + 1]), w))
            assert np.array_equal(alone[0], full[b]), f"{fmt} {t}: row {b} differs alone vs batch of 8"
        for m in (2, 3, 4, 5, 7):  # the 4-row instance (2-4 rows) and the 8-row one: the same bits per row
            part = cp.asnumpy(gemv(cp.ascontiguousarray(x[:m]), w))
            assert np.array_equal(part, full[:m]), f"{fmt} {t}: {m} rows differ from the batch of 8"


# K off every chunk width (8 | K; K % 16 == 8 for FP8's guarded half; K % 128 != 0 for the padded formats), N off
@pytest.mark.parametrize("fmt", ["BF16", "NVFP4G16_E4M3S", "Q6G64_F16S"])
def test_gemv_many_rows_are_8_row_blocks(cp: Any, report: list, fmt: str) -> None:
    """More than 8 rows run as 8-row blocks of one launch: each block bitwise equals its own 8-row launch."""
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(21)
    for m, n, k in ((9, 70, 200), (37, 130, 1000)):
        w, wf = _weight(rng, fmt, (n, k))
        x = cp.asarray(_inputs(rng, (m, k), "float"))
        out = _poison(cp, (m, n), "float")
        gemv(x, w, out)
        got = cp.asnumpy(out)
        _close(report, f"gemv {m} rows {fmt}", got, ops.linear(cp.asnumpy(x), wf), TOL["float"])
        for r in range(0, m, 8):
            blk = cp.asnumpy(gemv(cp.ascontiguousarray(x[r : r + 8]), w))
            assert np.array_equal(blk, got[r : r + 8]), (
                f"{fmt} {m}x{n}x{k}: rows {r}.. differ from their block"
            )


# N off the 16-row m-tiles and the 64/128-row blocks, K off the 128-wide tile, one to several K-splits (gemv_plan)
ODD_GEMV_SHAPES = ((6, 8), (13, 200), (37, 1000), (9, 5128), (70, 2056), (5, 17416))


@pytest.mark.parametrize("fmt", MATRIX_FMTS)
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gemv_odd_shapes(cp: Any, report: list, fmt: str, t: str) -> None:
    """Every row count 1..8 at awkward N and K, a sub-range of rows (row0), and row-strided x and out views."""
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(17)
    for n, k in ODD_GEMV_SHAPES:
        w, wf = _weight(rng, fmt, (n, k))
        for b in range(1, 9):
            x = _inputs(rng, (b, k), t)
            out = _poison(cp, (b, n), t)
            gemv(_dev(cp, x, t), w, out)
            _close(report, f"gemv odd {fmt} {t} b={b} {n}x{k}", _host(cp, out), ops.linear(x, wf), TOL[t])
        x = _inputs(rng, (3, k), t)
        xbuf = cp.zeros((3, k + 16), dtype=DTYPES[t])
        xbuf[:, :k] = _dev(cp, x, t)
        r0, m = n // 3, n - n // 3 - 1
        obuf = _poison(cp, (3, m + 8), t)
        gemv(xbuf[:, :k], w, obuf[:, :m], row0=r0, n=m)
        got = _host(cp, obuf)
        _close(report, f"gemv row0 {fmt} {t} {n}x{k}", got[:, :m], ops.linear(x, wf[r0 : r0 + m]), TOL[t])
        assert np.isnan(got[:, m:]).all(), f"{fmt} {n}x{k}: wrote outside the out view"


@pytest.mark.parametrize("fmt", MATRIX_FMTS)
def test_gemv_experts(cp: Any, report: list, fmt: str) -> None:
    rng = np.random.default_rng(7)
    # (96, 256): rows a whole number of blocks; (37, 2056): N off the row groups, K off the chunk widths
    for n, k in ((96, 256), (37, 2056)):
        _experts_case(cp, report, rng, fmt, n, k)


def _experts_case(cp: Any, report: list, rng: np.random.Generator, fmt: str, n: int, k: int) -> None:
    from ninfer.cuda.gemv_experts import gemv_experts
    from ninfer.cuda.linear import gemv

    e, tokens, top = 6, 3, 4
    w, wf = _weight(rng, fmt, (e, n, k))
    x = _inputs(rng, (tokens, k), "float")
    ids = np.stack([rng.choice(e, top, replace=False) for _ in range(tokens)]).reshape(-1).astype(np.int32)
    xrow = np.repeat(np.arange(tokens, dtype=np.int32), top)
    out = _poison(cp, (tokens * top, n), "float")
    xd = cp.asarray(x)
    gemv_experts(xd, w, cp.asarray(ids), cp.asarray(xrow), n, out)
    got = cp.asnumpy(out)
    ref = np.stack([ops.linear(x[r : r + 1], wf[i])[0] for i, r in zip(ids, xrow, strict=True)])
    _close(report, f"gemv_experts {fmt} {n}x{k}", got, ref, TOL["float"])
    # each slot is bitwise the plain GEMV of its expert's rows split as expert launches split K (dense launches
    # may take more splits by default: gemv_geometry._GV_DENSE_MIN_TILES)
    with _dense_as_expert_plan():
        for s, (i, r) in enumerate(zip(ids, xrow, strict=True)):
            solo = cp.asnumpy(gemv(cp.ascontiguousarray(xd[r : r + 1]), w, row0=int(i) * n, n=n))
            assert np.array_equal(solo[0], got[s]), f"slot {s}: expert product differs from the plain gemv"


@contextlib.contextmanager
def _dense_as_expert_plan() -> Iterator[None]:
    """Inside the block, dense GEMV launches are planned as expert launches (_GV_DENSE_MIN_TILES off; the cached
    plans and launch geometries dropped on entry and on exit)."""
    import ninfer.cuda.gemv_geometry as geo
    from ninfer.cuda.linear import replan

    saved = geo._GV_DENSE_MIN_TILES
    geo._GV_DENSE_MIN_TILES = None
    replan()
    try:
        yield
    finally:
        geo._GV_DENSE_MIN_TILES = saved
        replan()


@pytest.mark.parametrize("fmt", ["NVFP4G16_E4M3S", "BF16", "Q4G64_F16S"])
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gemv_prologues_equal_the_standalone_kernels(cp: Any, fmt: str, t: str) -> None:
    """The GEMV's fused SwiGLU and output-gate inputs are bitwise the GEMV of the standalone kernels' outputs
    (1, 3 and 8 rows; the expert dispatch's SwiGLU too)."""
    from ninfer.cuda.activation import sigmoid_gate, swiglu
    from ninfer.cuda.gemv_experts import gemv_experts
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(29)
    heads, d = 3, 64
    k = heads * d
    w, _ = _weight(rng, fmt, (70, k))
    for b in (1, 3, 8):
        gu = _dev(cp, _inputs(rng, (b, 2 * k), t), t)
        assert np.array_equal(cp.asnumpy(gemv(gu, w, swiglu=True)), cp.asnumpy(gemv(swiglu(gu), w)))
        o = _dev(cp, _inputs(rng, (b, k), t), t)
        qg = _dev(cp, _inputs(rng, (b, 2 * k), t), t)
        fused = cp.asnumpy(gemv(o, w, gate=(qg, d)))
        assert np.array_equal(fused, cp.asnumpy(gemv(sigmoid_gate(o, qg, heads, d), w))), f"{fmt} {t} b={b}"
    we, _ = _weight(rng, fmt, (4, 70, k))
    gu = _dev(cp, _inputs(rng, (6, 2 * k), t), t)
    ids = cp.asarray(np.array([3, 0, 2, 2, 1, 3], np.int32))
    slot = cp.arange(6, dtype=np.int32)
    got = cp.asnumpy(gemv_experts(gu, we, ids, slot, 70, swiglu=True))
    assert np.array_equal(got, cp.asnumpy(gemv_experts(swiglu(gu), we, ids, slot, 70)))


@pytest.mark.parametrize("fmt", MATRIX_FMTS)
def test_fused_projection_equals_its_parts(cp: Any, fmt: str) -> None:
    """A fused weight (ninfer/cuda/fuse.py; different scales per part, so NVFP4 becomes per-row globals and FP8
    tensor scales row scales) gives each part's columns bitwise as the part's own GEMV (all of them one row block
    here, so the GEMV splits K alike), and its GEMM matches the reference."""
    from ninfer.cuda.fuse import concat_rows
    from ninfer.cuda.gemm import gemm
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(23)
    k = 1000
    from ninfer.cuda.weights import upload_weight

    codec = FORMATS[fmt]
    parts = []
    for n, s in ((48, 1.0), (16, 30.0), (3, 0.01)):
        buf = codec.encode((rng.standard_normal((n, k)) * s).astype(F32), (n, k))
        parts.append((upload_weight(fmt, (n, k), buf), codec.decode(buf, (n, k))))
    fused = concat_rows([w for w, _ in parts])
    for t in ("float", "bf16"):
        x = _dev(cp, _inputs(rng, (5, k), t), t)
        full = cp.asnumpy(gemv(x, fused))
        c = 0
        for w, _ in parts:
            own = cp.asnumpy(gemv(x, w))
            assert np.array_equal(full[:, c : c + w.rows], own), f"{fmt} {t}: fused columns {c}.. differ"
            c += w.rows
    x = _inputs(rng, (20, k), "float")
    ref = ops.linear(x, np.concatenate([wf for _, wf in parts]))
    got = cp.asnumpy(gemm(cp.asarray(x), fused))
    err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    assert err <= 5e-5, f"{fmt}: fused GEMM error {err:.2e}"


# tensor-core products: exact weight operands, bf16 x exact, float x split into two bf16 halves (<= 2^-17)
GEMM_TOL = {"float": 5e-5, "bf16": TOL["bf16"]}


@pytest.mark.parametrize("fmt", MATRIX_FMTS)
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gemm(cp: Any, report: list, fmt: str, t: str) -> None:
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(8)
    for m, n, k in ((9, 64, 64), (100, 200, 136), (257, 1000, 512)):
        w, wf = _weight(rng, fmt, (n, k))
        x = _inputs(rng, (m, k), t)
        out = _poison(cp, (m, n), t)
        gemm(_dev(cp, x, t), w, out)
        _close(report, f"gemm {fmt} {t} {m}x{n}x{k}", _host(cp, out), ops.linear(x, wf), GEMM_TOL[t])


# the model's awkward shapes: N < 8 (GDN a/b), N and K off the 64/32 tiles, K not a multiple of 128 (padded rows
# of NVFP4 and the group formats), M of one row up to several row tiles
ODD_GEMM_SHAPES = ((1, 6, 8), (32, 6, 64), (33, 96, 72), (65, 130, 200), (130, 257, 264))


@pytest.mark.parametrize("fmt", MATRIX_FMTS)
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gemm_odd_shapes_strided(cp: Any, report: list, fmt: str, t: str) -> None:
    """Row-strided x and out views (as the model's fused gate|up buffer): right values inside, nothing written
    outside the view, and rows equal to the same product computed alone (no dependence on the row tile)."""
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(16)
    for m, n, k in ODD_GEMM_SHAPES:
        w, wf = _weight(rng, fmt, (n, k))
        x = _inputs(rng, (m, k), t, 4.0)
        xbuf = cp.zeros((m, k + 24), dtype=DTYPES[t])
        xbuf[:, 8 : 8 + k] = _dev(cp, x, t)
        buf = _poison(cp, (m, n + 11), t)
        gemm(xbuf[:, 8 : 8 + k], w, buf[:, 3 : 3 + n])
        got = _host(cp, buf)
        assert np.isnan(got[:, :3]).all() and np.isnan(got[:, 3 + n :]).all(), (
            f"{fmt} {m}x{n}x{k}: wrote outside"
        )
        _close(report, f"gemm odd {fmt} {t} {m}x{n}x{k}", got[:, 3 : 3 + n], ops.linear(x, wf), GEMM_TOL[t])
        last = cp.asnumpy(gemm(_dev(cp, x[-1:], t), w))
        assert np.array_equal(last[0], cp.asnumpy(buf)[-1, 3 : 3 + n]), f"{fmt} {m}x{n}x{k}: row depends on M"


@pytest.mark.parametrize("fmt", MATRIX_FMTS)
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gemm_experts(cp: Any, report: list, fmt: str, t: str) -> None:
    """Grouped MoE prefill GEMM: slots sorted by expert, empty experts, an expert spanning several row tiles,
    one-row experts, a K long enough to cycle the pipeline ring several times; every slot's row equals its expert's
    product."""
    from ninfer.cuda.gemm import gemm_experts

    rng = np.random.default_rng(17)
    # expert 1 spans two 128-row tiles, 0 and 3 are empty; then three experts over a 1032-wide K (17 K tiles)
    for n, k, counts in ((130, 136, [0, 150, 1, 0, 64, 65, 3]), (300, 1032, [130, 0, 257])):
        e = len(counts)
        w, wf = _weight(rng, fmt, (e, n, k))
        ids = np.repeat(np.arange(e, dtype=np.int32), counts)
        x = _inputs(rng, (ids.size, k), t)
        out = _poison(cp, (ids.size, n), t)
        gemm_experts(_dev(cp, x, t), w, cp.asarray(ids), n, out)
        ref = np.concatenate([ops.linear(x[ids == i], wf[i]) for i in range(e) if counts[i]])
        _close(report, f"gemm_experts {fmt} {t} {n}x{k}", _host(cp, out), ref, GEMM_TOL[t])


@pytest.mark.parametrize("fmt", ["NVFP4G16_E4M3S", "Q4G64_F16S", "BF16"])
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gemm_mma_fallback(cp: Any, report: list, fmt: str, t: str) -> None:
    """impl="mma" keeps the mma.sync kernel (gemm.cu, the path of non-Hopper devices) working on any GPU, and
    both kernels agree with the reference."""
    from ninfer.cuda.gemm import gemm, gemm_experts

    rng = np.random.default_rng(31)
    m, n, k = 130, 257, 264
    w, wf = _weight(rng, fmt, (n, k))
    x = _inputs(rng, (m, k), t)
    ids = np.repeat(np.arange(1, dtype=np.int32), m)
    for mode in ("mma", "auto"):
        out = _poison(cp, (m, n), t)
        gemm(_dev(cp, x, t), w, out, impl=mode)
        _close(report, f"gemm[{mode}] {fmt} {t}", _host(cp, out), ops.linear(x, wf), GEMM_TOL[t])
        out = _poison(cp, (m, n), t)
        gemm_experts(_dev(cp, x, t), w, cp.asarray(ids), n, out, impl=mode)
        _close(report, f"gemm_experts[{mode}] {fmt} {t}", _host(cp, out), ops.linear(x, wf), GEMM_TOL[t])


def _rowg_weight(cp: Any, rng: np.random.Generator, n: int, k: int) -> tuple[Any, np.ndarray]:
    """NVFP4 with per-row globals (the fused projections' format): three parts of different scales fused."""
    from ninfer.cuda.fuse import concat_rows
    from ninfer.cuda.weights import upload_weight

    codec, parts, refs = FORMATS["NVFP4G16_E4M3S"], [], []
    for rows, s in ((n // 2, 1.0), (n // 4, 30.0), (n - n // 2 - n // 4, 0.01)):
        buf = codec.encode((rng.standard_normal((rows, k)) * s).astype(F32), (rows, k))
        parts.append(upload_weight("NVFP4G16_E4M3S", (rows, k), buf))
        refs.append(codec.decode(buf, (rows, k)))
    fused = concat_rows(parts)
    assert fused.fmt == "NVFP4G16_E4M3S_ROWG"
    return fused, np.concatenate(refs)


@pytest.mark.parametrize("fmt", (*MATRIX_FMTS, "NVFP4G16_E4M3S_ROWG"))
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gemm_rows_independent(cp: Any, report: list, fmt: str, t: str) -> None:
    """Three row tiles, column tiles with a partial last one, K = 2056 (33 K tiles: the pipeline ring wraps many
    times, a tail of 8): right values, and every row bitwise equal to the same row computed alone or inside a
    differently aligned slice of rows (its result depends only on its own activations and K)."""
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(29)
    m, n, k = 300, 520, 2056
    w, wf = _rowg_weight(cp, rng, n, k) if fmt.endswith("ROWG") else _weight(rng, fmt, (n, k))
    x = _inputs(rng, (m, k), t)
    xd = _dev(cp, x, t)
    out = _poison(cp, (m, n), t)
    gemm(xd, w, out)
    _close(report, f"gemm rows {fmt} {t} {m}x{n}x{k}", _host(cp, out), ops.linear(x, wf), GEMM_TOL[t])
    full = cp.asnumpy(out)
    for r in (0, 127, 128, 255, 299):
        alone = cp.asnumpy(gemm(cp.ascontiguousarray(xd[r : r + 1]), w))
        assert np.array_equal(alone[0], full[r]), f"{fmt} {t}: row {r} alone differs from the full launch"
    part = cp.asnumpy(gemm(xd[100:260], w))
    assert np.array_equal(part, full[100:260]), f"{fmt} {t}: rows 100..259 differ when launched as a slice"


# ---- Gated DeltaNet ------------------------------------------------------------------------------------------
def _packed(cp: Any, lens: list[int]) -> tuple[Any, Any, list[int]]:
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    slots = np.arange(len(lens), dtype=np.int32)[::-1].copy()  # not the identity: slots are looked up
    return cp.asarray(starts), cp.asarray(slots), starts.tolist()


@pytest.mark.parametrize("t", ["float", "bf16"])
def test_causal_conv(cp: Any, report: list, t: str) -> None:
    from ninfer.cuda.gdn import causal_conv

    rng = np.random.default_rng(9)
    for c, lens in ((96, [1, 7]), (1024, [5, 1, 2]), (1100, [62, 3, 200, 0, 1, 130])):  # token tiles of 64
        x = _inputs(rng, (sum(lens), c), t)
        w = (rng.standard_normal((c, 4)) * 0.5).astype(F32)
        state = rng.standard_normal((len(lens), c, 3)).astype(F32)
        starts, slots, st = _packed(cp, lens)
        state_d = cp.asarray(state)
        out = _poison(cp, x.shape, t)
        causal_conv(_dev(cp, x, t), cp.asarray(w), state_d, starts, slots, out)
        got, got_state = _host(cp, out), cp.asnumpy(state_d)
        slot_of = cp.asnumpy(slots)
        for b in range(len(lens)):
            y, new = ops.conv1d_causal(x[st[b] : st[b + 1]], state[slot_of[b]], w)
            if st[b + 1] > st[b]:  # an empty sequence has no output, only its (unchanged) state
                _close(report, f"conv {t} C={c} seq{b}", got[st[b] : st[b + 1]], ops.silu(y), TOL[t])
            _close(report, f"conv state C={c} seq{b}", got_state[slot_of[b]], new, 0.0)


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("st", ["float", "bf16"])
def test_gdn_recurrent(cp: Any, report: list, t: str, st: str) -> None:
    from ninfer.cuda.gdn import gdn_recurrent

    rng = np.random.default_rng(10)
    for hk, hv, dk, lens in ((2, 6, 16, [1, 5]), (2, 4, 128, [37, 1]), (1, 2, 64, [3])):
        dv, n = dk, sum(lens)
        qkv = _inputs(rng, (n, 2 * hk * dk + hv * dv), t)
        a, b = _inputs(rng, (n, hv), t), _inputs(rng, (n, hv), t)
        a_log = rng.uniform(-2, 1, hv).astype(F32)
        dt_bias = rng.uniform(-1, 1, hv).astype(F32)
        state = (rng.standard_normal((len(lens), hv, dk, dv)) * 0.1).astype(F32)
        if st == "bf16":
            state = bf16_round(state)
        starts, slots, sts = _packed(cp, lens)
        state_d = _dev(cp, state, st)
        out = _poison(cp, (n, hv * dv), t)
        gdn_recurrent(_dev(cp, qkv, t), _dev(cp, a, t), _dev(cp, b, t), cp.asarray(a_log), cp.asarray(dt_bias),
                      state_d, starts, slots, n_k_heads=hk, out=out)  # fmt: skip
        got, got_state, slot_of = _host(cp, out), _host(cp, state_d), cp.asnumpy(slots)
        for s in range(len(lens)):
            z = slice(sts[s], sts[s + 1])
            q = ops.l2norm(qkv[z, : hk * dk].reshape(-1, hk, dk))
            k = ops.l2norm(qkv[z, hk * dk : 2 * hk * dk].reshape(-1, hk, dk))
            v = qkv[z, 2 * hk * dk :].reshape(-1, hv, dv)
            beta, g = ops.gdn_gates(a[z], b[z], a_log, dt_bias)
            o, new = ops.gdn_recurrent(q, k, v, g, beta, state[slot_of[s]])
            name = f"gdn {t} state={st} hv={hv} dk={dk} T={lens[s]}"
            _close(report, name, got[z], o.reshape(lens[s], hv * dv), 1e-4 if t == "float" else TOL[t])
            _close(
                report, name + " state", got_state[slot_of[s]], new, 1e-4 if st == "float" else TOL["bf16"]
            )


def _gdn_case(rng: np.random.Generator, st: str, hv: int, dk: int, dv: int, nseq: int) -> dict:
    """Gate parameters and an initial state per sequence (bf16-representable when stored as bf16)."""
    a_log = rng.uniform(-2, 1, hv).astype(F32)
    dt_bias = rng.uniform(-1, 1, hv).astype(F32)
    state = (rng.standard_normal((nseq, hv, dk, dv)) * 0.1).astype(F32)
    return {"a_log": a_log, "dt_bias": dt_bias, "state": bf16_round(state) if st == "bf16" else state}


def _gdn_ref(
    qkv: np.ndarray, a: np.ndarray, b: np.ndarray, c: dict, s0: np.ndarray, hk: int, dk: int
) -> tuple:
    hv, dv = s0.shape[0], s0.shape[2]
    q = ops.l2norm(qkv[:, : hk * dk].reshape(-1, hk, dk))
    k = ops.l2norm(qkv[:, hk * dk : 2 * hk * dk].reshape(-1, hk, dk))
    v = qkv[:, 2 * hk * dk :].reshape(-1, hv, dv)
    beta, g = ops.gdn_gates(a, b, c["a_log"], c["dt_bias"])
    o, new = ops.gdn_recurrent(q, k, v, g, beta, s0)
    return o.reshape(-1, hv * dv), new


# lengths around the 64-token chunk (1, 63, 64, 65, several chunks with a ragged tail), GQA ratios 1..3,
# dk != dv and a dv that is not a multiple of the 64-column slice
GDN_CHUNKED_CASES = (
    (2, 6, 32, 32, [1, 5, 63, 64]),
    (1, 3, 64, 128, [65, 200]),
    (2, 4, 128, 128, [300, 64, 1]),
    (1, 2, 64, 96, [130]),
    (2, 2, 128, 64, [7, 129]),
    (2, 4, 16, 16, [70, 3]),
)


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("st", ["float", "bf16"])
@pytest.mark.parametrize("cols", [None, 16])
@pytest.mark.parametrize("variant", ["tc", "tcs", "wsp", "wsp2", "wspb", "tc8", "split", "mma", "fp32"])
def test_gdn_chunked(cp: Any, report: list, t: str, st: str, cols: int | None, variant: str) -> None:
    """Chunked kernels against the NumPy token-by-token recurrence (outputs and carried state), then one decode
    step of the exact recurrent kernel from the chunked state. ``cols``: the state pass's value columns per block
    (None: the wrapper's choice, 32 unless dv <= 16); ``variant``: the passes on 3xTF32 mma.sync (``tc`` with the
    prep's solve on tensor cores too) or fp32 FMAs (the same tolerances); "wspb" (a bf16 scratch) within the bf16
    tolerance throughout."""
    from ninfer.cuda.gdn import SCRATCH_BF16, gdn_chunked, gdn_recurrent

    f32 = 1e-4 if variant not in SCRATCH_BF16 else TOL["bf16"]  # the tolerance where every value is float

    rng = np.random.default_rng(11)
    for hk, hv, dk, dv, lens in GDN_CHUNKED_CASES:
        n, width = sum(lens), 2 * hk * dk + hv * dv
        qkv = _inputs(rng, (n + len(lens), width), t)  # one extra decode row per sequence at the end
        a, b = _inputs(rng, (n + len(lens), hv), t), _inputs(rng, (n + len(lens), hv), t)
        c = _gdn_case(rng, st, hv, dk, dv, len(lens))
        state = c["state"]
        starts, slots, sts = _packed(cp, lens)
        state_d = _dev(cp, state, st)
        out = _poison(cp, (n, hv * dv), t)
        dev = [_dev(cp, x, t) for x in (qkv, a, b)]
        gdn_chunked(dev[0][:n], dev[1][:n], dev[2][:n], cp.asarray(c["a_log"]), cp.asarray(c["dt_bias"]),
                    state_d, starts, slots, n_k_heads=hk, out=out, cols=cols, variant=variant)  # fmt: skip
        got, got_state, slot_of = _host(cp, out), _host(cp, state_d), cp.asnumpy(slots)
        # decode: row n + s is sequence s's next token, run by the exact kernel from the chunked state
        dstarts = cp.arange(len(lens) + 1, dtype=np.int32)
        dout = _poison(cp, (len(lens), hv * dv), t)
        gdn_recurrent(dev[0][n:], dev[1][n:], dev[2][n:], cp.asarray(c["a_log"]), cp.asarray(c["dt_bias"]),
                      state_d, dstarts, slots, n_k_heads=hk, out=dout)  # fmt: skip
        dgot = _host(cp, dout)
        for s in range(len(lens)):
            rows = list(range(sts[s], sts[s + 1])) + [n + s]
            o, new = _gdn_ref(qkv[rows], a[rows], b[rows], c, state[slot_of[s]], hk, dk)
            name = f"gdn_chunked {variant} {t} state={st} cols={cols} hk={hk} hv={hv} dk={dk} dv={dv} T={lens[s]}"
            _close(report, name, got[sts[s] : sts[s + 1]], o[:-1], f32 if t == "float" else TOL[t])
            stol = f32 if st == "float" else TOL["bf16"]
            _, mid = _gdn_ref(qkv[rows[:-1]], a[rows[:-1]], b[rows[:-1]], c, state[slot_of[s]], hk, dk)
            _close(report, name + " state", got_state[slot_of[s]], mid, stol)
            dtol = f32 if t == "float" and st == "float" else TOL["bf16"]
            _close(report, name + " decode", dgot[s : s + 1], o[-1:], dtol)


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("variant", ["tc", "tcs", "wsp", "wsp2", "wspb", "tc8", "split", "mma", "fp32"])
def test_gdn_chunked_real_heads(cp: Any, report: list, t: str, variant: str) -> None:
    """The two-pass chunked kernels (either state pass) at a real head shape (dk = dv = 128, 16 key heads, 32
    value heads) on one 2100-token sequence (33 chunks, a ragged tail) and two short ones, against the NumPy
    recurrence ("wspb", a bf16 scratch: within the bf16 tolerance); then batch invariance: the long sequence alone
    gives the same bits as inside the batch."""
    from ninfer.cuda.gdn import SCRATCH_BF16, gdn_chunked

    f32 = 1e-4 if variant not in SCRATCH_BF16 else TOL["bf16"]

    rng = np.random.default_rng(21)
    hk, hv, dk, dv, lens = 16, 32, 128, 128, [2100, 37, 1]
    n, width = sum(lens), 2 * hk * dk + hv * dv
    qkv, a, b = _inputs(rng, (n, width), t), _inputs(rng, (n, hv), t), _inputs(rng, (n, hv), t)
    c = _gdn_case(rng, "float", hv, dk, dv, len(lens))
    starts, slots, sts = _packed(cp, lens)
    dev = [_dev(cp, x, t) for x in (qkv, a, b)]
    gates = (cp.asarray(c["a_log"]), cp.asarray(c["dt_bias"]))
    state_d, out = cp.asarray(c["state"]), _poison(cp, (n, hv * dv), t)
    gdn_chunked(*dev, *gates, state_d, starts, slots, n_k_heads=hk, out=out, variant=variant)
    got, got_state, slot_of = _host(cp, out), _host(cp, state_d), cp.asnumpy(slots)
    for s in range(len(lens)):
        z = slice(sts[s], sts[s + 1])
        o, new = _gdn_ref(qkv[z], a[z], b[z], c, c["state"][slot_of[s]], hk, dk)
        name = f"gdn_chunked real heads {variant} {t} hk={hk} hv={hv} d={dk} T={lens[s]}"
        _close(report, name, got[z], o, f32 if t == "float" else TOL[t])
        _close(report, name + " state", got_state[slot_of[s]], new, f32)
    # the long sequence alone (slot 0 of a fresh state copy): bitwise the batch's rows and state
    one = cp.asarray(c["state"][slot_of[0]][None])
    out1 = _poison(cp, (lens[0], hv * dv), t)
    gdn_chunked(*(x[: lens[0]] for x in dev), *gates, one, cp.asarray(np.array([0, lens[0]], np.int32)),
                cp.zeros(1, np.int32), n_k_heads=hk, out=out1, variant=variant)  # fmt: skip
    assert np.array_equal(_host(cp, out1), got[: lens[0]]), "batch invariance: outputs differ"
    assert np.array_equal(_host(cp, one)[0], got_state[slot_of[0]]), "batch invariance: states differ"


@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gdn_chunked_split_is_tc(cp: Any, t: str) -> None:
    """The "split" state pass (the chunk walk for V' and the states, then a chunk-parallel output pass) gives the
    "tc" variant's outputs and states bit for bit: the same fragments and mma sequence per accumulator."""
    from ninfer.cuda.gdn import gdn_chunked

    rng = np.random.default_rng(23)
    hk, hv, dk, dv, lens = 16, 48, 128, 128, [700, 64, 1, 130]
    n, width = sum(lens), 2 * hk * dk + hv * dv
    qkv, a, b = _inputs(rng, (n, width), t), _inputs(rng, (n, hv), t), _inputs(rng, (n, hv), t)
    c = _gdn_case(rng, "float", hv, dk, dv, len(lens))
    starts, slots, _ = _packed(cp, lens)
    dev = [_dev(cp, x, t) for x in (qkv, a, b)]
    gates = (cp.asarray(c["a_log"]), cp.asarray(c["dt_bias"]))
    got = {}
    for v in ("tc", "split"):
        state_d, out = cp.asarray(c["state"]), _poison(cp, (n, hv * dv), t)
        gdn_chunked(*dev, *gates, state_d, starts, slots, n_k_heads=hk, out=out, variant=v)
        got[v] = (_host(cp, out), _host(cp, state_d))
    assert np.array_equal(got["split"][0], got["tc"][0]), "split vs tc: outputs differ"
    assert np.array_equal(got["split"][1], got["tc"][1]), "split vs tc: states differ"


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("st", ["float", "bf16"])
@pytest.mark.parametrize("variant", ["tc8", "tcs", "wsp", "wspq"])
def test_gdn_chunked_variant_is_tc(cp: Any, t: str, st: str, variant: str) -> None:
    """The 8-warp state pass ("tc8": each warp half the columns of its chunk rows and half the state tiles), the
    staged one ("tcs": each chunk's W and Q rows read from shared memory, copied there by cp.async) and the
    warp-specialized ones ("wsp", "wspq": the walk and the outputs on two warp groups meeting at named barriers) give
    the "tc" variant's outputs and states bit for bit, at 16 and 32 columns per block, at every head dim (the same
    mma sequence per accumulator; only which warp computes it, or where an operand is read from, changes)."""
    from ninfer.cuda.gdn import gdn_chunked

    rng = np.random.default_rng(29)
    cases = (*GDN_CHUNKED_CASES, (16, 48, 128, 128, [700, 64, 1, 130]))
    for hk, hv, dk, dv, lens in cases:
        n, width = sum(lens), 2 * hk * dk + hv * dv
        qkv, a, b = _inputs(rng, (n, width), t), _inputs(rng, (n, hv), t), _inputs(rng, (n, hv), t)
        c = _gdn_case(rng, st, hv, dk, dv, len(lens))
        starts, slots, _ = _packed(cp, lens)
        dev = [_dev(cp, x, t) for x in (qkv, a, b)]
        gates = (cp.asarray(c["a_log"]), cp.asarray(c["dt_bias"]))
        for cols in (16, 32):
            got = {}
            for v in ("tc", variant):
                state_d, out = _dev(cp, c["state"], st), _poison(cp, (n, hv * dv), t)
                gdn_chunked(*dev, *gates, state_d, starts, slots, n_k_heads=hk, out=out, variant=v, cols=cols)
                got[v] = (
                    cp.asnumpy(out).view(out.dtype.str.replace("f", "u")),
                    cp.asnumpy(state_d).view(state_d.dtype.str.replace("f", "u")),
                )  # raw bits
            what = f"{variant} vs tc, {t} state={st} dk={dk} dv={dv} cols={cols}"
            assert np.array_equal(got[variant][0], got["tc"][0]), f"{what}: outputs differ"
            assert np.array_equal(got[variant][1], got["tc"][1]), f"{what}: states differ"


def _bits(cp: Any, x: Any) -> np.ndarray:
    h = cp.asnumpy(x)
    return h.view(h.dtype.str.replace("f", "u"))


# the fused conv's shapes: (hk, hv, dk, dv) of the 27B and the 35B-A3B, and one whose value rows need the grown
# shared memory (dv > dk + 2)
GDN_CONV_SHAPES = ((16, 48, 128, 128), (16, 32, 128, 128), (1, 2, 64, 96))


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("st", ["float", "bf16"])
@pytest.mark.parametrize("variant", ["wsp", "wspb", "tcs", "tc", "split", "mma"])
def test_gdn_chunked_conv_fused(cp: Any, t: str, st: str, variant: str) -> None:
    """``gdn_chunked(conv=...)`` over the raw in-projection rows (a strided view, as in the model) against
    ``causal_conv`` then ``gdn_chunked`` on its output: outputs, recurrent states, carried conv states and (tc
    variants: ``gdn_chunk_prep_tc_conv``) every word of the prep's scratch bitwise, on fresh random inputs with
    nonzero conv states, several packed sequences (one- and two-token ones, whose new conv state mixes the old,
    an empty one, sequences over several chunks). "mma" runs causal_conv itself (no fused prep)."""
    import ninfer.cuda.gdn_chunk as gdn  # gdn_chunked's module: its launches go through its _launch_smem
    from ninfer.cuda.gdn import causal_conv, gdn_chunked

    rng = np.random.default_rng(31)
    lens = [700, 64, 1, 2, 0, 130]
    for hk, hv, dk, dv in GDN_CONV_SHAPES:
        n, c = sum(lens), 2 * hk * dk + hv * dv
        proj = _inputs(rng, (n, c + 72), t)  # q | k | v, then columns of the other projections
        a, b = _inputs(rng, (n, hv), t), _inputs(rng, (n, hv), t)
        g = _gdn_case(rng, st, hv, dk, dv, len(lens))
        conv_w = cp.asarray((rng.standard_normal((c, 4)) * 0.5).astype(F32))
        conv0 = rng.standard_normal((len(lens), c, 3)).astype(F32)
        starts, slots, _ = _packed(cp, lens)
        dev = [_dev(cp, x, t) for x in (proj, a, b)]
        qkv = dev[0][:, :c]
        gates = (cp.asarray(g["a_log"]), cp.asarray(g["dt_bias"]))
        got = {}
        for fused in (False, True):
            state_d, conv_d, out = _dev(cp, g["state"], st), cp.asarray(conv0), _poison(cp, (n, hv * dv), t)
            scratch: list[Any] = []
            orig = gdn._launch_smem

            def keep(fn: Any, grid: Any, threads: int, smem: int, args: tuple, orig: Any = orig,
                     scratch: list = scratch) -> None:  # fmt: skip
                if not scratch:  # the prep's launch: its scratch sections qk, w, a, u, g
                    scratch.extend(args[5:10])
                orig(fn, grid, threads, smem, args)

            gdn._launch_smem = keep
            try:
                if fused:
                    gdn_chunked(qkv, *dev[1:], *gates, state_d, starts, slots, n_k_heads=hk, out=out,
                                variant=variant, conv=(conv_w, conv_d))  # fmt: skip
                else:
                    y = causal_conv(qkv, conv_w, conv_d, starts, slots)
                    gdn_chunked(y, *dev[1:], *gates, state_d, starts, slots, n_k_heads=hk, out=out,
                                variant=variant)  # fmt: skip
            finally:
                gdn._launch_smem = orig
            if scratch:  # g's words only: the split variant pads its section (16-byte aligned h after it)
                scratch[4] = scratch[4].ravel()[: n * hv]
            got[fused] = [_bits(cp, x) for x in (out, state_d, conv_d, *scratch)]
        what = f"fused conv {variant} {t} state={st} hk={hk} hv={hv} dk={dk} dv={dv}"
        names = ("outputs", "states", "conv states", "qk", "w", "a", "u", "g")
        for name, x, y in zip(names, got[False], got[True], strict=True):
            assert np.array_equal(x, y), f"{what}: {name} differ ({np.count_nonzero(x != y)} words)"


# ---- attention -----------------------------------------------------------------------------------------------
def _pages(rng: np.random.Generator, lens: list[int], page: int) -> tuple[np.ndarray, int]:
    per = [max(1, -(-n // page)) for n in lens]
    total = sum(per) + 3
    perm = rng.permutation(total).astype(np.int32)
    table = np.zeros((len(lens), max(per)), dtype=np.int32)
    at = 0
    for b, p in enumerate(per):
        table[b, :p] = perm[at : at + p]
        at += p
    return table, total


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("ct", ["float", "bf16"])
def test_qk_norm_rope_kv_write(cp: Any, report: list, t: str, ct: str) -> None:
    from ninfer.cuda.attention import qk_norm_rope_kv_write

    rng = np.random.default_rng(11)
    for hq, hkv, d, rot, sec in ((4, 2, 32, 8, (2, 1, 1)), (8, 2, 256, 64, (11, 11, 10))):
        n, page = 7, 4
        qg, k, v = (
            _inputs(rng, (n, hq * 2 * d), t),
            _inputs(rng, (n, hkv * d), t),
            _inputs(rng, (n, hkv * d), t),
        )
        qw, kw = (rng.standard_normal(d) * 0.3).astype(F32), (rng.standard_normal(d) * 0.3).astype(F32)
        pos = np.stack([rng.integers(0, 3000, n) for _ in range(3)]).astype(np.int32)  # distinct MRoPE axes
        table, total = _pages(rng, [n], page)
        slots = (table[0, np.arange(n) // page].astype(np.int64) * page + np.arange(n) % page).astype(
            np.int64
        )
        cache_dt = DTYPES[ct]
        k_cache = cp.zeros((total, page, hkv, d), dtype=cache_dt)
        v_cache = cp.zeros((total, page, hkv, d), dtype=cache_dt)
        q_out = _poison(cp, (n, hq, d), t)
        qk_norm_rope_kv_write(_dev(cp, qg, t), _dev(cp, k, t), _dev(cp, v, t), cp.asarray(qw), cp.asarray(kw),
                              cp.asarray(pos), cp.asarray(slots), k_cache, v_cache, heads=hq, kv_heads=hkv,
                              head_dim=d, rotary_dim=rot, theta=1e7, mrope_section=sec, q_out=q_out)  # fmt: skip
        q, _ = ops.split_q_gate(qg, hq, d)
        cos, sin = ops.rope_cos_sin(pos, rot, 1e7, sec, True)
        q_ref = ops.apply_rope(ops.rmsnorm_offset(q, qw, 1e-6), cos, sin)
        k_ref = ops.apply_rope(ops.rmsnorm_offset(k.reshape(n, hkv, d), kw, 1e-6), cos, sin)
        # angles up to 3000 rad in fp32: cos/sin argument rounding differs by ~1e-4 between implementations
        tol = 1e-3 if t == "float" else TOL[t]
        _close(report, f"rope q {t} d={d}", _host(cp, q_out), q_ref, tol)
        kc = _host(cp, k_cache).reshape(-1, hkv, d)[slots]
        vc = _host(cp, v_cache).reshape(-1, hkv, d)[slots]
        _close(report, f"rope k->cache {t}/{ct} d={d}", kc, k_ref, 5e-4 if ct == "float" else TOL["bf16"])
        v_ref = v.reshape(n, hkv, d)
        _close(report, f"v->cache {t}/{ct} d={d}", vc, bf16_round(v_ref) if ct == "bf16" else v_ref, 0.0)


def _cache(cp: Any, rng: np.random.Generator, lens: list[int], hkv: int, d: int, ct: str, page: int) -> tuple:
    table, total = _pages(rng, lens, page)
    kc = _inputs(rng, (total, page, hkv, d), ct)
    vc = _inputs(rng, (total, page, hkv, d), ct)
    seq_k = [kc[table[b]].reshape(-1, hkv, d)[: lens[b]] for b in range(len(lens))]
    seq_v = [vc[table[b]].reshape(-1, hkv, d)[: lens[b]] for b in range(len(lens))]
    return _dev(cp, kc, ct), _dev(cp, vc, ct), cp.asarray(table), seq_k, seq_v


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("ct", ["float", "bf16"])
def test_decode_attention(cp: Any, report: list, t: str, ct: str) -> None:
    from ninfer.cuda.attention import attention

    rng = np.random.default_rng(12)
    for hq, hkv, d, lens in ((8, 2, 128, [1, 40, 300]), (6, 1, 256, [700, 3]), (4, 2, 32, [17])):
        kd, vd, table, seq_k, seq_v = _cache(cp, rng, lens, hkv, d, ct, 16)
        q = _inputs(rng, (len(lens), hq, d), t)
        row_seq = cp.asarray(np.arange(len(lens), dtype=np.int32))
        row_pos = cp.asarray(np.array(lens, dtype=np.int32) - 1)
        ref = np.stack(
            [ops.attention(q[b : b + 1], seq_k[b], seq_v[b], lens[b] - 1)[0] for b in range(len(lens))]
        )
        for chunk in (64, None):
            out = _poison(cp, q.shape, t)
            attention(
                _dev(cp, q, t), kd, vd, table, row_seq, row_pos, max_len=max(lens), chunk=chunk, out=out
            )
            name = f"decode attn {t}/{ct} hq={hq} d={d} chunk={chunk}"
            _close(report, name, _host(cp, out), ref, 1e-4 if t == "float" else TOL[t])
        # a row alone equals the row in the batch (split size fixed, never derived from the batch)
        full = cp.asnumpy(
            attention(_dev(cp, q, t), kd, vd, table, row_seq, row_pos, max_len=max(lens), chunk=64)
        )
        b = len(lens) - 1
        alone = attention(
            _dev(cp, q[b:], t), kd, vd, table, row_seq[b:], row_pos[b:], max_len=lens[b], chunk=64
        )
        assert np.array_equal(cp.asnumpy(alone)[0], full[b]), "decode attention depends on the batch"


@pytest.mark.parametrize("t", ["float", "bf16"])
def test_prefill_attention(cp: Any, report: list, t: str) -> None:
    from ninfer.cuda.attention import attention

    rng = np.random.default_rng(13)
    for hq, hkv, d, starts, news in (
        (8, 2, 128, [0, 30], [50, 9]),
        (4, 2, 32, [5], [64]),
        (6, 1, 256, [0], [130]),
    ):
        lens = [s + n for s, n in zip(starts, news, strict=True)]
        kd, vd, table, seq_k, seq_v = _cache(cp, rng, lens, hkv, d, "bf16", 16)
        q = _inputs(rng, (sum(news), hq, d), t)
        row_seq = np.repeat(np.arange(len(news)), news).astype(np.int32)
        row_pos = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, news, strict=True)]).astype(
            np.int32
        )
        out = _poison(cp, q.shape, t)
        attention(
            _dev(cp, q, t),
            kd,
            vd,
            table,
            cp.asarray(row_seq),
            cp.asarray(row_pos),
            max_len=max(lens),
            out=out,
        )
        got, at = _host(cp, out), 0
        for b, (s, n) in enumerate(zip(starts, news, strict=True)):
            ref = ops.attention(q[at : at + n], seq_k[b], seq_v[b], s)
            _close(
                report,
                f"prefill attn {t} hq={hq} d={d} seq{b}",
                got[at : at + n],
                ref,
                1e-4 if t == "float" else TOL[t],
            )
            at += n


# ---- MoE router ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("e,k", [(8, 2), (64, 4), (256, 8)])
def test_moe_route(cp: Any, report: list, e: int, k: int) -> None:
    from ninfer.cuda.router import moe_route

    rng = np.random.default_rng(14)
    logits = (np.round(rng.standard_normal((33, e)) * 4) / 4).astype(F32)  # coarse grid: many exact ties
    ids, w = moe_route(cp.asarray(logits), k)
    ref_ids, ref_w = ops.moe_route(logits, k)
    assert np.array_equal(cp.asnumpy(ids), ref_ids.astype(np.int32)), (
        "top-k ids (ties to the lower id) differ"
    )
    _close(report, f"router E={e} k={k}", cp.asnumpy(w), ref_w, 1e-6)
    # with the shared expert's slot (fuse.append_shared_expert): the routed ids row-major, then e once per row
    ids2, w2 = moe_route(cp.asarray(logits), k, shared=e)
    assert ids2.shape == (33 * (k + 1),)
    assert np.array_equal(cp.asnumpy(ids2[: 33 * k]).reshape(33, k), cp.asnumpy(ids))
    assert (cp.asnumpy(ids2[33 * k :]) == e).all() and np.array_equal(cp.asnumpy(w2), cp.asnumpy(w))


@pytest.mark.parametrize("e,k", [(8, 2), (64, 4), (256, 8)])
def test_moe_route_nan_rows_stay_in_range(cp: Any, e: int, k: int) -> None:
    """All-NaN / all -inf / partly NaN logits: k distinct ids in [0, E) (the expert kernels index by them), NaN
    weights where a NaN expert had to be chosen, the finite experts first otherwise."""
    from ninfer.cuda.router import moe_route

    rng = np.random.default_rng(17)
    logits = rng.standard_normal((4, e)).astype(F32)
    logits[0] = np.nan
    logits[1] = -np.inf
    logits[2, : e - k + 1] = np.nan  # k - 1 finite experts: one NaN expert must be chosen
    logits[3, ::2] = np.nan  # e/2 >= k finite experts
    ids, w = (cp.asnumpy(a) for a in moe_route(cp.asarray(logits), k))
    assert ((ids >= 0) & (ids < e)).all(), f"ids out of range: {ids}"
    assert all(len(set(r)) == k for r in ids.tolist()), "ids of a row must be distinct"
    assert np.isnan(w[:3]).all(), "rows that had to select NaN experts must carry NaN weights"
    assert set(ids[2, : k - 1].tolist()) == set(range(e - k + 1, e)), "finite experts rank before NaN ones"
    ref_ids, ref_w = ops.moe_route(logits[3, 1::2][None], k)
    assert np.array_equal(ids[3], 1 + 2 * ref_ids[0]) and np.allclose(w[3], ref_w[0], rtol=1e-6)


@pytest.mark.parametrize(
    "t,k,e,shared",
    [(9, 2, 8, False), (33, 8, 256, True), (256, 8, 256, True), (4096, 8, 256, False), (1000, 4, 64, True)],
)
def test_moe_sort_is_the_stable_argsort(cp: Any, t: int, k: int, e: int, shared: bool) -> None:
    """moe_sort (one launch) gives exactly what the stable argsort construction gives (NumPy here): slots ordered
    by expert, ties by pair position; each slot's token row; each pair's slot; the shared slots appended in token
    order. Skewed ids (a few hot experts, many empty ones) so that groups span warps and steps."""
    from ninfer.cuda.router import moe_sort

    rng = np.random.default_rng(t + k)
    n = t * k
    hot = rng.integers(0, e, 3)
    routed = np.where(rng.random(n) < 0.5, rng.choice(hot, n), rng.integers(0, e, n)).astype(np.int32)
    flat = np.concatenate([routed, np.full(t if shared else 0, e, np.int32)])
    ids, xrow, where = (cp.asnumpy(a) for a in moe_sort(cp.asarray(flat), n, k, e))
    order = np.argsort(routed, kind="stable")
    ref_ids = np.concatenate([routed[order], flat[n:]])
    ref_xrow = np.concatenate([order // k, np.arange(len(flat) - n)]).astype(np.int32)
    ref_where = np.empty(n, np.int64)
    ref_where[order] = np.arange(n)
    assert np.array_equal(ids, ref_ids), "expert ids per slot"
    assert np.array_equal(xrow, ref_xrow), "token row per slot"
    assert np.array_equal(where, ref_where), "slot per pair"
    sorted_dev = cp.asnumpy(cp.argsort(cp.asarray(routed)))  # what the prefill used before: the same order
    assert np.array_equal(sorted_dev, order), "cupy.argsort is not the stable order (the test's premise)"


@pytest.mark.parametrize(
    "s,e,hot", [(36864, 256, False), (2048, 256, True), (300, 1, False), (4000, 1024, True)]
)
def test_expert_tiles_is_the_searchsorted_table(cp: Any, s: int, e: int, hot: bool) -> None:
    """router.expert_tiles (one launch) gives every entry of the CuPy searchsorted / cumsum construction it replaced
    (tests/test_router_host.py runs the kernel on the CPU too)."""
    from test_router_host import _numpy_tiles

    from ninfer.cuda.gemm import expert_tiles

    rng = np.random.default_rng(s + e)
    raw = np.minimum(rng.geometric(0.05, s) - 1, e - 1) if hot else rng.integers(0, e, s)
    ids = np.sort(raw).astype(np.int32)
    got = expert_tiles(cp.asarray(ids), e)
    want = _numpy_tiles(ids, e, 128)
    assert got[4] == -(-s // 128) + e
    for name, g, w in zip(("off", "tile_e", "tile_s0", "ntiles"), got[:4], want, strict=True):
        assert np.array_equal(cp.asnumpy(g), w), name


# ---- sampling ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_argmax_masked(cp: Any, t: str) -> None:
    from ninfer.cuda.sampling import argmax_masked

    rng = np.random.default_rng(15)
    for rows, v, limit in ((1, 100, 100), (5, 1000, 990), (3, 248320, 248077)):
        logits = _inputs(rng, (rows, v), t)
        logits = np.round(logits * 2) / 2  # coarse grid: ties everywhere, the lowest id must win
        bits = rng.random((rows, v)) < 0.3
        bits[0] = False  # nothing allowed: -1
        words = np.packbits(np.pad(bits, ((0, 0), (0, -v % 32))), axis=1, bitorder="little").view("<i4")
        got = cp.asnumpy(argmax_masked(_dev(cp, logits, t), cp.asarray(words), limit=limit))
        plain = cp.asnumpy(argmax_masked(_dev(cp, logits, t)))
        assert np.array_equal(plain, np.argmax(logits, axis=1)), "unmasked argmax (lowest id on ties)"
        allowed = bits.copy()
        allowed[:, limit:] = False
        ref = np.where(allowed.any(axis=1), np.argmax(np.where(allowed, logits, -np.inf), axis=1), -1)
        assert np.array_equal(got, ref), f"masked argmax differs: {got} vs {ref}"


def test_counter_uniform(cp: Any) -> None:
    sampler = pytest.importorskip("ninfer.engine.sampler")
    from ninfer.cuda.sampling import counter_uniform

    rng = np.random.default_rng(16)
    seeds = rng.integers(0, 2**63, 64, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    pos = rng.integers(0, 2**40, 64, dtype=np.uint64)
    got = cp.asnumpy(counter_uniform(cp.asarray(seeds), cp.asarray(pos)))
    ref = np.array([sampler.uniform(int(s), int(p)) for s, p in zip(seeds, pos, strict=True)])
    assert np.array_equal(got, ref), "GPU uniforms must equal engine.sampler.uniform bit for bit"
