"""Kernel launches with programmatic dependent launch (PDL, Hopper) or thread-block clusters set at launch:
``cuLaunchKernelEx`` through ctypes, since CuPy's ``RawKernel.__call__`` takes no launch attributes.

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

__all__ = ["CLUSTER_PORTABLE", "capturing", "launch", "launch_ex", "launch_pdl", "max_active_clusters"]

_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID (cuda.h, CUDA 13)
_ATTR_CLUSTER_DIMENSION = 4  # CUlaunchAttributeID: value.clusterDim {x, y, z}
_FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CUfunction_attribute
CLUSTER_PORTABLE = 8  # blocks per cluster every sm_90 device runs; up to 16 needs the attribute above


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("flag", ctypes.c_int), ("dims", ctypes.c_uint * 3)]


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
def _lib() -> Any:
    return ctypes.CDLL("libcuda.so.1")


@functools.cache
def _driver() -> Any:
    """``cuLaunchKernelEx``. Every driver launch calls it through this module global, looked up at the launch
    (perf/launch_spans.py replaces it for a profiled run to time the launches that bypass a function's ``__call__``)."""
    fn = _lib().cuLaunchKernelEx
    fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def _allow_non_portable(func: int) -> None:
    """cuFuncSetAttribute(func, NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1): clusters of up to 16 blocks (sm_90); once
    per CUfunction (the cache)."""
    fn = _lib().cuFuncSetAttribute
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    rc = fn(func, _FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    if rc != 0:
        raise KernelError(f"cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) failed with CUresult {rc}")


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


def _params(args: Sequence[Any]) -> tuple[Any, list[Any]]:
    """The ``void**`` parameter array of a launch and the ctypes values it points at (the caller keeps them
    alive for the call). The scalars inline (no call per argument): a ws GEMM launch has ~12 arguments."""
    cargs = []
    for a in args:
        ct = _SCALARS.get(type(a))
        cargs.append(ct(a) if ct is not None else _c_arg(a))
    return (ctypes.c_void_p * len(cargs))(*map(ctypes.addressof, cargs)), cargs


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


# (grid, block, shared memory, stream, pdl, cluster) -> (CUlaunchConfig, its attribute array): the eager GEMM
# launches repeat a few configurations every layer, and building one costs ~3 us of ctypes (the driver copies it
# at the launch, so one object serves every launch with those values)
_CONFIGS: dict[tuple[Any, ...], tuple[_Config, Any]] = {}
_CONFIGS_MAX = 4096


def _config(
    func: int,
    grid: Sequence[int],
    block: Sequence[int],
    shared_mem: int,
    pdl: bool,
    cluster: Sequence[int] | None,
) -> tuple[_Config, Any]:
    """A ``CUlaunchConfig`` on the current CuPy stream with the PDL and cluster-dimension attributes asked for
    (clusters of more than CLUSTER_PORTABLE blocks set the function's non-portable attribute first), and the
    attribute array it points at (the caller keeps it alive for the call). Cached by those values (tuples; other
    sequences are built each time)."""
    import cupy

    stream = cupy.cuda.get_current_stream().ptr
    key = (grid, block, shared_mem, stream, pdl, cluster)
    try:
        hit = _CONFIGS.get(key)
    except TypeError:  # a list among them: not a key
        key, hit = None, None
    if cluster is not None:
        c = (*cluster, 1, 1)[:3]
        if c[0] * c[1] * c[2] > CLUSTER_PORTABLE:
            _allow_non_portable(func)  # per function (cached there)
    if hit is not None:
        return hit
    hit = _build_config(grid, block, shared_mem, stream, pdl, cluster)
    if key is not None:
        if len(_CONFIGS) >= _CONFIGS_MAX:
            _CONFIGS.clear()
        _CONFIGS[key] = hit
    return hit


def _build_config(
    grid: Sequence[int],
    block: Sequence[int],
    shared_mem: int,
    stream: int,
    pdl: bool,
    cluster: Sequence[int] | None,
) -> tuple[_Config, Any]:
    g, b = (*grid, 1, 1)[:3], (*block, 1, 1)[:3]
    if not pdl and cluster is None:  # a plain eager launch (the ws GEMMs): no attribute array
        return _Config(g, b, shared_mem, stream, None, 0), None
    attrs = (_Attr * 2)()
    n = 0
    if pdl:
        attrs[n].id, attrs[n].value.flag = _ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, 1
        n += 1
    if cluster is not None:
        attrs[n].id = _ATTR_CLUSTER_DIMENSION
        attrs[n].value.dims = (ctypes.c_uint * 3)(*(*cluster, 1, 1)[:3])
        n += 1
    return _Config(g, b, shared_mem, stream, attrs, n), attrs


def launch_ex(
    fn: Any,
    grid: Sequence[int],
    block: Sequence[int],
    args: Sequence[Any],
    shared_mem: int = 0,
    *,
    pdl: bool = False,
    cluster: Sequence[int] | None = None,
) -> None:
    """``cuLaunchKernelEx`` on the current CuPy stream, with the PDL attribute only if ``pdl`` and, with
    ``cluster`` (blocks per cluster along x, y, z; each must divide the grid's), the cluster-dimension attribute
    (clusters of more than CLUSTER_PORTABLE blocks set the function's non-portable attribute first). Arguments as
    :func:`launch_pdl`, plus ctypes arrays passed by value (a ``__grid_constant__`` struct parameter such as a
    ``CUtensorMap``: the driver copies the parameter's size from the array's address)."""
    params, _cargs = _params(args)  # _cargs: alive while params points at them
    func = getattr(fn, "kernel", fn).ptr  # a RawKernel's CUfunction (compiled and loaded on first use)
    cfg, _attrs = _config(func, grid, block, shared_mem, pdl, cluster)  # _attrs: alive while cfg points at it
    rc = _driver()(ctypes.byref(cfg), func, params, None)
    if rc != 0:
        raise KernelError(f"cuLaunchKernelEx failed with CUresult {rc}")


def max_active_clusters(
    fn: Any, grid: Sequence[int], block: Sequence[int], shared_mem: int, cluster: Sequence[int]
) -> int:
    """``cuOccupancyMaxActiveClusters``: how many clusters of ``cluster`` blocks (x, y, z) of this launch the device
    runs at once (a diagnostic: a cluster's blocks must fit one GPC together)."""
    func = getattr(fn, "kernel", fn).ptr
    cfg, _attrs = _config(func, grid, block, shared_mem, False, cluster)
    fn_occ = _lib().cuOccupancyMaxActiveClusters
    fn_occ.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_Config)]
    fn_occ.restype = ctypes.c_int
    n = ctypes.c_int(0)
    rc = fn_occ(ctypes.byref(n), func, ctypes.byref(cfg))
    if rc != 0:
        raise KernelError(f"cuOccupancyMaxActiveClusters failed with CUresult {rc}")
    return n.value


def launch(
    fn: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], shared_mem: int = 0
) -> None:
    """A kernel that calls ``pdl_wait`` before its first dependent access: with PDL while a graph is being captured
    (decode steps), a plain CuPy launch otherwise (eager launches gain nothing from it, see ``capturing``)."""
    if capturing():
        launch_pdl(fn, grid, block, args, shared_mem)
    else:
        fn(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)
