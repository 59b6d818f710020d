"""What each architecture runs on: its reference network and whether the CUDA backend has kernels for it.

This table sits above the artifact layer (``artifact/registry.py``: identities, profiles, config readers and tensor
plans), the reference networks and the converter (which keeps its own checkpoint readers,
``convert/hf.py:CHECKPOINT_READERS``); nothing below imports it. ``ninfer.load`` and the server's backend choice
dispatch through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ninfer.artifact.registry import ARCHITECTURES, RegistryError
from ninfer.flash_next.model import FlashNext
from ninfer.reference import Qwen36

__all__ = ["REFERENCE_NETWORKS", "CUDA_ARCHITECTURES", "reference_network"]

# (config, WeightSource) -> the NumPy reference network, the definition of what ninfer computes
REFERENCE_NETWORKS: dict[str, Callable[[Any, Any], Any]] = {
    "qwen3_5": Qwen36,
    "qwen3_5_moe": Qwen36,
    "qwen4_exp": FlashNext,
}
# architectures the CUDA backend has kernels for; every other one (Flash-Next's qwen4_exp) runs on the reference
CUDA_ARCHITECTURES = ("qwen3_5", "qwen3_5_moe")

assert set(REFERENCE_NETWORKS) == set(ARCHITECTURES), "every registered architecture has a reference network"


def reference_network(cfg: Any, weights: Any) -> Any:
    """The reference network of ``cfg``'s architecture over ``weights`` (a ``WeightSource``)."""
    build = REFERENCE_NETWORKS.get(cfg.arch)
    if build is None:
        raise RegistryError(f"architecture {cfg.arch!r} has no reference network")
    return build(cfg, weights)
