"""Qwen3.8-Flash-Next (``qwen4_exp``): config, reference model, per-sequence state, tensor names, weight profiles.

Spec: /work/shared/spec/flash-next.md; state and reuse rules: docs/flash-next-state.md.
"""

from ninfer.flash_next.config import ConfigError, FlashNextConfig
from ninfer.flash_next.model import FlashNext
from ninfer.flash_next.state import FlashNextState, FlashSnapshot

__all__ = ["FlashNextConfig", "ConfigError", "FlashNext", "FlashNextState", "FlashSnapshot"]
