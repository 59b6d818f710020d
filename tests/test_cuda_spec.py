"""MTP speculative decoding on the CUDA runner (docs/speculative.md): greedy output with drafts is the CUDA
runner's output without them, at 1 and 8 lanes, k = 1..5, with the real MTP head and with scripted drafts that
force 100/80/50% acceptance (every rollback length), across a second turn with prefix reuse, through the graphed
snapshot path (the default) and the replay path (``spec_snapshots=False``); the snapshot commit leaves the replay's
GDN state bitwise, the verify rows are bitwise the decode steps' logits and the graphed draft steps the eager ones;
seeded sampled requests repeat; the MTP head's draft logits match the reference's.

    python -m pytest -m gpu tests/test_cuda_spec.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

gpu = pytest.mark.gpu
PROMPTS = [[5, 9, 33, 100, 7, 12], [1, 2, 3], list(range(40, 75)), [200, 17], [8] * 20, [3, 1, 4, 1, 5, 9, 2, 6],
           list(range(100, 130)), [77]]  # fmt: skip


@pytest.fixture(scope="module", params=["demo", "tiny-moe"])
def cuda_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Model on the CUDA backend whose artifact carries an MTP head (the demo model; a tiny converted MoE)."""
    pytest.importorskip("cupy")
    from ninfer.cuda.model import load_cuda
    from ninfer.model import load

    d = tmp_path_factory.mktemp(f"cuda-spec-{request.param}")
    if request.param == "demo":
        from ninfer.demo import build_demo

        path = build_demo(d / "demo.ninfer")
    else:
        from hf_tiny import save_tiny_hf

        from ninfer.convert.hf import convert

        save_tiny_hf(d / "hf", "moe", 5, mtp=True)
        path = str(d / "m.ninfer")
        convert(str(d / "hf"), path, "bf16", allow_unregistered_shape=True, progress=False)
    model = load(path)
    model.net = load_cuda(path, progress=False)
    model.backend = "cuda"
    return model, path


def _run(model: Any, lanes: int, wrap: Any = None, **kw: Any) -> list[Any]:
    from engines import engine_over

    from ninfer.engine import EngineConfig

    sampling = kw.pop("sampling", {})
    turns, seen = kw.pop("turns", 1), kw.pop("seen", None)
    cfg = EngineConfig(max_context=256, kv_capacity=8192, max_concurrency=lanes, queue_depth=16, **kw)

    def wrapped(runner: Any) -> Any:
        if seen is not None:
            seen.append(runner)
        return wrap(runner) if wrap is not None else runner

    out: list[Any] = []
    prompts = PROMPTS
    with engine_over(model, cfg, wrapped) as eng:
        for _ in range(turns):  # a later turn extends the previous one's prompt and output (prefix reuse)
            hs = [eng.submit(p, max_tokens=24, ignore_eos=True, **sampling) for p in prompts]
            res = [h.result(timeout=600) for h in hs]
            out += res
            prompts = [p + c.token_ids + [3, 4, 5] for p, c in zip(prompts, res, strict=True)]
    return out


