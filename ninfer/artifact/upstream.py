"""Upstream v1 artifacts (``NINFER`` magic) presented with the same interface as a ``.ninfer`` artifact.

A v1 file carries no config and no profile: its identity's pinned config is used (a test file of another size
passes its ``config`` explicitly and is then marked unregistered), and its weight profile is upstream's
group-int assignment, ``groupwise-int``.
"""

from __future__ import annotations

import os
from typing import Any

from ninfer.artifact.container import ArtifactError
from ninfer.artifact.registry import identity
from ninfer.artifact.v1 import V1Artifact
from ninfer.artifact.writer import RESOURCE_FILES
from ninfer.config import ModelConfig

__all__ = ["UpstreamArtifact", "is_upstream_v1"]


def is_upstream_v1(path: str | os.PathLike[str]) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"NINFER\x00\x01"
    except OSError:
        return False


class UpstreamArtifact:
    def __init__(self, path: str | os.PathLike[str], config: ModelConfig | None = None) -> None:
        self.path = os.fspath(path)
        self._v1 = V1Artifact.open(self.path)
        if not self._v1.registered:
            raise ArtifactError(f"{self.path}: upstream model id {self._v1.model_id!r} is not registered")
        ident = identity(self._v1.model_id)
        self.model_config = config if config is not None else ident.config
        self.shape_registered = config is None or config == ident.config
        self.model_id = self._v1.model_id
        self.weight_profile = "groupwise-int"
        self.manifest: dict[str, Any] | None = None
        self._weights = self._v1.canonical_weights(self.model_config)

    def weights(self) -> Any:
        return self._weights

    def resource(self, role: str) -> bytes | None:
        entry = RESOURCE_FILES.get(role)  # (file name, media type)
        if entry is None or entry[0] not in self._v1.resource_names():
            return None
        return self._v1.resource(entry[0])
