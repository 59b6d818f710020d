"""The host tier (docs/tiering.md) together with MTP speculative decoding (docs/speculative.md) on the reference
backend: the MTP head's KV plane travels with the pages it spills and restores, verify rounds run on lanes while
other requests wait for their restores, and every output equals the output without reuse and without drafts."""

from __future__ import annotations

import pytest
from engines import agent_opening, agent_tool_result, engine_over

from ninfer.demo import build_demo
from ninfer.engine import Engine, EngineConfig
from ninfer.engine.scripted_draft import ScriptedDrafts, replay_script
from ninfer.model import load

BASE = dict(max_context=256, prefill_chunk=64, checkpoint_stride=1024, page_size=16)
SESSIONS, TURNS, GEN = 6, 3, 8
SNAP = 58368  # the demo model's GDN checkpoint (fp32 state)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    return load(build_demo(tmp_path_factory.mktemp("tier-spec") / "demo.ninfer"))


def _engine(model, runner_wrap=None, **kw) -> Engine:  # noqa: ANN001
    return engine_over(model, EngineConfig(**{**BASE, **kw}), runner_wrap)


def test_host_tier_page_holds_the_mtp_plane(model) -> None:  # noqa: ANN001
    plain = model.runner(EngineConfig(**BASE, kv_capacity=256, host_cache_gib=1e-3))
    spec = model.runner(EngineConfig(**BASE, kv_capacity=256, host_cache_gib=1e-3, spec="mtp"))
    n_attn = len(model.config.full_attention_layers)
    assert spec.page_bytes == plain.page_bytes * (n_attn + 1) // n_attn
    assert spec.host_store is not None and len(spec.host_store.k) == len(spec.store.k) == n_attn + 1


def test_sessions_restore_from_the_host_while_lanes_speculate(model) -> None:  # noqa: ANN001
    oracle = _engine(model, kv_capacity=1024, queue_depth=SESSIONS, prefix_reuse=False, max_concurrency=2)
    tier = dict(
        max_concurrency=2,
        kv_capacity=2 * 192 + 64,
        checkpoint_budget_bytes=8 * SNAP,
        queue_depth=SESSIONS,
        tier_checksum=True,
        host_cache_gib=4e6 / (1 << 30),
        spec="mtp",
        draft_tokens=3,
    )
    wrap = lambda r: ScriptedDrafts(r, lambda tokens: None)  # noqa: E731 - the script is set per turn
    eng = _engine(model, wrap, **tier)
    ctx = [agent_opening(model, s) for s in range(SESSIONS)]
    hits = 0
    with oracle, eng:
        for turn in range(TURNS):
            want = [oracle.submit(c, max_tokens=GEN, ignore_eos=True).result(timeout=120) for c in ctx]
            refs = {tuple(c): c + w.token_ids for c, w in zip(ctx, want, strict=True)}
            eng._runner.script = replay_script(refs, 80, model.config.vocab_size)  # forced acceptance: 80%
            handles = [eng.submit(c, max_tokens=GEN, ignore_eos=True, checkpoint_at=()) for c in ctx]
            for s, h in enumerate(handles):
                c = h.result(timeout=120)
                assert c.finish_reason == "output_limit", c.error
                assert c.token_ids == want[s].token_ids, (turn, s)
                assert c.usage.speculative is not None
                hits += c.usage.host_cached_tokens > 0
                ctx[s] = ctx[s] + c.token_ids + agent_tool_result(model, turn)
            eng._cache.check()
            assert not eng._sched._restoring and not eng._sched._held
        st = eng.stats()
    assert hits >= SESSIONS and st.host_restores >= hits and st.spills > 0
    assert st.spec_rounds > 0 and st.spec_accepted > 0
