"""``ninfer.cuda.host_tier.HostTier``'s byte plumbing on the CPU: CuPy replaced by NumPy arrays whose
``data.ptr`` is their address and ``cudaMemcpyAsync`` by ``memmove``, so page offsets, runs of host pages, the
checkpoint byte stream across host pages and the debug checksum are checked without a GPU (the GPU test,
tests/test_cuda_tiering.py, runs the real copies)."""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

from ninfer.cuda.host_tier import HostTier, page_runs, stage_pages
from ninfer.engine.core import TierCopy


class Dev(np.ndarray):
    """A "device" array: NumPy with CuPy's ``data.ptr`` and ``get``."""

    @property
    def data(self):  # noqa: ANN201
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def get(self, stream=None):  # noqa: ANN001, ANN201
        return np.asarray(self)


class _Event:
    done = True

    def synchronize(self) -> None:
        pass


class _Stream:
    ptr = 0

    def __init__(self, non_blocking: bool = False) -> None:
        self.waited = 0

    def __enter__(self):  # noqa: ANN204
        return self

    def __exit__(self, *a: object) -> None:
        pass

    def record(self) -> _Event:
        return _Event()

    def synchronize(self) -> None:
        pass

    def wait_event(self, ev: _Event) -> None:
        self.waited += 1


def _dev(x: np.ndarray) -> Dev:
    return np.ascontiguousarray(x).view(Dev)


def _fake_cupy() -> types.ModuleType:
    cp = types.ModuleType("cupy")
    cp.asarray = lambda x, dtype=None: _dev(np.asarray(x, dtype))
    cp.empty = lambda shape, dtype: _dev(np.empty(shape, dtype))
    cp.ascontiguousarray = lambda x: _dev(np.array(x))
    cp.concatenate = lambda xs: _dev(np.concatenate([np.asarray(x) for x in xs]))
    cp.arange = lambda *a, dtype=None: _dev(np.arange(*a, dtype=dtype))
    cp.asnumpy = lambda x, stream=None: np.asarray(x)
    cp.uint64 = np.uint64
    runtime = types.SimpleNamespace(memcpyAsync=lambda dst, src, n, kind, stream: ctypes.memmove(dst, src, n))
    device = types.SimpleNamespace(synchronize=lambda: None)
    cp.cuda = types.SimpleNamespace(
        Stream=_Stream, runtime=runtime, get_elapsed_time=lambda a, b: 1.5, Device=lambda: device
    )
    cpx = types.ModuleType("cupyx")
    cpx.empty_pinned = lambda shape, dtype: np.zeros(shape, dtype)
    return cp, cpx


def _tier_pages(grid, block, args) -> None:  # noqa: ANN001
    """cuda_src/tier_copy.cu's ``tier_pages`` with memmove: staging row i <-> page idx[i] of every table array."""
    stage, table, idx, page_bytes, to_stage = args
    assert grid[1:] == (len(idx), len(table)) and block == (256,)
    for i, p in enumerate(np.asarray(idx).tolist()):
        for base, size, off in np.asarray(table).tolist():
            dev, row = base + p * size, stage.ctypes.data + i * int(page_bytes) + off
            ctypes.memmove(*((row, dev) if to_stage else (dev, row)), size)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    cp, cpx = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupyx", cpx)
    monkeypatch.setattr(HostTier, "_kernel", lambda self: _tier_pages)
    monkeypatch.setattr("ninfer.cuda.pinned_arena.cuda_pinned", lambda n: (np.zeros(n, np.uint8), None))
    monkeypatch.setattr("ninfer.cuda.pinned_arena.cuda_free", lambda h: None)
    return cp


def _net(fp8: bool, pages: int = 80, slots: int = 6):  # noqa: ANN202
    rng = np.random.default_rng(3)
    P, H, D = 4, 2, 8
    word = np.uint8 if fp8 else np.uint16

    def kv() -> Dev:
        return _dev(rng.integers(0, 250, (pages + 1, P, H, D)).astype(word))

    net = types.SimpleNamespace(stream=_Stream())
    net.kc, net.vc = [kv(), kv()], [kv(), kv()]
    net.ks = [_dev(rng.random((pages + 1, P, H), np.float32)) for _ in range(2)] if fp8 else []
    net.vs = [_dev(rng.random((pages + 1, P, H), np.float32)) for _ in range(2)] if fp8 else []
    net.conv = [_dev(rng.random((slots + 1, 6, 3), np.float32)) for _ in range(3)]
    net.rec = [_dev(rng.random((slots + 1, 2, 4, 4), np.float32)) for _ in range(3)]
    page_bytes = sum(int(a[0].nbytes) for a in net.kc + net.vc + net.ks + net.vs)
    return net, page_bytes


