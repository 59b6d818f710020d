"""TMA tensor maps (``CUtensorMap``) for the warp-specialized fp16 GEMM (cuda_src/gemm_sm90_ws.cu): CuPy does not
wrap ``cuTensorMapEncodeTiled``, so it is called through ctypes from libcuda into a 64-byte-aligned 128-byte host
buffer, which the launch passes by value (``launch.launch_ex``, a ``const __grid_constant__`` kernel parameter).

The map of an operand ``[rows, K]`` of 16-bit words (row stride ``ld`` elements) describes boxes of 64 k (128
bytes: one SW128 row) by ``box_rows`` rows, 128B-swizzled, zero-filled out of bounds: a box at (k0, r0) lands in
shared memory as row r (r0 + r) at bytes [128 r, 128 r + 128) with its 16-byte chunk c (k0 + 8c ..) at chunk
position c ^ (r % 8): the "SW128 K-major" layout of cuda_src/wgmma.cuh that the wgmma descriptors read, given a
1024-byte-aligned destination. :func:`map_params` is the pure description (checked on the CPU by
tests/test_gemm_ws_host.py, which emulates the box copy from it); :func:`encode` hands it to the driver.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, NamedTuple

from ninfer.cuda.loader import KernelError

__all__ = ["MapParams", "map_params", "scale_map_params", "encode", "TensorMap", "BOX_K", "SWIZZLE_128B"]

BOX_K = 64  # k per box: 64 x 2 bytes = the 128-byte swizzle span (GS_BK)
_DTYPE_FLOAT16 = 6  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16 (zero fill is +0.0 = word 0, as cp.async's)
DTYPE_FLOAT32 = 7  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32 (the group scales)
SWIZZLE_NONE = 0  # CU_TENSOR_MAP_SWIZZLE_NONE
SCALE_BOX_N = 128  # the group kernel's columns per tile (WSG_BN)
_INTERLEAVE_NONE = 0
SWIZZLE_128B = 3  # CU_TENSOR_MAP_SWIZZLE_128B
_L2_256B = 3  # CU_TENSOR_MAP_L2_PROMOTION_L2_256B (not tuned on a GPU)
_OOB_FILL_NONE = 0  # out-of-bounds elements read as zeros


class MapParams(NamedTuple):
    """cuTensorMapEncodeTiled's arguments for a 2-D fp16 operand (innermost dimension first), or a float32 one
    (``dtype``: the group scales of :func:`scale_map_params`)."""

    dims: tuple[int, int]  # (K, rows) elements
    strides: tuple[int]  # bytes between consecutive rows (the dimension-0 stride is implicit: the element's)
    box: tuple[int, int]  # (64, box_rows)
    elem_strides: tuple[int, int]
    swizzle: int
    dtype: int = _DTYPE_FLOAT16


def map_params(rows: int, k: int, ld: int, box_rows: int) -> MapParams:
    """The tensor map of ``[rows, k]`` 16-bit words with row stride ``ld`` elements, boxes of 64 x ``box_rows``.
    TMA's constraints: row stride a multiple of 16 bytes (``ld % 8 == 0``), box dimensions at most 256."""
    if rows < 1 or k < 1 or ld < k or ld % 8 or not 1 <= box_rows <= 256:
        raise KernelError(f"tensor map: rows={rows} k={k} ld={ld} box_rows={box_rows}")
    return MapParams((k, rows), (2 * ld,), (BOX_K, box_rows), (1, 1), SWIZZLE_128B)


def scale_map_params(groups: int, n: int, gpt: int) -> MapParams:
    """The map of the group kernel's scales, float32 ``[groups, n]`` (group-major: row g holds group g's scale of
    every weight row): boxes of 128 columns by ``gpt`` groups (a K tile's), unswizzled, so a box lands as ``gpt``
    rows of 128 floats (512 bytes each). TMA: the row stride (4 n bytes) a multiple of 16."""
    if groups < 1 or n < 1 or n % 4 or gpt not in (1, 2):
        raise KernelError(f"scale map: groups={groups} n={n} gpt={gpt}")
    return MapParams((n, groups), (4 * n,), (SCALE_BOX_N, gpt), (1, 1), SWIZZLE_NONE, DTYPE_FLOAT32)


class TensorMap:
    """A ``CUtensorMap``: 128 bytes at a 64-byte-aligned address inside an owned ctypes buffer. ``arg`` is the
    kernel argument (a ctypes array at that address; launch_ex passes its address as the parameter's value)."""

    def __init__(self) -> None:
        self._buf = (ctypes.c_ubyte * 192)()
        off = -ctypes.addressof(self._buf) % 64
        self.arg = (ctypes.c_ubyte * 128).from_buffer(self._buf, off)


@functools.cache
def _encoder() -> Any:
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]  # fmt: skip
    fn.restype = ctypes.c_int
    return fn


def encode(ptr: int, p: MapParams) -> TensorMap:
    """Encode ``p`` for the device address ``ptr`` (16-byte aligned)."""
    if ptr % 16:
        raise KernelError(f"tensor map: base address {ptr:#x} is not 16-byte aligned")
    tm = TensorMap()
    rc = _encoder()(
        ctypes.addressof(tm.arg), p.dtype, 2, ctypes.c_void_p(ptr),
        (ctypes.c_uint64 * 2)(*p.dims), (ctypes.c_uint64 * 1)(*p.strides), (ctypes.c_uint32 * 2)(*p.box),
        (ctypes.c_uint32 * 2)(*p.elem_strides), _INTERLEAVE_NONE, p.swizzle, _L2_256B, _OOB_FILL_NONE,
    )  # fmt: skip
    if rc != 0:
        raise KernelError(f"cuTensorMapEncodeTiled failed with CUresult {rc} ({p})")
    return tm
