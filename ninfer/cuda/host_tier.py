"""``HostTier``: the CUDA runner's host tier (docs/tiering.md) in pinned host memory, moved on its own stream.

Layout: a pinned arena ``[host_pages, page_bytes]`` in ``SEGMENT_BYTES`` segments (``ninfer.cuda.pinned_arena``).
Pinning takes 0.4-0.6 s per GiB and a ``cudaHostAlloc`` stalls the step thread for its whole duration even from
another thread (H200, 105c1fb: a step beside a 1 GiB pin took 620 ms), so the runner pins the whole tier when it
is made (``eager``); without it (tests) a segment is pinned when a copy first reaches it. A host page holds one KV page of every attention layer
(with speculation also the MTP head's plane), page-major (the K pages of every layer, then V, then the fp8
scales, each ``page_size x KV heads x head_dim`` as stored on the device); a GDN checkpoint takes
``ceil(snapshot_bytes / page_bytes)`` host pages, holding the bytes of its slot in every conv then every recurrent
state array in order.

Copies run on ``self.stream`` (a non-blocking copy stream). ``spill`` and ``restore`` only queue them as small ops
(a staging buffer of ``STAGE_BYTES`` per op: an index upload, one ``tier_pages`` launch moving those
pages of every layer array, cuda_src/tier_copy.cu, and one ``cudaMemcpyAsync`` per run of consecutive host pages;
or one checkpoint array's slot straight to/from its host pages). ``pump``, called by the runner once a step's
work is launched, issues them in order while the GPU runs that step: issuing an 8K restore took 10.5 ms of host
time, which inside one step stalled the other lanes' decode by 1.3 steps (105c1fb). ``guard`` issues at once
every queued op that touches what the compute stream is about to use. The kernel is compiled when the tier is
made (``warmup``), never inside a step. Each spill or restore records an event after its last op; until it has
passed, the compute stream waits on it before it touches any page or checkpoint slot the copy reads or writes
(``guard``: new lanes' pages, saves into reused slots). Decode of running lanes touches neither, so it runs while
a restore is queued or in flight; the restoring lane itself is set up only after ``done`` reported its ticket
(the scheduler holds it back).

``checksum``: each spilled page and checkpoint gets a position-weighted 64-bit sum of its device bytes, and every
restore is checked against it once its copy is complete (issued at once and synchronously: debug and tests only).

Nothing here blocks the host on the GPU outside checksum mode: completion is polled through events (``done``
with ``wait=False``), and ``busy_slots`` lets the runner take checkpoint slots no copy queued or in flight
touches, so a save never makes the compute stream wait for the copy stream.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer.cuda import pinned_arena
from ninfer.cuda.pinned_arena import PinnedArena
from ninfer.engine.core import TierCopy

__all__ = ["HostTier", "SOURCES", "STAGE_BYTES", "stage_pages", "page_runs"]

SOURCES: dict[str, tuple[str, ...]] = {"tier_copy.cu": ("tier_pages",)}

# device staging of the page copies, and a queued op's pages: 64 pages of the 27B's 1 MiB (bf16 KV), the op size
# measured at bf08816 (a 256 MiB buffer was allocated then, three quarters of it never used by the ops)
STAGE_BYTES = 64 << 20
SEGMENT_BYTES = 1 << 30  # the pinned arena grows by this much
MIN_ISSUE_S = 0.5e-3  # pump: issued per step even when the compute stream is already idle (progress)
MAX_ISSUE_S = 50e-3  # pump: at most this much host time per step
D2H, H2D = 2, 1  # cudaMemcpyKind
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _words(x: Any) -> Any:
    """A contiguous byte array as 32-bit words where its length allows (a quarter of the digest's temporaries)."""
    return x.view(np.uint32) if x.shape[-1] % 4 == 0 else x


def stage_pages(page_bytes: int) -> int:
    """Pages in the staging buffer: about ``STAGE_BYTES``, 1..1024."""
    return max(1, min(STAGE_BYTES // page_bytes, 1024))


def page_runs(ids: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """(index into ``ids``, first id, length) of each run of consecutive ids."""
    i = 0
    while i < len(ids):
        j = i + 1
        while j < len(ids) and ids[j] == ids[j - 1] + 1:
            j += 1
        yield i, ids[i], j - i
        i = j


@dataclass(eq=False, slots=True)
class _Flight:
    pages: set[int]
    slots: set[int]
    ticket: int  # 0: a spill
    ops: deque[Callable[[], None]]  # not issued yet, in order (each a few launches or copies)
    end: Any = None  # cupy Event recorded after the last op (None: still queued)
    start: Any | None = None  # restores: the event before the first op (the copy's time)


class HostTier:
    def __init__(
        self,
        net: Any,
        host_pages: int,
        page_bytes: int,
        *,
        checksum: bool = False,
        eager: bool = False,
    ) -> None:
        import cupy

        self.net = net
        self.page_arrays = list(net.kc) + list(net.vc) + list(net.ks) + list(net.vs)
        self.slot_arrays = list(net.conv) + list(net.rec)
        sizes = [int(a[0].nbytes) for a in self.page_arrays]
        if sum(sizes) != page_bytes:
            raise ValueError(
                f"host tier: a KV page takes {sum(sizes)} bytes on the device, planned {page_bytes}"
            )
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        self.page_bytes, self.checksum, self.host_pages = page_bytes, checksum, host_pages
        self.seg_pages = max(1, SEGMENT_BYTES // page_bytes)
        self.arena = PinnedArena(
            host_pages, page_bytes, self.seg_pages, pinned_arena.cuda_pinned, pinned_arena.cuda_free
        )
        self.chunk = stage_pages(page_bytes)
        self.stage = cupy.empty((self.chunk, page_bytes), np.uint8)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._flights: list[_Flight] = []  # issued, not yet known complete
        self._queue: deque[_Flight] = deque()  # enqueued, not fully issued (FIFO: the copy stream's order)
        self._digests: dict[tuple[str, int], int] = {}
        self._table = cupy.asarray(self._page_table(sizes))
        self._grid_x = max(1, min(8, -(-max(sizes, default=1) // (256 * 16))))
        self.issue_seconds = 0.0  # host time spent issuing spills and restores (the step thread's share)
        if eager:
            self.arena.pin_all()
        self.warmup()

    def _page_table(self, sizes: list[int]) -> np.ndarray:
        """``tier_pages``' table: (base address, bytes of one page, offset in a staging row) per page array."""
        rows = []
        for a, size, off in zip(self.page_arrays, sizes, self.offsets, strict=False):
            if not a.flags.c_contiguous:
                raise ValueError("host tier: the KV page arrays must be contiguous with pages on axis 0")
            rows.append((int(a.data.ptr), size, off))
        return np.asarray(rows, np.int64).reshape(-1, 3)

    def warmup(self) -> None:
        """Compile and load the copy kernels now (and the checksum's), not in the first step that spills: page 0 of
        every array goes to the staging buffer and back (bytes unchanged)."""
        import cupy

        if not self.page_arrays:
            return
        cupy.cuda.Device().synchronize()  # whatever filled the arrays (other streams) is done
        with self.stream:
            self._gather([0])
            self._scatter([0])
            if self.checksum:
                self._row_digests(2)
                self._slot_digest(0)
        self.stream.synchronize()

    @property
    def host_bytes(self) -> int:
        """Pinned bytes allocated so far."""
        return self.arena.nbytes

    @property
    def pin_seconds(self) -> float:
        """Time the copies (the step thread) spent pinning host memory themselves: 0 when pinned at start-up."""
        return self.arena.wait_seconds

    def row(self, host_id: int) -> np.ndarray:
        """Host page ``host_id`` (a view of the pinned arena)."""
        return self.arena.row(host_id)

    def _ptr(self, host_id: int) -> int:
        return int(self.row(host_id).ctypes.data)

    # ---- copies ---------------------------------------------------------------------------------------------
    def spill(self, c: TierCopy, slot: int | None) -> None:
        """Queue the copy of device pages (and checkpoint ``slot``) of ``c`` to its host pages (see ``pump``)."""
        ops: deque[Callable[[], None]] = deque()
        for a in range(0, len(c.device_pages), self.chunk):
            dp, hp = c.device_pages[a : a + self.chunk], c.host_pages[a : a + self.chunk]
            ops.append(lambda dp=dp, hp=hp: self._spill_pages(dp, hp))
        if c.host_ckpt:
            assert slot is not None
            if self.checksum:
                ops.append(
                    lambda: self._digests.__setitem__(("ckpt", c.host_ckpt[0]), self._slot_digest(slot))
                )
            ops.extend(self._slot_ops(slot, c.host_ckpt, D2H))
        self._enqueue(_Flight(set(c.device_pages), {slot} if slot is not None else set(), 0, ops))
        if self.checksum:
            self.flush()
            self.stream.synchronize()  # debug: the spill is complete before any lane writes again

    def restore(self, copies: Sequence[TierCopy], slots: Sequence[int | None], ticket: int) -> None:
        """Queue one restore (its copies, each into its device pages and checkpoint slot); ``done`` reports
        ``ticket`` once it is on the device."""
        ops: deque[Callable[[], None]] = deque()
        pages: set[int] = set()
        for c, slot in zip(copies, slots, strict=True):
            for a in range(0, len(c.device_pages), self.chunk):
                dp, hp = c.device_pages[a : a + self.chunk], c.host_pages[a : a + self.chunk]
                ops.append(lambda dp=dp, hp=hp: (self._rows(hp, H2D), self._scatter(dp)))
            if c.host_ckpt:
                assert slot is not None
                ops.extend(self._slot_ops(slot, c.host_ckpt, H2D))
            pages |= set(c.device_pages)
        self._enqueue(_Flight(pages, {s for s in slots if s is not None}, ticket, ops))
        if self.checksum:
            self.flush()
            self.stream.synchronize()
            for c, slot in zip(copies, slots, strict=True):
                self._verify(c, slot)

    def _spill_pages(self, dp: Sequence[int], hp: Sequence[int]) -> None:
        self._gather(dp)
        if self.checksum:
            self._record("page", hp, self._row_digests(len(dp)))
        self._rows(hp, D2H)

    def _enqueue(self, f: _Flight) -> None:
        if not f.ops:
            f.ops.append(lambda: None)  # an empty copy still gets its events
        self._queue.append(f)

    def pump(self, busy: Callable[[], bool] | None = None) -> None:
        """Issue queued copy ops on the copy stream, in order: one op and at least ``MIN_ISSUE_S`` of host time, then on
        while ``busy()`` (the compute stream still runs the step: issuing then costs the step nothing), at most
        ``MAX_ISSUE_S``; ``busy=None``: everything. Called by the runner once the step's work is launched, so
        a long restore is issued beside the steps instead of stalling one (docs/tiering.md)."""
        t0, n = time.perf_counter(), 0
        with self.stream:
            while self._queue:
                if busy is not None and n:  # at least one op per call
                    spent = time.perf_counter() - t0
                    if spent >= MAX_ISSUE_S or (spent >= MIN_ISSUE_S and not busy()):
                        break
                f = self._queue[0]
                if f.start is None and f.ticket:
                    f.start = self.stream.record()
                f.ops.popleft()()
                n += 1
                if not f.ops:
                    f.end = self.stream.record()
                    self._flights.append(self._queue.popleft())
        self.issue_seconds += time.perf_counter() - t0

    def flush(self, upto: _Flight | None = None) -> None:
        """Issue every queued op (up to and including flight ``upto``'s)."""
        if upto is None:
            self.pump()
            return
        while upto in self._queue:
            self.pump(lambda: False)

    @property
    def queued(self) -> bool:
        """Copy ops enqueued and not issued yet."""
        return bool(self._queue)

    def guard(self, pages: set[int], slots: set[int], writes_only: bool = False) -> None:
        """The compute stream waits for every copy in flight that reads or writes these pages or slots
        (``writes_only``: that writes them, i.e. restores; for what the compute stream only reads)."""
        hit = [
            f for f in self._queue if (f.ticket or not writes_only) and (f.pages & pages or f.slots & slots)
        ]
        if hit:
            self.flush(hit[-1])  # its ops (and every earlier flight's: the stream's order) are issued now
        self._prune()
        for f in self._flights:
            if (f.ticket or not writes_only) and (f.pages & pages or f.slots & slots):
                self.net.stream.wait_event(f.end)

    def busy_slots(self) -> set[int]:
        """Checkpoint slots a copy in flight still reads or writes."""
        self._prune()
        return {s for f in [*self._flights, *self._queue] if f.end is None or not f.end.done for s in f.slots}

    def done(self, wait: bool) -> list[tuple[int, float]]:
        """Restores complete since the last call: (ticket, seconds between its events on the copy stream).
        ``wait=False`` (the step path) only polls the events."""
        import cupy

        if wait and any(f.ticket for f in self._queue):
            self.flush()
        pending = [f for f in self._flights if f.ticket]
        if wait and pending and not any(f.end.done for f in pending):
            pending[0].end.synchronize()
        out = []
        for f in pending:
            if f.end.done:
                out.append((f.ticket, cupy.cuda.get_elapsed_time(f.start, f.end) * 1e-3))
                self._flights.remove(f)
        self._prune()
        return out

    def _prune(self) -> None:
        self._flights = [f for f in self._flights if f.ticket or not f.end.done]

    # ---- pieces ---------------------------------------------------------------------------------------------
    def _kernel(self) -> Any:
        from ninfer.cuda.loader import kernel

        return kernel("tier_copy.cu", SOURCES["tier_copy.cu"], "tier_pages")

    def _pages(self, pages: Sequence[int], to_stage: bool) -> None:
        """Device pages ``pages`` of every page array <-> staging rows 0.. (one launch, on the current stream)."""
        import cupy

        idx = cupy.asarray(np.asarray(pages, np.int32))  # through CuPy's pinned staging: asynchronous
        grid = (self._grid_x, len(pages), len(self.page_arrays))
        args = (self.stage, self._table, idx, np.int64(self.page_bytes), np.int32(to_stage))
        self._kernel()(grid, (256,), args)

    def _gather(self, pages: Sequence[int]) -> None:
        self._pages(pages, True)

    def _scatter(self, pages: Sequence[int]) -> None:
        self._pages(pages, False)

    def _rows(self, host_ids: Sequence[int], kind: int) -> None:
        """Staging rows 0.. <-> host pages ``host_ids``, one memcpy per run of consecutive host pages (within a
        segment)."""
        import cupy

        pb, stage, sp = self.page_bytes, self.stage.data.ptr, self.seg_pages
        ids = list(host_ids)
        for i, _, n in page_runs([h + (h // sp) * 2 for h in ids]):  # a gap between segments ends a run
            dev, host = stage + i * pb, self._ptr(ids[i])
            dst, src = (host, dev) if kind == D2H else (dev, host)
            cupy.cuda.runtime.memcpyAsync(dst, src, n * pb, kind, self.stream.ptr)

    def _slot_ops(self, slot: int, host_ids: Sequence[int], kind: int) -> list[Callable[[], None]]:
        """Checkpoint slot ``slot`` of every GDN array <-> the byte stream of host pages ``host_ids``: one op per
        array (one copy per run of consecutive host pages of one segment)."""
        ops, pos = [], 0
        for arr in self.slot_arrays:
            ops.append(lambda arr=arr, pos=pos: self._slot_array(arr, slot, pos, host_ids, kind))
            pos += int(arr[slot].nbytes)
        return ops

    def _slot_array(self, arr: Any, slot: int, pos: int, host_ids: Sequence[int], kind: int) -> None:
        import cupy

        pb, sp = self.page_bytes, self.seg_pages
        ptr, left = arr[slot].data.ptr, int(arr[slot].nbytes)
        while left:
            row, off = divmod(pos, pb)
            run = 1
            while (
                row + run < len(host_ids)
                and host_ids[row + run] == host_ids[row] + run
                and (host_ids[row] + run) % sp
            ):
                run += 1
            n = min(left, run * pb - off)
            host = self._ptr(host_ids[row]) + off
            dst, src = (host, ptr) if kind == D2H else (ptr, host)
            cupy.cuda.runtime.memcpyAsync(dst, src, n, kind, self.stream.ptr)
            ptr, pos, left = ptr + n, pos + n, left - n

    # ---- checksum (debug) -----------------------------------------------------------------------------------
    def _row_digests(self, n: int) -> list[int]:
        import cupy

        w = _words(self.stage[:n]).astype(cupy.uint64)
        mult = cupy.arange(1, w.shape[1] + 1, dtype=cupy.uint64) * _MIX
        return [int(x) for x in cupy.asnumpy((w * mult).sum(axis=1), stream=self.stream)]

    def _slot_digest(self, slot: int) -> int:
        import cupy

        flat = cupy.concatenate([a[slot].reshape(-1).view(np.uint8) for a in self.slot_arrays])
        w = _words(flat).astype(cupy.uint64)
        mult = cupy.arange(1, w.size + 1, dtype=cupy.uint64) * _MIX
        return int((w * mult).sum().get(stream=self.stream))

    def _record(self, kind: str, host_ids: Sequence[int], digests: list[int]) -> None:
        for h, d in zip(host_ids, digests, strict=True):
            self._digests[kind, h] = d

    def _verify(self, c: TierCopy, slot: int | None) -> None:
        with self.stream:
            for a in range(0, len(c.device_pages), self.chunk):
                dp, hp = c.device_pages[a : a + self.chunk], c.host_pages[a : a + self.chunk]
                self._gather(dp)
                for p, h, d in zip(dp, hp, self._row_digests(len(dp)), strict=True):
                    if d != self._digests["page", h]:
                        raise RuntimeError(f"host tier: device page {p} restored from host page {h} differs")
            if c.host_ckpt and self._slot_digest(slot) != self._digests["ckpt", c.host_ckpt[0]]:
                raise RuntimeError(f"host tier: checkpoint slot {slot} restored from the host differs")
