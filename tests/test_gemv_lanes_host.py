"""CPU check of the MoE expert lanes: cuda_src/moe_lanes.cu's slot table and cuda_src/gemv.cu's ``experts == 2`` mode
in the host emulation of tests/gemv_lanes_emu.py. Checks the table against a NumPy model (every routed pair in
exactly one lane, slots in expert order, the launch bound), and the lanes GEMV (4 and 8 lanes, K splits, the SwiGLU
prologue, float and bf16 activations) bitwise against the one-lane expert GEMV per row and against the NumPy
reference. The routed expert launch (the top-k inside the expert GEMV) and the down launch with the MoE combine
and the next norm in its tail are checked the same way against the kernels they replace. The dense launches and
norm folding: tests/test_gemv_dense_host.py; the SwiGLU epilogue and the routing tail: tests/test_gemv_fused_host.py.
The GPU tests (tests/test_cuda_moe_lanes.py, tests/test_cuda_moe_fused.py) check the kernels on the device.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from gemv_lanes_emu import F32, FMTS, emulate, lanes_case, weight, write
from moe_lanes_model import routing, table_model

from ninfer.cuda.moe_lanes import slot_bound


def _table(
    emu: Path, d: Path, ids: np.ndarray, xrow: np.ndarray, experts: int, nb: int
) -> tuple[np.ndarray, ...]:
    z = slot_bound(ids.size, experts, nb)
    write(d, ids=ids, xrow=xrow, dims=np.array([z, 0, 0], np.int64))
    args = [d, 0, 0, nb, 16, 8, 1, ids.size, experts, 0, 0, 1, 1]
    proc = subprocess.run([str(emu), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return tuple(np.fromfile(d / f"{n}.bin", dtype=np.int32) for n in ("sid", "tx", "ts"))


@pytest.mark.parametrize(
    "case",
    [
        (256, 8, 256, True, 8),
        (64, 8, 256, True, 4),
        (40, 3, 5, False, 8),
        (9, 1, 1, False, 4),
        (8, 1, 3, True, 8),
        (33, 4, 16, False, 4),
    ],  # fmt: skip
    ids=lambda c: f"t{c[0]}k{c[1]}e{c[2]}{'s' if c[3] else ''}nb{c[4]}",
)
def test_slot_table_matches_model(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    """The 35B-A3B's 256-token chunk (256 experts + shared, 8 lanes), a 4-lane chunk, few experts with many rows
    (several slots each), one expert, fewer pairs than lanes: the device table is the model's, every routed pair is
    in exactly one lane, and the bound covers the slots."""
    t, k, e, shared, nb = case
    ids, xrow, experts = routing(np.random.default_rng(t * 7 + e), t, k, e, shared)
    got = _table(lanes_emu, tmp_path, ids, xrow, experts, nb)
    want = table_model(ids, xrow, experts, nb)
    for name, g, w in zip(("sid", "tx", "ts"), got, want, strict=True):
        assert np.array_equal(g, w), f"{name} differs from the model"
    outs = got[1].reshape(-1, 2, nb)[:, 1]
    assert np.array_equal(np.sort(outs[outs >= 0]), np.arange(ids.size)), "a pair is missing or doubled"
    assert (got[0] >= 0).sum() == sum(-(-np.count_nonzero(ids == x) // nb) for x in range(experts))


# fmt, activation type, lanes, N, K, tokens, top-k, experts, shared, SwiGLU (down projection: x by pair row)
GEMV_CASES = [
    ("NVFP4G16_E4M3S", "float", 8, 40, 1032, 12, 3, 4, True, False),  # 2 K splits, slots of 1..8 lanes
    ("NVFP4G16_E4M3S", "bf16", 4, 24, 264, 10, 2, 3, False, True),
    ("BF16", "float", 4, 70, 520, 9, 2, 3, True, True),  # 70 rows: two row blocks, the second partial
    ("FP8E4M3_F32ROW", "bf16", 8, 33, 256, 11, 2, 2, False, False),
    ("Q4G64_F16S", "float", 8, 40, 1032, 12, 3, 4, True, False),  # the group formats: 64-wide group sums
    ("Q5G64_F16S", "bf16", 4, 33, 264, 10, 2, 3, False, False),
]


@pytest.mark.parametrize(
    "case", GEMV_CASES, ids=lambda c: f"{c[0]}-{c[1]}-nb{c[2]}-{'swiglu' if c[9] else 'plain'}"
)
def test_lanes_gemv_bitwise_one_lane_and_reference(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    lanes_case(lanes_emu, tmp_path, case, cluster=False)


# expert modes 1 and 2 with their K splits as clusters (more splits than the plan's, 1..16 tiles each)
CLUSTER_LANES_CASES = [
    ("NVFP4G16_E4M3S", "float", 8, 40, 1032, 12, 3, 4, True, False, 5),
    ("FP8E4M3_F32ROW", "bf16", 4, 33, 2048, 7, 2, 2, False, True, 16),
]


@pytest.mark.parametrize("case", CLUSTER_LANES_CASES, ids=lambda c: f"{c[0]}-{c[1]}-nb{c[2]}-s{c[10]}")
def test_lanes_gemv_cluster_bitwise_counter(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    """The expert launches (one lane per slot and expert lanes) with their splits reduced through distributed
    shared memory: every output bitwise the arrival-counter path's, and against the reference."""
    lanes_case(lanes_emu, tmp_path, case[:10], cluster=True, splits=case[10])


