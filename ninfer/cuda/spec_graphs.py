"""``VerifyGraphs``: CUDA graphs of the speculative verify forward (docs/speculative.md, ``ninfer/cuda/spec.py``).

One graph per (lanes, positions per lane), captured on first use like the decode graphs (``model_graph.GraphSet``):
static ``Meta`` buffers filled by one staging upload, a private memory pool, ``prefill_gemm`` off so every row is
its decode step's bits. The GDN layers' inputs of the captured forward are the graph's own buffers (valid until
its next replay): the runner's rollback replays from them in the same step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["VerifyGraphs"]


class VerifyGraphs:
    """Verify-forward graphs of one network, one per (lanes, positions per lane), captured on first use with
    ``prefill_gemm`` off and the GDN inputs kept (their buffers are the graph's, valid until its next replay)."""

    def __init__(self, net: Any) -> None:
        self.net = net
        self._graphs: dict[tuple[int, int], Any] = {}
        self._failed: set[tuple[int, int]] = set()

    def run(
        self, ids: np.ndarray, segs: Sequence[tuple[int, int, int, list[int]]]
    ) -> tuple[Any, Any, dict] | None:
        """(hidden, logits, GDN inputs) of the verify forward by replay; None where no graph serves it."""
        from ninfer.cuda.model_graph import _FIELDS, host_meta

        n = {s[2] for s in segs}
        key = (len(segs), n.pop())
        if n or key in self._failed:
            return None
        net = self.net
        g = self._graphs.get(key) or self._capture(*key)
        if g is None:
            return None
        hm = host_meta(segs, net.pool[2], net.pool[3])
        g["staging"].upload({"ids": np.asarray(ids, np.int32), **{k: hm[k] for k in _FIELDS}}, net.stream)
        g["graph"].launch(net.stream)
        net.stream.synchronize()
        return g["h"], g["logits"], g["cap"]

    def _capture(self, b: int, n: int) -> Any:
        import cupy

        from ninfer.cuda.model_graph import _FIELDS, Meta, _Staging, host_meta

        net = self.net
        slot, page = net.scratch
        ps, max_pages = net.pool[2], net.pool[3]
        hm = host_meta([(slot, 0, n, [page])] * b, ps, max_pages)
        net.zero_slot(slot)
        pool = cupy.cuda.MemoryPool()
        gemm, net.prefill_gemm = net.prefill_gemm, False
        try:
            with net.stream, cupy.cuda.using_allocator(pool.malloc):
                shapes = {"ids": ((b * n,), np.int32), **{k: (hm[k].shape, hm[k].dtype) for k in _FIELDS}}
                staging = _Staging(shapes)
                staging.upload({"ids": np.zeros(b * n, np.int32), **{k: hm[k] for k in _FIELDS}}, net.stream)
                v = staging.views
                meta = Meta(
                    t=b * n,
                    nseq=b,
                    max_len=max_pages * ps,
                    chunk=net.attn_chunk,
                    **{k: v[k] for k in _FIELDS},
                )
                net.gdn_capture = {}
                net.logits_dev(net.body(v["ids"], meta))  # warm-up: kernels loaded, the private pool filled
                net.stream.synchronize()
                cap = net.gdn_capture = {}
                net.stream.begin_capture()
                try:
                    h = net.body(v["ids"], meta)
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
        g = {"graph": graph, "pool": pool, "staging": staging, "h": h, "logits": logits, "cap": cap}
        self._graphs[(b, n)] = g
        return g
