"""Writing a registered artifact from float32 tensors: format assignment by profile, encoding, streaming.

The architecture's plan (``registry.tensor_plan``) fixes every tensor's stored shape and format. Tensors are
written in plan order, then the ``host_rows`` tensors (the n-gram tables) last, so they form their own region at
the end of the tensor data. A host-rows tensor may come as any row-sliceable source (``RowSource``: a NumPy array,
a memory map, or a lazy concatenation of checkpoint shards); it is encoded in row chunks (its format is row-local,
``ninfer.artifact.rows``) into a temporary file next to the output, so a table larger than memory never has to be
held in memory, as floats or encoded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from ninfer.artifact.container import ArtifactError, check_output_path, write_container
from ninfer.artifact.inventory import TensorPlan
from ninfer.artifact.registry import AnyConfig, check_config, tensor_plan
from ninfer.artifact.rows import is_row_local, put_rows
from ninfer.formats import FORMATS

__all__ = ["write_artifact", "RESOURCE_FILES", "RowSource", "encode_host_rows"]

# resource role -> (file name inside the artifact, media type)
RESOURCE_FILES = {
    "tokenizer": ("frontend/tokenizer.json", "application/json"),
    "tokenizer_config": ("frontend/tokenizer_config.json", "application/json"),
    "chat_template": ("frontend/chat_template.jinja", "text/x-jinja2"),
    "generation_config": ("frontend/generation_config.json", "application/json"),
}

ENCODER_ID = "ninfer-formats-v1"
_CHUNK_ELEMS = 1 << 23  # float32 values encoded at a time for host-rows tensors (32 MiB)


class RowSource(Protocol):
    """A 2-D source read by row ranges: ``shape`` and ``src[a:b] -> float32 [b-a, K]``."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, rows: slice) -> np.ndarray: ...


def _check(name: str, x: np.ndarray) -> np.ndarray:
    if not np.isfinite(x).all():
        raise ArtifactError(f"tensor {name!r}: source has non-finite values")
    return x


def encode_host_rows(name: str, src: RowSource, plan: TensorPlan, out: np.ndarray) -> None:
    """Encode the whole host-rows tensor ``plan`` from ``src`` (logical rows) into ``out``, in row chunks.

    Stored row r holds logical rows ``r·pack .. r·pack+pack-1`` (``pack`` = logical rows per stored row).
    """
    fmt = FORMATS[plan.format]
    if not is_row_local(plan.format):
        raise ArtifactError(
            f"tensor {name!r}: format {plan.format} is not row-local; it cannot be a row table"
        )
    if tuple(src.shape) != plan.logical:
        raise ArtifactError(f"tensor {name!r}: source shape {list(src.shape)}, expected {list(plan.logical)}")
    n_stored, k = plan.shape
    pack = plan.logical[0] // n_stored
    step = max(1, _CHUNK_ELEMS // k)
    for a in range(0, n_stored, step):
        b = min(a + step, n_stored)
        x = np.asarray(src[a * pack : b * pack], dtype=np.float32).reshape(b - a, k)
        put_rows(fmt, out, plan.shape, a, _check(name, x))


def write_artifact(
    path: str | os.PathLike[str],
    *,
    model_id: str,
    weight_profile: str,
    config: AnyConfig,
    shape_registered: bool,
    load_tensor: Callable[[str], np.ndarray | RowSource],
    resources: Mapping[str, bytes],
    source: list[dict[str, Any]] | None = None,
    provenance: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write ``path``: every tensor of the plan, loaded as float32 by ``load_tensor(name)`` (host-rows tensors:
    any ``RowSource``), encoded in the format the profile assigns. ``resources`` maps role -> bytes.
    Returns the manifest. Nothing is left at ``path`` (nor beside it) when writing fails."""
    check_output_path(path)
    ident = check_config(model_id, config, shape_registered)
    if weight_profile not in ident.profiles:
        raise ArtifactError(f"weight profile {weight_profile!r} is not registered for {model_id!r}")
    plan = tensor_plan(model_id, config, weight_profile)
    order = [n for n, p in plan.items() if not p.host_rows] + [n for n, p in plan.items() if p.host_rows]
    entries = []
    for name in order:
        p = plan[name]
        fmt = FORMATS[p.format]
        entries.append((name, fmt.id, fmt.layout, p.shape, fmt.encoded_size(p.shape)))
    scratch: list[str] = []  # one temporary file per host-rows tensor, removed at the end

    def blobs() -> Iterator[bytes | np.ndarray]:
        for name, fmt_id, _, shape, nbytes in entries:
            p = plan[name]
            src = load_tensor(name)
            if p.host_rows:
                scratch.append(f"{os.fspath(path)}.rows{len(scratch)}.partial")
                out = np.memmap(scratch[-1], np.uint8, "w+", shape=(nbytes,))
                encode_host_rows(name, src, p, out)
                yield out
                del out
            else:
                x = np.asarray(src, dtype=np.float32)
                if x.shape != p.logical:
                    raise ArtifactError(
                        f"tensor {name!r}: source shape {list(x.shape)}, expected {list(p.logical)}"
                    )
                yield FORMATS[fmt_id].encode(_check(name, x).reshape(shape), shape)
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
        architecture=ident.arch,
        shape_registered=shape_registered,
        config=config.to_dict(),
        recipe=dict(id=f"{model_id}/{weight_profile}", encoder=ENCODER_ID),
        source=source or [],
        provenance=provenance or {},
    )
    try:
        return write_container(path, base, entries, blobs(), res)
    finally:
        for f in scratch:
            if os.path.exists(f):
                os.remove(f)
