"""Every launch of the ``cuda_src`` kernels timed with CUDA events and named by its family (perf/profile_step.py).

Two interception points that every launch of those kernels passes through, whichever module, closure or import
form holds the call site:

- ``ninfer.cuda.loader.kernel``, the only source of the kernels' function objects: for the run
  (``loader.intercept``) it hands out a timed stand-in of each function, which records an event pair around every
  call on the launch's stream (CuPy's launch path, ``fn(grid, block, args, ...)``; ``launch.launch`` outside a
  capture) and reads and sets its attributes on the function itself;
- ``ninfer.cuda.launch._driver``, the only way to ``cuLaunchKernelEx`` (``launch_ex``, ``launch_pdl``,
  ``launch.launch`` inside a capture): replaced for the run by a timed driver, which names the kernel by its
  CUfunction handle among those the loader has looked up.

A launch counts under ``key(source, name)``: :func:`by_source` (the default; the cuda_src file's stem, e.g.
``gemm_sm90_ws``, ``gdn_chunk``, ``norm``) or :func:`by_kernel` (the kernel's name less its template arguments,
e.g. ``gemm90_f16_ws_swiglu``, ``split_f16row``, ``rmsnorm``). The categories used to be the public wrappers of
``ninfer.cuda.FAMILY_MODULES``, patched as module attributes: every launch from a module outside that list
(gemv_experts, experts_swiglu, gemm_swiglu, gdn_chunk, ...) or from a wrapper whose source did not read
``kernel(`` (gemm.gemm_gate_up_swiglu) went uncounted and showed as ``other``. A kernel belongs to one source, so
this split misses nothing that the loader hands out.

No event is recorded while the launch's stream captures a CUDA graph (the launch lands in the graph; replays are
not timed, so profile eager steps). CuPy's own kernels (element-wise glue, copies, fills, sorts) are not ours and
stay unattributed. At exit: the loader hands out plain functions again (its caches never held a stand-in), the
driver is the original, and a stand-in still held somewhere (``loader.kernel`` asks callers to keep none) passes
its calls through untimed.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["UNKNOWN", "by_kernel", "by_source", "profile"]

# a driver launch of a CUfunction the loader never looked up (none is: every kernel comes from loader.kernel)
UNKNOWN = "unattributed"

Key = Callable[[str, str], str]


def by_source(source: str, name: str) -> str:
    """The family of kernel ``name``: its cuda_src file's stem (``gemm_sm90_ws.cu`` -> ``gemm_sm90_ws``)."""
    return source.removesuffix(".cu")


def by_kernel(source: str, name: str) -> str:
    """Kernel ``name`` less its template arguments (``gemv_mma<FragNVFP4, float, 1>`` -> ``gemv_mma``)."""
    return name.split("<", 1)[0]


def _capturing(stream: Any) -> bool:
    """Whether ``stream`` (None: the current stream) is capturing a CUDA graph."""
    if stream is None:
        from ninfer.cuda.launch import capturing

        return capturing()
    import cupy

    return cupy.cuda.runtime.streamIsCapturing(stream.ptr) != 0


class _Run:
    """One profiled run: its spans by category (``calls``), whether it is still on, its key and its stand-ins."""

    def __init__(self, key: Key) -> None:
        self.key, self.active = key, True
        self.calls: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
        # id(function) -> its stand-in, which keeps the function alive (so no other function takes its id)
        self.stand_ins: dict[int, _Timed] = {}
        self.by_ptr: dict[int, str] = {}  # CUfunction handle -> category

    def timed(self, cat: str, stream: Any, fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        """``fn(*a, **kw)`` between two events on ``stream`` (None: the current one), kept under ``cat``; untimed
        once the run has ended or while the stream captures a graph (an event there would be a graph node)."""
        if not self.active or _capturing(stream):
            return fn(*a, **kw)
        import cupy

        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record(stream)
        try:
            return fn(*a, **kw)
        finally:
            e.record(stream)
            self.calls[cat].append((s, e))

    def stand_in(self, source: str, name: str, fn: Any) -> _Timed:
        """loader.intercept's hook: the timed stand-in of ``fn`` (one per function and run)."""
        t = self.stand_ins.get(id(fn))
        if t is None:
            t = self.stand_ins[id(fn)] = _Timed(fn, self.key(source, name), self)
        return t

    def category(self, ptr: int) -> str:
        """The category of the kernel with CUfunction handle ``ptr`` (a driver launch)."""
        cat = self.by_ptr.get(ptr)
        if cat is None:
            from ninfer.cuda.loader import looked_up

            for (source, name), fn in looked_up().items():
                self.by_ptr[getattr(fn, "kernel", fn).ptr] = self.key(source, name)
            cat = self.by_ptr.get(ptr, UNKNOWN)
        return cat


class _Timed:
    """A kernel function's stand-in for one run: its calls timed, its attributes (``kernel``, shared memory
    opt-in, ...) read from and set on the function itself."""

    __slots__ = ("_fn", "_cat", "_run")

    def __init__(self, fn: Any, cat: str, run: _Run) -> None:
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_cat", cat)
        object.__setattr__(self, "_run", run)

    def __call__(self, *a: Any, **kw: Any) -> Any:
        return self._run.timed(self._cat, kw.get("stream"), self._fn, *a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._fn, name, value)


@contextlib.contextmanager
def profile(key: Key = by_source) -> Iterator[dict[str, list[tuple[Any, Any]]]]:
    """Time every launch of the cuda_src kernels while active; yields ``{category: [(start, end), ...]}`` (CUDA
    events, one pair per launch), filled as the launches happen. Not reentrant (``loader.intercept``)."""
    from ninfer.cuda import launch, loader

    run = _Run(key)
    real = launch._driver
    driver = real()

    def timed_driver(cfg: Any, func: int, params: Any, extra: Any) -> Any:
        return run.timed(run.category(func), None, driver, cfg, func, params, extra)

    launch._driver = lambda: timed_driver  # type: ignore[assignment]
    try:
        with loader.intercept(run.stand_in):
            yield run.calls
    finally:
        run.active = False
        launch._driver = real
