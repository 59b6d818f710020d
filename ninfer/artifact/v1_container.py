"""Strict reader of the upstream v1 ``.ninfer`` container (docs/upstream-v1.md §1-4): framing, directory, ranges.

```
[0,16)   b"NINFER\\0\\x01" | u64 LE json_bytes (> 0)
[16,16+J) UTF-8 JSON {model_id, objects[]};  payload at align_up(16+J, 4096); objects at payload offsets
```
``V1Container.open(path)`` reads only the prefix and the JSON directory, checks the closed schema and registries
and every object's range (offset >= cursor, alignment, bounds, exact encoded size, in array order), then maps
the payload with one read-only ``numpy.memmap``. Any ``model_id`` opens here; which ones can be served, and what
each object name means, is ``ninfer.artifact.v1_binding``. Every failure is a ``V1FormatError`` naming the
object/member at fault.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer.artifact.container import ArtifactError
from ninfer.formats import FORMATS, FormatError, align_up

__all__ = ["V1Container", "V1Object", "V1FormatError", "MAGIC_V1", "V1_FORMATS", "is_v1_file"]

MAGIC_V1 = b"NINFER\x00\x01"
PAYLOAD_ALIGN = 4096
_DIRECT = ("BF16", "FP32", "I32")
_GROUPED = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S")
V1_FORMATS = _DIRECT + _GROUPED
# layout -> (formats, min rank, max rank, byte alignment of offsets)
V1_LAYOUTS = {"contiguous-le-v1": (_DIRECT, 0, 16, 256), "row-split-k128-v1": (_GROUPED, 2, 2, 256)}
_TENSOR_MEMBERS = ("name", "kind", "shape", "format", "layout", "offset", "bytes")
_RESOURCE_MEMBERS = ("name", "kind", "encoding", "offset", "bytes")


class V1FormatError(ArtifactError):
    """An upstream v1 file that is malformed or cannot be used; the message names the object/member at fault."""


@dataclass(frozen=True, slots=True)
class V1Object:
    """One directory entry. ``shape``/``format``/``layout`` are None for resources, ``encoding`` for tensors."""

    name: str
    kind: str
    offset: int
    bytes: int
    shape: tuple[int, ...] | None = None
    format: str | None = None
    layout: str | None = None
    encoding: str | None = None


# ---- container parsing ------------------------------------------------------------------------------------
def is_v1_file(path: str | os.PathLike[str]) -> bool:
    """Whether the file starts with the upstream v1 magic (framing revision 1)."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == MAGIC_V1
    except OSError:
        return False


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise V1FormatError(f"directory: duplicate JSON member {k!r}")
        out[k] = v
    return out


def _reject_constant(token: str) -> None:
    raise V1FormatError(f"directory: JSON constant {token} is not allowed")


