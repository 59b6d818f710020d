"""Argument checks shared by the kernel wrappers.

Activations are float32 or bf16; CuPy has no bf16 dtype, so bf16 arrays are ``uint16`` arrays of raw bf16 words
(``ninfer.formats.bf16_encode`` / ``bf16_decode`` convert on the host). Every wrapper checks shapes, dtypes and
strides up front and raises :class:`KernelError` naming the argument, never a launch failure.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ninfer.cuda.loader import KernelError

__all__ = [
    "F16Rows",
    "KernelError",
    "MadeF16Rows",
    "act_type",
    "array_module",
    "arrival_counters",
    "stream_buffer",
    "check_array",
    "check_rows",
    "dev_int32",
    "f16_rows_checked",
    "grid_1d",
    "ACT_DTYPES",
    "matrix_args",
    "matrix_out",
]

# activation dtype -> C++ type name used in the template instances
ACT_DTYPES = {np.dtype(np.float32): "float", np.dtype(np.uint16): "bf16"}


def act_type(a: Any, name: str) -> str:
    """C++ element type of an activation array (float32 -> ``float``, uint16 bf16 words -> ``bf16``)."""
    t = ACT_DTYPES.get(np.dtype(a.dtype))
    if t is None:
        raise KernelError(f"{name}: activations must be float32 or uint16 (bf16 words), got {a.dtype}")
    return t


def check_array(
    a: Any,
    name: str,
    *,
    dtype: Any = None,
    shape: Sequence[int | None] | None = None,
    contiguous: bool = True,
) -> None:
    """``a`` is a CuPy array of ``dtype`` whose shape matches ``shape`` (None entries match anything).

    Runs ~20 times per layer of an eager prefill chunk (perf/profile_host.py), so the passing case is kept short:
    ``a.dtype != dtype`` (a NumPy dtype compares with any dtype-like as ``np.dtype(dtype)`` would) and one tuple
    comparison when ``shape`` has no None entry; the per-entry walk only when that comparison fails."""
    import cupy

    if not isinstance(a, cupy.ndarray):
        raise KernelError(f"{name}: expected a cupy.ndarray on the device, got {type(a).__name__}")
    if dtype is not None and a.dtype != dtype:
        raise KernelError(f"{name}: dtype must be {np.dtype(dtype)}, got {a.dtype}")
    if shape is not None and a.shape != shape:
        have = a.shape
        bad = len(have) != len(shape)
        if not bad:
            for s, d in zip(shape, have, strict=True):
                if s is not None and s != d:
                    bad = True
                    break
        if bad:
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise KernelError(f"{name}: shape must be {want}, got {list(have)}")
    if contiguous and not a.flags.c_contiguous:
        raise KernelError(f"{name}: must be C-contiguous")


def check_rows(a: Any, name: str, cols: int | None = None, *, vec8: bool = False) -> tuple[int, int, int]:
    """A 2-D activation with unit column stride: (rows, cols, row stride in elements).

    ``vec8``: the kernel reads 8 consecutive elements with one vector load, so the base pointer must be 16-byte
    aligned and the row stride and width multiples of 8 elements.
    """
    import cupy

    if not isinstance(a, cupy.ndarray):
        raise KernelError(f"{name}: expected a cupy.ndarray on the device, got {type(a).__name__}")
    shape = a.shape
    if len(shape) != 2:
        raise KernelError(f"{name}: must be 2-D [rows, cols], got shape {list(shape)}")
    rows, width = shape
    if cols is not None and width != cols:
        raise KernelError(f"{name}: needs {cols} columns, got shape {list(shape)}")
    item = a.dtype.itemsize
    s0, s1 = a.strides
    if width > 1 and s1 != item:
        raise KernelError(f"{name}: columns must be contiguous (stride {s1} bytes)")
    if s0 % item:
        raise KernelError(f"{name}: row stride {s0} is not a whole number of elements")
    ld = s0 // item if rows > 1 else width
    if vec8 and (a.data.ptr % 16 or ld % 8 or width % 8):
        raise KernelError(f"{name}: needs 16-byte aligned rows whose width and stride are multiples of 8")
    return rows, width, ld


def dev_int32(a: Any, name: str, n: int | None = None) -> Any:
    """A contiguous int32 device vector (length ``n`` if given)."""
    check_array(a, name, dtype=np.int32, shape=None if n is None else (n,))
    return a


@functools.cache
def sm_count(device: int) -> int:
    """Streaming multiprocessors of CUDA device ``device`` (grids sized to one wave of resident blocks)."""
    import cupy

    return int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])


def grid_1d(n: int, per_block: int) -> int:
    return max(1, (n + per_block - 1) // per_block)


class _StreamBuffer:
    """A zero-initialised device buffer of one dtype for one (device, stream), shared by the launches that merge
    partial results in the launch: the arrival counters of the split-K GEMV, split-KV attention and the split argmax
    (int32; the last arrival resets its counter, so the buffer is zero again after every launch) and their partials
    (written and read within a launch). Launches on one stream never overlap, so one buffer serves them all. A grown
    buffer is a new one; the old ones stay alive because a captured CUDA graph may still point at them. Grown only
    outside stream capture (a decode graph's warm-up run allocates what its capture needs)."""

    def __init__(self, dtype: np.dtype) -> None:
        self._dtype = dtype
        self._bufs: list[Any] = []

    def get(self, n: int) -> Any:
        import cupy

        if not self._bufs or self._bufs[-1].size < n:
            size = max(n, 1 << 16, 2 * (self._bufs[-1].size if self._bufs else 0))
            nbytes = size * self._dtype.itemsize
            mem = cupy.cuda.Memory(nbytes)  # plain cudaMalloc, outside any pool or graph
            cupy.cuda.runtime.memset(mem.ptr, 0, nbytes)
            self._bufs.append(cupy.ndarray((size,), self._dtype, cupy.cuda.MemoryPointer(mem, 0)))
        return self._bufs[-1]


@functools.cache
def _stream_buffer(device: int, stream: int, dtype: str, tag: str) -> _StreamBuffer:
    return _StreamBuffer(np.dtype(dtype))


def stream_buffer(n: int, dtype: Any, tag: str = "") -> Any:
    """At least ``n`` elements of this device's and stream's shared ``dtype`` buffer (see ``_StreamBuffer``);
    ``tag`` names a separate buffer, for state that must survive other kernels' launches between its own."""
    import cupy

    dev, stream = cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr
    return _stream_buffer(dev, stream, np.dtype(dtype).str, tag).get(n)


def arrival_counters(n: int) -> Any:
    """At least ``n`` zeroed int32 arrival counters for the current device and stream (see ``_StreamBuffer``)."""
    return stream_buffer(n, np.int32)


def array_module(a: Any) -> Any:
    """numpy or cupy, whichever holds ``a`` (cupy only if something already imported it: host code stays CPU-only)."""
    import sys

    cupy = sys.modules.get("cupy")
    return cupy.get_array_module(a) if cupy is not None else np


def matrix_args(x: Any, w: Any, out: Any, what: str) -> tuple[str, int, int, int]:
    """A product's activations ``x[M, K]`` (float32 or bf16, row stride a multiple of 8) against a DeviceWeight
    of K columns (K % 8 == 0): (activation type, M, K, row stride). The weight is recognised by its planes and
    columns (importing ninfer.cuda.weights here would close an import cycle through nvfp4_layout)."""
    if not (hasattr(w, "planes") and hasattr(w, "cols")):
        raise KernelError(f"{what}: w must be a DeviceWeight, got {type(w).__name__}")
    t = act_type(x, "x")
    m, k, ldx = check_rows(x, "x", w.cols, vec8=True)
    if k % 8:
        raise KernelError(f"{what}: K={k} must be a multiple of 8")
    return t, m, k, ldx


class F16Rows(NamedTuple):
    """A float32 activation ``[T, K]`` already in the fp16 GEMM mode's input form (docs/cuda.md "Prefill GEMM
    inputs"): ``xh`` uint16 ``[T, K]`` fp16 words (contiguous rows) = each row times 2^k rounded to fp16, ``rowf``
    float32 ``[T]`` = 2^-k; what split_f16row makes of the float rows, written by the norm that produced them
    (norm.rmsnorm(..., f16=True)). Only an fp16-mode GEMM reads it (gemm.gemm)."""

    xh: Any
    rowf: Any

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.xh.shape[0]), int(self.xh.shape[1]))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)


