"""Shared test configuration: GPU tests (marked ``gpu``) skip cleanly where no CUDA device is usable; fixtures
and helpers more than one test module uses."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ninfer.engine.core import Finish, RequestMetrics, Usage

if TYPE_CHECKING:
    from ninfer.actors.engine_actor import EngineActor


@functools.cache
def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "no GPU here"
        return False


@pytest.fixture(autouse=True)
def _switch_interval() -> Iterator[None]:
    """An ``EngineActor`` made in-process sets its process's GIL switch interval (``ActorSpec.gil_switch_s``):
    each test starts and ends with the interpreter's own."""
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (cupy device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def finish_event(reason: str, prompt: int, cached: int, completion: int, text: str = "") -> Finish:
    """An engine ``Finish`` as the actor forwards it (zero timings)."""
    usage = Usage(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion)
    metrics = RequestMetrics(queue_wait_s=0.0, prefill_s=0.0, decode_s=0.0, ttft_s=0.0, prompt_tokens=prompt,
                             cached_tokens=cached, completion_tokens=completion, finish_reason=reason)  # fmt: skip
    return Finish(0, reason, usage, metrics, text)


@pytest.fixture(scope="module")
def tok() -> Any:
    """The demo model's tokenizer (the grammar tests' vocabulary)."""
    import json

    import tokenizers

    from ninfer.frontend import Tokenizer
    from ninfer.frontend.demo_tokenizer import demo_frontend_resources

    res = demo_frontend_resources()
    return Tokenizer(
        tokenizers.Tokenizer.from_str(res["tokenizer"].decode()), json.loads(res["tokenizer_config"])
    )


@pytest.fixture(scope="module")
def compiler(tok: Any) -> Any:
    """A GrammarCompiler over ``tok`` with the demo model's padded logits rows (test_grammar.VOCAB)."""
    from test_grammar import VOCAB

    from ninfer.frontend.grammar import GrammarCompiler

    return GrammarCompiler(tok.hf, VOCAB, tok.eos_token_ids)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo artifact, built once per module (the in-process engine actor tests' model)."""
    from ninfer.demo import build_demo

    return build_demo(tmp_path_factory.mktemp("demo") / "demo.ninfer")


def make_actor(artifact: str, **engine: object) -> EngineActor:
    """An in-process engine actor (no Ray, reference backend) on ``artifact``: 2 lanes, a queue of 2, a 512-token
    context and 4096 KV tokens, unless ``engine`` (``EngineConfig`` fields) says otherwise."""
    from ninfer.actors.engine_actor import EngineActor
    from ninfer.actors.messages import ActorSpec

    from ninfer.engine import EngineConfig

    base = {"max_concurrency": 2, "queue_depth": 2, "max_context": 512, "kv_capacity": 4096}
    base.update(engine)
    return EngineActor(ActorSpec(artifact=artifact, backend="reference", engine=EngineConfig(**base)))


@pytest.fixture
def actor(artifact: str) -> Iterator[EngineActor]:
    """A fresh ``make_actor`` actor on the module's demo artifact, shut down after the test."""
    a = make_actor(artifact)
    yield a
    asyncio.run(a.shutdown())


@pytest.fixture(scope="session")
def lanes_emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The host emulator of gemv.cu's launches (tests/gemv_lanes_emu.py), built once for every module using it."""
    from gemv_lanes_emu import build_lanes_emu

    return build_lanes_emu(tmp_path_factory)
