"""The replica router without Ray: the engine's prefix digest, the routing policy, and ReplicaRouter over fake
replicas (failover on 429 and on a dead replica, 429 only when every replica is full, mid-stream death)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import finish_event
from ninfer.actors.messages import ActorStats, Failed, GenerateRequest, Health
from ninfer.actors.router import ReplicaRouter
from ninfer.actors.routing import ReplicaView, RouterConfig, RouteState, merge_stats, rank

from ninfer.engine.core import Accepted, TokenDelta
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.prefix_cache import PrefixCache
from ninfer.engine.prefix_digest import PrefixDigest, chain_hashes

B = 4


def _cache() -> PrefixCache:
    return PrefixCache(PagePool(256), 4, 10, 10_000, 4)


def _publish(cache: PrefixCache, tokens: list[int], pos: int) -> None:
    pages = cache.pool.alloc(-(-len(tokens) // 4))
    cid = cache.new_checkpoint(True)
    assert cid is not None
    cache.publish(tokens, pos, pages, cid)


def test_digest_reports_the_block_before_every_checkpoint_and_only_changes_with_the_tree() -> None:
    cache, d = _cache(), PrefixDigest(B)
    assert d.update(cache.root) == (0, ())
    a = list(range(1, 23))  # 22 tokens
    _publish(cache, a, 22)
    v1, h1 = d.update(cache.root)
    assert set(h1) == {chain_hashes(a, B)[-1]}  # block 5 ends at 20 <= 22
    assert d.update(cache.root) == (v1, h1)  # unchanged tree: same version
    b = a[:10] + [99] * 9  # splits a's node at 10; the checkpoint at 19 anchors block 4 (ends at 16)
    _publish(cache, b, 19)
    _publish(cache, a, 13)  # a checkpoint inside a's path: block 3
    v2, h2 = d.update(cache.root)
    assert v2 > v1
    assert set(h2) == {chain_hashes(a, B)[-1], chain_hashes(b, B)[3], chain_hashes(a, B)[2]}
    cache.check()


def test_a_prompt_matches_to_the_deepest_resume_point() -> None:
    view = ReplicaView(index=0, name="0", client=None, capacity=4, lanes=2)
    prompt = chain_hashes(list(range(40)), B)
    view.hashes = frozenset({prompt[2], prompt[6]})
    assert view.matched(prompt, 0.0) == 7
    assert view.matched(prompt[:6], 0.0) == 3
    assert view.matched(chain_hashes([7] * 40, B), 0.0) == 0
    view.remember(prompt[:9], ttl=5.0, now=0.0)  # a routed prompt's end counts until it expires
    assert view.matched(prompt, 1.0) == 9 and view.matched(prompt, 6.0) == 7


def _views(n: int, lanes: int = 2, depth: int = 2) -> list[ReplicaView]:
    return [
        ReplicaView(index=i, name=str(i), client=None, capacity=lanes + depth, lanes=lanes) for i in range(n)
    ]


def test_rank_affinity_least_loaded_full_and_busy() -> None:
    cfg, vs = RouterConfig(block_tokens=B), _views(3)
    blocks = chain_hashes(list(range(32)), B)
    vs[1].hashes = frozenset({blocks[5]})
    r = rank(vs, blocks, cfg)
    assert (r.order[0].index, r.reason, r.matched_blocks) == (1, "affinity", 6)
    vs[1].inflight = 2  # its lanes are busy while others have free lanes: do not make the request wait
    r = rank(vs, blocks, cfg)
    assert r.reason == "imbalance" and r.order[0].index != 1 and r.order[-1].index == 1
    vs[0].inflight = vs[2].inflight = 3  # nobody has a free lane: the prefix wins
    assert rank(vs, blocks, cfg).order[0].index == 1
    vs[1].inflight = 4  # full: elsewhere, full ones last
    r = rank(vs, blocks, cfg)
    assert r.reason == "full" and r.order[-1].index == 1
    # no prefix anywhere: least loaded, then the fewest routed (sequential sessions spread)
    fresh = _views(3)
    fresh[0].routed, fresh[1].routed = 2, 1
    assert [v.index for v in rank(fresh, chain_hashes([5] * 8, B), cfg).order] == [2, 1, 0]
    fresh[2].down()
    assert [v.index for v in rank(fresh, [], cfg).order] == [1, 0]
    assert rank([], [], cfg).order == []


def test_a_next_turn_sent_at_once_finds_its_replica_before_the_next_poll() -> None:
    """The last poll saw a session's request running on its one-lane replica; the request ended since. Its next
    turn, sent at once, goes back there (the poll's count of it is retired), not to an idle replica."""
    cfg = RouterConfig(block_tokens=B)
    vs = [ReplicaView(index=i, name=str(i), client=None, capacity=2, lanes=1) for i in range(3)]
    blocks = chain_hashes(list(range(32)), B)
    vs[1].remember(blocks[:6], 30.0, now=10.0)  # turn 1 was routed there at t = 10
    vs[1].polled_load, vs[1].poll_sent, vs[1].poll_done = 1, 10.2, 10.21  # a poll while it ran
    assert rank(vs, blocks, cfg, now=10.5).reason == "imbalance"  # without the retirement: sent elsewhere
    vs[1].retired(admitted=10.0, now=10.5)
    r = rank(vs, blocks, cfg, now=10.5)
    assert (r.order[0].index, r.reason) == (1, "affinity") and vs[1].polled_load == 0
    vs[1].retired(admitted=10.0, now=10.6)
    assert vs[1].polled_load == 0  # never below zero
    # a request the poll never saw running (accepted after it was asked, or ended before its answer) is not
    # retired from it
    vs[2].polled_load, vs[2].poll_sent, vs[2].poll_done = 1, 10.2, 10.21
    vs[2].retired(admitted=10.3, now=10.5)
    vs[2].retired(admitted=10.0, now=10.205)
    assert vs[2].polled_load == 1


def test_a_request_that_ends_while_a_poll_is_in_flight_is_not_counted_by_it() -> None:
    """A poll asked while a session's request ran on its one-lane replica, answered after the request ended (its
    count may include it, and the retirement compared it with the poll before): the polled load leaves it out, so
    the next turn, sent at once, goes back there. A request that ended before the poll was asked, or is still
    running, is not taken off."""
    cfg = RouterConfig(block_tokens=B)
    vs = [ReplicaView(index=i, name=str(i), client=None, capacity=2, lanes=1, epoch="e") for i in range(2)]
    blocks = chain_hashes(list(range(32)), B)
    vs[1].remember(blocks[:6], 30.0, now=10.0)
    vs[1].poll_sent, vs[1].poll_done = 9.7, 9.71  # the previous poll, before the request
    vs[1].retired(admitted=10.0, now=10.3)  # ended while the next poll (asked at 10.2) was in flight
    busy = RouteState(
        epoch="e", version=1, hashes=None, lanes_total=1, lanes_busy=1, queue_len=0, queue_depth=1
    )
    vs[1].apply(busy, sent=10.2)
    assert vs[1].polled_load == 0 and rank(vs, blocks, cfg, now=10.45).reason == "affinity"
    vs[1].apply(busy, sent=10.7)  # a later poll that counts one: someone else's request (this one is gone)
    assert vs[1].polled_load == 1 and vs[1].ended == []
    vs[0].retired(admitted=9.0, now=9.5)  # ended before the poll was asked: not in its count
    vs[0].apply(busy, sent=10.2)
    assert vs[0].polled_load == 1


def test_the_router_retires_a_request_before_handing_on_its_last_event() -> None:
    """The caller answers its client with the terminal event; the client's next turn may reach the router before
    the stream is resumed or closed, and must not find its replica's lane still taken by the turn before."""
    router = _router([FakeReplica("a")])

    async def go() -> None:
        gen = router.generate(GenerateRequest(request_id="r5", prompt_ids=(1,)))
        async for ev in gen:
            if isinstance(ev, Failed) or getattr(ev, "reason", None) is not None:
                assert router.views[0].inflight == 0 and "r5" not in router._where
                break
            assert router.views[0].inflight == 1
        await gen.aclose()
        await router.close()

    asyncio.run(go())
    assert router.views[0].inflight == 0


def test_route_state_restart_forgets_prefixes_and_config_is_validated() -> None:
    v = _views(1)[0]
    st = RouteState(
        epoch="a", version=3, hashes=(1, 2), lanes_total=4, lanes_busy=1, queue_len=2, queue_depth=8
    )
    assert v.apply(st) is False and v.hashes == {1, 2} and (v.capacity, v.lanes, v.load) == (12, 4, 3)
    assert v.apply(RouteState(**{**_asdict(st), "hashes": None})) is False and v.hashes == {1, 2}
    assert v.apply(RouteState(**{**_asdict(st), "epoch": "b", "hashes": None})) is True
    assert v.hashes == frozenset() and v.restarts == 1 and v.version == -1
    assert v.down() is True and v.down() is False and not v.up
    for bad in ({"block_tokens": 0}, {"max_imbalance": 0}, {"poll_interval_s": 0}):
        with pytest.raises(ValueError):
            RouterConfig(**bad)


def _asdict(st: RouteState) -> dict[str, Any]:
    import msgspec

    return msgspec.structs.asdict(st)


def test_merge_stats_sums_replicas() -> None:
    a = ActorStats(lanes_total=4, lanes_busy=1, queue_len=0, queue_depth=8, open_streams=1, engine_failures=0,
                   uptime_s=3.0, engine={"page_size": 16.0, "decode_tokens": 5.0})  # fmt: skip
    m = merge_stats([a, a])
    assert (m.lanes_total, m.queue_depth, m.uptime_s) == (8, 16, 3.0)
    assert m.engine == {"page_size": 16.0, "decode_tokens": 10.0}


class FakeReplica:
    """An AsyncEngineClient stand-in: answers 429 when ``full``, dies (503) when ``dead``."""

    def __init__(self, name: str, *, full: bool = False, dead: bool = False, die_mid: bool = False) -> None:
        self.name, self.full, self.dead, self.die_mid = name, full, dead, die_mid
        self.calls: list[str] = []
        self.cancelled: list[str] = []

    async def generate(self, req: GenerateRequest) -> AsyncIterator[Any]:
        self.calls.append(req.request_id)
        if self.dead:
            yield Failed(code="engine_unavailable", message="gone", status=503)
            return
        if self.full:
            yield Failed(code="queue_full", message="full", status=429, retry_after=1.0)
            return
        await asyncio.sleep(0.01)  # the engine takes a moment to accept
        yield Accepted(0, 3, 8, False)
        yield TokenDelta(0, [1, 2], self.name)
        if self.die_mid:
            self.dead = True
            yield Failed(code="engine_unavailable", message="the engine actor failed", status=503)
            return
        yield finish_event("length", 3, 0, 2)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    async def route_state(self, block_tokens: int, since: int) -> RouteState:
        if self.dead:
            raise RuntimeError("actor died")
        return RouteState(epoch=self.name, version=1, hashes=(), lanes_total=2, lanes_busy=0, queue_len=0,
                          queue_depth=2)  # fmt: skip

    async def health(self) -> Health:
        return Health(ok=True)


class NoKey:
    def __call__(self, req: GenerateRequest) -> list[int]:
        return []

    def size(self, req: GenerateRequest) -> int:
        return 0


def _router(reps: list[FakeReplica]) -> ReplicaRouter:
    return ReplicaRouter(reps, [(2, 2)] * len(reps), RouterConfig(block_tokens=B), NoKey())


def _run(router: ReplicaRouter, rid: str = "r1") -> list[Any]:
    async def go() -> list[Any]:
        req = GenerateRequest(request_id=rid, prompt_ids=(1, 2, 3))
        out = [ev async for ev in router.generate(req)]
        for t in router._pollers:  # the next asyncio.run starts others
            t.cancel()
        return out

    return asyncio.run(go())


def test_the_router_keys_only_small_prompts_on_its_event_loop() -> None:
    """Many messages without text (a million empty ones have no characters to count) are keyed on the router's
    thread, as long prompts are; a short chat is keyed on the loop itself."""
    import threading

    seen: list[bool] = []

    class Where(NoKey):
        def __call__(self, req: GenerateRequest) -> list[int]:
            seen.append(threading.current_thread() is threading.main_thread())
            return []

    router = ReplicaRouter([FakeReplica("a")], [(2, 2)], RouterConfig(block_tokens=B), Where())

    async def go(n: int) -> None:
        req = GenerateRequest(request_id=f"m{n}", messages=({"role": "user", "content": ""},) * n)
        [ev async for ev in router.generate(req)]
        for t in router._pollers:
            t.cancel()

    asyncio.run(go(1))
    asyncio.run(go(1000))
    assert seen == [True, False]


def test_router_fails_over_on_429_and_dead_replicas() -> None:
    reps = [FakeReplica("a", full=True), FakeReplica("b", dead=True), FakeReplica("c")]
    router = _router(reps)
    evs = _run(router)
    assert isinstance(evs[0], Accepted) and evs[-1].reason == "length"
    assert all(r.calls == ["r1"] for r in reps)
    c = router.counters
    assert (c.fallback_full + c.fallback_unavailable, c.replica_failures) == (1, 1)
    assert not router.views[1].up and router.views[2].routed == 1


def test_router_answers_429_only_when_every_replica_is_full_and_503_when_none_is_up() -> None:
    router = _router([FakeReplica("a", full=True), FakeReplica("b", full=True)])
    (ev,) = _run(router)
    assert isinstance(ev, Failed) and ev.status == 429 and router.counters.rejected_all_full == 1
    router = _router([FakeReplica("a", dead=True)])
    (ev,) = _run(router)
    assert isinstance(ev, Failed) and ev.status == 503
    (ev,) = _run(router, "r2")  # the dead one is out of rotation now
    assert ev.code == "no_replica" and router.counters.no_replica == 2


def test_a_replica_dying_mid_stream_ends_its_stream_and_leaves_the_rotation() -> None:
    reps = [FakeReplica("a", die_mid=True)]
    router = _router(reps)
    evs = _run(router)
    assert isinstance(evs[-1], Failed) and evs[-1].status == 503
    assert not router.views[0].up and reps[0].cancelled == []  # it ended: nothing to cancel


def test_a_consumer_that_stops_early_cancels_on_its_replica() -> None:
    reps = [FakeReplica("a")]
    router = _router(reps)

    async def go() -> None:
        gen = router.generate(GenerateRequest(request_id="r9", prompt_ids=(1,)))
        assert isinstance(await anext(gen), Accepted)
        assert router.views[0].inflight == 1
        await gen.aclose()
        await router.close()

    asyncio.run(go())
    assert reps[0].cancelled == ["r9"] and router.views[0].inflight == 0


def test_a_burst_ranked_before_any_acceptance_spreads() -> None:
    reps = [FakeReplica("a"), FakeReplica("b"), FakeReplica("c")]
    router = _router(reps)

    async def go() -> None:
        async def collect(i: int) -> list[Any]:
            return [ev async for ev in router.generate(GenerateRequest(request_id=f"r{i}", prompt_ids=(1,)))]

        await asyncio.gather(*(collect(i) for i in range(6)))
        await router.close()

    asyncio.run(go())
    assert [len(r.calls) for r in reps] == [2, 2, 2]
