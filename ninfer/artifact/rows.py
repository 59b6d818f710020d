"""Row access to encoded tensors whose encoding is row-local: encode, copy and gather whole rows of the byte planes.

A format is *row-local* when every byte of its encoding belongs to exactly one row of the ``[N, K]`` row view:
the contiguous formats (one plane of ``N`` rows) and the per-row scaled ones (``views()`` gives planes whose
first axis is ``N``: group-int, FP8 rows). NVFP4 (one global scale) and FP8 per-tensor are not. For a row-local
format, encoding rows ``[a, b)`` on their own gives exactly the bytes those rows have in the whole tensor's
encoding, which lets the writer stream a table larger than memory and a reader gather rows from a memory map.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from ninfer.formats import FormatError, get_format
from ninfer.formats.common import Buffer, Format

__all__ = ["row_planes", "is_row_local", "put_rows", "take_rows", "gather_rows"]


def row_planes(fmt: Format, buf: Buffer, shape: Sequence[int]) -> list[np.ndarray]:
    """The encoding of ``shape`` as per-row planes ``[N, bytes_per_row]`` (uint8 views into ``buf``)."""
    rows, _ = fmt.rows_cols(shape)
    views = getattr(fmt, "views", None)
    if views is None:  # a contiguous format: one plane
        b = fmt.as_bytes(buf, shape)
        return [b.reshape(rows, -1)]
    planes = []
    for name, v in views(buf, shape).items():
        if v.ndim == 1:  # one value per row (FP8 row scales), or a global value
            v = v.reshape(v.shape[0], 1)
        if v.ndim != 2 or v.shape[0] != rows:
            raise FormatError(f"{fmt.id}: plane {name!r} is not per row; the format is not row-local")
        planes.append(v.view(np.uint8))
    return planes


@functools.cache
def is_row_local(format_id: str) -> bool:
    fmt = get_format(format_id)
    try:
        row_planes(fmt, np.zeros(fmt.encoded_size((2, 128)), np.uint8), (2, 128))
    except FormatError:
        return False
    return True


def put_rows(fmt: Format, buf: np.ndarray, shape: Sequence[int], r0: int, chunk: np.ndarray) -> None:
    """Write the encoding of float32 rows ``chunk[n, K]`` as rows ``r0 .. r0+n`` of the encoded ``buf``."""
    enc = fmt.encode(chunk, chunk.shape)
    for dst, src in zip(row_planes(fmt, buf, shape), row_planes(fmt, enc, chunk.shape), strict=True):
        dst[r0 : r0 + chunk.shape[0]] = src


def take_rows(fmt: Format, buf: Buffer, shape: Sequence[int], rows: np.ndarray) -> np.ndarray:
    """A standalone encoded tensor ``[len(rows), K]`` holding the given rows of ``buf`` (only they are read)."""
    _, cols = fmt.rows_cols(shape)
    sub_shape = (int(rows.size), cols)
    out = np.zeros(fmt.encoded_size(sub_shape), np.uint8)
    for dst, src in zip(row_planes(fmt, out, sub_shape), row_planes(fmt, buf, shape), strict=True):
        dst[:] = src[rows]
    return out


def gather_rows(fmt: Format, buf: Buffer, shape: Sequence[int], rows: np.ndarray) -> np.ndarray:
    """Rows ``[len(rows), K]`` decoded to float32, reading only those rows' bytes (``buf`` may be a map)."""
    idx = np.asarray(rows, np.int64).reshape(-1)
    n, cols = fmt.rows_cols(shape)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise FormatError(f"{fmt.id}: row id outside [0, {n}) of shape {list(shape)}")
    if idx.size == 0:
        return np.zeros((0, cols), np.float32)
    return fmt.decode(take_rows(fmt, buf, shape, idx), (idx.size, cols))
