"""A cancel that reaches the actor before the request it names is registered with the engine ("cancel before
open"): while a large request is prepared on the prompt pool, or before Ray ran the ``open`` or ``generate`` call at
all (the cancel goes on the control group's thread, the open on the generation loop: Ray keeps no order between
them). The request must then end at once as cancelled, never taking a lane; a request in the same call that was
not cancelled runs as usual; an id whose request ended is free again. In-process actor (no Ray), demo model.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from conftest import make_actor
from ninfer.actors import prepare
from ninfer.actors.engine_actor import EngineActor
from ninfer.actors.messages import (
    Accepted,
    Finish,
    TokenDelta,
    decode_batch,
    decode_events,
    decode_opened,
    encode_requests,
)
from test_actor import collect, req


class _Gate:
    """Holds ``prepare.ready_all`` (the large path, on the prompt pool) until ``release``: the window in which the
    request is accepted by the actor but not yet registered with the engine."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        real = prepare.ready_all

        def held(ld: Any, raw: bytes) -> Any:
            self.entered.set()
            assert self.released.wait(30)
            return real(ld, raw)

        monkeypatch.setattr(prepare, "LARGE_REQUEST_BYTES", 0)
        monkeypatch.setattr(prepare, "ready_all", held)

    async def reached(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 30)

    def release(self) -> None:
        self.released.set()


def _decoded(a: EngineActor) -> float:
    return a._engine.engine.stats().decode_tokens


def _cancelled_at_once(evs: list[Any]) -> None:
    """The protocol's cancelled end, without a lane: ``Accepted`` then ``Finish(cancelled)``, nothing generated."""
    assert [type(e) for e in evs] == [Accepted, Finish], evs
    fin = evs[-1]
    assert fin.reason == "cancelled" and fin.usage.completion_tokens == 0 and fin.metrics.lane == -1
    assert evs[0].prompt_tokens == fin.usage.prompt_tokens > 0


