"""Writing a registered artifact from float32 tensors: format assignment by profile, encoding, streaming."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ninfer.artifact.container import ArtifactError, write_container
from ninfer.artifact.inventory import expected_inventory
from ninfer.artifact.registry import check_config, profile_format
from ninfer.config import ModelConfig
from ninfer.formats import FORMATS

__all__ = ["write_artifact", "RESOURCE_FILES"]

# resource role -> (file name inside the artifact, media type)
RESOURCE_FILES = {
    "tokenizer": ("frontend/tokenizer.json", "application/json"),
    "tokenizer_config": ("frontend/tokenizer_config.json", "application/json"),
    "chat_template": ("frontend/chat_template.jinja", "text/x-jinja2"),
    "generation_config": ("frontend/generation_config.json", "application/json"),
}

ENCODER_ID = "ninfer-formats-v1"


def write_artifact(
    path: str | os.PathLike[str],
    *,
    model_id: str,
    weight_profile: str,
    config: ModelConfig,
    shape_registered: bool,
    load_tensor: Callable[[str], np.ndarray],
    resources: Mapping[str, bytes],
    source: list[dict[str, Any]] | None = None,
    provenance: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write ``path``: every tensor of the config's inventory, loaded as float32 by ``load_tensor(name)``,
    encoded in the format the profile assigns. ``resources`` maps role -> bytes. Returns the manifest."""
    ident = check_config(model_id, config, shape_registered)
    if weight_profile not in ident.profiles:
        raise ArtifactError(f"weight profile {weight_profile!r} is not registered for {model_id!r}")
    inv = expected_inventory(config)
    plan = []
    for name, shape in inv.items():
        fmt = FORMATS[profile_format(weight_profile, name, shape)]
        plan.append((name, fmt.id, fmt.layout, shape, fmt.encoded_size(shape)))

    def blobs() -> Iterator[bytes | np.ndarray]:
        for name, fmt_id, _, shape, _ in plan:
            x = np.asarray(load_tensor(name), dtype=np.float32)
            if x.shape != shape:
                raise ArtifactError(f"tensor {name!r}: source shape {list(x.shape)}, expected {list(shape)}")
            if not np.isfinite(x).all():
                raise ArtifactError(f"tensor {name!r}: source has non-finite values")
            yield FORMATS[fmt_id].encode(x, shape)
            if progress:
                progress(name)

    unknown = sorted(set(resources) - set(RESOURCE_FILES))
    if unknown:
        raise ArtifactError(f"unknown resource role(s) {unknown}")
    res = {
        RESOURCE_FILES[role][0]: (role, RESOURCE_FILES[role][1], bytes(data))
        for role, data in resources.items()
    }
    base = dict(
        model_id=model_id,
        weight_profile=weight_profile,
        architecture=config.arch,
        shape_registered=shape_registered,
        config=config.to_dict(),
        recipe=dict(id=f"{model_id}/{weight_profile}", encoder=ENCODER_ID),
        source=source or [],
        provenance=provenance or {},
    )
    return write_container(path, base, plan, blobs(), res)
