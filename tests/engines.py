"""Engines over a loaded model whose runner a test wraps (e.g. ``ScriptedDrafts``): ``Engine.from_model`` builds the
runner itself, so tests that wrap it build the engine here, one way for all of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ninfer.engine import Engine, EngineConfig


def engine_over(model: Any, cfg: EngineConfig, wrap: Callable[[Any], Any] | None = None, **kw: Any) -> Engine:
    """An engine over ``model``'s runner for ``cfg`` (passed through ``wrap`` when given); ``kw``: more ``Engine``
    arguments (``turns``, ``background``)."""
    runner = model.runner(cfg)
    runner = wrap(runner) if wrap is not None else runner
    return Engine(runner, model.config, model.tokenizer, cfg, eos_token_ids=model.eos_token_ids,
                  token_limit=model.token_limit, **kw)  # fmt: skip
