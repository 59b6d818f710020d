"""Weights as the reference model sees them: a ``WeightSource`` of float32 arrays under canonical names.

Canonical names are the HF names without the ``model.`` / ``model.language_model.`` prefix (docs/contracts.md).
``expected_shapes(cfg)`` is the single table of every tensor a Qwen3.6-family text model (and its MTP head) has;
``CachedWeights`` fetches each tensor once, checks it against that table and keeps the float32 copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from ninfer.artifact.inventory import expected_shapes, lm_head_name  # re-exported: the reference names them
from ninfer.config import ModelConfig

if TYPE_CHECKING:
    pass

__all__ = ["WeightSource", "DictWeights", "CachedWeights", "WeightError", "expected_shapes", "lm_head_name"]


class WeightError(ValueError):
    """A weight that is missing or has the wrong shape, with the tensor named."""


@runtime_checkable
class WeightSource(Protocol):
    def get(self, name: str) -> np.ndarray: ...  # float32, HF shape

    def names(self) -> Iterable[str]: ...

    def __contains__(self, name: object) -> bool: ...


class DictWeights:
    """A ``WeightSource`` over a plain ``dict[str, np.ndarray]`` (values converted to float32 on ``get``)."""

    def __init__(self, tensors: Mapping[str, np.ndarray]) -> None:
        self._t = dict(tensors)

    def get(self, name: str) -> np.ndarray:
        try:
            arr = self._t[name]
        except KeyError:
            raise WeightError(f"{name}: no such tensor") from None
        return np.asarray(arr, dtype=np.float32)

    def names(self) -> Iterator[str]:
        return iter(self._t)

    def __contains__(self, name: object) -> bool:
        return name in self._t

    def __len__(self) -> int:
        return len(self._t)


def mtp_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The MTP head's tensors (docs/model-math.md §6, §8): one full-attention decoder layer plus fc and norms."""
    return {k: v for k, v in expected_shapes(cfg, mtp=True).items() if k.startswith("mtp.")}


class CachedWeights:
    """Fetches each tensor from a ``WeightSource`` once, checks its shape, and keeps the float32 array.

    ``shapes`` is the table the tensors are checked against (``expected_shapes``); a name outside it is refused
    so a typo in model code fails loudly instead of reading an unrelated tensor.
    """

    def __init__(self, source: WeightSource, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.source = source
        self._shapes = dict(shapes)
        self._cache: dict[str, np.ndarray] = {}

    def require(self, names: Iterable[str], what: str) -> None:
        """Raise ``WeightError`` naming the first of ``names`` the source lacks."""
        for name in names:
            if name not in self.source:
                raise WeightError(f"{name}: missing from the weights ({what})")

    def __call__(self, name: str) -> np.ndarray:
        arr = self._cache.get(name)
        if arr is not None:
            return arr
        shape = self._shapes.get(name)
        if shape is None:
            raise WeightError(f"{name}: not a tensor of this model configuration")
        if name not in self.source:
            raise WeightError(f"{name}: missing from the weights")
        arr = np.ascontiguousarray(self.source.get(name), dtype=np.float32)
        if arr.shape != shape:
            raise WeightError(
                f"{name}: shape {list(arr.shape)} does not match the config, expected {list(shape)}"
            )
        arr = arr.view()  # read-only view: the source's own array keeps its flags
        arr.setflags(write=False)
        self._cache[name] = arr
        return arr
