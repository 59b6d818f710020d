"""Opening, checking and reading ``.ninfer`` artifacts.

Every check that can fail raises ``ArtifactError`` with a message naming the file and what is wrong; nothing
from deep inside numpy or json reaches the caller. Blobs are read through one read-only ``numpy.memmap``.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from ninfer.artifact.container import BLOB_ALIGN, ArtifactError, content_digest, read_header
from ninfer.artifact.inventory import TensorPlan
from ninfer.artifact.registry import AnyConfig, RegistryError, architecture, check_config, tensor_plan
from ninfer.artifact.rows import gather_rows, is_row_local
from ninfer.artifact.weights import ArtifactWeights
from ninfer.config import ConfigError
from ninfer.formats import FORMATS, FormatError

__all__ = ["Artifact", "ArtifactWeights", "open_artifact"]

_TOP_KEYS = {
    "container",
    "container_version",
    "model_id",
    "weight_profile",
    "architecture",
    "shape_registered",
    "config",
    "recipe",
    "source",
    "tensors",
    "resources",
    "digest",
    "provenance",
}
_HASH_CHUNK = 1 << 24
_TENSOR_KEYS = {"name", "format", "layout", "shape", "offset", "nbytes", "sha256"}
_RESOURCE_KEYS = {"name", "role", "media_type", "offset", "nbytes", "sha256"}
_ROLES = {
    "tokenizer",
    "tokenizer_config",
    "chat_template",
    "generation_config",
    "preprocessor",
    "video_preprocessor",
    "conversion_report",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_hex64(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _check_entry(path: str, kind: str, e: Any, keys: set[str]) -> None:
    if not isinstance(e, dict):
        raise ArtifactError(f"{path}: manifest: a {kind} entry is not an object")
    name = e.get("name", "?")
    if set(e) != keys:
        missing, extra = sorted(keys - set(e)), sorted(set(e) - keys)
        raise ArtifactError(f"{path}: manifest: {kind} {name!r}: missing {missing} / unknown {extra} members")
    for k in sorted(keys & {"name", "format", "layout", "role", "media_type"}):
        if not isinstance(e[k], str):
            raise ArtifactError(f"{path}: manifest: {kind} {name!r}: {k} must be a string")
    for k in ("offset", "nbytes"):
        if not _is_int(e[k]) or e[k] < 0:
            raise ArtifactError(f"{path}: manifest: {kind} {name!r}: {k} must be a non-negative integer")
    if not isinstance(e["sha256"], str) or len(e["sha256"]) != 64:
        raise ArtifactError(f"{path}: manifest: {kind} {name!r}: sha256 must be 64 hex characters")
    if kind == "tensor" and (
        not isinstance(e["shape"], list) or not all(_is_int(d) and d > 0 for d in e["shape"])
    ):
        raise ArtifactError(f"{path}: manifest: tensor {name!r}: shape must be a list of positive integers")


def _check_schema(path: str, m: Any) -> None:
    if not isinstance(m, dict):
        raise ArtifactError(f"{path}: manifest is not a JSON object")
    if set(m) != _TOP_KEYS:
        missing, extra = sorted(_TOP_KEYS - set(m)), sorted(set(m) - _TOP_KEYS)
        raise ArtifactError(f"{path}: manifest: missing members {missing}, unknown members {extra}")
    if m["container"] != "ninfer-py" or m["container_version"] != 1:
        raise ArtifactError(
            f"{path}: manifest: unsupported container {m['container']!r} v{m['container_version']}"
        )
    if not isinstance(m["shape_registered"], bool):
        raise ArtifactError(f"{path}: manifest: shape_registered must be true or false")
    for k in ("model_id", "weight_profile", "architecture"):
        if not isinstance(m[k], str):
            raise ArtifactError(f"{path}: manifest: {k} must be a string")
    d = m["digest"]
    if not isinstance(d, dict) or d.get("algo") != "sha256" or not _is_hex64(d.get("content")):
        raise ArtifactError(f"{path}: manifest: digest must be {{algo: sha256, content: 64 hex characters}}")
    for k in ("tensors", "resources"):
        if not isinstance(m[k], list):
            raise ArtifactError(f"{path}: manifest: {k} must be a list")
    for e in m["tensors"]:
        _check_entry(path, "tensor", e, _TENSOR_KEYS)
    for e in m["resources"]:
        _check_entry(path, "resource", e, _RESOURCE_KEYS)
        if e["role"] not in _ROLES:
            raise ArtifactError(f"{path}: manifest: resource {e['name']!r}: unknown role {e['role']!r}")


def _check_layout(path: str, m: dict[str, Any], data_bytes: int) -> None:
    cursor = 0
    seen: set[str] = set()
    last_end = 0
    for kind, e in [("tensor", t) for t in m["tensors"]] + [("resource", r) for r in m["resources"]]:
        if e["name"] in seen:
            raise ArtifactError(f"{path}: manifest: duplicate {kind} name {e['name']!r}")
        seen.add(e["name"])
        if e["offset"] % BLOB_ALIGN or e["offset"] < cursor:
            raise ArtifactError(
                f"{path}: {kind} {e['name']!r}: offset {e['offset']} misaligned or overlapping"
            )
        last_end = e["offset"] + e["nbytes"]
        if last_end > data_bytes:
            raise ArtifactError(f"{path}: {kind} {e['name']!r} ends past the end of the file (truncated?)")
        cursor = last_end
    if last_end != data_bytes:
        raise ArtifactError(f"{path}: {data_bytes - last_end} unexpected bytes after the last blob")


def _check_model(path: str, m: dict[str, Any]) -> tuple[AnyConfig, dict[str, TensorPlan]]:
    try:
        arch = architecture(m["architecture"])
        if not isinstance(m["config"], dict):
            raise ConfigError("config must be an object")
        try:
            cfg = arch.config_from_dict(m["config"])
        except (TypeError, ValueError) as e:  # a value of the wrong type deep in the config's checks
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"config: {e}") from None
        ident = check_config(m["model_id"], cfg, m["shape_registered"])
        if m["architecture"] != ident.arch:
            raise RegistryError(f"architecture {m['architecture']!r} does not match {ident.model_id!r}")
        plan = tensor_plan(ident.model_id, cfg, m["weight_profile"])
    except (ConfigError, RegistryError) as e:
        raise ArtifactError(f"{path}: {e}") from None
    have = {t["name"]: t for t in m["tensors"]}
    missing, extra = [n for n in plan if n not in have], [n for n in have if n not in plan]
    if missing or extra:
        raise ArtifactError(f"{path}: tensor inventory: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, p in plan.items():
        t = have[name]
        if tuple(t["shape"]) != p.shape:
            raise ArtifactError(
                f"{path}: tensor {name!r}: shape {t['shape']} but the config implies {list(p.shape)}"
            )
        if t["format"] != p.format:
            raise ArtifactError(
                f"{path}: tensor {name!r}: format {t['format']} but profile {m['weight_profile']!r} requires "
                f"{p.format}"
            )
        fmt = FORMATS[p.format]
        if t["layout"] != fmt.layout or t["nbytes"] != fmt.encoded_size(p.shape):
            raise ArtifactError(f"{path}: tensor {name!r}: layout/size do not match format {p.format}")
    return cfg, plan


class Artifact:
    """An opened, checked artifact. Blobs are memory-mapped; nothing is read until asked for.

    Tensors planned as ``host_rows`` (the n-gram tables) get their own read-only mapping with ``MADV_RANDOM``:
    they are read only by rows, and without read-ahead a row read from a cold file brings in one page, not a
    read-ahead window. Nothing in this class reads such a tensor whole unless ``tensor()`` is asked for it.
    """

    def __init__(
        self,
        path: str,
        manifest: dict[str, Any],
        data_offset: int,
        config: AnyConfig,
        plan: dict[str, TensorPlan],
    ) -> None:
        self.path = path
        self.manifest = manifest
        self.model_config = config
        self.plan = plan
        self._data_offset = data_offset
        self._data = np.memmap(path, dtype=np.uint8, mode="r", offset=data_offset)
        self._tensors = {t["name"]: t for t in manifest["tensors"]}
        self._resources = {r["role"]: r for r in manifest["resources"]}
        self._regions: dict[str, np.ndarray] = {}

    model_id = property(lambda self: self.manifest["model_id"])
    weight_profile = property(lambda self: self.manifest["weight_profile"])
    architecture = property(lambda self: self.manifest["architecture"])
    shape_registered = property(lambda self: self.manifest["shape_registered"])
    digest = property(lambda self: self.manifest["digest"]["content"])

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def tensor_info(self, name: str) -> dict[str, Any]:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's encoded bytes (a view of the map; a host-rows tensor's own region)."""
        t = self.tensor_info(name)
        if self.plan[name].host_rows:
            return self._region(name)
        return self._data[t["offset"] : t["offset"] + t["nbytes"]]

    def _region(self, name: str) -> np.ndarray:
        if name not in self._regions:
            t = self._tensors[name]
            start = self._data_offset + t["offset"]
            base = start - start % mmap.ALLOCATIONGRANULARITY  # a mapping starts on a page boundary
            with open(self.path, "rb") as f:
                mm = mmap.mmap(f.fileno(), start - base + t["nbytes"], access=mmap.ACCESS_READ, offset=base)
            if hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_RANDOM)
            self._regions[name] = np.frombuffer(mm, np.uint8, t["nbytes"], start - base)
        return self._regions[name]

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32 in the shape the model sees (``plan[name].logical``)."""
        t = self.tensor_info(name)
        return FORMATS[t["format"]].decode(self.raw(name), tuple(t["shape"])).reshape(self.plan[name].logical)

    def tensor_rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` of the tensor's stored row view (``[prod(shape[:-1]), shape[-1]]``)."""
        t = self.tensor_info(name)
        return FORMATS[t["format"]].decode_rows(self.raw(name), tuple(t["shape"]), r0, r1)

    def rows(self, name: str, row_ids: np.ndarray) -> np.ndarray:
        """Logical rows of a 2-D tensor (float32 ``[n, K]``), reading only those rows' bytes."""
        p = self.plan.get(name)
        if p is None:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        ids = np.asarray(row_ids, np.int64).reshape(-1)
        if p.rows is not None:
            return p.rows(self.raw(name), ids)
        if len(p.logical) != 2 or p.logical != p.shape:
            raise ValueError(f"{self.path}: tensor {name!r} of shape {list(p.logical)} has no row reader")
        uniq, inverse = np.unique(ids, return_inverse=True)
        fmt = FORMATS[p.format]
        if is_row_local(p.format):
            got = gather_rows(fmt, self.raw(name), p.shape, uniq)
        else:  # a global scale (NVFP4, FP8 per tensor): decode row by row
            got = np.stack([fmt.decode_rows(self.raw(name), p.shape, int(r), int(r) + 1)[0] for r in uniq])
        return got.reshape(uniq.size, -1)[inverse.reshape(-1)]

    def resource(self, role: str) -> bytes | None:
        r = self._resources.get(role)
        return None if r is None else bytes(self._data[r["offset"] : r["offset"] + r["nbytes"]])

    def weights(self) -> ArtifactWeights:
        return ArtifactWeights(self)

    def verify_blobs(self, threads: int = 4) -> None:
        """Hash every blob against the manifest (hashlib releases the GIL, so threads overlap).

        Blobs are read with ``os.pread`` into 16 MiB chunks, not through the map, so verifying never maps the
        file into this process (the resident set stays small even for a table larger than memory).
        """
        entries = self.manifest["tensors"] + self.manifest["resources"]
        fd = os.open(self.path, os.O_RDONLY)

        def digest(e: dict[str, Any]) -> str:
            h = hashlib.sha256()
            start, end = self._data_offset + e["offset"], self._data_offset + e["offset"] + e["nbytes"]
            for off in range(start, end, _HASH_CHUNK):
                h.update(os.pread(fd, min(_HASH_CHUNK, end - off), off))
            return h.hexdigest()

        try:
            with ThreadPoolExecutor(max_workers=threads) as ex:
                for e, got in zip(entries, ex.map(digest, entries), strict=True):
                    if got != e["sha256"]:
                        raise ArtifactError(f"{self.path}: blob {e['name']!r} is corrupt (SHA-256 mismatch)")
        finally:
            os.close(fd)
        if content_digest(self.manifest) != self.digest:
            raise ArtifactError(f"{self.path}: manifest digest does not match its blob digests")


def open_artifact(path: str | os.PathLike[str], verify: Literal["full", "manifest"] = "full") -> Artifact:
    """Open and check an artifact. ``verify="full"`` also hashes every blob. An upstream v1 file (``NINFER``
    magic) opens as an ``UpstreamArtifact`` with the same interface (``verify="full"`` decodes every object)."""
    path = os.fspath(path)
    from ninfer.artifact.v1_container import is_v1_file

    if is_v1_file(path):
        from ninfer.artifact.upstream import open_upstream

        return open_upstream(path, verify)  # type: ignore[return-value]
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ArtifactError(f"{path}: cannot open: {e.strerror}") from None
    header, manifest = read_header(path, size)
    _check_schema(path, manifest)
    _check_layout(path, manifest, header.data_bytes)
    try:
        cfg, plan = _check_model(path, manifest)
    except FormatError as e:
        raise ArtifactError(f"{path}: {e}") from None
    art = Artifact(path, manifest, header.data_offset, cfg, plan)
    if verify == "full":
        art.verify_blobs()
    return art
