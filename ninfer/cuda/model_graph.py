"""Per-call row metadata of ``CudaQwen36`` and the decode CUDA graphs.

``Meta`` describes where the T rows of one call live: text positions, KV cache slots, the page table of each
sequence, GDN state slots and segment starts. Eager calls upload a fresh ``Meta``; a decode graph owns static
``Meta`` buffers that are refilled before each replay. A graph is captured once per lane count B on the model's
stream, after one warm-up run over the scratch slot and page; its temporaries come from a private memory pool
kept alive with the graph, so replays never write into memory that was handed out again. A replay uploads the
token ids and the ``Meta`` arrays with one asynchronous copy from a pinned buffer (``_Staging``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Meta", "host_meta", "GraphSet", "next_product", "prefetch_order", "traced_step"]

Seg = tuple[int, int, int, list[int]]  # (GDN slot, start position, tokens, KV pages)


def host_meta(segs: Sequence[Seg], page_size: int, max_pages: int, positions: Any = None) -> dict[str, Any]:
    """Host arrays of the metadata of packed segments (rows of segment b follow those of b-1)."""
    pos = np.concatenate([np.arange(s, s + n, dtype=np.int64) for _, s, n, _ in segs])
    t = pos.size
    kv = np.empty(t, np.int64)
    pt = np.zeros((len(segs), max_pages), np.int32)
    r = 0
    for b, (_, s, n, pages) in enumerate(segs):
        pg = np.asarray(pages, np.int64)
        if -(-(s + n) // page_size) > min(pg.size, max_pages):
            raise ValueError(f"segment {b}: positions up to {s + n} need more than its {pg.size} KV pages")
        p = pos[r : r + n]
        kv[r : r + n] = pg[p // page_size] * page_size + p % page_size
        pt[b, : min(pg.size, max_pages)] = pg[:max_pages]
        r += n
    if positions is None:
        pos3 = np.broadcast_to(pos, (3, t))
    else:
        pos3 = np.asarray(positions)
        pos3 = np.broadcast_to(pos3, (3, t)) if pos3.ndim == 1 else pos3
        if pos3.shape != (3, t):
            raise ValueError(f"positions: expected [3, {t}] or [{t}], got {list(pos3.shape)}")
    counts = np.asarray([n for _, _, n, _ in segs], np.int64)
    return {
        "pos": np.ascontiguousarray(pos3, np.int32),
        "kv_slots": kv,
        "page_table": pt,
        "row_seq": np.repeat(np.arange(len(segs), dtype=np.int32), counts),
        "row_pos": pos.astype(np.int32),
        "starts": np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
        "gslots": np.asarray([g for g, _, _, _ in segs], np.int32),
        "max_len": int(max(s + n for _, s, n, _ in segs)),
    }


_FIELDS = ("pos", "kv_slots", "page_table", "row_seq", "row_pos", "starts", "gslots")


@dataclass(slots=True)
class Meta:
    """Device metadata of one call (see ``host_meta``); ``chunk`` is the attention KV split length."""

    t: int
    nseq: int
    max_len: int
    chunk: int
    pos: Any
    kv_slots: Any
    page_table: Any
    row_seq: Any
    row_pos: Any
    starts: Any
    gslots: Any
    snap: Any = (
        None  # speculative verify: GDN snapshot slot of each sequence's first token (gdn_decode's ``snap``)
    )

    @classmethod
    def from_host(cls, hm: dict[str, Any], chunk: int) -> Meta:
        import cupy

        dev = {k: cupy.asarray(hm[k]) for k in _FIELDS}
        return cls(t=hm["row_pos"].size, nseq=hm["gslots"].size, max_len=hm["max_len"], chunk=chunk, **dev)

    @staticmethod
    def ids_from(ids: np.ndarray) -> Any:
        import cupy

        return cupy.asarray(np.asarray(ids, np.int32))


@dataclass(slots=True)
class _Graph:
    graph: Any
    pool: Any  # private cupy MemoryPool holding every temporary of the captured step
    ids: Any
    meta: Meta
    h: Any
    logits: Any
    staging: _Staging


class _Staging:
    """The graph's static inputs (token ids and ``Meta`` arrays) as views of one device buffer, mirrored by one
    pinned host buffer: a replay fills the host views and uploads everything with a single asynchronous copy
    (measured: eight synchronous ``.set()`` copies cost ~0.1 ms per decode step)."""

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], Any]]) -> None:
        import cupy

        offs, size = {}, 0
        for name, (shape, dtype) in shapes.items():
            offs[name] = size
            size += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 16) * 16
        self.size = size
        self.dev = cupy.empty(size, dtype=np.uint8)
        self._pinned = cupy.cuda.alloc_pinned_memory(size)
        host = np.frombuffer(self._pinned, np.uint8, size)
        self.views = {n: cupy.ndarray(s, d, self.dev.data + offs[n]) for n, (s, d) in shapes.items()}
        self.host = {n: host[offs[n] : offs[n] + int(np.prod(s)) * np.dtype(d).itemsize].view(d).reshape(s)
                     for n, (s, d) in shapes.items()}  # fmt: skip

    def upload(self, values: dict[str, Any], stream: Any) -> None:
        import cupy

        for name, v in values.items():
            self.host[name][...] = v
        cupy.cuda.runtime.memcpyAsync(self.dev.data.ptr, self._pinned.ptr, self.size, 1, stream.ptr)


def next_product(net: Any, w: Any) -> Any:
    """The weight of the decode GEMV launched after ``w`` (``net.gemv_next``, from the traced warm-up step) when
    ``net.gemv_prefetch`` is on, else None; records ``w`` while a trace is on (``net.gemv_trace``)."""
    trace = getattr(net, "gemv_trace", None)
    if trace is not None:
        trace.append(w)
    return net.gemv_next.get(id(w)) if getattr(net, "gemv_prefetch", False) else None


def prefetch_order(trace: list[Any]) -> dict[int, Any]:
    """``gemv_next`` from one step's GEMV weights in launch order: each to the one after it, the last (the LM head)
    to the first (the next step's)."""
    return {id(w): trace[(i + 1) % len(trace)] for i, w in enumerate(trace)}


def traced_step(net: Any, step: Callable[[], Any]) -> None:
    """Run ``step`` (one decode step); with prefetching on and no order yet, record its GEMVs' order into
    ``net.gemv_next``."""
    if not getattr(net, "gemv_prefetch", False) or net.gemv_next:
        step()
        return
    net.gemv_trace = []
    try:
        step()
    finally:
        order, net.gemv_trace = net.gemv_trace, None
    net.gemv_next = prefetch_order(order)


class GraphSet:
    """Decode graphs of one ``CudaQwen36``, one per lane count."""

    def __init__(self, net: Any) -> None:
        self.net = net
        self._graphs: dict[int, _Graph] = {}

    def clear(self) -> None:
        self._graphs.clear()

    @property
    def captured(self) -> list[int]:
        return sorted(self._graphs)

    def graph(self, b: int) -> Any:
        """The captured ``b``-lane ``cupy.cuda.graph.Graph`` (None when not captured): for inspection (perf/)."""
        g = self._graphs.get(b)
        return None if g is None else g.graph

    def pool_bytes(self) -> int:
        return int(sum(g.pool.total_bytes() for g in self._graphs.values()))

    def replay(self, ids: np.ndarray, segs: Sequence[Seg]) -> tuple[Any, Any]:
        """Fill the static inputs of the B-lane graph and launch it on ``net.stream`` (not synchronized); returns its
        (hidden, logits) buffers, valid until the next replay. The caller synchronizes the stream before the next
        replay (the pinned staging buffer is reused)."""
        net = self.net
        g = self._graphs.get(len(segs)) or self.capture(len(segs))
        hm = host_meta(segs, net.pool[2], net.pool[3])
        g.staging.upload({"ids": ids, **{k: hm[k] for k in _FIELDS}}, net.stream)
        g.graph.launch(net.stream)
        return g.h, g.logits

    def capture(self, b: int) -> _Graph:
        import cupy

        net = self.net
        slot, page = net.scratch
        ps, max_pages = net.pool[2], net.pool[3]
        hm = host_meta([(slot, 0, 1, [page])] * b, ps, max_pages)
        net.zero_slot(slot)  # all B warm-up rows share the scratch slot: same inputs, same (finite) values
        pool = cupy.cuda.MemoryPool()
        with net.stream, cupy.cuda.using_allocator(pool.malloc):
            shapes = {"ids": ((b,), np.int32), **{k: (hm[k].shape, hm[k].dtype) for k in _FIELDS}}
            staging = _Staging(shapes)
            staging.upload({"ids": np.zeros(b, np.int32), **{k: hm[k] for k in _FIELDS}}, net.stream)
            v = staging.views
            meta = Meta(
                t=b, nseq=b, max_len=max_pages * ps, chunk=net.attn_chunk, **{k: v[k] for k in _FIELDS}
            )
            # max_len: fixed launch shape, the graph serves any length up to the capacity
            ids = v["ids"]
            # warm-up: loads every kernel, fills the private pool (and gives the prefetch hints their order)
            traced_step(net, lambda: net.logits_dev(net.body(ids, meta)))
            net.stream.synchronize()
            net.stream.begin_capture()
            try:
                h = net.body(ids, meta)
                logits = net.logits_dev(h)
            finally:
                graph = net.stream.end_capture()
            graph.upload(net.stream)
        net.stream.synchronize()
        self._graphs[b] = _Graph(graph, pool, ids, meta, h, logits, staging)
        return self._graphs[b]