@pytest.fixture
def replay_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The earlier CUDA rollback (pre-round copy + GDN replay, eager drafts) for the runners made in the test."""
    from ninfer.cuda.runner import CudaModelRunner

    monkeypatch.setattr(CudaModelRunner, "spec_snapshots", False)


@gpu
@pytest.mark.parametrize("lanes", [1, 8])
def test_cuda_spec_greedy_equals_no_spec(cuda_model: Any, lanes: int) -> None:
    """Two turns (the second resumes from the first's checkpoints, with checkpoint steps inside the rounds), k =
    1..5, through the graphed snapshot path: the verify and draft graphs were used."""
    cuda_model = cuda_model[0]
    kw = dict(turns=2, checkpoint_stride=16)
    plain = _run(cuda_model, lanes, **kw)
    for k in (1, 2, 3, 4, 5):
        seen: list[Any] = []
        spec = _run(cuda_model, lanes, spec="mtp", draft_tokens=k, seen=seen, **kw)
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain], f"k={k}"
        assert all(c.usage.speculative.rounds > 0 for c in spec)
        assert any(c.usage.cached_tokens > 0 for c in spec[len(PROMPTS) :]), "no prefix reuse in turn 2"
        sp = seen[0]._spec  # noqa: SLF001
        assert sp.snapshots and sp.graphs._graphs and sp.drafts._graphs, (
            "the graphed snapshot path was not used"
        )  # noqa: SLF001


@gpu
def test_cuda_spec_replay_path_equals_no_spec(cuda_model: Any, replay_path: None) -> None:
    """The earlier path stays selectable and exact."""
    cuda_model = cuda_model[0]
    plain = _run(cuda_model, 8)
    for k in (1, 3):
        seen: list[Any] = []
        spec = _run(cuda_model, 8, spec="mtp", draft_tokens=k, seen=seen)
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain], f"k={k}"
        assert not seen[0]._spec.snapshots  # noqa: SLF001


@gpu
@pytest.mark.parametrize("pct", [100, 80, 50])
def test_cuda_forced_acceptance_equals_no_spec(cuda_model: Any, pct: int) -> None:
    cuda_model = cuda_model[0]
    from ninfer.engine.scripted_draft import ScriptedDrafts, replay_script

    plain = _run(cuda_model, 8)
    refs = {tuple(p): p + c.token_ids for p, c in zip(PROMPTS, plain, strict=True)}
    wrap = lambda r: ScriptedDrafts(r, replay_script(refs, pct, cuda_model.config.vocab_size))  # noqa: E731
    for k in (1, 3, 5):
        spec = _run(cuda_model, 8, wrap, spec="mtp", draft_tokens=k)
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain], f"k={k} pct={pct}"
        acc = sum(c.usage.speculative.accepted for c in spec) / sum(c.usage.speculative.drafted for c in spec)
        assert acc == 1.0 if pct == 100 else 0.0 < acc < 1.0


@gpu
def test_cuda_spec_sampled_is_reproducible(cuda_model: Any) -> None:
    cuda_model = cuda_model[0]
    s = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 42}
    a = _run(cuda_model, 8, spec="mtp", draft_tokens=3, sampling=s)
    b = _run(cuda_model, 4, spec="mtp", draft_tokens=3, sampling=s)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


@gpu
def test_cuda_mtp_head_matches_reference(cuda_model: Any) -> None:
    """The device MTP head's draft logits against the reference network's, on the same prompt."""
    from ninfer.cuda.model import load_cuda
    from ninfer.cuda.spec import mtp_hidden
    from ninfer.model import load

    ref = load(cuda_model[1])
    prompt = PROMPTS[2]
    net = load_cuda(cuda_model[1], progress=False, prefill_gemm=False)  # its own pools
    net.allocate(num_slots=2, num_pages=64, page_size=16, max_context=512, extra_kv=1)
    h = net.run([(0, 0, len(prompt), list(range(32)))], np.asarray(prompt, np.int32))
    d = mtp_hidden(net, h[:-1], np.asarray(prompt[1:], np.int32), [(0, 0, len(prompt) - 1, list(range(32)))])
    got = net.lm_head(d[-1:])[0]
    rn = ref.net
    hr = rn.forward(prompt, rn.new_state())
    want = rn.mtp_forward(hr[:-1], prompt[1:], None, rn.new_mtp_state())[-1]
    assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 5e-2


def _lane_state(net: Any, lane: int) -> tuple[np.ndarray, np.ndarray]:
    import cupy

    net.stream.synchronize()
    return cupy.asnumpy(net.conv_all[:, lane]), cupy.asnumpy(net.rec_all[:, lane])


@gpu
@pytest.mark.parametrize("k", [1, 3, 5])
def test_cuda_snapshot_commit_equals_replay(cuda_model: Any, k: int) -> None:
    """One lane, every rollback length: the snapshot runner (graphs) and the replay runner (eager drafts) draft the
    same logits bitwise, verify to the same logits bitwise, which are the plain runner's decode logits of the same
    tokens bitwise; after ``commit`` both hold the same GDN state bitwise and their next decode steps agree."""
    import cupy

    from ninfer.cuda.model import load_cuda
    from ninfer.cuda.runner import CudaModelRunner
    from ninfer.engine import EngineConfig
    from ninfer.engine.core import Batch, DraftLane, LaneSetup, LaneWork, SampleRequest, SamplingParams

    model, path = cuda_model
    greedy = SamplingParams(max_tokens=1 << 20, temperature=0.0)
    base = dict(max_context=256, kv_capacity=2048, max_concurrency=2, prefix_reuse=False)
    spec_cfg, plain_cfg = EngineConfig(**base, spec="mtp", draft_tokens=k), EngineConfig(**base)
    nets = [load_cuda(path, progress=False, prefill_gemm=False) for _ in range(3)]
    snap = CudaModelRunner(nets[0], model.config, spec_cfg, spec_snapshots=True)
    replay = CudaModelRunner(nets[1], model.config, spec_cfg, spec_snapshots=False)
    plain = CudaModelRunner(nets[2], model.config, plain_cfg)
    prompt, lane, pages = PROMPTS[2], 1, list(range(16))
    start = len(prompt)

    def req(pos: int) -> list[SampleRequest]:
        return [SampleRequest(greedy, 0, pos, {}, None)]

    def logits(r: Any) -> np.ndarray:
        return cupy.asnumpy(r._logits)  # noqa: SLF001

    def prefill(r: Any) -> int:
        r.execute(Batch(setups=[LaneSetup(lane, pages, None, 0, None)],
                        work=[LaneWork(lane, 0, prompt, True, True, None)]))  # fmt: skip
        return r.sample([0], req(start), None)[0]

    for kept in range(k + 2):  # 0 (defensive) .. k + 1 (every position kept)
        firsts = [prefill(r) for r in (snap, replay, plain)]
        assert len(set(firsts)) == 1
        drafts: list[int] = []
        for _ in range(k):  # the head's own greedy drafts
            toks = []
            for r in (snap, replay):
                r.draft([DraftLane(lane, [*prompt, firsts[0], *drafts])])
                toks.append(r.sample([0], req(start + 1 + len(drafts)), None)[0])
            np.testing.assert_array_equal(logits(snap), logits(replay), err_msg="graphed vs eager draft step")
            drafts.append(max(toks[0], 0))
        row = [firsts[0], *drafts]
        got = []
        for r in (snap, replay):
            r.execute(Batch(work=[LaneWork(lane, start, row, False, False, None, verify=True)]))
            r.net.stream.synchronize()  # a verify-only step is left running (its ``verify`` synchronizes)
            got.append(cupy.asnumpy(r._spec._verify[lane][3]))  # noqa: SLF001
            r.verify([lane], [drafts], [[req(start + i)[0] for i in range(k + 1)]], None)
        np.testing.assert_array_equal(got[0], got[1], err_msg="verify logits: snapshot vs replay path")
        for i, tok in enumerate(row):  # the plain runner decodes the same tokens one by one
            plain.execute(Batch(work=[LaneWork(lane, start + i, [tok], False, True, None)]))
            np.testing.assert_array_equal(
                logits(plain)[0], got[0][i], err_msg=f"verify row {i} vs its decode"
            )
        for r in (snap, replay):
            r.commit(lane, start + kept)
        for a, b, what in zip(
            _lane_state(nets[0], lane), _lane_state(nets[1], lane), ("conv", "rec"), strict=True
        ):
            np.testing.assert_array_equal(a, b, err_msg=f"kept={kept}: {what} state, snapshot vs replay")
        nxt = row[kept] if kept <= k else 7  # the next token fed at the committed length
        for r in (snap, replay):
            r.execute(Batch(work=[LaneWork(lane, start + kept, [nxt], False, True, None)]))
        np.testing.assert_array_equal(logits(snap), logits(replay), err_msg=f"kept={kept}: next decode step")


@gpu
@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
def test_cuda_copy_slot_pitched(cuda_model: Any, state_dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``copy_slot`` (one pitched device copy per kind: the speculative commit, checkpoint saves and restores)
    copies every layer's state of one slot bitwise and touches no other slot; so does its elementwise fallback."""
    import cupy

    from ninfer.cuda import model as cuda_model_mod
    from ninfer.cuda.model import load_cuda

    net = load_cuda(cuda_model[1], progress=False)
    net.state_dtype = state_dtype
    net.allocate(num_slots=5, num_pages=4, page_size=16, max_context=64)
    rng = np.random.default_rng(3)
    for a in (net.conv_all, net.rec_all):
        bits = rng.integers(0, 1 << 15, a.shape) if a.dtype == np.uint16 else rng.standard_normal(a.shape)
        a[...] = cupy.asarray(bits.astype(a.dtype))
    cupy.cuda.Device().synchronize()
    for src, dst, pitch in ((1, 3, None), (4, 0, 0)):  # pitch 0: the limit forces the fallback
        if pitch is not None:
            monkeypatch.setattr(cuda_model_mod, "_max_pitch", lambda pitch=pitch: pitch)
        want = [cupy.asnumpy(a) for a in (net.conv_all, net.rec_all)]
        for w in want:
            w[:, dst] = w[:, src]
        net.copy_slot(src, dst)
        net.stream.synchronize()
        for w, a in zip(want, (net.conv_all, net.rec_all), strict=True):
            np.testing.assert_array_equal(
                cupy.asnumpy(a), w, err_msg=f"copy_slot({src}, {dst}) pitch limit {pitch}"
            )


@gpu
@pytest.mark.parametrize("snapshots", [True, False], ids=["graphed", "eager"])
def test_cuda_draft_chain_equals_steps(cuda_model: Any, snapshots: bool) -> None:
    """``draft_chain`` (each draft sampled on the device and fed to the next step there, one synchronization)
    drafts the tokens and the draft logits rows of the ``draft`` / ``sample`` loop bitwise, at 3 lanes with greedy
    and sampled rows, through the draft graphs (snapshot path) and eagerly (replay path); with ``forced`` tokens
    it feeds and returns those. After ``capture_spec_graphs`` no round captures a graph."""
    import cupy

    from ninfer.cuda.model import load_cuda
    from ninfer.cuda.runner import CudaModelRunner
    from ninfer.engine import EngineConfig
    from ninfer.engine.core import Batch, DraftLane, LaneSetup, LaneWork, SampleRequest, SamplingParams
    from ninfer.engine.spec_verify import draft_request

    model, path = cuda_model
    k, lanes, prompts = 4, [0, 2, 3], PROMPTS[:3]
    cfg = EngineConfig(max_context=256, kv_capacity=2048, max_concurrency=4, prefix_reuse=False, spec="mtp",
                       draft_tokens=k)  # fmt: skip
    chain, steps = (
        CudaModelRunner(load_cuda(path, progress=False), model.config, cfg, spec_snapshots=snapshots)
        for _ in "ab"
    )
    before = chain.spec_graph_captures
    captured = chain.capture_spec_graphs(len(lanes))
    # the runner captured every spec graph of every lane count at construction, within the plan's graph pools
    assert captured == before > 0
    verify = 4 * k  # (b lanes, n rows per lane) for b = 1..4, n = 2..k+1
    drafts = sum(min(8, b * (k + 1)) - b + 1 for b in range(1, 5)) if snapshots else 0
    assert captured == verify + drafts
    assert chain.graph_pool_bytes() <= chain.plan.graph_pools
    params = [SamplingParams(max_tokens=1 << 20), SamplingParams(max_tokens=1 << 20, temperature=0.8, top_k=20),
              SamplingParams(max_tokens=1 << 20, temperature=1.0)]  # fmt: skip

    def req(i: int, pos: int) -> SampleRequest:
        return SampleRequest(params[i], 1000 + i, pos, {}, None)

    firsts = []
    for r in (chain, steps):
        r.execute(Batch(setups=[LaneSetup(ln, list(range(16 * ln, 16 * ln + 16)), None, 0, None) for ln in lanes],
                        work=[LaneWork(ln, 0, p, True, True, None) for ln, p in zip(lanes, prompts, strict=True)]))  # fmt: skip
        firsts.append(r.sample(range(3), [req(i, len(p)) for i, p in enumerate(prompts)], None))
    assert firsts[0] == firsts[1]
    seqs = [[*p, t] for p, t in zip(prompts, firsts[0], strict=True)]

    def rows(r: Any) -> list[np.ndarray]:
        return [cupy.asnumpy(cupy.concatenate(r._spec._lane(ln).rows, axis=0)) for ln in lanes]  # noqa: SLF001

    def loop(r: Any, reqs: list[list[SampleRequest]], forced: Any = None) -> list[list[int]]:
        toks: list[list[int]] = [[] for _ in lanes]
        for s in range(k):
            fed = toks if forced is None else [f[:s] for f in forced]
            r.draft([DraftLane(ln, [*q, *t]) for ln, q, t in zip(lanes, seqs, fed, strict=True)])
            for t, x in zip(toks, r.sample(range(3), [q[s] for q in reqs], None), strict=True):
                t.append(max(x, 0))
        return toks

    for rnd in range(2):  # round 1: the head's own drafts; round 2: forced drafts
        reqs = [[draft_request(req(i, len(q) + s)) for s in range(k)] for i, q in enumerate(seqs)]
        forced = [[(7 * i + 3 * s + 1) % 50 for s in range(k)] for i in range(3)] if rnd else None
        got = chain.draft_chain([DraftLane(ln, q) for ln, q in zip(lanes, seqs, strict=True)], reqs, None,
                                forced=forced)  # fmt: skip
        want = loop(steps, reqs, forced)
        assert got == (forced if rnd else want)
        for a, b in zip(rows(chain), rows(steps), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"round {rnd}: draft logits rows, chain vs steps")
        for r in (chain, steps):  # verify [last, drafts] and keep two positions
            r.execute(Batch(work=[LaneWork(ln, len(q) - 1, [q[-1], *d], False, False, None, verify=True)
                                  for ln, q, d in zip(lanes, seqs, got, strict=True)]))  # fmt: skip
            r.verify(
                lanes, got, [[req(i, len(q) + s) for s in range(k + 1)] for i, q in enumerate(seqs)], None
            )
            for ln, q in zip(lanes, seqs, strict=True):
                r.commit(ln, len(q) + 1)
        seqs = [[*q, d[0], 5] for q, d in zip(seqs, got, strict=True)]
    assert chain.spec_graph_captures == captured, "a round captured a graph after capture_spec_graphs"


@gpu
@pytest.mark.parametrize(
    "case", [(2, 6, 64, 96, [1, 5, 0, 3]), (16, 48, 128, 128, [4, 4])], ids=["ragged", "27b"]
)
def test_cuda_gdn_decode_snapshots(case: tuple) -> None:
    """``gdn_decode(snap=...)`` (the verify's rollback): outputs and final states are bitwise those without
    snapshots, and the snapshot before token i of a sequence is bitwise the state (recurrent and conv) that a call
    over its first i tokens leaves."""
    cp = pytest.importorskip("cupy")
    from ninfer.cuda.gdn import gdn_decode

    hk, hv, dk, dv, lens = case
    rng = np.random.default_rng(7)
    n, nseq, c = sum(lens), len(lens), 2 * hk * dk + hv * dv
    base = nseq + 1  # slot 0 unused, sequence s in slot s + 1, snapshots after
    state0 = (rng.standard_normal((base + n, hv, dk, dv)) * 0.1).astype(np.float32)
    conv0 = rng.standard_normal((base + n, c, 3)).astype(np.float32)
    x = {k: rng.standard_normal(s).astype(np.float32) for k, s in
         (("qkv", (n, c)), ("a", (n, hv)), ("b", (n, hv)), ("z", (n, hv * dv)))}  # fmt: skip
    convw, normw = (rng.standard_normal((c, 4)) * 0.5).astype(np.float32), np.ones(dv, np.float32)
    alog, dtb = rng.uniform(-2, 1, hv).astype(np.float32), rng.uniform(-1, 1, hv).astype(np.float32)
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    slots = np.arange(1, base, dtype=np.int32)
    snap = (base + starts[:-1]).astype(np.int32)

    def call(keep: int | None, with_snap: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = [n_ if keep is None else min(n_, keep) for n_ in lens]
        rows = np.concatenate([np.arange(s0, s0 + m) for s0, m in zip(starts, k, strict=False)]).astype(
            np.int64
        )
        st, cv = cp.asarray(state0), cp.asarray(conv0)
        y = gdn_decode(
            cp.asarray(x["qkv"][rows]), cp.asarray(convw), cv, cp.asarray(x["a"][rows]), cp.asarray(x["b"][rows]),
            cp.asarray(alog), cp.asarray(dtb), st, cp.asarray(np.concatenate([[0], np.cumsum(k)]).astype(np.int32)),
            cp.asarray(slots), cp.asarray(x["z"][rows]), cp.asarray(normw), 1e-6, n_k_heads=hk,
            snap=cp.asarray(snap) if with_snap else None,
        )  # fmt: skip
        return cp.asnumpy(y), cp.asnumpy(st), cp.asnumpy(cv)

    y0, st0, cv0 = call(None, False)
    y1, st1, cv1 = call(None, True)
    np.testing.assert_array_equal(y1, y0, err_msg="snapshots change the output")
    np.testing.assert_array_equal(st1[:base], st0[:base], err_msg="snapshots change the state")
    np.testing.assert_array_equal(cv1[:base], cv0[:base], err_msg="snapshots change the conv state")
    for i in range(max(lens)):
        _, sti, cvi = call(i, False) if i else (None, state0, conv0)
        for s in range(nseq):
            if i < lens[s]:
                np.testing.assert_array_equal(
                    st1[snap[s] + i], sti[slots[s]], err_msg=f"seq {s} token {i}: state"
                )
                np.testing.assert_array_equal(
                    cv1[snap[s] + i], cvi[slots[s]], err_msg=f"seq {s} token {i}: conv"
                )
