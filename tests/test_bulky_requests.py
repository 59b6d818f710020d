"""Requests too large for the actor's event loop (actors/prepare.py, the chunked wire form of actors/messages.py):
the wire form round-trips, a large argument is decoded, rendered and freed on the prompt pool, and its answers are
those of the usual path (in-process actor, no Ray; the stall itself is measured live in
tests/test_client_audit_live.py)."""

from __future__ import annotations

import asyncio
import gc

import msgspec
import pytest
from conftest import make_actor
from ninfer.actors import prepare
from ninfer.actors.engine_actor import EngineActor
from ninfer.actors.messages import (
    WIRE_CHUNK,
    Accepted,
    Failed,
    Finish,
    GenerateRequest,
    GrammarSpec,
    bulky,
    decode_batch,
    decode_events,
    decode_opened,
    decode_requests,
    encode_requests,
    release,
)
from test_actor import USER, req

MANY = tuple(
    {"role": "user", "content": [{"type": "text", "text": f"m{i}"}]} for i in range(3 * WIRE_CHUNK + 5)
)


def test_a_bulky_request_crosses_in_chunks_and_comes_back_equal() -> None:
    tools = tuple({"type": "function", "function": {"name": f"t{i}"}} for i in range(WIRE_CHUNK + 1))
    chat = GenerateRequest(request_id="c", messages=MANY, tools=tools, template_kwargs={"x": [1, 2]})
    ids = GenerateRequest(request_id="i", prompt_ids=tuple(range(2 * WIRE_CHUNK + 1)))
    small = req("s")
    assert bulky(chat) and bulky(ids) and not bulky(small)
    keep: list[list[object]] = []
    assert decode_requests(encode_requests([small, chat, ids]), keep) == [small, chat, ids]
    assert len(keep) == 4 + 2 + 3  # the chunks of each bulky sequence, to be freed in steps
    release(keep)
    assert keep == []
    # a request that is not bulky crosses as it always did: the Struct itself
    assert encode_requests([small]) == msgspec.msgpack.encode([small])
    bad = msgspec.msgpack.encode([(small, [b"\xc1"], None, None)])  # a chunk that is not msgpack
    with pytest.raises(msgspec.DecodeError):
        decode_requests(bad)


def test_the_collector_pause_nests_and_ends() -> None:
    assert gc.isenabled()
    from ninfer.gc_pause import gc_paused

    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def _opened(a: EngineActor, reqs: list[GenerateRequest], sub: str) -> list[list[object]]:
    """Open ``reqs`` in one call and read the subscription until every accepted one has finished."""

    async def scenario() -> list[list[object]]:
        events = a.subscribe(sub)
        got = decode_opened(await a.open(encode_requests(reqs), sub))
        left = {r.request_id for r, g in zip(reqs, got, strict=True) if isinstance(g[0], Accepted)}
        async for item in events:
            left -= {rid for rid, evs in decode_batch(item) if any(isinstance(e, Finish) for e in evs)}
            if not left:
                break
        await events.aclose()
        return got

    return asyncio.run(scenario())


