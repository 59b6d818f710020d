"""The .ninfer artifact: container, registry, inventory, writer and reader."""

from ninfer.artifact.container import ArtifactError
from ninfer.artifact.reader import Artifact, ArtifactWeights, open_artifact
from ninfer.artifact.registry import MODELS, PROFILES, RegistryError, identity, profile_format
from ninfer.artifact.writer import write_artifact

__all__ = [
    "Artifact",
    "ArtifactError",
    "ArtifactWeights",
    "MODELS",
    "PROFILES",
    "RegistryError",
    "identity",
    "open_artifact",
    "profile_format",
    "write_artifact",
]
