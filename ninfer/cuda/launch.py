"""Kernel launches with programmatic dependent launch (PDL, Hopper): ``cuLaunchKernelEx`` through ctypes, since
CuPy's ``RawKernel.__call__`` takes no launch attributes.

A kernel launched here may start while the kernel before it in the stream is still running: its blocks become
resident as soon as the previous grid has triggered (``griddepcontrol.launch_dependents``, common.cuh
``pdl_trigger``) or finished, do the work that depends on nothing the previous kernel writes (the decode GEMV
issues its first weight tiles), then ``griddepcontrol.wait`` (``pdl_wait``), which returns once the previous grid
has completed and its writes are visible. So every kernel launched here MUST call ``pdl_wait`` before it reads
anything an earlier kernel writes, and before it writes anything an earlier kernel reads. Inside stream capture the
attribute becomes a programmatic edge of the CUDA graph (CUDA >= 12.3), so graph-replayed decode steps keep it.
The arithmetic is the kernel's own: the attribute changes when a kernel starts, never what it computes.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ninfer.cuda.loader import KernelError

__all__ = ["capturing", "launch", "launch_ex", "launch_pdl"]

_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("flag", ctypes.c_int)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attr)),
        ("num_attrs", ctypes.c_uint),
    ]


@functools.cache
def _driver() -> Any:
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuLaunchKernelEx
    fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_SCALARS = {
    np.int32: ctypes.c_int32,
    np.int64: ctypes.c_int64,
    np.uint32: ctypes.c_uint32,
    np.uint64: ctypes.c_uint64,
    np.float32: ctypes.c_float,
}


def _c_arg(a: Any) -> Any:
    """One kernel argument as the ctypes value the kernel's parameter expects (a dict lookup, not
    ``np.ctypeslib``: this runs ~20 times per eager launch)."""
    ct = _SCALARS.get(type(a))
    if ct is not None:
        return ct(a)
    if isinstance(a, ctypes.Array):  # a by-value struct parameter (tensor_map.TensorMap.arg): its bytes as is
        return a
    ptr = getattr(getattr(a, "data", None), "ptr", None)
    if ptr is None:
        raise KernelError(f"launch_pdl: unsupported kernel argument {type(a).__name__}")
    return ctypes.c_void_p(ptr)


def capturing() -> bool:
    """Whether the current CuPy stream is capturing a CUDA graph. PDL pays off in replayed graphs; an eager launch
    through ctypes costs more host time than the overlap saves (measured: eager 27B decode 33 -> 17 tok/s)."""
    import cupy

    return cupy.cuda.runtime.streamIsCapturing(cupy.cuda.get_current_stream().ptr) != 0


def launch_pdl(
    fn: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], shared_mem: int = 0
) -> None:
    """``fn(grid, block, args, shared_mem=...)`` on the current CuPy stream with the programmatic-serialization
    attribute. Arguments: CuPy arrays (device pointers) and NumPy scalars of the kernel's parameter types."""
    launch_ex(fn, grid, block, args, shared_mem, pdl=True)


def launch_ex(
    fn: Any,
    grid: Sequence[int],
    block: Sequence[int],
    args: Sequence[Any],
    shared_mem: int = 0,
    *,
    pdl: bool = False,
) -> None:
    """``cuLaunchKernelEx`` on the current CuPy stream, with the PDL attribute only if ``pdl``. Arguments as
    :func:`launch_pdl`, plus ctypes arrays passed by value (a ``__grid_constant__`` struct parameter such as a
    ``CUtensorMap``: the driver copies the parameter's size from the array's address)."""
    import cupy

    cargs = [_c_arg(a) for a in args]
    params = (ctypes.c_void_p * len(cargs))(*[ctypes.addressof(c) for c in cargs])
    attr = _Attr(id=_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value.flag = 1
    g, b = (*grid, 1, 1)[:3], (*block, 1, 1)[:3]
    cfg = _Config(
        (ctypes.c_uint * 3)(*g),
        (ctypes.c_uint * 3)(*b),
        shared_mem,
        cupy.cuda.get_current_stream().ptr,
        ctypes.pointer(attr) if pdl else None,
        1 if pdl else 0,
    )
    func = getattr(fn, "kernel", fn).ptr  # a RawKernel's CUfunction (compiled and loaded on first use)
    rc = _driver()(ctypes.byref(cfg), func, params, None)
    if rc != 0:
        raise KernelError(f"cuLaunchKernelEx failed with CUresult {rc}")


def launch(
    fn: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], shared_mem: int = 0
) -> None:
    """A kernel that calls ``pdl_wait`` before its first dependent access: with PDL while a graph is being captured
    (decode steps), a plain CuPy launch otherwise (eager launches gain nothing from it, see ``capturing``)."""
    if capturing():
        launch_pdl(fn, grid, block, args, shared_mem)
    else:
        fn(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)
