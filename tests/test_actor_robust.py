"""The engine actor in-process (no Ray): an artifact of an unregistered shape needs
``allow_unregistered_shape``."""

from __future__ import annotations

import asyncio

import pytest
from ninfer.actors.engine_actor import EngineActor
from ninfer.actors.messages import ActorSpec, Finished, GenerateRequest, SamplingOptions, decode_event


def req(rid: str, content: str = "hello", **kw: object) -> GenerateRequest:
    sampling = SamplingOptions(max_tokens=4, temperature=0.0, ignore_eos=True)
    messages = ({"role": "user", "content": content},)
    return GenerateRequest(request_id=rid, messages=messages, sampling=sampling, **kw)  # type: ignore[arg-type]


async def _events(a: EngineActor, r: GenerateRequest) -> list[object]:
    return [decode_event(raw) async for raw in a.generate(r)]


def test_unregistered_shape_needs_the_flag(tmp_path) -> None:
    from ninfer.demo import build_demo

    path = build_demo(tmp_path / "tiny.ninfer", shape_registered=False)
    engine = {"max_concurrency": 1, "queue_depth": 0, "max_context": 256, "kv_capacity": 256}
    with pytest.raises(ValueError, match="--allow-unregistered-shape"):
        EngineActor(ActorSpec(artifact=path, backend="reference", engine=engine))
    a = EngineActor(
        ActorSpec(artifact=path, backend="reference", engine=engine, allow_unregistered_shape=True)
    )
    try:
        assert isinstance(asyncio.run(_events(a, req("ok")))[-1], Finished)
    finally:
        asyncio.run(a.shutdown())