def test_the_large_path_admits_and_refuses_as_the_usual_one(
    actor: EngineActor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every argument taken as large, requests are prepared on the pool and answer as they always do: accepted
    ones run to their end, a bad prompt and a grammar refusal are the usual 400s, a duplicate id is refused."""
    monkeypatch.setattr(prepare, "LARGE_REQUEST_BYTES", 0)
    bad_schema = GrammarSpec(kind="json_schema", schema='{"type": "nonsense"}')
    reqs = [req("a", 4), req("b", 4, messages=()), req("c", 4, grammar=bad_schema), req("a", 4)]
    got = _opened(actor, reqs, "s-large")
    assert isinstance(got[0][0], Accepted)
    assert [g[0].status for g in got[1:]] == [400, 400, 400]  # type: ignore[attr-defined]
    assert got[3][0].code == "duplicate_request_id"  # type: ignore[attr-defined]

    async def one() -> list[object]:
        return [
            e
            for raw in [x async for x in actor.generate(encode_requests([req("g", 3)]))]
            for e in decode_events(raw)
        ]

    evs = asyncio.run(one())
    assert isinstance(evs[0], Accepted) and isinstance(evs[-1], Finish)
    assert asyncio.run(actor.count_tokens(encode_requests([req("n")]))) == asyncio.run(
        actor.count_tokens(req("n"))
    )
    assert asyncio.run(actor.stats()).open_streams == 0


def test_a_bug_while_preparing_a_large_request_is_its_own_500(
    actor: EngineActor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prepare, "LARGE_REQUEST_BYTES", 0)
    real = prepare.adapter.prompt_ids

    def broken(ld: object, r: GenerateRequest) -> list[int]:
        if r.request_id == "bug":
            raise RuntimeError("boom")
        return real(ld, r)  # type: ignore[arg-type]

    monkeypatch.setattr(prepare.adapter, "prompt_ids", broken)
    got = _opened(actor, [req("bug", 2), req("fine", 2)], "s-bug")
    assert got[0][0] == Failed(code="internal_error", message="internal error: RuntimeError", status=500)
    assert isinstance(got[1][0], Accepted)
    assert asyncio.run(actor.stats()).internal_errors == 1


def test_a_huge_request_is_refused_for_its_size_by_every_method(actor: EngineActor) -> None:
    """Half a million messages (12 MB of msgpack, far over the 1 MiB bound): the usual context_length_exceeded from
    open, generate and count_tokens alike, counted only up to the context's bound in characters."""
    huge = req("huge", 2, messages=USER * 500_000)
    raw = encode_requests([huge])
    assert isinstance(raw, bytes) and prepare.is_large(raw)
    opened = decode_opened(asyncio.run(actor.open(raw, "s-huge")))
    assert opened[0][0].code == "context_length_exceeded"  # type: ignore[attr-defined]

    async def streamed() -> list[object]:
        return [e for item in [x async for x in actor.generate(raw)] for e in decode_events(item)]

    (failed,) = asyncio.run(streamed())
    assert isinstance(failed, Failed) and failed.code == "context_length_exceeded" and failed.status == 400
    counted = asyncio.run(actor.count_tokens(raw))
    assert isinstance(counted, Failed) and counted.code == "context_length_exceeded"
    assert "at least" in counted.message and "context is 512 tokens" in counted.message


def test_a_malformed_argument_is_refused_whole(actor: EngineActor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepare, "LARGE_REQUEST_BYTES", 0)
    bad = decode_opened(asyncio.run(actor.open(b"\x93not a request list", "s-bad")))
    assert isinstance(bad[0][0], Failed) and bad[0][0].code == "invalid_request"
    two = encode_requests([req("x"), req("y")])
    counted = asyncio.run(actor.count_tokens(two))
    assert isinstance(counted, Failed) and counted.code == "invalid_request"


@pytest.mark.parametrize("large", [False, True])
def test_a_bulky_request_that_fits_runs_to_its_end(
    artifact: str, monkeypatch: pytest.MonkeyPatch, large: bool
) -> None:
    """More prompt ids than one wire chunk, beside a small request in the same call: both accepted, both finish,
    whether the call is decoded on the loop or (``large``) on the prompt pool."""
    if large:
        monkeypatch.setattr(prepare, "LARGE_REQUEST_BYTES", 0)
    a = make_actor(artifact, max_context=8192, kv_capacity=16384)
    try:
        ids = tuple(i % 200 + 10 for i in range(WIRE_CHUNK + 100))
        long = GenerateRequest(request_id="long", prompt_ids=ids, sampling=req("x", 2).sampling)
        assert bulky(long)
        got = _opened(a, [long, req("short", 2)], f"s-fits-{large}")
        assert [type(g[0]) for g in got] == [Accepted, Accepted]
        assert got[0][0].prompt_tokens == len(ids)  # type: ignore[attr-defined]
    finally:
        asyncio.run(a.shutdown())
