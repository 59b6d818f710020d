"""Engines over a loaded model whose runner a test wraps (e.g. ``ScriptedDrafts``): ``Engine.from_model`` builds the
runner itself, so tests that wrap it build the engine here, one way for all of them. Also the agent sessions' prompt
pieces of the tiering tests (a session's opening, a tool result closing a turn) in the demo model's tokens."""

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


def agent_opening(model: Any, s: int) -> list[int]:
    """Session ``s``'s opening prompt (system and user turns, the assistant's turn open): longer for later sessions."""
    text = (
        f"<|im_start|>system\nAgent {s}. " + "note " * (16 + 2 * s) + "<|im_end|>\n"
        f"<|im_start|>user\nTask {s}?<|im_end|>\n<|im_start|>assistant\n"
    )
    return model.tokenizer.encode(text)


def agent_tool_result(model: Any, turn: int) -> list[int]:
    """What follows the assistant's answer of ``turn``: its end, a user turn with the result, the next turn open."""
    return model.tokenizer.encode(
        f"<|im_end|>\n<|im_start|>user\nresult {turn}<|im_end|>\n<|im_start|>assistant\n"
    )
