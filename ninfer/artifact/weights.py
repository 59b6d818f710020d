"""The float32 view of an opened artifact's tensors (the ``WeightSource`` the reference backend reads), shared by
our container (reader.py) and upstream v1 files (upstream.py), which offer the same reading interface."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ArtifactWeights"]


class ArtifactWeights:
    """WeightSource over an artifact: float32 tensors in the model's shape, dequantized once and cached.

    ``get_rows`` serves rows without decoding the tensor: host-rows tensors (the n-gram tables) are only ever
    read this way, from their own mapped region, and are never cached whole.
    """

    def __init__(self, art: Any) -> None:
        self._art = art  # our container or an upstream v1 file (upstream.py): the same reading interface
        self._names = frozenset(art.tensor_names())
        self._cache: dict[str, np.ndarray] = {}

    def get(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = self._art.tensor(name)
        return self._cache[name]

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Rows ``[n, K]`` float32 of a 2-D tensor (embedding and n-gram gathers)."""
        if name in self._cache:
            return self._cache[name][np.asarray(rows, np.int64)]
        return self._art.rows(name, rows)

    def names(self) -> list[str]:
        return self._art.tensor_names()

    def __contains__(self, name: object) -> bool:
        return name in self._names
