"""Host-only stand-ins for CuPy and the CUDA driver, so that the CUDA runner's *host* path runs on a machine without
a GPU (perf/profile_host.py ``--no-gpu``): where the Python time of an eager prefill chunk goes, measured where the
device is not.

``install()`` puts a module named ``cupy`` into ``sys.modules`` before anything imports the real one:
- arrays are NumPy arrays of a subclass whose ``.data.ptr`` is the host address (so ``launch._c_arg``, views,
  ``cupy.ndarray(shape, dtype, memptr)`` and pointer arithmetic work as on the device); every allocation is
  zero-filled up to 64 KiB (so
  data-dependent host reads of counts and ids see zeros), larger ones are left as they are;
- ``RawModule`` compiles nothing and its functions launch nothing (a launch is counted: ``LAUNCHES``, CuPy's
  launches and the driver's alike); a stream capture records nothing (the launches made while capturing are
  counted) and its graph's replays launch nothing (``LAUNCHES["graph"]`` counts them);
- ``cupy.cuda`` (Device, Stream, MemoryPool, runtime, graphs, events, pinned memory) answers like an idle H200;
- ``ctypes.CDLL("libcuda.so.1")`` loads a stub (compiled once with ``cc``: cuLaunchKernelEx, cuFuncSetAttribute,
  cuOccupancyMaxActiveClusters and cuTensorMapEncodeTiled return success), so the ctypes marshalling of a PDL or
  cluster launch and of a tensor-map encode costs what it costs on the device host.

Nothing computes: results are meaningless, timings are the host's alone, and a kernel's own launch cost inside
CuPy (~5 us of Cython per eager launch on the device hosts) is not in them; ``LAUNCHES`` counts those launches.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.machinery
import os
import subprocess
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["install", "LAUNCHES", "BLOCKS"]

LAUNCHES: Counter[str] = Counter()  # kernel name -> launches (CuPy's launch path and the driver's)
BLOCKS: Counter[tuple[str, int]] = Counter()  # (kernel name, threads per block) -> launches
_NAMES: dict[int, str] = {}  # a stand-in CUfunction handle -> its kernel's name
_SM_COUNT = 132
_MEM = 140 << 30
_ZERO_BYTES = 1 << 16  # allocations up to this size are zero-filled

_STUB_C = r"""
typedef struct { int x; } CUlaunchConfig;
int cuLaunchKernelEx(const void* cfg, void* f, void** params, void** extra) { return 0; }
int cuFuncSetAttribute(void* f, int attr, int value) { return 0; }
int cuOccupancyMaxActiveClusters(int* n, void* f, const void* cfg) { *n = 16; return 0; }
int cuTensorMapEncodeTiled(void* map, int dtype, unsigned rank, void* addr, const void* dims, const void* strides,
                           const void* box, const void* estrides, int il, int sw, int l2, int oob) { return 0; }
"""


def _stub_lib() -> str:
    """The driver stub's path, built with ``cc`` into the temporary directory once per machine."""
    out = Path(tempfile.gettempdir()) / "ninfer_nogpu_libcuda.so"
    if not out.exists():
        src, tmp = out.with_suffix(f".{os.getpid()}.c"), out.with_suffix(f".{os.getpid()}.so")
        src.write_text(_STUB_C)
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(tmp), str(src)], check=True)
        os.replace(tmp, out)  # atomic: a concurrent reader sees no half-written library
        src.unlink()
    return str(out)


class MemoryPointer:
    """cupy.cuda.MemoryPointer: ``mem`` (an allocation) and an absolute address ``ptr``."""

    def __init__(self, mem: Any, offset: int) -> None:
        self.mem, self.ptr = mem, mem.ptr + offset

    def __add__(self, off: int) -> MemoryPointer:
        return MemoryPointer(self.mem, self.ptr - self.mem.ptr + int(off))


class Memory:
    """cupy.cuda.Memory: ``nbytes`` of zero-filled host memory."""

    def __init__(self, nbytes: int) -> None:
        self.buf = np.zeros(max(1, int(nbytes)), np.uint8)
        self.ptr, self.size = self.buf.ctypes.data, int(nbytes)


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class _ArrayData:
    """``arr.data``: the pointer of the array's first element within its root allocation."""

    def __init__(self, a: np.ndarray, ptr: int) -> None:
        self._a, self.ptr = a, ptr

    def __add__(self, off: int) -> MemoryPointer:
        root = _root(self._a)
        mem = Memory.__new__(Memory)
        mem.buf = root.reshape(-1).view(np.uint8) if root.flags.c_contiguous else root
        mem.ptr, mem.size = root.ctypes.data, root.nbytes
        return MemoryPointer(mem, self.ptr - mem.ptr + int(off))


