"""Embedding gather from a stored-format table (cuda_src/embedding.cu)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, check_array
from ninfer.cuda.loader import kernel
from ninfer.cuda.weights import FORMAT_STRUCTS, DeviceWeight

__all__ = ["embed", "SOURCES"]

SOURCES: dict[str, tuple[str, ...]] = {
    "embedding.cu": tuple(f"embed<{f}, {t}>" for f in FORMAT_STRUCTS.values() for t in ("float", "bf16"))
}


def embed(table: DeviceWeight, ids: Any, dtype: Any = np.float32, out: Any = None) -> Any:
    """Rows ``table[ids]`` as ``[T, H]`` float32 or bf16 words (uint16). An id outside the table gives NaNs."""
    import cupy

    if not isinstance(table, DeviceWeight):
        raise KernelError(f"embed: table must be a DeviceWeight, got {type(table).__name__}")
    check_array(ids, "ids", dtype=np.int32, shape=(None,))
    h = table.cols
    if h % 8:
        raise KernelError(f"embed: hidden size {h} must be a multiple of 8")
    t = {np.dtype(np.float32): "float", np.dtype(np.uint16): "bf16"}.get(np.dtype(dtype))
    if t is None:
        raise KernelError(f"embed: dtype must be float32 or uint16 (bf16), got {np.dtype(dtype)}")
    if out is None:
        out = cupy.empty((ids.shape[0], h), dtype=dtype)
    check_array(out, "out", dtype=dtype, shape=(ids.shape[0], h))
    if ids.shape[0]:
        fn = kernel("embedding.cu", SOURCES["embedding.cu"], f"embed<{table.struct}, {t}>")
        p0, p1, p2 = table.planes()
        fn((ids.shape[0],), (128,), (p0, p1, p2, ids, out, np.int32(table.rows), np.int32(h), np.int64(h)))
    return out
