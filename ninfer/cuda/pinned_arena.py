"""``PinnedArena``: the host tier's pages ``[pages, page_bytes]`` in pinned host memory, pinned segment by segment
ahead of use by a background thread, so that pinning (about 0.3 s per GiB: the driver pins every page) never runs
inside an engine step.

The engine hands out low host page ids first, so the ids in use grow from 0: the arena keeps ``ahead`` segments
pinned beyond the highest id a copy has reached (``prefetch``, called after each spill is issued). A copy that
outruns the thread pins what it needs itself (``wait_seconds`` counts the time the caller spent there: a stall, 0
in steady state); ``prefetch(-1)`` starts it (the runner: once its CUDA graphs are captured, so that no
``cudaHostAlloc`` runs beside a capture). ``pin_all`` pins everything at once (tests). Segments are allocated with ``alloc(nbytes) ->
(uint8 array of nbytes, handle)`` and released with ``free(handle)`` when the arena is collected.

On the GPU the segments come from ``cudaHostAlloc`` directly (``cuda_pinned``), not through CuPy's pinned-memory
pool, whose lock the step thread's own small transfers take.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PinnedArena", "cuda_pinned", "cuda_free"]

Alloc = Callable[[int], tuple[np.ndarray, Any]]


def cuda_pinned(nbytes: int) -> tuple[np.ndarray, int]:
    """``nbytes`` of page-locked host memory (portable: usable from every context), as a uint8 array."""
    import ctypes

    import cupy

    ptr = cupy.cuda.runtime.hostAlloc(nbytes, 1)  # cudaHostAllocPortable
    return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), np.uint8), ptr


def cuda_free(ptr: int) -> None:
    import cupy

    cupy.cuda.runtime.freeHost(ptr)


def _release(free: Callable[[Any], None] | None, handles: list[Any]) -> None:
    if free is not None:
        for h in handles:
            free(h)
    handles.clear()


class PinnedArena:
    def __init__(
        self,
        pages: int,
        page_bytes: int,
        seg_pages: int,
        alloc: Alloc,
        free: Callable[[Any], None] | None = None,
        *,
        ahead: int = 0,
    ) -> None:
        self.pages, self.page_bytes, self.seg_pages, self.ahead = pages, page_bytes, max(1, seg_pages), ahead
        self.num_segments = -(-pages // self.seg_pages) if pages else 0
        self.segments: list[np.ndarray] = []  # [rows, page_bytes] each; appended in order, never removed
        self._alloc = alloc
        self._handles: list[Any] = []
        self._lock = threading.Lock()
        self._target = 0
        self._thread: threading.Thread | None = None
        self.pin_seconds = 0.0  # all pinning, wherever it ran
        self.wait_seconds = 0.0  # time callers of ``row`` spent pinning or waiting for the thread
        fin = weakref.finalize(self, _release, free, self._handles)
        fin.atexit = False  # at exit the process's memory goes anyway (and CUDA may be gone)

    @property
    def nbytes(self) -> int:
        return sum(int(s.nbytes) for s in self.segments)

    def row(self, host_id: int) -> np.ndarray:
        """Host page ``host_id`` (pinning up to its segment first if the thread has not got there)."""
        if not 0 <= host_id < self.pages:
            raise IndexError(f"host page {host_id} outside the tier's {self.pages}")
        seg, i = divmod(host_id, self.seg_pages)
        if seg >= len(self.segments):
            t0 = time.perf_counter()
            self._grow(seg + 1)
            self.wait_seconds += time.perf_counter() - t0
        return self.segments[seg][i]

    def prefetch(self, host_id: int) -> None:
        """Keep ``ahead`` segments pinned past ``host_id``'s (in the background)."""
        self.grow_to((host_id // self.seg_pages if host_id >= 0 else -1) + 1 + self.ahead)

    def grow_to(self, n: int) -> None:
        """Pin up to ``n`` segments in the background."""
        self._target = max(self._target, min(self.num_segments, n))
        if len(self.segments) >= self._target or self.pinning:
            return
        self._thread = threading.Thread(target=self._fill, name="host-tier-pin", daemon=True)
        self._thread.start()

    @property
    def pinning(self) -> bool:
        """The background thread is at work."""
        return self._thread is not None and self._thread.is_alive()

    def pin_all(self) -> None:
        self._grow(self.num_segments)

    def join(self) -> None:
        """Wait for the background pinning (tests, benchmarks)."""
        if self._thread is not None:
            self._thread.join()

    def _fill(self) -> None:
        while len(self.segments) < self._target:
            self._grow(len(self.segments) + 1)

    def _grow(self, n: int) -> None:
        with self._lock:
            while len(self.segments) < min(n, self.num_segments):
                t0 = time.perf_counter()
                first = len(self.segments) * self.seg_pages
                rows = min(self.seg_pages, self.pages - first)
                buf, handle = self._alloc(rows * self.page_bytes)
                self._handles.append(handle)
                self.segments.append(buf.reshape(rows, self.page_bytes))
                self.pin_seconds += time.perf_counter() - t0