class ndarray(np.ndarray):  # noqa: N801 (cupy's name)
    """cupy.ndarray over host memory."""

    def __new__(
        cls, shape: Any, dtype: Any = float, memptr: Any = None, strides: Any = None, order: str = "C"
    ) -> ndarray:
        # small allocations zero-filled (host reads of counts, ids), large ones not (no memset time)
        if memptr is None:
            a = np.empty(shape, dtype, order=order)
            if a.nbytes <= _ZERO_BYTES:
                a.fill(0)
            return a.view(cls)
        buf = memptr.mem.buf
        off = memptr.ptr - memptr.mem.ptr
        return np.ndarray(shape, dtype, buffer=buf, offset=off, strides=strides).view(cls)

    @property
    def data(self) -> _ArrayData:  # type: ignore[override]
        # the address read once per array object (it never changes): ``a.ctypes.data`` costs ~1.2 us a call, which
        # CuPy's ``a.data.ptr`` does not, and the wrappers read the same weight planes' pointers on every call
        ptr = self.__dict__.get("_nogpu_ptr")
        if ptr is None:
            ptr = self.__dict__["_nogpu_ptr"] = self.ctypes.data
        return _ArrayData(self, ptr)

    def get(self, stream: Any = None, out: Any = None, **_: Any) -> np.ndarray:
        return np.array(self.view(np.ndarray))

    def set(self, arr: Any, stream: Any = None) -> None:
        self[...] = arr

    def toDlpack(self) -> Any:  # noqa: N802 (cupy's name)
        raise NotImplementedError("nogpu: no DLPack")


def _wrap(x: Any) -> Any:
    if isinstance(x, np.ndarray) and not isinstance(x, ndarray):
        return x.view(ndarray)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _numpy_fn(fn: Any) -> Any:
    def call(*a: Any, **k: Any) -> Any:
        return _wrap(fn(*a, **k))

    return call


class _Function:
    """A kernel of a RawModule: launching it counts the launch."""

    def __init__(self, name: str) -> None:
        self.name, self.ptr = name, id(self)
        _NAMES[self.ptr] = name
        self.max_dynamic_shared_size_bytes = 0
        self.num_regs, self.shared_size_bytes, self.local_size_bytes = 128, 0, 0
        self.max_threads_per_block = 1024
        self.attributes: dict[str, int] = {}
        self.kernel = self

    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0, stream: Any = None) -> None:
        LAUNCHES[self.name] += 1
        threads = 1
        for b in block:  # not np.prod: ~3.5 us a launch that the device host does not spend
            threads *= int(b)
        BLOCKS[self.name, threads] += 1


class RawModule:
    def __init__(self, code: str = "", options: Any = (), name_expressions: Any = (), **_: Any) -> None:
        self._names = list(name_expressions or ())

    def compile(self, *a: Any, **k: Any) -> None:
        pass

    def get_function(self, name: str) -> _Function:
        return _Function(name)

    def get_global(self, name: str) -> MemoryPointer:
        return MemoryPointer(Memory(1 << 16), 0)


class ElementwiseKernel:
    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "", **_: Any) -> None:
        self.name = name
        self._n_in = len([p for p in in_params.split(",") if p.strip()])

    def __call__(self, *args: Any, size: Any = None, **_: Any) -> Any:
        LAUNCHES[self.name] += 1
        if len(args) > self._n_in:
            return args[-1]
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        return ndarray(np.broadcast_shapes(*(a.shape for a in arrays)), np.float32)


class _Stream:
    def __init__(self, non_blocking: bool = False, null: bool = False, ptr: int = 0) -> None:
        self.ptr = ptr if null else id(self)

    def __enter__(self) -> _Stream:
        _CUDA.current.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _CUDA.current.pop()

    def use(self) -> _Stream:
        _CUDA.current[-1:] = [self]
        return self

    def synchronize(self) -> None:
        pass

    def record(self, event: Any = None) -> Any:
        return event or _Event()

    def wait_event(self, event: Any) -> None:
        pass

    def begin_capture(self, *a: Any, **k: Any) -> None:
        _CUDA.capturing.add(self.ptr)

    def end_capture(self) -> _Graph:
        _CUDA.capturing.discard(self.ptr)
        return _Graph()