class MadeF16Rows(F16Rows):
    """``F16Rows`` whose arrays a wrapper here allocated or sliced from the row scratch itself (``xh`` contiguous
    uint16 ``[T, K]``, ``rowf`` float32 ``[T]``, by construction): the GEMM wrappers that read it skip the shape and
    dtype checks an ``F16Rows`` built elsewhere gets (two ``check_array`` per fp16-mode GEMM of an eager chunk)."""

    __slots__ = ()


def f16_rows_checked(x: F16Rows, m: int, k: int) -> None:
    """``x`` holds ``m`` fp16 rows of ``k`` words and their ``m`` factors (checked unless a wrapper made it)."""
    if type(x) is not MadeF16Rows:
        check_array(x.xh, "xh", dtype=np.uint16, shape=(m, k))
        check_array(x.rowf, "rowf", dtype=np.float32, shape=(m,))


def matrix_out(x: Any, out: Any, rows: int, n: int) -> tuple[Any, int]:
    """The output ``[rows, n]`` of ``x``'s dtype (allocated when ``out`` is None, else checked) and its row stride.
    An array allocated here is contiguous ``[rows, n]`` by construction, so only a caller's ``out`` is checked."""
    import cupy

    if out is None:
        return cupy.empty((rows, n), dtype=x.dtype), n
    if out.dtype != x.dtype:
        raise KernelError(f"out: dtype {out.dtype} differs from x ({x.dtype})")
    _, _, ld = check_rows(out, "out", n)
    if out.shape[0] != rows:
        raise KernelError(f"out: needs {rows} rows, got {out.shape[0]}")
    return out, ld


# ---- the 16-row tiling of the device layouts (nvfp4_layout.py, qg64_layout.py) ----
GROUP = 16


def padded_rows(rows: int) -> int:
    return -(-rows // GROUP) * GROUP


def tile_rows(xp: Any, plane: Any, rows: int, tb: int, inverse: bool) -> Any:
    """Rows x (tiles x tb) bytes <-> the tiled order (rows padded to 16; ``inverse`` drops the padding)."""
    pr = padded_rows(rows)
    nt = plane.size // (rows if not inverse else pr) // tb
    if inverse:
        nat = plane.reshape(pr // GROUP, nt, GROUP, tb).transpose(0, 2, 1, 3)
        return xp.ascontiguousarray(nat).reshape(pr, nt * tb)[:rows].reshape(-1)
    full = xp.zeros((pr, nt * tb), dtype=np.uint8)
    full[:rows] = plane.reshape(rows, nt * tb)
    return xp.ascontiguousarray(full.reshape(pr // GROUP, GROUP, nt, tb).transpose(0, 2, 1, 3)).reshape(-1)
