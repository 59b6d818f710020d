"""Qwen3.8-Flash-Next (``qwen4_exp``): config, reference model, per-sequence state, tensor names, weight profiles.

Spec: docs/flash-next.md; state and reuse rules: docs/flash-next-state.md.

The exports are resolved lazily (PEP 562) so that ``ninfer.flash_next.config`` / ``.quant`` can be imported by
the artifact registry without pulling in the reference model (which itself imports the artifact package).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["FlashNextConfig", "ConfigError", "FlashNext", "FlashNextState", "FlashSnapshot"]

_WHERE = {
    "FlashNextConfig": "ninfer.flash_next.config",
    "ConfigError": "ninfer.flash_next.config",
    "FlashNext": "ninfer.flash_next.model",
    "FlashNextState": "ninfer.flash_next.state",
    "FlashSnapshot": "ninfer.flash_next.state",
}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'ninfer.flash_next' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
