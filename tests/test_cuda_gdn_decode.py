"""The fused GDN mixer core (``gdn_decode``: cuda_src/gdn_step.cu) and the register-resident ``rmsnorm`` (norm.cu)
on the GPU, on fresh random inputs, outputs poisoned with NaN first (marked ``gpu``; skipped without a device):

- ``gdn_decode`` against the NumPy reference (conv, l2norm, gates, recurrence, gated RMSNorm) at the 27B's shapes
  (1 and 8 sequences) and small ragged ones, float32/bf16 activations and state; the recurrent and conv states;
- ``gdn_decode`` == ``causal_conv`` -> ``gdn_recurrent`` -> ``gated_rmsnorm`` bitwise (states included);
- exact prefill == decode: T tokens of each sequence in one call equal the same tokens as T decode calls, bitwise
  (float32 state; a bf16 state is rounded once per call, so there only within bf16 tolerance);
- a sequence decoded alone == inside an 8-sequence launch, bitwise;
- the cluster kernel (``variant="cluster"``, gdn_step_cl, the default) == the counter epilogue (``"counter"``, the
  kernel before it) == the persistent clusters (``"persist"``, gdn_step_clp: at the 27B's eight sequences each
  resident cluster takes several (sequence, value head) items) == the two launches, bitwise; decode calls captured
  back to back in one CUDA graph (PDL launches on the same states) == the same calls eager, bitwise, for all three;
- ``rmsnorm`` at 1 and 8 rows of 5120 (and two register rounds, ragged widths) against the reference, a row alone
  == inside a batch, the 16-byte and the scalar instances bitwise equal.
The host emulation tests (test_gdn_step_host.py, test_norm_host.py) check the same kernels on the CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer.formats import bf16_decode, bf16_encode, bf16_round
from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32
TOL = {"float": 1e-4, "bf16": 1.2e-2}
EPS = 1e-6
# hk, hv, dk, dv, tokens per sequence
CASES = (
    (16, 48, 128, 128, [1]),  # the 27B's decode step, one sequence
    (16, 48, 128, 128, [1] * 8),  # ... eight
    (2, 6, 64, 96, [1, 5, 0, 3]),  # ratio 3, a partial column tile, an empty segment, multi-token segments
    (1, 3, 16, 16, [7, 1]),  # half a column tile (the tiny test model's heads)
    (2, 4, 32, 64, [40]),  # a longer exact prefill
)


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _dev(cp: Any, x: np.ndarray, bf: bool) -> Any:
    return cp.asarray(bf16_encode(x) if bf else np.ascontiguousarray(x, dtype=F32))


def _host(cp: Any, a: Any) -> np.ndarray:
    h = cp.asnumpy(a)
    return bf16_decode(h) if h.dtype == np.uint16 else h


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(got).all(), f"non-finite output ({np.count_nonzero(~np.isfinite(got))} values)"
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def _problem(rng: np.random.Generator, case: tuple, tb: bool, sb: bool) -> dict[str, np.ndarray]:
    """Host inputs; slot 0 belongs to no sequence (must stay untouched), sequence s uses slot nseq - s."""
    hk, hv, dk, dv, lens = case
    n, nseq, c, w = sum(lens), len(lens), 2 * hk * dk + hv * dv, hv * dv

    def act(*shape: int, scale: float = 1.0) -> np.ndarray:
        x = (rng.standard_normal(shape) * scale).astype(F32)
        return bf16_round(x) if tb else x

    state = (rng.standard_normal((nseq + 1, hv, dk, dv)) * 0.1).astype(F32)
    return {
        "qkv": act(n, c),
        "convw": (rng.standard_normal((c, 4)) * 0.5).astype(F32),
        "conv": rng.standard_normal((nseq + 1, c, 3)).astype(F32),
        "a": act(n, hv),
        "b": act(n, hv),
        "alog": rng.uniform(-2, 1, hv).astype(F32),
        "dtb": rng.uniform(-1, 1, hv).astype(F32),
        "state": bf16_round(state) if sb else state,
        "starts": np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
        "slots": (np.arange(nseq, dtype=np.int32)[::-1] + 1).copy(),
        "z": act(n, w, scale=2.0),
        "normw": (1 + rng.standard_normal(dv) * 0.2).astype(F32),
    }


def _decode(
    cp: Any,
    p: dict,
    hk: int,
    tb: bool,
    sb: bool,
    rows: Any = None,
    seqs: Any = None,
    fused: bool = True,
    variant: str = "cluster",
) -> dict[str, Any]:
    """One ``gdn_decode`` call on the device states ``p['dev']`` (fresh copies of the host states on first use):
    every row of every sequence, or one row (``rows[i]``) for each sequence ``seqs[i]``. Returns the arrays."""
    from ninfer.cuda.gdn import gdn_decode

    d = p.setdefault("dev", {"state": _dev(cp, p["state"], sb), "conv": cp.asarray(p["conv"])})
    if rows is None:
        rows, seqs, starts = np.arange(p["qkv"].shape[0]), np.arange(len(p["slots"])), p["starts"]
    else:
        rows, seqs, starts = np.asarray(rows), np.asarray(seqs), np.arange(len(rows) + 1, dtype=np.int32)
    starts = cp.asarray(starts)
    out = cp.full((len(rows), p["z"].shape[1]), 0x7FC0 if tb else np.nan, dtype=np.uint16 if tb else F32)
    gdn_decode(_dev(cp, p["qkv"][rows], tb), cp.asarray(p["convw"]), d["conv"], _dev(cp, p["a"][rows], tb),
               _dev(cp, p["b"][rows], tb), cp.asarray(p["alog"]), cp.asarray(p["dtb"]), d["state"], starts,
               cp.asarray(p["slots"][seqs]), _dev(cp, p["z"][rows], tb), cp.asarray(p["normw"]), EPS,
               n_k_heads=hk, out=out, fused=fused, variant=variant)  # fmt: skip
    return {"y": out, **d}


def _reference(case: tuple, p: dict, s: int, tb: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    hk, hv, dk, dv, _ = case
    z, slot = slice(p["starts"][s], p["starts"][s + 1]), p["slots"][s]
    y, conv = ops.conv1d_causal(p["qkv"][z], p["conv"][slot], p["convw"])
    y = ops.silu(y)
    y = bf16_round(y) if tb else y  # the conv output is stored as an activation
    q = ops.l2norm(y[:, : hk * dk].reshape(-1, hk, dk))
    k = ops.l2norm(y[:, hk * dk : 2 * hk * dk].reshape(-1, hk, dk))
    beta, g = ops.gdn_gates(p["a"][z], p["b"][z], p["alog"], p["dtb"])
    o, new = ops.gdn_recurrent(q, k, y[:, 2 * hk * dk :].reshape(-1, hv, dv), g, beta, p["state"][slot])
    o = bf16_round(o) if tb else o
    out = ops.gated_rmsnorm(o, p["normw"], p["z"][z].reshape(-1, hv, dv), EPS)
    return out.reshape(-1, hv * dv), new, conv


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("st", ["float", "bf16"])
@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"hk{c[0]}hv{c[1]}dk{c[2]}dv{c[3]}x{len(c[4])}T{sum(c[4])}"
)
def test_gdn_decode(cp: Any, t: str, st: str, case: tuple) -> None:
    from ninfer.cuda.gdn import causal_conv, gdn_recurrent
    from ninfer.cuda.norm import gated_rmsnorm

    hk, hv, dk, dv, lens = case
    tb, sb = t == "bf16", st == "bf16"
    p = _problem(np.random.default_rng(sum(lens) + hv + dk), case, tb, sb)
    r = _decode(cp, p, hk, tb, sb, variant="cluster")
    y, got_s, got_c = _host(cp, r["y"]), _host(cp, r["state"]), cp.asnumpy(r["conv"])
    np.testing.assert_array_equal(got_s[0], p["state"][0])
    np.testing.assert_array_equal(got_c[0], p["conv"][0])
    for s in range(len(lens)):
        ref_y, ref_s, ref_c = _reference(case, p, s, tb)
        rows, slot = slice(p["starts"][s], p["starts"][s + 1]), p["slots"][s]
        if lens[s]:
            assert _rel(y[rows], ref_y) <= TOL[t], f"seq {s}: output {_rel(y[rows], ref_y):.2e}"
        # bf16 activations: the conv output is rounded to bf16 (as stored), and a last-bit difference in the fp32
        # conv/silu can flip that rounding for a value on a boundary (one bf16 ulp, 2^-8); through v and k it moves
        # the state by ~1e-4 of its range (measured 1.8e-4 at the 27B's x8 decode on the H200)
        tol_s = max(TOL[st], 1e-3) if tb else TOL[st]
        assert _rel(got_s[slot], ref_s) <= tol_s, f"seq {s}: state {_rel(got_s[slot], ref_s):.2e}"
        np.testing.assert_array_equal(got_c[slot], ref_c)
    # the same through the three separate kernels: bitwise
    state, conv = _dev(cp, p["state"], sb), cp.asarray(p["conv"])
    starts, slots, n = cp.asarray(p["starts"]), cp.asarray(p["slots"]), sum(lens)
    yc = causal_conv(_dev(cp, p["qkv"], tb), cp.asarray(p["convw"]), conv, starts, slots)
    o = gdn_recurrent(yc, _dev(cp, p["a"], tb), _dev(cp, p["b"], tb), cp.asarray(p["alog"]), cp.asarray(p["dtb"]),
                      state, starts, slots, n_k_heads=hk)  # fmt: skip
    on = gated_rmsnorm(
        o.reshape(n * hv, dv), _dev(cp, p["z"], tb).reshape(n * hv, dv), cp.asarray(p["normw"]), EPS
    )
    np.testing.assert_array_equal(cp.asnumpy(r["y"]), cp.asnumpy(on).reshape(n, hv * dv), "fused vs unfused")
    np.testing.assert_array_equal(cp.asnumpy(r["state"]), cp.asnumpy(state), "fused vs unfused: state")
    np.testing.assert_array_equal(cp.asnumpy(r["conv"]), cp.asnumpy(conv), "fused vs unfused: conv state")
    # the cluster kernel == the counter epilogue == the persistent clusters == the default ("auto") == gdn_step +
    # gdn_step_post, bitwise
    fresh = {k: v for k, v in p.items() if k != "dev"}
    for other in (
        _decode(cp, dict(fresh), hk, tb, sb, fused=False),
        _decode(cp, dict(fresh), hk, tb, sb, variant="counter"),
        _decode(cp, dict(fresh), hk, tb, sb, variant="persist"),
        _decode(cp, dict(fresh), hk, tb, sb, variant="auto"),
    ):
        for name in ("y", "state", "conv"):
            np.testing.assert_array_equal(cp.asnumpy(r[name]), cp.asnumpy(other[name]), f"variants: {name}")


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("st", ["float", "bf16"])
@pytest.mark.parametrize(
    "case", [(16, 48, 128, 128, [4, 2, 3]), (2, 6, 64, 96, [6, 1])], ids=["27b", "small"]
)
def test_gdn_prefill_equals_decode(cp: Any, t: str, st: str, case: tuple) -> None:
    """Each sequence's tokens in one exact-prefill call, then the same tokens as decode calls (call i carries the
    i-th token of every sequence that has one): outputs and states bitwise equal with a float32 state."""
    hk, _, _, _, lens = case
    tb, sb = t == "bf16", st == "bf16"
    p = _problem(np.random.default_rng(7), case, tb, sb)
    pre = _decode(cp, dict(p), hk, tb, sb)
    dec = dict(p)
    y = np.zeros_like(cp.asnumpy(pre["y"]))
    for i in range(max(lens)):
        seqs = [s for s in range(len(lens)) if i < lens[s]]
        rows = [p["starts"][s] + i for s in seqs]
        y[rows] = cp.asnumpy(_decode(cp, dec, hk, tb, sb, rows, seqs)["y"])
    np.testing.assert_array_equal(cp.asnumpy(dec["dev"]["conv"]), cp.asnumpy(pre["conv"]), "conv state")
    if not sb:
        np.testing.assert_array_equal(y, cp.asnumpy(pre["y"]), "prefill vs decode: output")
        np.testing.assert_array_equal(cp.asnumpy(dec["dev"]["state"]), cp.asnumpy(pre["state"]), "state")
    else:
        got = bf16_decode(y) if tb else y
        assert _rel(got, _host(cp, pre["y"])) <= TOL["bf16"]


@pytest.mark.parametrize("st", ["float", "bf16"])
def test_gdn_decode_batch_invariant(cp: Any, st: str) -> None:
    """8 sequences in one decode launch == each sequence alone, bitwise (27B shapes)."""
    case = (16, 48, 128, 128, [1] * 8)
    sb = st == "bf16"
    p = _problem(np.random.default_rng(8), case, False, sb)
    batch = _decode(cp, dict(p), 16, False, sb)
    alone = dict(p)
    for s in range(8):
        y = _decode(cp, alone, 16, False, sb, [s], [s])["y"]
        np.testing.assert_array_equal(cp.asnumpy(y)[0], cp.asnumpy(batch["y"])[s], f"sequence {s}")
    np.testing.assert_array_equal(cp.asnumpy(alone["dev"]["state"]), cp.asnumpy(batch["state"]))


@pytest.mark.parametrize("variant", ["cluster", "counter", "persist"])
@pytest.mark.parametrize(
    "case", [(16, 48, 128, 128, [3] * 8), (2, 6, 64, 96, [3, 2, 3])], ids=["27b", "small"]
)
def test_gdn_decode_graph(cp: Any, variant: str, case: tuple) -> None:
    """Decode calls (call i: the i-th token of every sequence) captured back to back in one CUDA graph, so each is a
    PDL launch that may start while the one before it (on the same states) still runs, after copy kernels that
    write their inputs: outputs and states bitwise those of the same calls eager."""
    from ninfer.cuda.gdn import gdn_decode

    hk, _, _, _, lens = case
    p = _problem(np.random.default_rng(11), case, False, False)
    steps = max(lens)
    calls = []  # per call: (rows, sequences)
    for i in range(steps):
        seqs = [s for s in range(len(lens)) if i < lens[s]]
        calls.append(([p["starts"][s] + i for s in seqs], seqs))
    eager = dict(p)
    want = [cp.asnumpy(_decode(cp, eager, hk, False, False, r, q, variant=variant)["y"]) for r, q in calls]
    consts = (cp.asarray(p["convw"]), cp.asarray(p["alog"]), cp.asarray(p["dtb"]), cp.asarray(p["normw"]))
    host = [{n: p[n][r] for n in ("qkv", "a", "b", "z")} for r, _ in calls]
    src = [{n: cp.asarray(v) for n, v in h.items()} for h in host]
    dst = [{n: cp.empty_like(v) for n, v in h.items()} for h in src]
    meta = [(cp.arange(len(r) + 1, dtype=np.int32), cp.asarray(p["slots"][q])) for r, q in calls]
    outs = [cp.full((len(r), p["z"].shape[1]), np.nan, F32) for r, _ in calls]

    def run(state: Any, conv: Any) -> None:
        for i in range(steps):
            for n in dst[i]:
                dst[i][n][...] = src[i][
                    n
                ]  # a copy kernel writes the inputs (not PDL: the chain starts after)
        for i, d in enumerate(dst):
            gdn_decode(d["qkv"], consts[0], conv, d["a"], d["b"], consts[1], consts[2], state, *meta[i], d["z"],
                       consts[3], EPS, n_k_heads=hk, out=outs[i], variant=variant)  # fmt: skip

    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with stream:
        run(cp.asarray(p["state"]), cp.asarray(p["conv"]))  # warm-up: counters of this stream, compiles
        state, conv = cp.asarray(p["state"]), cp.asarray(p["conv"])
        for o in outs:
            o.fill(np.nan)
        stream.synchronize()
        stream.begin_capture()
        run(state, conv)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(cp.asnumpy(o), want[i], f"graph vs eager: call {i}")
    np.testing.assert_array_equal(
        cp.asnumpy(state), cp.asnumpy(eager["dev"]["state"]), "graph vs eager: state"
    )
    np.testing.assert_array_equal(cp.asnumpy(conv), cp.asnumpy(eager["dev"]["conv"]), "graph vs eager: conv")


def _rms(cp: Any, xd: Any, w: np.ndarray, res: np.ndarray, tb: bool, offset: bool, fused: bool) -> tuple:
    """rmsnorm of device rows ``xd`` into a NaN-poisoned output; (output words, residual after) on the host."""
    from ninfer.cuda.norm import rmsnorm

    out = cp.full(xd.shape, 0x7FC0 if tb else np.nan, dtype=np.uint16 if tb else F32)
    rd = cp.asarray(res)
    rmsnorm(xd, cp.asarray(w), EPS, offset=offset, residual=rd if fused else None, out=out)
    return cp.asnumpy(out), cp.asnumpy(rd)


@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("offset", [True, False])
@pytest.mark.parametrize("fused", [True, False])
def test_rmsnorm_rows(cp: Any, t: str, offset: bool, fused: bool) -> None:
    tb = t == "bf16"
    rng = np.random.default_rng(12)
    for rows, h in ((1, 5120), (8, 5120), (3, 8200), (2, 1003), (4, 2048)):
        x = (rng.standard_normal((rows, h)) * 3).astype(F32)
        x = bf16_round(x) if tb else x
        w = (rng.standard_normal(h) * 0.3).astype(F32)
        res = rng.standard_normal((rows, h)).astype(F32)
        r = ops.add_residual(res, x) if fused else x
        ref = ops.rmsnorm_offset(r, w, EPS) if offset else ops.rmsnorm_plain(r, EPS) * w
        y, rr = _rms(cp, _dev(cp, x, tb), w, res, tb, offset, fused)
        err = _rel(bf16_decode(y) if tb else y, ref)
        assert err <= (1.2e-2 if tb else 2e-5), f"rmsnorm {rows}x{h}: {err:.2e}"
        if fused:
            np.testing.assert_array_equal(rr, r)
        y1, r1 = _rms(cp, _dev(cp, x[-1:], tb), w, res[-1:], tb, offset, fused)  # the last row alone
        np.testing.assert_array_equal(y1[0], y[-1], f"{rows}x{h}: row alone vs in a batch")
        np.testing.assert_array_equal(r1[0], rr[-1])
        wide = _dev(cp, np.concatenate([x[:, :1], x], axis=1), tb)[
            :, 1:
        ]  # misaligned rows: the scalar instance
        ys, rs = _rms(cp, wide, w, res, tb, offset, fused)
        np.testing.assert_array_equal(ys, y, f"{rows}x{h}: scalar vs 16-byte instance")
        np.testing.assert_array_equal(rs, rr)
