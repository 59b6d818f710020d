"""The ``.ninfer`` container (docs/formats.md §6): 128-byte header, sorted compact JSON manifest, 256-byte aligned
blobs readable with ``numpy.memmap``.

Header (little-endian):
    0   magic b"NINFPY\\0\\x01"
    8   u32 header_bytes = 128, u32 flags = 0
    16  u64 manifest_offset = 128, u64 manifest_bytes
    32  u64 data_offset = align_up(128 + manifest_bytes, 4096), u64 data_bytes = filesize - data_offset
    48  sha256(manifest bytes)
    80  reserved zeros
Blob offsets are relative to ``data_offset``; blobs are in offset order, 256-aligned, and the last ends at EOF.
``digest.content`` is sha256 over the ordered blob digests (tensors then resources): the artifact's identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer.formats import align_up

__all__ = [
    "MAGIC",
    "ArtifactError",
    "TensorSpec",
    "write_container",
    "check_output_path",
    "read_header",
    "align_up",
    "HEADER_BYTES",
    "content_digest",
]

MAGIC = b"NINFPY\x00\x01"
HEADER_BYTES = 128
BLOB_ALIGN = 256
DATA_ALIGN = 4096
_HEADER = struct.Struct("<8sIIQQQQ32s48s")
assert _HEADER.size == HEADER_BYTES


class ArtifactError(ValueError):
    """A file that is not a valid, intact, registered .ninfer artifact. The message names what is wrong."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor to write: canonical name, format id, shape and its encoded bytes."""

    name: str
    format: str
    layout: str
    shape: tuple[int, ...]
    data: bytes | np.ndarray  # encoded bytes (uint8 array or bytes)


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def write_container(
    path: str | os.PathLike[str],
    manifest_base: dict[str, Any],
    tensors: Iterable[tuple[str, str, str, tuple[int, ...], int]],
    blobs: Iterator[bytes | np.ndarray],
    resources: dict[str, tuple[str, str, bytes]],
) -> dict[str, Any]:
    """Write an artifact in one streaming pass; returns the final manifest.

    ``tensors`` lists (name, format, layout, shape, nbytes) in write order and ``blobs`` yields their encoded
    bytes in the same order, one at a time (so a converter never holds more than one encoded tensor).
    ``resources`` maps name -> (role, media_type, bytes). The manifest's hashes are fixed-width hex, so the
    manifest planned with placeholder hashes has exactly the final length and the data offset is known up front.
    """
    check_output_path(path)
    tensor_entries: list[dict[str, Any]] = []
    cursor = 0
    for name, fmt, layout, shape, nbytes in tensors:
        tensor_entries.append(
            dict(
                name=name,
                format=fmt,
                layout=layout,
                shape=list(shape),
                offset=cursor,
                nbytes=nbytes,
                sha256="0" * 64,
            )
        )
        cursor = align_up(cursor + nbytes, BLOB_ALIGN)
    resource_entries: list[dict[str, Any]] = []
    for name, (role, media_type, data) in resources.items():
        resource_entries.append(
            dict(
                name=name,
                role=role,
                media_type=media_type,
                offset=cursor,
                nbytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
            )
        )
        cursor = align_up(cursor + len(data), BLOB_ALIGN)
    manifest = dict(manifest_base)
    manifest.update(
        container="ninfer-py",
        container_version=1,
        tensors=tensor_entries,
        resources=resource_entries,
        digest=dict(algo="sha256", content="0" * 64),
    )
    planned_len = len(_manifest_bytes(manifest))
    data_offset = align_up(HEADER_BYTES + planned_len, DATA_ALIGN)
    tmp = f"{os.fspath(path)}.partial"
    try:
        with open(tmp, "wb") as f:
            end = _write_blobs(f, data_offset, tensor_entries, blobs, resource_entries, resources)
            manifest["digest"]["content"] = content_digest(manifest)
            mbytes = _manifest_bytes(manifest)
            if len(mbytes) != planned_len:  # invariant: hashes are fixed width
                raise AssertionError("manifest length changed between plan and write")
            f.seek(0)
            f.write(_header(mbytes, data_offset, end))
            f.write(mbytes)
        os.replace(tmp, path)
    except BaseException:  # a failed source, encoder or disk, or Ctrl-C: no half-written file is left behind
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return manifest