def _read_directory(path: str, size: int) -> tuple[dict[str, Any], int]:
    """The parsed JSON root and the payload offset; reads only the prefix and the directory."""
    if size < 16:
        raise V1FormatError(f"{path}: {size} bytes is shorter than the 16-byte v1 prefix (truncated file)")
    with open(path, "rb") as f:
        magic, jbytes = struct.unpack("<8sQ", f.read(16))
        if magic != MAGIC_V1:
            if magic[:7] == MAGIC_V1[:7]:
                raise V1FormatError(f"{path}: unsupported v1 framing revision {magic[7]} (expected 1)")
            raise V1FormatError(f"{path}: bad magic {magic!r}: not an upstream v1 .ninfer file")
        if jbytes == 0 or 16 + jbytes > size:
            raise V1FormatError(f"{path}: json_bytes {jbytes} does not fit the {size}-byte file (truncated?)")
        raw = f.read(jbytes)
    try:
        root = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
        )
    except UnicodeDecodeError as e:
        raise V1FormatError(f"{path}: directory is not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise V1FormatError(f"{path}: directory is not valid JSON ({e.msg} at char {e.pos})") from None
    except V1FormatError as e:
        raise V1FormatError(f"{path}: {e}") from None
    return root, align_up(16 + jbytes, PAYLOAD_ALIGN)


def _check_members(where: str, obj: Any, members: tuple[str, ...]) -> None:
    if not isinstance(obj, dict):
        raise V1FormatError(f"{where}: must be a JSON object, got {type(obj).__name__}")
    missing = [m for m in members if m not in obj]
    extra = sorted(set(obj) - set(members))
    if missing or extra:
        raise V1FormatError(f"{where}: missing members {missing}, unexpected members {extra}")
    nulls = [m for m in members if obj[m] is None]
    if nulls:
        raise V1FormatError(f"{where}: member {nulls[0]!r} is null")


def _want(where: str, member: str, ok: bool, what: str, value: Any) -> None:
    if not ok:
        raise V1FormatError(f"{where}: member {member!r} must be {what}, got {value!r}")


def _parse_object(i: int, o: Any) -> V1Object:
    where = f"objects[{i}]"
    if isinstance(o, dict) and isinstance(o.get("name"), str):
        where += f" {o['name']!r}"
    kind = o.get("kind") if isinstance(o, dict) else None
    if not isinstance(o, dict):
        raise V1FormatError(f"{where}: must be a JSON object, got {type(o).__name__}")
    if kind not in ("tensor", "resource"):
        raise V1FormatError(f"{where}: member 'kind' must be 'tensor' or 'resource', got {kind!r}")
    _check_members(where, o, _TENSOR_MEMBERS if kind == "tensor" else _RESOURCE_MEMBERS)
    _want(where, "name", isinstance(o["name"], str) and o["name"] != "", "a non-empty string", o["name"])
    _want(where, "offset", _is_int(o["offset"]) and o["offset"] >= 0, "an integer >= 0", o["offset"])
    if kind == "resource":
        _want(where, "bytes", _is_int(o["bytes"]) and o["bytes"] > 0, "an integer > 0", o["bytes"])
        _want(where, "encoding", o["encoding"] == "raw-bytes-v1", "'raw-bytes-v1'", o["encoding"])
        return V1Object(o["name"], kind, o["offset"], o["bytes"], encoding=o["encoding"])
    _want(where, "bytes", _is_int(o["bytes"]) and o["bytes"] > 0, "an integer > 0", o["bytes"])
    shape = o["shape"]
    ok = isinstance(shape, list) and all(_is_int(d) and d > 0 for d in shape)
    _want(where, "shape", ok, "a list of integers > 0", shape)
    fmt, layout = o["format"], o["layout"]
    if isinstance(fmt, str) and fmt.upper().startswith(("NVFP4", "MXFP4", "FP8")):
        raise V1FormatError(
            f"{where}: format {fmt!r}: upstream v1 defines no FP4/FP8 format, and the layout of nvfp4 v1 files "
            "is not known yet; this file cannot be read (convert the checkpoint with --profile nvfp4 instead)"
        )
    _want(where, "format", isinstance(fmt, str) and fmt in V1_FORMATS, f"one of {' '.join(V1_FORMATS)}", fmt)
    _want(
        where,
        "layout",
        isinstance(layout, str) and layout in V1_LAYOUTS,
        f"one of {list(V1_LAYOUTS)}",
        layout,
    )
    formats, lo, hi, _ = V1_LAYOUTS[layout]
    if fmt not in formats:
        raise V1FormatError(f"{where}: format {fmt} cannot use layout {layout}")
    if not lo <= len(shape) <= hi:
        raise V1FormatError(f"{where}: layout {layout} needs rank {lo}..{hi}, got shape {shape}")
    return V1Object(o["name"], kind, o["offset"], o["bytes"], tuple(shape), fmt, layout)


def _check_ranges(objects: list[V1Object], payload_bytes: int) -> None:
    """Per-object checks in array order: offset >= cursor, alignment, bounds, exact encoded size."""
    cursor = 0
    for i, ob in enumerate(objects):
        where = f"objects[{i}] {ob.name!r}"
        if ob.offset < cursor:
            raise V1FormatError(
                f"{where}: offset {ob.offset} overlaps or precedes the previous object (ends {cursor})"
            )
        align = V1_LAYOUTS[ob.layout][3] if ob.layout else 1
        if ob.offset % align:
            raise V1FormatError(f"{where}: offset {ob.offset} is not {align}-byte aligned")
        end = ob.offset + ob.bytes
        if end > payload_bytes:
            raise V1FormatError(
                f"{where}: ends at payload byte {end}, past the payload's {payload_bytes} (truncated?)"
            )
        if ob.kind == "tensor":
            want = FORMATS[ob.format].encoded_size(ob.shape)
            if ob.bytes != want:
                raise V1FormatError(
                    f"{where}: bytes {ob.bytes} != {want}, the size of {ob.format} {list(ob.shape)}"
                )
        cursor = end


def parse_directory(root: Any, payload_bytes: int) -> tuple[str, list[V1Object]]:
    """Check a parsed JSON root against the v1 schema; returns (model_id, objects)."""
    _check_members("directory", root, ("model_id", "objects"))
    mid, objs = root["model_id"], root["objects"]
    _want("directory", "model_id", isinstance(mid, str) and mid != "", "a non-empty string", mid)
    _want("directory", "objects", isinstance(objs, list) and len(objs) > 0, "a non-empty list", objs)
    objects = [_parse_object(i, o) for i, o in enumerate(root["objects"])]
    seen: set[str] = set()
    for i, ob in enumerate(objects):
        if ob.name in seen:
            raise V1FormatError(f"objects[{i}] {ob.name!r}: duplicate name")
        seen.add(ob.name)
    _check_ranges(objects, payload_bytes)
    return root["model_id"], objects


class V1Container:
    """An opened upstream v1 file. Use ``V1Container.open(path)``."""

    def __init__(self, path: str, model_id: str, objects: list[V1Object], payload_offset: int, size: int):
        self.path, self.model_id, self.objects = path, model_id, objects
        self.payload_offset, self.file_size = payload_offset, size
        self._by_name = {o.name: o for o in objects}
        n = size - payload_offset
        self._mm: np.ndarray | None = (
            np.memmap(path, dtype=np.uint8, mode="r", offset=payload_offset, shape=(n,))
            if n > 0
            else np.zeros(0, np.uint8)
        )

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> V1Container:
        p = os.fspath(path)
        try:
            size = os.stat(p).st_size
        except OSError as e:
            raise V1FormatError(f"{p}: cannot open ({e.strerror})") from None
        root, payload = _read_directory(p, size)
        try:
            model_id, objects = parse_directory(root, size - payload)
        except V1FormatError as e:
            raise V1FormatError(f"{p}: {e}") from None
        return cls(p, model_id, objects, payload, size)

    def close(self) -> None:
        """Drop this object's memory map. The mapping itself goes when the last ``raw()`` view is gone: forcing
        ``mmap.close()`` under live views would leave them dangling (a segfault on the next read)."""
        self._mm = None

    def __enter__(self) -> V1Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def entry(self, name: str) -> V1Object:
        try:
            return self._by_name[name]
        except KeyError:
            raise V1FormatError(f"{self.path}: no object named {name!r}") from None

    def tensor_names(self) -> list[str]:
        return [o.name for o in self.objects if o.kind == "tensor"]

    def resource_names(self) -> list[str]:
        return [o.name for o in self.objects if o.kind == "resource"]

    def raw(self, name: str) -> np.ndarray:
        """The object's bytes as a read-only uint8 view of the memory map."""
        o = self.entry(name)
        if self._mm is None:
            raise V1FormatError(f"{self.path}: the artifact is closed")
        return self._mm[o.offset : o.offset + o.bytes]

    def _tensor(self, name: str) -> V1Object:
        o = self.entry(name)
        if o.kind != "tensor":
            raise V1FormatError(f"{self.path}: {name!r} is a resource, not a tensor")
        return o

    def decode(self, name: str) -> np.ndarray:
        o = self._tensor(name)
        try:
            return FORMATS[o.format].decode(self.raw(name), o.shape)
        except FormatError as e:
            raise V1FormatError(f"{self.path}: tensor {name!r}: {e}") from None

    def decode_rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` of the ``[prod(shape[:-1]), shape[-1]]`` view, float32 (I32: int32)."""
        o = self._tensor(name)
        try:
            return FORMATS[o.format].decode_rows(self.raw(name), o.shape, r0, r1)
        except FormatError as e:
            raise V1FormatError(f"{self.path}: tensor {name!r}: {e}") from None

    def resource(self, name: str) -> bytes:
        o = self.entry(name)
        if o.kind != "resource":
            raise V1FormatError(f"{self.path}: {name!r} is a tensor, not a resource")
        return bytes(self.raw(name))
