"""A minimal memory-mapped reader of safetensors files (numpy only: bf16 widened to float32 on read)."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

from ninfer.formats import bf16_decode

__all__ = ["SafetensorsDir", "CheckpointError"]

_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be converted; the message names the file or tensor."""


class _File:
    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise CheckpointError(f"{path}: not a safetensors file")
            (n,) = struct.unpack("<Q", head)
            try:
                self.header: dict[str, Any] = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{path}: corrupt safetensors header: {e}") from None
        self.header.pop("__metadata__", None)
        self.base = 8 + n
        self._map: np.memmap | None = None

    def array(self, name: str, rows: slice | None = None) -> np.ndarray:
        """The tensor (or rows ``rows`` of its first axis, reading only those) widened to float32."""
        e = self.header[name]
        if e["dtype"] not in _DTYPES:
            raise CheckpointError(f"{self.path}: tensor {name!r} has unsupported dtype {e['dtype']}")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        a, b = e["data_offsets"]
        raw = self._map[self.base + a : self.base + b]
        x = raw.view(_DTYPES[e["dtype"]]).reshape(e["shape"])
        if rows is not None:
            x = x[rows]
        if e["dtype"] == "BF16":
            return bf16_decode(x)
        return x.astype(np.float32) if x.dtype.kind == "f" else x


class SafetensorsDir:
    """All ``*.safetensors`` shards of a checkpoint directory, indexed by tensor name."""

    def __init__(self, directory: str) -> None:
        files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
        if not files:
            raise CheckpointError(f"{directory}: no .safetensors files")
        self._where: dict[str, _File] = {}
        for fn in files:
            sf = _File(os.path.join(directory, fn))
            for name in sf.header:
                if name in self._where:
                    raise CheckpointError(f"{directory}: tensor {name!r} appears in two shards")
                self._where[name] = sf

    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name].header[name]["shape"])

    def dtype(self, name: str) -> str:
        return self._where[name].header[name]["dtype"]

    def get(self, name: str) -> np.ndarray:
        return self._where[name].array(name)

    def get_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of the tensor's first axis as float32, reading only those bytes."""
        return self._where[name].array(name, slice(start, stop))

    def stacked_shape(self, name: str, groups: list[list[str]]) -> tuple[int, ...]:
        """Shape of ``stacked(groups)`` read from the headers; every group must hold parts of the same shapes."""
        shapes = {tuple(self.shape(n) for n in g) for g in groups}
        if len(shapes) != 1:
            raise CheckpointError(f"{name}: experts differ in shape")
        first = shapes.pop()
        return (len(groups), sum(s[0] for s in first), first[0][1])

    def stacked(self, groups: list[list[str]]) -> np.ndarray:
        """``[len(groups), rows, K]``: each group's tensors concatenated along rows (an expert's gate, up), stacked."""
        return np.stack([np.concatenate([self.get(n) for n in g], axis=0) for g in groups])