class _Graph:
    """A captured graph: replaying it launches nothing (``LAUNCHES["graph"]`` counts replays)."""

    def upload(self, stream: Any = None) -> None:
        pass

    def launch(self, stream: Any = None) -> None:
        LAUNCHES["graph"] += 1


class _Event:
    def __init__(self, *a: Any, **k: Any) -> None:
        self.ptr = id(self)

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Device:
    def __init__(self, device: int = 0) -> None:
        self.id = int(device)
        self.compute_capability = "90"
        self.attributes = {"MultiProcessorCount": _SM_COUNT, "MaxSharedMemoryPerBlockOptin": 232448}

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def use(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Pool:
    def __init__(self, *a: Any, **k: Any) -> None:
        self._used = 0

    def malloc(self, nbytes: int) -> MemoryPointer:
        self._used += int(nbytes)
        return MemoryPointer(Memory(nbytes), 0)

    def used_bytes(self) -> int:
        return self._used

    def total_bytes(self) -> int:
        return self._used

    def free_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        pass

    def set_limit(self, *a: Any, **k: Any) -> None:
        pass

    def get_limit(self) -> int:
        return _MEM


class _Pinned(np.ndarray):
    """cupy.cuda.alloc_pinned_memory's PinnedMemoryPointer: a buffer with ``ptr``."""

    def __new__(cls, nbytes: int) -> _Pinned:
        return np.zeros(max(1, int(nbytes)), np.uint8).view(cls)

    @property
    def ptr(self) -> int:
        return self.ctypes.data


class _Runtime(types.SimpleNamespace):
    """cupy.cuda.runtime: the calls below; its constants (``cudaDevAttr*``, ``memcpyHostToDevice``, ...) are their names."""

    def __getattr__(self, name: str) -> str:
        if name.startswith(("cuda", "memcpy")):
            return name
        raise AttributeError(name)


def _device_attribute(attr: Any, dev: int) -> int:
    return _SM_COUNT if attr == "cudaDevAttrMultiProcessorCount" else 2**31 - 1


def _runtime() -> _Runtime:
    hosts: dict[int, np.ndarray] = {}

    def host_alloc(nbytes: int, flags: int = 0) -> int:
        b = np.zeros(max(1, int(nbytes)), np.uint8)
        hosts[b.ctypes.data] = b
        return b.ctypes.data

    return _Runtime(
        memGetInfo=lambda: (_MEM - (4 << 30), _MEM),
        memcpyAsync=lambda *a: None,
        memcpy=lambda *a: None,
        memcpy2DAsync=lambda *a: None,
        memset=lambda *a: None,
        memsetAsync=lambda *a: None,
        streamIsCapturing=lambda ptr: int(ptr in _CUDA.capturing),
        hostAlloc=host_alloc,
        freeHost=lambda ptr: hosts.pop(ptr, None),
        getDeviceCount=lambda: 1,
        deviceSynchronize=lambda: None,
        getDeviceProperties=lambda d: {"multiProcessorCount": _SM_COUNT, "major": 9, "totalGlobalMem": _MEM},
        deviceGetAttribute=_device_attribute,
        runtimeGetVersion=lambda: 13000,
        driverGetVersion=lambda: 13000,
        CUDARuntimeError=RuntimeError,
    )


class _Cuda(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("cupy.cuda")
        self.current: list[_Stream] = [_Stream(null=True)]
        self.capturing: set[int] = set()  # streams between begin_capture and end_capture
        self.Device, self.Stream, self.Event = _Device, _Stream, _Event
        self.MemoryPool, self.PinnedMemoryPool = _Pool, _Pool
        self.Memory, self.MemoryPointer = Memory, MemoryPointer
        self.runtime = _runtime()
        self.graph = types.SimpleNamespace(Graph=_Graph)
        self.alloc_pinned_memory = _Pinned
        self.get_elapsed_time = lambda a, b: 0.0
        self.set_allocator = lambda *a: None
        self.set_pinned_memory_allocator = lambda *a: None
        self.is_available = lambda: True

    def get_current_stream(self) -> _Stream:
        return self.current[-1]

    @contextlib.contextmanager
    def using_allocator(self, allocator: Any = None) -> Any:
        yield


_CUDA: _Cuda


class _Random(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("cupy.random")

    class RandomState:
        def __init__(self, seed: Any = None) -> None:
            self._rs = np.random.RandomState(seed)

        def __getattr__(self, name: str) -> Any:
            return _numpy_fn(getattr(self._rs, name))

    def __getattr__(self, name: str) -> Any:
        return _numpy_fn(getattr(np.random, name))

    @staticmethod
    def random(size: Any = None, dtype: Any = np.float64) -> Any:
        """cupy.random.random takes a dtype (NumPy's does not)."""
        return _wrap(np.random.random(size).astype(dtype))


class _Cupy(types.ModuleType):
    """The stand-in ``cupy`` module: CuPy's names above, NumPy (results as host ``ndarray``) for the rest."""

    def __init__(self) -> None:
        super().__init__("cupy")
        self.__version__ = "nogpu"
        self.ndarray, self.RawModule, self.ElementwiseKernel = ndarray, RawModule, ElementwiseKernel
        self.cuda, self.random = _CUDA, _Random()

    def asnumpy(self, a: Any, stream: Any = None, **_: Any) -> np.ndarray:
        return np.array(np.asarray(a).view(np.ndarray) if isinstance(a, np.ndarray) else a)

    def get_array_module(self, *a: Any) -> Any:
        return self

    def get_default_memory_pool(self) -> _Pool:
        return _Pool()

    def get_default_pinned_memory_pool(self) -> _Pool:
        return _Pool()

    def empty(self, shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
        return ndarray(shape, dtype, order=order)

    def __getattr__(self, name: str) -> Any:
        v = getattr(np, name)
        return _numpy_fn(v) if callable(v) and not isinstance(v, type) else v


class _CountedLaunch:
    """The stub's cuLaunchKernelEx, counting each launch under its kernel's name (argtypes / restype go through)."""

    def __init__(self, fn: Any) -> None:
        object.__setattr__(self, "_fn", fn)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._fn, name, value)

    def __call__(self, cfg: Any, func: Any, params: Any, extra: Any) -> int:
        name, c = _NAMES.get(func, "?"), cfg._obj  # cfg: ctypes.byref(CUlaunchConfig)
        LAUNCHES[name] += 1
        BLOCKS[name, int(c.block[0] * c.block[1] * c.block[2])] += 1
        return self._fn(cfg, func, params, extra)


def install() -> None:
    """Make ``import cupy`` give the stand-in and ``ctypes.CDLL("libcuda.so.1")`` the driver stub (call before
    anything imports cupy)."""
    global _CUDA
    if "cupy" in sys.modules and isinstance(sys.modules["cupy"], _Cupy):
        return
    if "cupy" in sys.modules:
        raise RuntimeError("nogpu.install() must run before the real cupy is imported")
    _CUDA = _Cuda()
    mod = _Cupy()
    sys.modules["cupy"], sys.modules["cupy.cuda"], sys.modules["cupy.random"] = mod, _CUDA, mod.random
    for m in (mod, _CUDA, mod.random):
        # a loaded module's spec, as an imported package has: without one, each ``import cupy`` inside a function
        # (the wrappers' style) costs ~1 us (the import machinery's ``__spec__._initializing`` probe raises and
        # clears an AttributeError on None) instead of the ~0.3 us it costs with the real CuPy
        m.__spec__ = importlib.machinery.ModuleSpec(m.__name__, None)
        m.__spec__._initializing = False  # type: ignore[attr-defined]
    stub, cdll = _stub_lib(), ctypes.CDLL

    class _CDLL(cdll):  # type: ignore[misc, valid-type]
        def __init__(self, name: str, *a: Any, **k: Any) -> None:
            self._stub = name == "libcuda.so.1"
            super().__init__(stub if self._stub else name, *a, **k)

        def __getattr__(self, name: str) -> Any:
            fn = super().__getattr__(name)
            return _CountedLaunch(fn) if self._stub and name == "cuLaunchKernelEx" else fn

    ctypes.CDLL = _CDLL  # type: ignore[misc]