def check_output_path(path: str | os.PathLike[str]) -> None:
    """Refuse, before anything is read or written, an output path that cannot become the artifact's file: an
    existing directory, or one in a directory that does not exist."""
    p = os.fspath(path)
    if os.path.isdir(p):
        example = os.path.join(p, "model.ninfer")
        raise ArtifactError(f"{p}: is a directory; give the artifact's file path (e.g. {example})")
    parent = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(parent):
        raise ArtifactError(f"{p}: the directory {parent} does not exist")


def _write_blobs(
    f: Any,
    data_offset: int,
    tensor_entries: list[dict[str, Any]],
    blobs: Iterator[bytes | np.ndarray],
    resource_entries: list[dict[str, Any]],
    resources: dict[str, tuple[str, str, bytes]],
) -> int:
    """Every tensor (hashed into its entry) and resource at its offset; returns where the data ends."""
    f.truncate(data_offset)
    f.seek(data_offset)
    end = 0
    for entry in tensor_entries:
        blob = next(blobs)
        buf = memoryview(blob if isinstance(blob, bytes) else np.ascontiguousarray(blob).view(np.uint8))
        if buf.nbytes != entry["nbytes"]:
            raise ArtifactError(
                f"tensor {entry['name']}: encoder produced {buf.nbytes} bytes, layout says {entry['nbytes']}"
            )
        end = _write_at(f, data_offset, entry["offset"], buf)
        entry["sha256"] = hashlib.sha256(buf).hexdigest()
    for entry, (_, _, data) in zip(resource_entries, resources.values(), strict=True):
        end = _write_at(f, data_offset, entry["offset"], memoryview(data))
    f.truncate(data_offset + end)
    return end


def _header(mbytes: bytes, data_offset: int, data_bytes: int) -> bytes:
    return _HEADER.pack(
        MAGIC,
        HEADER_BYTES,
        0,
        HEADER_BYTES,
        len(mbytes),
        data_offset,
        data_bytes,
        hashlib.sha256(mbytes).digest(),
        b"\0" * 48,
    )


def _write_at(f: Any, data_offset: int, offset: int, buf: memoryview) -> int:
    f.seek(data_offset + offset)
    f.write(buf)
    return offset + buf.nbytes


def content_digest(manifest: dict[str, Any]) -> str:
    """``digest.content``: sha256 over the blob digests, tensors then resources, in manifest order."""
    h = hashlib.sha256()
    for e in manifest["tensors"] + manifest["resources"]:
        h.update(bytes.fromhex(e["sha256"]))
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class Header:
    manifest_offset: int
    manifest_bytes: int
    data_offset: int
    data_bytes: int
    manifest_sha256: bytes


def read_header(path: str, file_size: int) -> tuple[Header, dict[str, Any]]:
    """Read and check the header and manifest bytes; returns the header and the parsed (unchecked) manifest."""
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
        if len(raw) < HEADER_BYTES:
            raise ArtifactError(f"{path}: file is {file_size} bytes, shorter than the 128-byte header")
        magic, hbytes, flags, moff, mbytes, doff, dbytes, msha, reserved = _HEADER.unpack(raw)
        if magic != MAGIC:
            if magic[:6] == b"NINFER":
                raise ArtifactError(f"{path}: upstream v1 container, not a ninfer-py artifact")
            raise ArtifactError(f"{path}: not a .ninfer artifact (bad magic {magic!r})")
        if hbytes != HEADER_BYTES or moff != HEADER_BYTES:
            raise ArtifactError(f"{path}: header: header_bytes/manifest_offset must be 128")
        if flags != 0:
            raise ArtifactError(f"{path}: header: unknown flags 0x{flags:08x}")
        if any(reserved):
            raise ArtifactError(f"{path}: header: reserved bytes are not zero")
        if doff != align_up(HEADER_BYTES + mbytes, DATA_ALIGN):
            raise ArtifactError(f"{path}: header: data_offset {doff} inconsistent with manifest size")
        if doff + dbytes != file_size:
            raise ArtifactError(
                f"{path}: file is {file_size} bytes but the header says {doff + dbytes} "
                f"(truncated or extended file)"
            )
        mraw = f.read(mbytes)
    if len(mraw) != mbytes or hashlib.sha256(mraw).digest() != msha:
        raise ArtifactError(f"{path}: manifest is corrupt (SHA-256 mismatch)")
    try:
        manifest = json.loads(mraw.decode("utf-8"))  # UTF-8 only (json.loads on bytes would guess)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path}: manifest is not valid JSON: {e}") from None
    return Header(moff, mbytes, doff, dbytes, msha), manifest
