"""``PinnedArena``: the host tier's pages ``[pages, page_bytes]`` in pinned host memory, in segments.

The CUDA runner pins every segment when its tier is made (``pin_all``, before the engine serves): a
``cudaHostAlloc`` stalls every other CUDA call of the process for its whole duration, even from another thread
(H200, 105c1fb: a step beside a 1 GiB pin took 620 ms, and pinning runs at about 0.4-0.6 s per GiB), so no segment
may be pinned while steps run. Without ``pin_all`` (tests) a segment is pinned when a copy first reaches one of its
pages (``wait_seconds`` counts that time). Segments are allocated with ``alloc(nbytes) -> (uint8 array of nbytes,
handle)`` and released with ``free(handle)`` when the arena is collected.

On the GPU the segments come from ``cudaHostAlloc`` directly (``cuda_pinned``), not through CuPy's pinned-memory
pool, whose lock the step thread's own small transfers take.
"""

from __future__ import annotations

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
    ) -> None:
        self.pages, self.page_bytes, self.seg_pages = pages, page_bytes, max(1, seg_pages)
        self.num_segments = -(-pages // self.seg_pages) if pages else 0
        self.segments: list[np.ndarray] = []  # [rows, page_bytes] each; appended in order, never removed
        self._alloc = alloc
        self._handles: list[Any] = []
        self.pin_seconds = 0.0  # all pinning, wherever it ran
        self.wait_seconds = 0.0  # time callers of ``row`` spent pinning
        fin = weakref.finalize(self, _release, free, self._handles)
        fin.atexit = False  # at exit the process's memory goes anyway (and CUDA may be gone)

    @property
    def nbytes(self) -> int:
        return sum(int(s.nbytes) for s in self.segments)

    def row(self, host_id: int) -> np.ndarray:
        """Host page ``host_id`` (pinning up to its segment first if that is not pinned yet)."""
        if not 0 <= host_id < self.pages:
            raise IndexError(f"host page {host_id} outside the tier's {self.pages}")
        seg, i = divmod(host_id, self.seg_pages)
        if seg >= len(self.segments):
            t0 = time.perf_counter()
            self._grow(seg + 1)
            self.wait_seconds += time.perf_counter() - t0
        return self.segments[seg][i]

    def pin_all(self) -> None:
        self._grow(self.num_segments)

    def _grow(self, n: int) -> None:
        while len(self.segments) < min(n, self.num_segments):
            t0 = time.perf_counter()
            first = len(self.segments) * self.seg_pages
            rows = min(self.seg_pages, self.pages - first)
            buf, handle = self._alloc(rows * self.page_bytes)
            self._handles.append(handle)
            self.segments.append(buf.reshape(rows, self.page_bytes))
            self.pin_seconds += time.perf_counter() - t0
