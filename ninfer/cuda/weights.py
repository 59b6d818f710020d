"""Weights on the device in their stored format: the encoded bytes of one tensor plus its plane offsets.

The bytes are uploaded verbatim (exactly ``ninfer.formats`` encodings / artifact blobs), except NVFP4's two planes,
which are rearranged once into the device layout (ninfer/cuda/nvfp4_layout.py), and the kernels dequantize in
place (cuda_src/wformat.cuh). Plane offsets come from the format's own ``views`` so they always agree with the
codec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ninfer.cuda.loader import KernelError

__all__ = ["DeviceWeight", "upload_weight", "plane_offsets", "FORMAT_STRUCTS", "PLANES"]

# format id -> C++ reader struct in wformat.cuh
FORMAT_STRUCTS = {
    "BF16": "FmtBF16",
    "FP8E4M3_F32ROW": "FmtFP8Row",
    "FP8E4M3_F32T": "FmtFP8Tensor",
    "NVFP4G16_E4M3S": "FmtNVFP4",
    "NVFP4G16_E4M3S_ROWG": "FmtNVFP4RowG",  # device only: fused parts with their own globals (fuse.py)
    "Q4G64_F16S": "FmtQG64<4>",
    "Q5G64_F16S": "FmtQG64<5>",
    "Q6G64_F16S": "FmtQG64<6>",
    "W8G32_F16S": "FmtW8G32",
}

# format id -> names of the planes (in ``Format.views``) passed as p0, p1, p2
PLANES: dict[str, tuple[str, ...]] = {
    "FP8E4M3_F32ROW": ("codes", "scale"),
    "FP8E4M3_F32T": ("codes", "scale"),
    "NVFP4G16_E4M3S": ("codes", "scale", "global"),
    "Q4G64_F16S": ("base", "high", "scale"),
    "Q5G64_F16S": ("base", "high", "scale"),
    "Q6G64_F16S": ("base", "high", "scale"),
    "W8G32_F16S": ("base", "high", "scale"),
}


@dataclass(frozen=True, slots=True)
class DeviceWeight:
    """A ``[rows, cols]`` row view of one stored tensor on the device (rank > 2: ``prod(shape[:-1])`` rows)."""

    fmt: str
    shape: tuple[int, ...]
    data: Any  # cupy uint8: the encoded bytes
    offsets: tuple[int, int, int]  # byte offsets of planes p0, p1, p2 in ``data``
    # the plane views and the row count, made once: a CuPy slice costs ~2 us and np.prod ~8, and an eager prefill
    # chunk asks ~500 times (perf/profile_host.py)
    _views: tuple[Any, Any, Any] = field(init=False, repr=False, compare=False)
    _rows: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_views", tuple(self.data[o:] for o in self.offsets))
        object.__setattr__(self, "_rows", int(np.prod(self.shape[:-1], dtype=np.int64)))

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def struct(self) -> str:
        return FORMAT_STRUCTS[self.fmt]

    def planes(self) -> tuple[Any, Any, Any]:
        """Device views starting at each plane (the kernel's p0, p1, p2)."""
        return self._views


def upload_weight(fmt: str, shape: tuple[int, ...], encoded: np.ndarray) -> DeviceWeight:
    """Copy one encoded tensor (``ninfer.formats`` bytes) to the device."""
    import cupy

    from ninfer.formats import get_format

    if fmt not in FORMAT_STRUCTS:
        raise KernelError(f"weight format {fmt!r} has no CUDA reader (have: {', '.join(FORMAT_STRUCTS)})")
    shape = tuple(int(d) for d in shape)
    if len(shape) < 2:
        raise KernelError(f"{fmt}: a matrix weight needs rank >= 2, got shape {list(shape)}")
    codec = get_format(fmt)
    buf = np.ascontiguousarray(np.asarray(encoded).reshape(-1).view(np.uint8))
    if buf.size != codec.encoded_size(shape):
        raise KernelError(f"{fmt} {list(shape)}: needs {codec.encoded_size(shape)} bytes, got {buf.size}")
    from ninfer.cuda.nvfp4_layout import to_device_layout

    w = DeviceWeight(fmt=fmt, shape=shape, data=cupy.asarray(buf), offsets=plane_offsets(fmt, shape, buf))
    return to_device_layout(w)


def plane_offsets(fmt: str, shape: tuple[int, ...], buf: np.ndarray) -> tuple[int, int, int]:
    """Byte offsets of planes p0, p1, p2 inside one encoded tensor ``buf`` (from the codec's own views; only the
    views' addresses are read, so ``buf`` may be any host buffer of the encoded size)."""
    from ninfer.formats import get_format

    offs = [0, 0, 0]
    if fmt in PLANES:
        views = get_format(fmt).views(buf, shape)  # type: ignore[attr-defined]
        for i, plane in enumerate(PLANES[fmt]):
            v = views[plane]
            offs[i] = v.ctypes.data - buf.ctypes.data if v.size else 0
    return offs[0], offs[1], offs[2]
