"""Shared test configuration: GPU tests (marked ``gpu``) skip cleanly where no CUDA device is usable."""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ninfer.engine.core import Finish, RequestMetrics, Usage


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
