"""The host tier (docs/tiering.md) on the reference backend: the pure-Python cache logic, then the acceptance
scenario on the demo model (ten interleaved agent sessions, device room for about two histories, host room for
about ten), every output compared with an engine without reuse."""

from __future__ import annotations

import pytest
from engines import agent_opening, agent_tool_result

from ninfer.demo import build_demo
from ninfer.engine import Engine, EngineConfig
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.tiering import TieredCache
from ninfer.model import load

P = 4


# ---- the cache logic without a model ------------------------------------------------------------------------
def _tiered(pages: int = 8, ckpts: int = 4, host_pages: int = 20) -> TieredCache:
    """Checkpoints of 150 bytes, pages of 100: a checkpoint takes two host pages."""
    return TieredCache(PagePool(pages), P, 150, 150 * ckpts, 8, host_pages=host_pages, page_bytes=100)


def _seq(c: TieredCache, tokens: list[int], end: int) -> None:
    """A request that computed ``tokens[:end]``, published a checkpoint there and retired."""
    assert c.evict_pages(-(-end // P))
    lane = c.pool.alloc(-(-end // P))
    c.publish(tokens, end, lane, c.new_checkpoint(True))
    c.pool.decref(lane)


def test_spill_restore_and_host_lru() -> None:
    c = _tiered()
    a, b = list(range(100, 112)), list(range(200, 212))
    _seq(c, a, 12)  # 3 pages
    _seq(c, b, 12)
    assert c.pool.free == 2
    assert c.evict_pages(5)  # a (least recent) goes to the host instead of being dropped
    spills = c.drain()
    assert len(spills) == 1 and len(spills[0].device_pages) == 3 and len(spills[0].host_ckpt) == 2
    c.check()
    m = c.lookup(a + [1], 12)
    assert m is not None and m.host and c.restore_pages(m) == 3
    c.pin(m.node)
    r = c.restore(m)
    c.pin(m.node, -1)
    assert r is not None and r.tokens == 12 and r.bytes == 3 * 100 + 150
    restores = c.drain()
    assert [x.ticket for x in restores] == [r.ticket] and restores[0].host_pages == spills[0].host_pages
    assert c.host_pool.free == 20 - 5  # held until the runner reports the copy done
    c.restored(r.ticket)
    assert c.host_pool.free == 20
    m2 = c.lookup(a + [1], 12)
    assert m2 is not None and not m2.host and m2.ckpt == restores[0].device_ckpt
    c.check()
    # the host tier evicts least recently used nodes: 6 device pages; a sequence takes 3 of them, or 5 host pages
    c2 = _tiered(pages=6, host_pages=10)
    seqs = [[k * 100 + i for i in range(12)] for k in range(1, 6)]
    for s in seqs:
        _seq(c2, s, 12)  # each publish needs 3 pages: the older ones are spilled, then evicted from the host
    c2.check()
    assert c2.num_spills == 3 and c2.host_evictions == 1  # the third spill found two on the host: one left
    assert c2.lookup(seqs[0] + [0], 12) is None  # the oldest is gone
    m3 = c2.lookup(seqs[2] + [0], 12)
    assert m3 is not None and m3.host  # the newest spilled one is on the host


def test_spill_keeps_device_part_closed_upwards() -> None:
    c = _tiered(pages=10)
    base = list(range(50, 58))
    _seq(c, base, 8)  # [0, 8): 2 pages
    _seq(c, base + [1, 2, 3, 4], 12)  # child [8, 12): 1 page
    assert c.evict_pages(10)  # both leave: the child first, then its parent
    c.check()
    assert all(n.on_host for n in c._nodes.values())
    m = c.lookup(base + [1, 2, 3, 4, 9], 12)
    assert m is not None and m.host and c.restore_pages(m) == 3
    c.pin(m.node)
    r = c.restore(m)
    c.pin(m.node, -1)
    assert r is not None and r.tokens == 12
    c.check()


def test_config_host_tier_size() -> None:
    kw = dict(max_context=1024, kv_capacity=1024, page_size=16)
    assert EngineConfig(**kw, host_cache_gib=0).host_tier(100, 150, 10**6) == 0
    assert EngineConfig(**kw).host_tier(100, 150, 128_000) == 1280  # None: the backend's automatic size
    device = 64 * 100 + EngineConfig(**kw).checkpoint_budget(150)  # ... at most 16 times the device pool
    assert EngineConfig(**kw).host_tier(100, 150, 10**9) == 16 * device // 100
    assert EngineConfig(**kw, host_cache_gib=1).host_tier(1 << 20, 150, 0) == 1024
    assert EngineConfig(**kw, prefix_reuse=False).host_tier(100, 150, 128_000) == 0
    assert EngineConfig(**kw).host_tier(100, 150, 200) == 0  # not one checkpoint and one page
    with pytest.raises(ValueError, match="host_cache_gib"):
        EngineConfig(host_cache_gib=-1)


# ---- the acceptance scenario on the demo model -----------------------------------------------------------------
BASE = dict(max_context=256, prefill_chunk=64, checkpoint_stride=1024, page_size=16, max_concurrency=1)
SESSIONS, TURNS, GEN = 10, 3, 8


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    return load(build_demo(tmp_path_factory.mktemp("tier") / "demo.ninfer"))


@pytest.fixture(scope="module")
def oracle(model):  # noqa: ANN001, ANN201 - outputs without reuse, memoized by prompt
    memo: dict[tuple[int, ...], list[int]] = {}
    with Engine.from_model(model, **dict(BASE, kv_capacity=1024, queue_depth=4, prefix_reuse=False)) as eng:

        def run(prompt: list[int]) -> list[int]:
            key = tuple(prompt)
            if key not in memo:
                memo[key] = eng.submit(prompt, max_tokens=GEN, ignore_eos=True).result(timeout=60).token_ids
            return memo[key]

        yield run


def _turn(eng: Engine, oracle, model, ctx: list[int], turn: int):  # noqa: ANN001, ANN202
    """One agent turn: the whole context as the prompt; returns (completion, the next turn's context)."""
    c = eng.submit(ctx, max_tokens=GEN, ignore_eos=True, checkpoint_at=()).result(timeout=60)
    assert c.token_ids == oracle(ctx), "an output differs from the output without reuse"
    return c, ctx + c.token_ids + agent_tool_result(model, turn)


def test_ten_sessions_spill_to_the_host_and_come_back(model, oracle) -> None:  # noqa: ANN001
    histories = [len(agent_opening(model, s)) + TURNS * (GEN + 20) for s in range(SESSIONS)]
    assert max(histories) <= 192
    eng0 = Engine.from_model(model, **dict(BASE, kv_capacity=288), background=False)
    runner = eng0._runner
    snap, page_bytes = runner.snapshot_bytes, runner.page_bytes
    eng0.close()
    # device: pages for about two histories, a few checkpoints; host: about ten histories (the same split)
    dev = dict(BASE, kv_capacity=2 * 192, checkpoint_budget_bytes=6 * snap, queue_depth=2, tier_checksum=True)
    host_bytes = 10 * (14 * page_bytes + 3 * snap)
    eng = Engine.from_model(model, **dev, host_cache_gib=host_bytes / (1 << 30), background=False)
    assert eng._runner.host_pages >= 10 * 14
    ctx = [agent_opening(model, s) for s in range(SESSIONS)]
    last = [0] * SESSIONS  # the previous turn's whole context: its prompt and its output
    restored = 0
    for turn in range(TURNS):
        for s in range(SESSIONS):
            n = len(ctx[s])
            c, ctx[s] = _turn(eng, oracle, model, ctx[s], turn)
            if turn:
                assert c.usage.cached_tokens == last[s], (s, turn, c.usage)
                restored += c.usage.host_cached_tokens > 0
                assert c.usage.host_cached_tokens == c.metrics.host_cached_tokens
                assert (c.metrics.restore_bytes > 0) == (c.usage.host_cached_tokens > 0)
            last[s] = n + GEN
            eng._cache.check()
    st = eng.stats()
    # two of ten sessions fit the device: the others come back from the host every turn
    assert restored >= (TURNS - 1) * (SESSIONS - 3), restored
    assert st.spills > 0 and st.host_restores >= restored and st.restore_bytes > 0
    assert st.host_hit_tokens + st.device_hit_tokens == st.prefix_hit_tokens
    # the host tier full: new sessions push the least recently used histories out of it; coming back newest
    # first, the latest sessions still restore, the oldest lost their prefixes and recompute; the same outputs
    for s in range(SESSIONS, SESSIONS + 6):
        _turn(eng, oracle, model, agent_opening(model, s), 0)
    back = {}
    for s in reversed(range(SESSIONS)):
        c, ctx[s] = _turn(eng, oracle, model, ctx[s], TURNS)
        back[s] = (c.usage.cached_tokens, c.usage.host_cached_tokens)
        eng._cache.check()
    st2 = eng.stats()
    eng.close()
    assert st2.host_evictions > 0
    assert back[SESSIONS - 1][0] == last[SESSIONS - 1] and back[SESSIONS - 1][1] > 0, (
        back
    )  # the newest restores
    assert back[0][0] < 20 and back[0][1] == 0, (
        back
    )  # the oldest recomputes (at most a shared opening is kept)


def test_interleaved_sessions_on_two_lanes(model, oracle) -> None:  # noqa: ANN001
    """Every session's turn submitted at once: restores wait for their copies while the other lane runs, a node
    restored for one request may be spilled again for the next; outputs still equal the outputs without reuse."""
    snap = 58368
    kw = dict(BASE, max_concurrency=2, kv_capacity=2 * 192 + 64, checkpoint_budget_bytes=8 * snap)
    eng = Engine.from_model(
        model, **kw, queue_depth=SESSIONS, tier_checksum=True, host_cache_gib=4e6 / (1 << 30)
    )
    assert eng._runner.snapshot_bytes == snap
    ctx = [agent_opening(model, s) for s in range(SESSIONS)]
    hits = 0
    for turn in range(TURNS):
        handles = [eng.submit(c, max_tokens=GEN, ignore_eos=True, checkpoint_at=()) for c in ctx]
        for s, h in enumerate(handles):
            c = h.result(timeout=120)
            assert c.finish_reason == "output_limit", c.error
            assert c.token_ids == oracle(ctx[s]), (turn, s)
            hits += c.usage.host_cached_tokens > 0
            ctx[s] = (
                ctx[s]
                + c.token_ids
                + model.tokenizer.encode(
                    f"<|im_end|>\n<|im_start|>user\nresult {turn}<|im_end|>\n<|im_start|>assistant\n"
                )
            )
        eng._cache.check()
        assert not eng._sched._restoring and not eng._sched._held  # every hold released
    st = eng.stats()
    eng.close()
    assert hits >= SESSIONS and st.host_restores >= hits and st.spills > 0


def test_cancel_while_restoring_keeps_the_restored_prefix(model, oracle) -> None:  # noqa: ANN001
    kw = dict(BASE, kv_capacity=2 * 192, checkpoint_budget_bytes=6 * 58368, queue_depth=2, tier_checksum=True)
    eng = Engine.from_model(model, **kw, host_cache_gib=4e6 / (1 << 30), background=False)
    ctx = agent_opening(model, 0)
    _, nxt = _turn(eng, oracle, model, ctx, 0)
    for s in (1, 2, 3):  # push session 0 to the host
        _turn(eng, oracle, model, agent_opening(model, s), 0)
    h = eng.submit(nxt, max_tokens=GEN, ignore_eos=True, checkpoint_at=())
    assert eng._sched.restoring
    h.cancel()
    assert h.result().finish_reason == "cancelled"
    assert not eng._sched.restoring and not eng._sched._held
    eng._cache.check()
    again = eng.submit(nxt, max_tokens=GEN, ignore_eos=True, checkpoint_at=()).result()
    assert again.token_ids == oracle(nxt)
    assert (
        again.usage.cached_tokens == len(ctx) + GEN and again.usage.host_cached_tokens == 0
    )  # restored before
    eng.close()