def test_switch_points_and_bounds() -> None:
    """The 35B-A3B (256 experts, top 8): chunks of up to 256 tokens take the lanes (4 lanes up to 32 tokens), 257
    the grouped GEMM; the slot bound covers any spread of the pairs; the split partials stay per launch."""
    from ninfer.cuda.moe_lanes import SLOTS_PER_LAUNCH, lanes_nb, lanes_workspace_bytes, use_lanes

    e, k = 256, 8
    assert use_lanes(16 * k, e) and use_lanes(256 * k, e) and not use_lanes(257 * k, e)
    assert lanes_nb(32 * k, e) == 4 and lanes_nb(33 * k, e) == 8
    rng = np.random.default_rng(0)
    for s, ex, nb in ((2304, 257, 8), (9, 3, 4), (100, 1, 8), (7, 50, 4)):
        counts = rng.multinomial(s, rng.dirichlet(np.full(ex, 0.3)))
        assert sum(-(-c // nb) for c in counts) <= slot_bound(s, ex, nb)
    # the 35B's gate|up: 8 row blocks x 4 splits of [128 rows x 8 lanes] fp32 per slot (NVFP4; others no larger)
    assert lanes_workspace_bytes(1024, 2048, 10**6) == SLOTS_PER_LAUNCH * 8 * 4 * 128 * 8 * 4
    assert lanes_workspace_bytes(2048, 512, 10) == 0  # the down projection (4 K-tiles) has no split


def test_moe_fusion_rules() -> None:
    """The routing runs inside gate | up only for decode-sized calls with float32 rows whose experts run as one-lane
    GEMV slots, and only when switched on; a pending down launch (MoeCombine.down) is run exactly once by
    model_layers.settle."""
    from types import SimpleNamespace

    import ninfer.cuda.gemv_experts as gex
    from ninfer.cuda.model_layers import _route_in_experts, settle
    from ninfer.cuda.norm import MoeCombine

    on, h32 = SimpleNamespace(moe_route_fused=True), np.zeros((1, 4), F32)
    assert _route_in_experts(on, h32, 8, False, False)
    assert not _route_in_experts(on, h32, 9, False, False)  # prefill
    assert not _route_in_experts(on, h32, 4, True, False) and not _route_in_experts(on, h32, 4, False, True)
    assert not _route_in_experts(on, h32.astype(np.uint16), 1, False, False)
    assert not _route_in_experts(SimpleNamespace(), h32, 1, False, False)  # off unless switched on
    calls = []
    real, gex.gemv_experts = gex.gemv_experts, lambda *a, **kw: calls.append((a, kw))
    try:
        c = MoeCombine(np.zeros((3, 8), F32), None, None, None, None, 1, ("gu", "w", "ids", "slot"))
        done = settle(c)
        assert done.down is None and settle(done) is done
        assert calls == [(("gu", "w", "ids", "slot", 8, c.dn), {"swiglu": True})]
    finally:
        gex.gemv_experts = real


# fmt, N (rows per expert), K, splits, tokens, routed experts, top-k, shared expert
ROUTED_CASES = [
    (
        "NVFP4G16_E4M3S",
        128,
        256,
        2,
        1,
        40,
        8,
        True,
    ),  # one decode token, the shared expert's slot after the routed
    ("NVFP4G16_E4M3S", 200, 384, 1, 3, 256, 8, False),  # 256 experts (8 per lane), a partial row block
    ("BF16", 64, 128, 2, 2, 33, 5, True),  # one expert past a lane's 32: lane 0 holds experts 0 and 32
]


@pytest.mark.parametrize(
    "case", ROUTED_CASES, ids=lambda c: f"{c[0]}-e{c[5]}k{c[6]}-t{c[4]}-{'sh' if c[7] else 'no'}"
)
def test_routed_expert_launch_is_route_then_experts(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    """gemv.cu's routed expert launch (gemv_mma_rt: the top-k inside the expert GEMV) against router.cu's
    moe_route and then the one-lane expert launch: the same ids, the same weights and the same products, bit for
    bit; the ids are NumPy's top-k (ties to the lower id) and the products match the decoded weights."""
    fmt, n, k, splits, t, e, top, shared = case
    rng = np.random.default_rng(1000 + e)
    ne = e + int(shared)
    buf, wdec, offs = weight(rng, fmt, ne * n, k)
    x = rng.standard_normal((t, k)).astype(F32)
    lg = (rng.standard_normal((t, e + 1)) * 2).astype(F32)
    write(tmp_path, w=buf, woff=np.array(offs, np.int64), wsize=np.array([buf.size], np.int64), x=x, lg=lg)
    args = ["routed", tmp_path, FMTS.index(fmt), n, k, splits, t, e, top, int(shared), 7]
    emulate(lanes_emu, args)
    out = {name: np.fromfile(tmp_path / f"{name}.bin", dtype=np.int32 if name.startswith("ids") else F32)
           for name in ("ids_ref", "w_ref", "y_ref", "ids_rt", "w_rt", "y_rt")}  # fmt: skip
    for a, b in (("ids_ref", "ids_rt"), ("w_ref", "w_rt"), ("y_ref", "y_rt")):
        assert np.array_equal(out[a].view(np.uint8), out[b].view(np.uint8)), f"{a} != {b}"
    p = np.exp(lg[:, :e].astype(np.float64) - lg[:, :e].max(axis=1, keepdims=True))
    want = np.argsort(-p, axis=1, kind="stable")[:, :top]
    slots = want.reshape(-1).tolist() + ([e] * t if shared else [])
    assert out["ids_rt"].tolist() == slots
    sel = np.take_along_axis(p, want, axis=1)
    np.testing.assert_allclose(out["w_rt"].reshape(t, top), sel / sel.sum(axis=1, keepdims=True), rtol=1e-5)
    rows = [s // top for s in range(t * top)] + (list(range(t)) if shared else [])
    ref = np.stack([wdec[ex * n : (ex + 1) * n] @ x[r] for ex, r in zip(slots, rows, strict=True)])
    err = np.max(np.abs(out["y_rt"].reshape(len(slots), n) - ref)) / np.max(np.abs(ref))
    assert err <= 2e-5, f"normalised error {err:.3e}"


# fmt, hidden H, intermediate I, tokens, top-k, shared expert as slots, offset
COMBINE_CASES = [
    ("NVFP4G16_E4M3S", 2048, 256, 1, 8, True, True),  # the 35B-A3B's widths, one decode token
    ("NVFP4G16_E4M3S", 520, 128, 3, 4, False, False),  # a partial row block, the shared expert's rows apart
    ("BF16", 256, 64, 2, 2, True, True),  # 64-row blocks
    ("NVFP4G16_E4M3S", 1024, 128, 8, 2, True, True),  # eight decode lanes (eight last blocks, eight norms)
]


@pytest.mark.parametrize(
    "case", COMBINE_CASES, ids=lambda c: f"{c[0][:5]}-h{c[1]}-t{c[3]}k{c[4]}-{c[5]}-{c[6]}"
)
def test_down_with_combine_is_down_then_moe_combine_rmsnorm(
    lanes_emu: Path, tmp_path: Path, case: tuple
) -> None:
    """gemv.cu's down launch with the MoE combine and the next norm in its tail (gemv_mma_cb: the token's last
    block plays norm.cu's 256-thread moe_combine_rmsnorm block with 128 threads) against the down launch followed by
    that kernel: the expert rows, the updated residual and the normed rows bit for bit (blocks in a shuffled order,
    the per-token counters back at zero), and the normed rows against NumPy."""
    fmt, h, inter, t, k, shared, offset = case
    rng = np.random.default_rng(h + t)
    e = 12
    n = t * k
    s = n + (t if shared else 0)
    ids = np.concatenate([rng.choice(e, size=(t, k), replace=False).reshape(-1) if t == 1 else
                          rng.integers(0, e, n), np.full(t if shared else 0, e)]).astype(np.int32)  # fmt: skip
    buf, wdec, offs = weight(rng, fmt, (e + 1) * h, inter)
    gu = rng.standard_normal((s, 2 * inter)).astype(F32)
    ew = rng.random((t, k)).astype(F32)
    sg = rng.standard_normal(t).astype(F32)
    r = (rng.standard_normal((t, h)) * 2).astype(F32)
    nw = (rng.standard_normal(h) * 0.2).astype(F32)
    sh = rng.standard_normal((t, h)).astype(F32)
    write(
        tmp_path, w=buf, woff=np.array(offs, np.int64), wsize=np.array([buf.size], np.int64), gu=gu, ids=ids
    )
    write(tmp_path, ew=ew, sg=sg, r=r, nw=nw, sh=sh)
    emulate(
        lanes_emu, ["combine", tmp_path, FMTS.index(fmt), h, inter, t, k, int(shared), int(offset), 1e-6, 5]
    )
    out = {
        name: np.fromfile(tmp_path / f"{name}.bin", dtype=F32)
        for name in ("dn1", "r1", "y1", "dn2", "r2", "y2")
    }
    for a in ("dn", "r", "y"):
        assert np.array_equal(out[a + "1"].view(np.uint8), out[a + "2"].view(np.uint8)), f"{a} differs"
    # NumPy: the expert rows, the combine, the residual and the norm
    act = gu[:, :inter] / (1 + np.exp(-gu[:, :inter].astype(np.float64))) * gu[:, inter:]
    dn = np.stack([wdec[ex * h : (ex + 1) * h] @ act[j] for j, ex in enumerate(ids)])
    shr = dn[n:] if shared else sh
    comb = np.einsum("tk,tkh->th", ew, dn[:n].reshape(t, k, h)) + shr / (
        1 + np.exp(-sg[:, None].astype(np.float64))
    )
    res = r + comb
    y = res / np.sqrt(np.mean(res**2, axis=1, keepdims=True) + 1e-6) * ((1 + nw) if offset else nw)
    for name, want in (("r2", res), ("y2", y)):
        got = out[name].reshape(t, h)
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert err <= 2e-5, f"{name}: normalised error {err:.3e}"