def _snapshot(net, pages: list[int], slot: int) -> list[np.ndarray]:  # noqa: ANN001
    return [np.array(a[pages]) for a in net.kc + net.vc + net.ks + net.vs] + [
        np.array(a[slot]) for a in net.conv + net.rec
    ]


def test_page_runs() -> None:
    assert list(page_runs([3, 4, 5, 9, 1, 2])) == [(0, 3, 3), (3, 9, 1), (4, 1, 2)]
    assert list(page_runs([])) == []


def test_pinned_arena_grows_by_segments(fake, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    net, page_bytes = _net(False)
    monkeypatch.setattr("ninfer.cuda.host_tier.SEGMENT_BYTES", 8 * page_bytes)
    tier = HostTier(net, 20, page_bytes)
    assert tier.host_bytes == 0
    tier.row(3)
    assert tier.host_bytes == 8 * page_bytes
    tier.row(17)
    assert tier.host_bytes == 20 * page_bytes  # three segments, the last one short
    with pytest.raises(IndexError):
        tier.row(20)
    eager = HostTier(
        net, 20, page_bytes, eager=True
    )  # the runner's: everything pinned up front, none in a step
    assert eager.host_bytes == 20 * page_bytes


@pytest.mark.parametrize("fp8", [False, True])
def test_spill_then_restore_elsewhere_is_bitwise(fake, fp8: bool, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    net, page_bytes = _net(fp8)
    monkeypatch.setattr("ninfer.cuda.host_tier.STAGE_BYTES", 16 * page_bytes)
    monkeypatch.setattr("ninfer.cuda.host_tier.SEGMENT_BYTES", 30 * page_bytes)  # runs cross segments
    tier = HostTier(net, 90, page_bytes, checksum=True)
    ckpt_pages = -(-sum(int(a[0].nbytes) for a in net.conv + net.rec) // page_bytes)
    n = stage_pages(page_bytes) + 5  # two staging chunks
    dev_pages = list(range(n))
    host_pages = [*range(20, 20 + n - 3), 5, 7, 6]  # runs and scattered pages
    host_ckpt = [88 - i for i in range(ckpt_pages)]  # the checkpoint bytes across non-consecutive host pages
    before = _snapshot(net, dev_pages, 2)
    tier.spill(TierCopy(0, dev_pages, host_pages, 11, host_ckpt), 2)
    for a in net.kc + net.vc + net.ks + net.vs + net.conv + net.rec:  # the device memory is reused meanwhile
        a[...] = 0
    new_pages = [p + 5 for p in dev_pages][::-1]  # restored into other pages, reversed, another slot
    tier.restore([TierCopy(7, new_pages, host_pages, 12, host_ckpt)], [4], 7)
    after = _snapshot(net, new_pages, 4)
    for b, a in zip(before, after[: len(before)], strict=True):
        if b.ndim and b.shape[0] == n:  # page arrays: restored page i holds spilled page i
            np.testing.assert_array_equal(a, b)
    for b, a in zip(before[-6:], after[-6:], strict=True):
        np.testing.assert_array_equal(a, b)
    assert tier.done(False) == [(7, 1.5e-3)] and tier.done(True) == []
    tier.guard({new_pages[0]}, set())
    assert net.stream.waited == 0  # both copies have completed: nothing to wait for
    # the checksum catches a host page that changed between the spill and the restore
    tier.row(host_pages[3])[5] ^= 1
    with pytest.raises(RuntimeError, match="differs"):
        tier.restore([TierCopy(8, new_pages, host_pages, 12, host_ckpt)], [4], 8)


def test_guard_waits_only_for_overlapping_copies(fake) -> None:  # noqa: ANN001
    net, page_bytes = _net(False)
    tier = HostTier(net, 20, page_bytes)
    _Event.done = False
    try:
        tier.spill(TierCopy(0, [1, 2], [0, 1]), None)
        tier.guard({3, 4}, {0})
        assert net.stream.waited == 0
        tier.guard({2}, set())
        assert net.stream.waited == 1
    finally:
        _Event.done = True


def test_reads_wait_only_for_restores_and_busy_slots(fake) -> None:  # noqa: ANN001
    """What the compute stream only reads waits for restores (writers), not for a spill that reads it too; a save
    can see which slots a copy in flight still touches."""
    net, page_bytes = _net(False)
    tier = HostTier(net, 40, page_bytes)
    ckpt_pages = -(-sum(int(a[0].nbytes) for a in net.conv + net.rec) // page_bytes)
    _Event.done = False
    try:
        tier.spill(TierCopy(0, [1, 2], [0, 1], 3, list(range(2, 2 + ckpt_pages))), 5)
        assert tier.busy_slots() == {5}
        tier.guard({1}, {5}, writes_only=True)
        assert net.stream.waited == 0
        tier.restore([TierCopy(9, [6], [0])], [None], 9)
        tier.guard({6}, set(), writes_only=True)
        assert net.stream.waited == 1
    finally:
        _Event.done = True
    assert tier.busy_slots() == set()


def test_checkpoint_copy_is_one_memcpy_per_array_and_run(fake, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    net, page_bytes = _net(False)
    calls: list[int] = []
    memmove = fake.cuda.runtime.memcpyAsync
    fake.cuda.runtime.memcpyAsync = lambda d, s, n, k, st: (calls.append(n), memmove(d, s, n, k, st))
    tier = HostTier(net, 40, page_bytes)
    ckpt_pages = -(-sum(int(a[0].nbytes) for a in net.conv + net.rec) // page_bytes)
    assert ckpt_pages > 1
    tier.spill(TierCopy(0, [], [], 3, list(range(10, 10 + ckpt_pages))), 2)  # consecutive host pages
    assert calls == [] and tier.queued  # queued: issued by pump (or a guard)
    tier.flush()
    assert len(calls) == len(net.conv + net.rec) and not tier.queued


def test_pump_issues_in_order_beside_the_step_and_guards_issue_what_they_touch(
    fake, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    """Queued copies go out in FIFO order: ``pump`` issues at least one op and goes on only while the compute
    stream is busy; a guard issues the queue up to the last flight touching what it guards (never a later one);
    ``done(True)`` issues a queued restore before it waits; ``busy_slots`` counts queued flights."""
    net, page_bytes = _net(False)
    monkeypatch.setattr("ninfer.cuda.host_tier.STAGE_BYTES", 2 * page_bytes)
    monkeypatch.setattr("ninfer.cuda.host_tier.MIN_ISSUE_S", 0.0)
    tier = HostTier(net, 40, page_bytes)
    before = _snapshot(net, [1, 2, 3, 4, 5], 2)
    issued: list[int] = []
    memmove = fake.cuda.runtime.memcpyAsync
    fake.cuda.runtime.memcpyAsync = lambda d, s, n, k, st: (issued.append(n), memmove(d, s, n, k, st))
    tier.spill(TierCopy(0, [1, 2, 3, 4, 5], [0, 1, 2, 3, 4]), None)  # 3 ops of <= 2 pages
    tier.spill(TierCopy(0, [6], [5]), None)
    tier.restore([TierCopy(4, [7, 8], [0, 1])], [None], 4)
    assert tier.queued and issued == [] and tier.busy_slots() == set()
    tier.pump(lambda: False)  # the GPU is idle: the minimum, at least one op
    first = len(issued)
    assert first == 1 and tier.queued  # one run of host pages: one memcpy
    tier.guard({6}, set())  # the second spill: issued with everything before it, the restore stays queued
    assert len(tier._queue) == 1 and tier._queue[0].ticket == 4 and net.stream.waited == 0  # events done
    assert tier.done(False) == []  # the restore is not issued yet
    got = tier.done(True)
    assert [t for t, _ in got] == [4] and not tier.queued
    for b, a in zip(before, net.kc + net.vc, strict=False):  # spilled pages 1, 2 came back as pages 7, 8
        assert np.array_equal(b[:2], np.asarray(a[[7, 8]]))
    tier.spill(TierCopy(0, [], [], 3, [30, 31, 32]), 5)
    assert tier.busy_slots() == {5}  # queued, not issued
    n = len(issued)
    tier.pump(lambda: True)  # the step still runs: everything goes out (well under MAX_ISSUE_S)
    assert not tier.queued and len(issued) > n


def test_pinned_arena_pins_lazily_or_all_at_once() -> None:
    """Without ``pin_all`` a segment is pinned when a page of it is first reached (counted as the caller's
    wait); ``pin_all`` (the runner's) pins every segment up front, so copies then wait for nothing; the last
    segment is short; out-of-range pages are refused; the segments are freed with the arena."""
    from ninfer.cuda.pinned_arena import PinnedArena

    calls, freed = [], []

    def alloc(n: int) -> tuple[np.ndarray, int]:
        calls.append(n)
        return np.zeros(n, np.uint8), len(calls)

    arena = PinnedArena(50, 16, 8, alloc, freed.append)  # 7 segments, the last one short
    assert arena.nbytes == 0
    arena.row(15)[:] = 7  # segments 0 and 1, pinned here, counted
    assert len(arena.segments) == 2 and arena.wait_seconds > 0
    arena.row(49)
    assert len(arena.segments) == 7 and arena.segments[-1].shape == (2, 16)
    assert int(arena.row(15)[0]) == 7
    with pytest.raises(IndexError):
        arena.row(50)
    eager = PinnedArena(50, 16, 8, lambda n: (np.zeros(n, np.uint8), None))
    eager.pin_all()
    assert len(eager.segments) == 7 and eager.nbytes == 50 * 16
    eager.row(49)
    assert eager.wait_seconds == 0
    del arena
    import gc

    gc.collect()
    assert sorted(freed) == list(range(1, 8))  # every segment released with the arena
