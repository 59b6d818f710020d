"""Shared pieces of the weight formats: the error type, the ``Format`` interface and argument checks.

Every format maps a float32 tensor of a given shape to a byte string whose size is a pure function of
(format, shape). Grouped/block/row formats quantize along the last axis and treat a tensor of rank > 2 as
``prod(shape[:-1])`` rows of ``shape[-1]`` columns (MoE expert tensors ``[E, N, K]`` are ``E*N`` rows).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["FormatError", "Format", "align_up", "Buffer"]

Buffer = bytes | bytearray | memoryview | np.ndarray

# Encoders work on row chunks of about this many float32 elements so temporaries stay bounded
# (a 248320 x 5120 embedding would otherwise need several 5 GB intermediates).
CHUNK_ELEMS = 1 << 22


def padded_row_chunks(x2: np.ndarray, kpad: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, float32 [n, kpad])`` chunks of the rows of ``x2[N, K]``, zero padded to ``kpad`` columns;
    about ``CHUNK_ELEMS`` values each, so an encoder's temporaries stay bounded."""
    rows, cols = x2.shape
    step = max(1, CHUNK_ELEMS // kpad)
    for a in range(0, rows, step):
        blk = np.zeros((min(step, rows - a), kpad), dtype=np.float32)
        blk[:, :cols] = x2[a : a + step]
        yield a, blk


class FormatError(ValueError):
    """Bad input to a format: wrong size, wrong shape, non-finite values, illegal codes."""


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class Format(ABC):
    """One weight format identity: ``id`` (e.g. ``Q4G64_F16S``) stored under layout ``layout``."""

    id: str
    layout: str
    min_rank: int = 0  # direct formats accept scalars; row formats need rank >= 2

    # ---- interface ----------------------------------------------------------------------------------
    @abstractmethod
    def encoded_size(self, shape: Sequence[int]) -> int:
        """Exact byte size of a tensor of ``shape`` in this format."""

    @abstractmethod
    def encode(self, x: np.ndarray, shape: Sequence[int] | None = None) -> np.ndarray:
        """Encode ``x`` (cast to float32, reshaped to ``shape`` if given) into a 1-D uint8 array."""

    def decode(self, buf: Buffer, shape: Sequence[int]) -> np.ndarray:
        """Decode ``encoded_size(shape)`` bytes into a float32 array of ``shape`` (every row of the row view)."""
        rows, _ = self.rows_cols(shape)
        return np.ascontiguousarray(self.decode_rows(buf, shape, 0, rows)).reshape(self.check_shape(shape))

    @abstractmethod
    def decode_rows(self, buf: Buffer, shape: Sequence[int], r0: int, r1: int) -> np.ndarray:
        """Decode rows ``[r0, r1)`` of the ``[prod(shape[:-1]), shape[-1]]`` row view -> float32 ``[r1-r0, K]``."""

    def __repr__(self) -> str:
        return f"<Format {self.id} layout={self.layout}>"

    # ---- argument checks shared by the implementations -----------------------------------------------
    def check_shape(self, shape: Sequence[int] | None) -> tuple[int, ...]:
        if shape is None:
            raise FormatError(f"{self.id}: a shape is required")
        try:
            dims = tuple(shape)
        except TypeError:
            raise FormatError(f"{self.id}: shape must be a sequence of ints, got {shape!r}") from None
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, int | np.integer) or d <= 0:
                raise FormatError(f"{self.id}: shape {list(dims)} must hold positive integers")
        if len(dims) < self.min_rank:
            raise FormatError(f"{self.id}: needs a tensor of rank >= {self.min_rank}, got shape {list(dims)}")
        return tuple(int(d) for d in dims)

    def rows_cols(self, shape: Sequence[int]) -> tuple[int, int]:
        """(rows, cols) of the row view; rank-0/1 tensors are one row."""
        dims = self.check_shape(shape)
        cols = dims[-1] if dims else 1
        return math.prod(dims) // cols, cols

    def as_input(self, x: np.ndarray, shape: Sequence[int] | None, dtype: type = np.float32) -> np.ndarray:
        """``x`` as a C-contiguous array of ``dtype`` reshaped to ``shape`` (default: its own shape)."""
        arr = np.asarray(x)
        dims = self.check_shape(arr.shape if shape is None else shape)
        if arr.size != math.prod(dims):
            raise FormatError(f"{self.id}: input of shape {list(arr.shape)} does not fit shape {list(dims)}")
        if arr.dtype.kind not in "fiub":
            raise FormatError(f"{self.id}: cannot encode an array of dtype {arr.dtype}")
        return np.ascontiguousarray(arr, dtype=dtype).reshape(dims)

    def check_finite(self, x: np.ndarray) -> None:
        if not np.isfinite(x).all():
            bad = np.argwhere(~np.isfinite(x))[0]
            raise FormatError(
                f"{self.id}: non-finite input value {x[tuple(bad)]} at index {bad.tolist()} cannot be quantized"
            )

    def as_bytes(self, buf: Buffer, shape: Sequence[int]) -> np.ndarray:
        """The encoded buffer as a 1-D uint8 view, checked against ``encoded_size(shape)``."""
        if isinstance(buf, np.ndarray):
            arr = buf.reshape(-1) if buf.dtype == np.uint8 else buf.reshape(-1).view(np.uint8)
        else:
            arr = np.frombuffer(buf, dtype=np.uint8)
        want = self.encoded_size(shape)
        if arr.size != want:
            raise FormatError(f"{self.id}: shape {list(shape)} needs {want} bytes, got {arr.size}")
        return arr

    def check_row_range(self, shape: Sequence[int], r0: int, r1: int) -> tuple[int, int]:
        if len(self.check_shape(shape)) < 1:
            raise FormatError(f"{self.id}: a scalar has no rows")
        rows, cols = self.rows_cols(shape)
        if not (0 <= r0 <= r1 <= rows):
            raise FormatError(f"{self.id}: row range [{r0}, {r1}) outside 0..{rows} of shape {list(shape)}")
        return rows, cols
