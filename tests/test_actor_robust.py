"""The engine actor under bad or heavy input, in-process (no Ray): long prompts are prepared off its event loop,
bad template variables and its own bugs are answered (400 / 500) instead of escaping, and an artifact of an
unregistered shape needs ``allow_unregistered_shape``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from ninfer.actors import _engine_adapter as adapter
from ninfer.actors.engine_actor import EngineActor
from ninfer.actors.messages import (
    Accepted,
    ActorSpec,
    Failed,
    Finish,
    GenerateRequest,
    SamplingOptions,
    decode_events,
)

from ninfer.engine import EngineConfig


@pytest.fixture(scope="module")
def actor(artifact: str) -> Iterator[EngineActor]:
    engine = EngineConfig(max_concurrency=2, queue_depth=2, max_context=32768, kv_capacity=32768)
    a = EngineActor(ActorSpec(artifact=artifact, backend="reference", engine=engine))
    yield a
    asyncio.run(a.shutdown())


def req(rid: str, content: str = "hello", **kw: object) -> GenerateRequest:
    sampling = SamplingOptions(max_tokens=4, temperature=0.0, ignore_eos=True)
    messages = ({"role": "user", "content": content},)
    return GenerateRequest(request_id=rid, messages=messages, sampling=sampling, **kw)  # type: ignore[arg-type]


async def _events(a: EngineActor, r: GenerateRequest) -> list[object]:
    return [ev async for raw in a.generate(r) for ev in decode_events(raw)]


def test_long_prompt_is_prepared_off_the_event_loop(actor: EngineActor) -> None:
    """~1 MB of text takes about a second to tokenize on a small CPU: health and a running stream go on."""
    content = "lorem ipsum dolor sit amet " * 40000  # inside the character bound, far over 32768 tokens

    async def scenario() -> tuple[list[object], float, int, float]:
        t_start = time.perf_counter()
        task = asyncio.ensure_future(_events(actor, req("long", content)))
        worst, polls = 0.0, 0
        while not task.done():
            t0 = time.perf_counter()
            assert (await actor.health()).ok
            await asyncio.sleep(0.01)
            worst, polls = max(worst, time.perf_counter() - t0), polls + 1
        return task.result(), worst, polls, time.perf_counter() - t_start

    evs, worst, polls, total = asyncio.run(scenario())
    (ev,) = evs
    assert isinstance(ev, Failed) and (ev.status, ev.code) == (400, "context_length_exceeded")
    assert "tokens" in ev.message
    # inline, the first poll would wait for the whole encode (worst == total); relative, for loaded machines
    assert polls >= 5 and worst < max(0.25, total / 4), (polls, worst, total)


def test_far_oversized_prompt_is_refused_before_tokenizing(actor: EngineActor) -> None:
    (ev,) = asyncio.run(_events(actor, req("huge", "lorem ipsum " * 500_000)))
    assert isinstance(ev, Failed) and ev.code == "context_length_exceeded" and "characters" in ev.message
    n = asyncio.run(actor.count_tokens(req("count-huge", "lorem ipsum " * 500_000)))
    assert isinstance(n, Failed) and n.code == "context_length_exceeded"


@pytest.mark.parametrize("name", ["tools", "add_generation_prompt", "messages", "documents"])
def test_template_variables_that_collide_are_a_400(actor: EngineActor, name: str) -> None:
    r = req("kw", template_kwargs={name: 1})
    (ev,) = asyncio.run(_events(actor, r))
    assert isinstance(ev, Failed) and ev.status == 400, ev
    assert ev.param == f"chat_template_kwargs.{name}"
    n = asyncio.run(actor.count_tokens(r))
    assert isinstance(n, Failed) and n.status == 400


def test_a_bug_in_prompt_preparation_is_a_counted_500(actor: EngineActor, monkeypatch) -> None:
    def broken(*_: object) -> list[int]:
        raise KeyError("surprise")

    before = asyncio.run(actor.stats()).internal_errors
    monkeypatch.setattr(adapter, "prompt_ids", broken)
    monkeypatch.setattr(adapter, "count_prompt", broken)
    (ev,) = asyncio.run(_events(actor, req("bug")))
    assert isinstance(ev, Failed) and (ev.status, ev.code) == (500, "internal_error")
    n = asyncio.run(actor.count_tokens(req("bug2")))
    assert isinstance(n, Failed) and n.status == 500
    assert asyncio.run(actor.stats()).internal_errors == before + 2
    monkeypatch.undo()
    evs = asyncio.run(_events(actor, req("after")))
    assert isinstance(evs[0], Accepted) and isinstance(evs[-1], Finish)


def test_unregistered_shape_needs_the_flag(tmp_path) -> None:
    from ninfer.demo import build_demo

    path = build_demo(tmp_path / "tiny.ninfer", shape_registered=False)
    engine = EngineConfig(max_concurrency=1, queue_depth=0, max_context=256, kv_capacity=256)
    with pytest.raises(ValueError, match="--allow-unregistered-shape"):
        EngineActor(ActorSpec(artifact=path, backend="reference", engine=engine))
    a = EngineActor(
        ActorSpec(artifact=path, backend="reference", engine=engine, allow_unregistered_shape=True)
    )
    try:
        assert isinstance(asyncio.run(_events(a, req("ok")))[-1], Finish)
    finally:
        asyncio.run(a.shutdown())