def test_a_job_cancels_a_large_request_while_it_is_prepared(
    actor: EngineActor, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _Gate(monkeypatch)
    before = _decoded(actor)

    async def scenario() -> tuple[bool, list[Any]]:
        task = asyncio.ensure_future(collect(actor, encode_requests([req("job", 200)])))  # type: ignore[arg-type]
        await gate.reached()
        known = await actor.cancel("job")  # EngineClient.cancel("job") from the job's other thread
        gate.release()
        return known, await task

    known, evs = asyncio.run(scenario())
    assert known is False  # nothing ran under that id yet: the cancel is remembered
    _cancelled_at_once(evs)
    assert _decoded(actor) == before
    st = asyncio.run(actor.stats())
    assert (st.open_streams, st.cancelled_before_start) == (0, 1)


def test_an_api_open_of_a_large_call_ends_only_the_cancelled_request(
    actor: EngineActor, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _Gate(monkeypatch)

    async def scenario() -> tuple[list[list[Any]], list[Any]]:
        events = actor.subscribe("s-large")
        opening = asyncio.ensure_future(
            actor.open(encode_requests([req("gone", 200), req("stays", 6)]), "s-large")
        )
        await gate.reached()
        await actor.cancel("gone")  # the HTTP client went away while its request was prepared
        gate.release()
        answers = decode_opened(await opening)
        streamed: list[Any] = []
        async for item in events:
            streamed += [(rid, e) for rid, evs in decode_batch(item) for e in evs]
            if any(rid == "stays" and isinstance(e, Finish) for rid, e in streamed):
                break
        await events.aclose()
        return answers, streamed

    answers, streamed = asyncio.run(scenario())
    _cancelled_at_once(answers[0])
    assert [type(e) for e in answers[1]] == [Accepted]
    assert all(rid == "stays" for rid, _ in streamed)  # nothing of "gone" runs or streams
    assert sum(len(e.token_ids) for _, e in streamed if isinstance(e, TokenDelta)) == 6
    assert asyncio.run(actor.stats()).lanes_busy == 0


@pytest.mark.parametrize("method", ["generate", "open"])
def test_a_cancel_that_overtakes_a_small_open(actor: EngineActor, method: str) -> None:
    """Ray runs the cancel (control group) before the open it followed (generation loop)."""
    before = _decoded(actor)

    async def scenario() -> list[Any]:
        assert await actor.cancel("small") is False
        if method == "generate":
            return await collect(actor, req("small", 200))
        return decode_opened(await actor.open(encode_requests([req("small", 200)]), "s-small"))[0]

    _cancelled_at_once(asyncio.run(scenario()))
    assert _decoded(actor) == before


def test_the_api_client_left_before_ray_ran_its_open(actor: EngineActor) -> None:
    """``AsyncEngineClient``: the consumer leaves while its open is on its way; its fire-and-forget cancel runs
    first (Ray delivers the open late: emulated by holding it 50 ms). The request must not run."""
    from ninfer.actors.client import AsyncEngineClient
    from ninfer.perf.request_path import _Remote

    class LateOpen(_Remote):
        def __getattr__(self, name: str) -> Any:
            method = super().__getattr__(name)
            if name != "open":
                return method

            async def late(raw: Any, sub: str) -> bytes:
                await asyncio.sleep(0.05)
                return await method.remote(raw, sub)

            return type(method)(remote=lambda raw, sub: asyncio.ensure_future(late(raw, sub)))

    client = AsyncEngineClient(LateOpen(actor))
    before = _decoded(actor)

    async def scenario() -> None:
        first = asyncio.ensure_future(anext(client.generate(req("left", 200))))
        await asyncio.sleep(0.01)  # the open is sent; its answer is awaited
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        ok = [e async for e in client.generate(req("next", 4))]  # the stream serves the next request
        assert isinstance(ok[-1], Finish) and ok[-1].reason == "output_limit"
        await asyncio.sleep(0.3)

    asyncio.run(scenario())
    assert _decoded(actor) - before == 4  # only "next" generated
    assert asyncio.run(actor.stats()).lanes_busy == 0


def test_a_queued_request_is_cancelled_before_it_takes_a_lane(artifact: str) -> None:
    """The FIFO admission queue: the request is registered at once, so its cancel finds it."""
    a = make_actor(artifact, max_concurrency=1, queue_depth=1)

    async def scenario() -> list[Any]:
        running = a.generate(req("running", 400))
        assert isinstance(decode_events(await anext(running))[0], Accepted)
        queued = a.generate(req("queued", 50))
        first = decode_events(await anext(queued))
        assert isinstance(first[0], Accepted) and first[0].queued
        assert await a.cancel("queued") is True
        rest = [e async for raw in queued for e in decode_events(raw)]
        assert await a.cancel("running") is True
        await running.aclose()
        return first + rest

    try:
        evs = asyncio.run(scenario())
        fin = evs[-1]
        assert isinstance(fin, Finish) and fin.reason == "cancelled" and fin.metrics.lane == -1
        assert fin.usage.completion_tokens == 0
    finally:
        asyncio.run(a.shutdown())


def test_an_id_is_free_again_once_its_request_ended(actor: EngineActor) -> None:
    """A late cancel of a request that ended is not remembered against the next request under its id; a cancel
    remembered before an open ends that one open only."""

    async def scenario() -> list[list[Any]]:
        done = await collect(actor, req("mine", 2))
        assert await actor.cancel("mine") is False  # over: nothing to cancel, nothing remembered
        again = await collect(actor, req("mine", 2))
        await actor.cancel("early")
        first = await collect(actor, req("early", 2))
        second = await collect(actor, req("early", 2))
        return [done, again, first, second]

    done, again, first, second = asyncio.run(scenario())
    for evs in (done, again, second):
        assert isinstance(evs[-1], Finish) and evs[-1].reason == "output_limit"
    _cancelled_at_once(first)


def test_remembered_cancels_expire_and_are_bounded() -> None:
    from ninfer.actors.cancels import CancelBook

    now = [0.0]
    book = CancelBook(ttl_s=10.0, limit=3, clock=lambda: now[0])
    assert book.remember("a") and book.remember("b")
    now[0] = 11.0
    assert not book.cancelled("a")  # expired: the open under "a" runs
    for rid in ("c", "d", "e", "f"):
        book.remember(rid)
    assert book.waiting == 3 and not book.cancelled("c")  # the oldest went first; memory stays bounded
    assert book.cancelled("f") and not book.cancelled("f") and book.applied == 1  # one open only
    book.ended("g")
    assert not book.remember("g") and not book.remember("g")  # late cancels of an ended request
    assert not book.cancelled("g")
    now[0] = 30.0
    assert book.remember("g")  # ended long ago: a cancel of "g" now waits for a new open
