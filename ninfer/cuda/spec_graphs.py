"""CUDA graphs of a speculative round (docs/speculative.md, ``ninfer/cuda/spec.py``): ``VerifyGraphs`` for the verify
forward, ``DraftGraphs`` for one step of the MTP head.

Both are captured at start-up by the runner (on first use outside it), like the decode graphs
(``model_graph.GraphSet``): static ``Meta`` buffers filled by one staging upload, a private memory pool,
``prefill_gemm`` off so every row is its decode step's bits.

- Verify, one graph per (lanes, positions per lane). With snapshots (``snap``) the static ``Meta`` carries each
  lane's first snapshot slot and the GDN recurrence stores the state before every position there (the rollback is a
  slot copy); without, the GDN layers' inputs of the captured forward are kept (the graph's own buffers, valid until
  its next replay) for the rollback by replay.
- Draft, one graph per (lanes, rows) for up to 8 rows (one GEMV weight pass; more rows run eagerly): the head's
  forward over the rows (static hidden buffer filled by one device copy), the pick of each lane's last row and its
  logits. Bitwise the eager ``mtp_hidden`` step: up to 8 rows both run the GEMV and the decode attention kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["VerifyGraphs", "DraftGraphs", "DRAFT_GRAPH_ROWS"]

DRAFT_GRAPH_ROWS = 8  # draft steps over more rows run eagerly (at most 36 small graphs: lanes <= rows <= 8)

Seg = tuple[int, int, int, list[int]]


def _staging(
    net: Any,
    segs: Sequence[Seg],
    extra: dict[str, tuple[tuple[int, ...], Any]],
    init: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """(staging, Meta over its views) for a capture over ``segs``; ``extra`` named buffers join the staging (zeros,
    or their values in ``init``)."""
    from ninfer.cuda.model_graph import _FIELDS, Meta, _Staging, host_meta

    ps, max_pages = net.pool[2], net.pool[3]
    hm = host_meta(segs, ps, max_pages)
    t = int(hm["row_pos"].size)
    shapes = {"ids": ((t,), np.int32), **{k: (hm[k].shape, hm[k].dtype) for k in _FIELDS}, **extra}
    staging = _Staging(shapes)
    zeros = {k: np.zeros(s, d) if k not in (init or {}) else init[k] for k, (s, d) in extra.items()}
    staging.upload({"ids": np.zeros(t, np.int32), **{k: hm[k] for k in _FIELDS}, **zeros}, net.stream)
    v = staging.views
    meta = Meta(
        t=t, nseq=len(segs), max_len=max_pages * ps, chunk=net.attn_chunk, **{k: v[k] for k in _FIELDS}
    )
    return staging, meta


def _upload(net: Any, g: dict[str, Any], ids: np.ndarray, segs: Sequence[Seg], **extra: np.ndarray) -> None:
    """Fill the graph's static inputs: one asynchronous copy from its pinned buffer, which is rewritten only once
    the previous copy from it is done."""
    from ninfer.cuda.model_graph import _FIELDS, host_meta

    hm = host_meta(segs, net.pool[2], net.pool[3])
    if g.get("uploaded") is not None:
        g["uploaded"].synchronize()
    g["staging"].upload(
        {"ids": np.asarray(ids, np.int32), **{k: hm[k] for k in _FIELDS}, **extra}, net.stream
    )
    g["uploaded"] = net.stream.record()


class VerifyGraphs:
    """Verify-forward graphs of one network, one per (lanes, positions per lane), captured by ``ensure`` or on first use, with
    ``prefill_gemm`` off. ``snapshots``: ``run`` takes each lane's first snapshot slot (``snap``); else the GDN
    inputs are kept (their buffers are the graph's, valid until its next replay)."""

    def __init__(self, net: Any, snapshots: bool = False, warm_snap: Sequence[int] = ()) -> None:
        self.net, self.snapshots = net, snapshots
        self._warm_snap = list(warm_snap)  # snapshot slots the warm-up run may write (lane i: warm_snap[i])
        self._graphs: dict[tuple[int, int], Any] = {}
        self._failed: set[tuple[int, int]] = set()
        self.captures = 0  # graphs captured so far (a capture costs a warm-up forward and the capture itself)

    def pool_bytes(self) -> int:
        """The private memory pools' bytes of the graphs captured so far."""
        return int(sum(g["pool"].total_bytes() for g in self._graphs.values()))

    def ensure(self, b: int, n: int) -> bool:
        """Capture the graph of ``b`` lanes and ``n`` positions per lane now unless it exists (False: it cannot
        be captured; that shape runs eagerly)."""
        key = (b, n)
        return key not in self._failed and (key in self._graphs or self._capture(b, n) is not None)

    def run(
        self, ids: np.ndarray, segs: Sequence[Seg], snap: Sequence[int] | None = None
    ) -> tuple[Any, Any, dict] | None:
        """(hidden, logits, GDN inputs) of the verify forward by replay (launched, not synchronized); None where no
        graph serves it."""
        n = {s[2] for s in segs}
        key = (len(segs), n.pop())
        if n or key in self._failed:
            return None
        g = self._graphs.get(key) or self._capture(*key)
        if g is None:
            return None
        extra = {"snap": np.asarray(snap, np.int32)} if self.snapshots else {}
        _upload(self.net, g, ids, segs, **extra)
        g["graph"].launch(self.net.stream)
        return g["h"], g["logits"], g["cap"]

    def _capture(self, b: int, n: int) -> Any:
        import cupy

        net = self.net
        self.captures += 1
        slot, page = net.scratch
        net.zero_slot(slot)
        pool = cupy.cuda.MemoryPool()
        gemm, net.prefill_gemm = net.prefill_gemm, False
        try:
            with net.stream, cupy.cuda.using_allocator(pool.malloc):
                extra = {"snap": ((b,), np.int32)} if self.snapshots else {}
                init = {"snap": np.asarray(self._warm_snap[:b], np.int32)}  # warm-up stores: unused slots
                staging, meta = _staging(net, [(slot, 0, n, [page])] * b, extra, init)
                meta.snap = staging.views["snap"] if self.snapshots else None
                ids = staging.views["ids"]
                net.gdn_capture = None if self.snapshots else {}
                net.logits_dev(net.body(ids, meta))  # warm-up: kernels loaded, the private pool filled
                net.stream.synchronize()
                cap = net.gdn_capture = None if self.snapshots else {}
                net.stream.begin_capture()
                try:
                    h = net.body(ids, meta)
                    logits = net.logits_dev(h)
                finally:
                    graph = net.stream.end_capture()
                graph.upload(net.stream)
            net.stream.synchronize()
        except Exception:  # noqa: BLE001 - e.g. a kernel that cannot be captured: this shape runs eagerly
            self._failed.add((b, n))
            return None
        finally:
            net.prefill_gemm, net.gdn_capture = gemm, None
        g = {"graph": graph, "pool": pool, "staging": staging, "h": h, "logits": logits, "cap": cap or {}}
        self._graphs[(b, n)] = g
        return g


class DraftGraphs:
    """One MTP head step per (lanes, rows <= ``DRAFT_GRAPH_ROWS``), captured by ``ensure`` or on first use."""

    def __init__(self, net: Any) -> None:
        self.net = net
        self._graphs: dict[tuple[int, int], Any] = {}
        self._failed: set[tuple[int, int]] = set()
        self.captures = 0

    def pool_bytes(self) -> int:
        """The private memory pools' bytes of the graphs captured so far."""
        return int(sum(g["pool"].total_bytes() for g in self._graphs.values()))

    def ensure(self, b: int, t: int) -> bool:
        """Capture the step of ``b`` lanes over ``t`` rows now unless it exists (False: it runs eagerly)."""
        key = (b, t)
        if t > DRAFT_GRAPH_ROWS or key in self._failed:
            return False
        return key in self._graphs or self._capture(b, t) is not None

    def run(
        self, hidden: Sequence[Any], ids: Any, segs: Sequence[Seg], last: Sequence[int]
    ) -> tuple[Any, Any] | None:
        """(chain ``[b, H]``, logits ``[b, V]``) of one head step over the rows ``hidden`` (device arrays, in
        order) and token ids ``ids`` (host, or an int32 device array: copied into the graph's ids after the
        staging upload, in stream order): copies, launched and not synchronized; None where no graph serves it."""
        import cupy

        key = (len(segs), int(ids.size))
        if key[1] > DRAFT_GRAPH_ROWS or key in self._failed:
            return None
        g = self._graphs.get(key) or self._capture(*key)
        if g is None:
            return None
        net = self.net
        on_device = not isinstance(ids, np.ndarray)
        with net.stream:
            cupy.concatenate([cupy.asarray(x, dtype=np.float32) for x in hidden], axis=0, out=g["hidden"])
        _upload(
            net, g, np.zeros(key[1], np.int32) if on_device else ids, segs, last=np.asarray(last, np.int64)
        )
        with net.stream:
            if on_device:
                g["staging"].views["ids"][...] = ids
            g["graph"].launch(net.stream)
            # the buffers are rewritten by the next replay (the next step of the round)
            return g["chain"].copy(), g["logits"].copy()

    def _capture(self, b: int, t: int) -> Any:
        import cupy

        from ninfer.cuda.mtp import mtp_body

        net, cfg = self.net, self.net.cfg
        self.captures += 1
        slot, page = net.scratch
        pages = [page] * net.pool[3]
        segs = [(slot, 0, t - b + 1, pages)] + [(slot, 0, 1, pages)] * (b - 1)
        pool = cupy.cuda.MemoryPool()
        gemm, net.prefill_gemm = net.prefill_gemm, False
        try:
            with net.stream, cupy.cuda.using_allocator(pool.malloc):
                staging, meta = _staging(net, segs, {"last": ((b,), np.int64)})
                hidden = cupy.zeros((t, cfg.hidden_size), np.float32)
                ids, last = staging.views["ids"], staging.views["last"]

                def step() -> tuple[Any, Any]:
                    chain = cupy.take(mtp_body(net, hidden, ids, meta), last, axis=0)
                    return chain, net.logits_dev(chain)

                step()  # warm-up: kernels loaded, the private pool filled
                net.stream.synchronize()
                net.stream.begin_capture()
                try:
                    chain, logits = step()
                finally:
                    graph = net.stream.end_capture()
                graph.upload(net.stream)
            net.stream.synchronize()
        except Exception:  # noqa: BLE001 - a step that cannot be captured runs eagerly
            self._failed.add((b, t))
            return None
        finally:
            net.prefill_gemm = gemm
        g = {
            "graph": graph,
            "pool": pool,
            "staging": staging,
            "hidden": hidden,
            "chain": chain,
            "logits": logits,
        }
        self._graphs[(b, t)] = g
        return g
