"""Shared test configuration: GPU tests (marked ``gpu``) skip cleanly where no CUDA device is usable."""

from __future__ import annotations

import functools
from typing import Any

import pytest


@functools.cache
def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "no GPU here"
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (cupy device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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

    from ninfer.engine.grammar import GrammarCompiler

    return GrammarCompiler(tok.hf, VOCAB, tok.eos_token_ids)
