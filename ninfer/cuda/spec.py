"""Speculative decoding on the device (docs/speculative.md): the MTP head, the verify forward and the rollback of a
lane's GDN state, for ``CudaModelRunner``.

- MTP head (``mtp_hidden``): docs/model-math.md §6 with the model's own kernels; its attention layer keeps KV in
  the extra plane ``len(full_attention_layers)`` of the device page pool (allocated with ``extra_kv=1``), through
  the lane's page table. Bookkeeping per lane as the reference (``ninfer/engine/reference_draft.py``): ``base``,
  pending target hiddens, the chain of a round, its draft logits rows.
- Verify: one forward over ``[last token, d_1..d_m]`` of every verified lane with ``prefill_gemm`` off (the GEMV
  in 8-row blocks, the decode attention kernel and the exact GDN recurrence ``gdn_decode``), so every position's
  hidden and logits are bitwise those of its decode step (fp32 GDN state). With ``net.cuda_graph`` it replays a
  graph captured for ``(b, k+1)`` (``spec_graphs.VerifyGraphs``; the runner's memory plan counts them); a round cut
  short (fewer drafts) or a capture that fails runs eagerly with the same kernels.
- Rollback by snapshots (``snapshots``, the default): lane ``l`` owns the GDN slots ``snap_slot(l) ..`` (``k + 1``);
  the verify's ``gdn_decode`` stores the lane's recurrent and conv state before each position ``i`` into slot
  ``snap_slot(l) + i`` (stores only: the arithmetic is unchanged), so ``commit`` to ``kept < m + 1`` positions is
  one slot copy of snapshot ``kept``, bitwise the state a replay of the kept rows leaves. Draft steps of up to 8
  rows replay ``spec_graphs.DraftGraphs``.
- Rollback by replay (``snapshots=False``, the earlier path, kept selectable): before the round the lane's GDN slot
  is copied to the lane's spare slot; the forward keeps each GDN layer's inputs (``in_proj`` qkv, z, a, b rows);
  ``commit`` to fewer than all positions copies the spare slot back and re-runs ``gdn_decode`` over the kept rows
  of every GDN layer. Draft steps run eagerly.
- KV of rejected positions is left behind the lane's length.
- Greedy verification samples every greedy lane's rows in one device call (one host synchronization per round).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ninfer.cuda.mtp import mtp_body, mtp_hidden
from ninfer.engine.core import DraftLane, SampleRequest
from ninfer.engine.spec_verify import verify_lane

__all__ = ["CudaSpec", "mtp_hidden", "mtp_body"]


class _Lane:
    __slots__ = ("base", "length", "pending", "chain", "rows")

    def __init__(self, length: int) -> None:
        self.base = self.length = (
            length  # MTP rows in the plane / MTP KV length (provisional rows beyond base)
        )
        self.pending: list[Any] = []  # device hidden rows [n, H] of positions base..
        self.chain: Any = None
        self.rows: list[Any] = []  # this round's draft logits rows [1, V]


class CudaSpec:
    """The runner's speculative state. ``snapshots`` (``k`` drafts at most): lane ``l``'s GDN snapshot slots are
    ``spare_base + l * (k + 1) ..`` (one per verified position); else ``spare_base + l`` is the lane's spare slot for
    the pre-round copy of the replay rollback."""

    def __init__(self, net: Any, lanes: int, spare_base: int, k: int = 0, snapshots: bool = False) -> None:
        self.net, self.spare_base, self.snapshots, self.k = net, spare_base, snapshots, k
        from ninfer.cuda.spec_graphs import DraftGraphs, VerifyGraphs

        warm = [self.snap_slot(lane) for lane in range(lanes)] if snapshots else []
        self.graphs = VerifyGraphs(net, snapshots, warm) if net.cuda_graph else None
        self.drafts = DraftGraphs(net) if net.cuda_graph and snapshots else None
        self._lanes: list[_Lane | None] = [None] * lanes
        self._pages: list[list[int]] = [[] for _ in range(lanes)]
        self._verify: dict[int, tuple[int, int, Any, Any]] = {}  # lane -> (start, first row, hidden, logits)
        self._capture: dict[int, Any] = {}
        self._rows_of: dict[int, tuple[int, int]] = {}  # lane -> (first row, rows) in the verify forward
        # how each verify forward and draft step ran: by graph replay or eagerly (an eager 27B verify forward costs
        # its ~1,000 launches from Python; the benchmark reports these per round, docs/speculative.md)
        self.counts = dict.fromkeys(("verify_graph", "verify_eager", "draft_graph", "draft_eager"), 0)

    def snap_slot(self, lane: int) -> int:
        """The lane's first GDN snapshot slot (snapshots: the state before the round's first position)."""
        return self.spare_base + lane * (self.k + 1)

    def capture(self, lanes: int) -> int:
        """Capture now every graph a round over ``lanes`` lanes can replay: the verify forward at 2..k+1 positions
        per lane (fewer than k+1 where drafting stops early) and the draft steps of ``lanes`` .. 8 rows (a round's
        first step covers each lane's kept rows). Otherwise each is captured on first use, in the middle of a
        request. Returns the graphs captured so far."""
        if self.graphs is not None:
            for n in range(2, self.k + 2):
                self.graphs.ensure(lanes, n)
        if self.drafts is not None:
            from ninfer.cuda.spec_graphs import DRAFT_GRAPH_ROWS

            for t in range(lanes, min(DRAFT_GRAPH_ROWS, lanes * (self.k + 1)) + 1):
                self.drafts.ensure(lanes, t)
        self.warm_chain()
        return self.captures

    def warm_chain(self) -> None:
        """Build now the CuPy kernels only ``draft_chain``'s device feed uses (the clamp of a sampled id, its copy
        into a graph's ids, the stack of the steps' ids): built lazily, they cost the first chained round of k >= 2
        ~100 ms on a fresh machine (the H200 rounds table's 12.3 ms ``draft_chain_ms`` at k = 3 at cedd073: one
        compile over its 10 timed rounds)."""
        import cupy

        with self.net.stream:
            ids = cupy.zeros(2, np.int32)
            nxt = cupy.maximum(ids, 0).astype(np.int32, copy=False)
            cupy.empty(2, np.int32)[...] = nxt
            cupy.stack([ids, nxt], axis=1)
        self.net.stream.synchronize()

    def pool_bytes(self) -> int:
        """The private memory pools' bytes of the verify and draft graphs captured so far."""
        return sum(g.pool_bytes() for g in (self.graphs, self.drafts) if g is not None)

    @property
    def captures(self) -> int:
        """Verify and draft graphs captured so far."""
        return sum(g.captures for g in (self.graphs, self.drafts) if g is not None)

    def setup(self, lane: int, pages: list[int], length: int) -> None:
        self._lanes[lane], self._pages[lane] = _Lane(length), list(pages)

    def record(self, lane: int, start: int, hidden: Any, token_ids: Sequence[int] | None = None) -> None:
        """Target hiddens ``[T, H]`` of positions ``start..`` just computed. With the work's ``token_ids`` (prefill)
        the rows whose next token is known run through the head now, so a long prompt keeps one pending row."""
        import cupy

        ln = self._lane(lane)
        held = sum(int(x.shape[0]) for x in ln.pending)
        assert start == ln.base + held, "MTP rows out of step"
        if token_ids is None or held > 1 or (held == 0 and hidden.shape[0] < 2):
            ln.pending.append(hidden)
            return
        with self.net.stream:  # every device operation on the network's (non-blocking) stream
            rows = cupy.concatenate([*ln.pending, hidden[:-1]], axis=0) if held else hidden[:-1]
        ids = list(token_ids) if held else list(token_ids[1:])
        mtp_hidden(self.net, rows, np.asarray(ids, np.int32), [(lane, ln.base, len(ids), self._pages[lane])])
        ln.base += len(ids)
        ln.length = ln.base
        ln.pending = [hidden[-1:]]

    # ---- drafting -----------------------------------------------------------------------------------------
    def draft(self, lanes: Sequence[DraftLane]) -> Any:
        """One draft step for every lane in one packed MTP call (a graph replay for up to 8 rows with
        ``snapshots``); returns the logits rows ``[len(lanes), V]``."""
        hid: list[Any] = []
        ids, segs, last, total = [], [], [], 0
        for dl in lanes:
            ln = self._lane(dl.lane)
            computed = ln.base + sum(int(x.shape[0]) for x in ln.pending)
            if len(dl.tokens) == computed + 1:  # first step of a round: catch up with the computed tokens
                ln.length, ln.rows, ln.chain = ln.base, [], None
                hid.extend(ln.pending)
                tok = list(dl.tokens[ln.base + 1 : computed + 1])
                assert tok, f"lane {dl.lane}: no computed row to draft from"
                ln.base, ln.pending = computed, []
            else:
                assert ln.chain is not None and len(dl.tokens) == computed + 1 + len(ln.rows)
                hid.append(ln.chain)
                tok = [int(dl.tokens[-1])]
            segs.append((dl.lane, ln.length, len(tok), self._pages[dl.lane]))
            ids.extend(tok)
            ln.length += len(tok)
            total += len(tok)
            last.append(total - 1)
        return self._step([dl.lane for dl in lanes], hid, np.asarray(ids, np.int32), segs, last)

    def draft_chain(
        self,
        lanes: Sequence[DraftLane],
        reqs: Sequence[Sequence[SampleRequest]],
        token_limit: int | None,
        forced: Sequence[Sequence[int]] | None = None,
    ) -> tuple[list[list[int]], Any]:
        """A round's ``len(reqs[i])`` draft steps with one host synchronization: ``lanes`` as for the first
        ``draft`` step; step ``s`` of lane ``i`` is sampled on the device with ``reqs[i][s]`` and its token is the
        next step's input there (``forced``: these host tokens are fed and returned instead; the sampler still
        runs). The requests must not depend on the drafts (no grammar mask, no penalties: the caller's rule).
        Bitwise the ``draft`` / ``sample`` loop (the same graphs or eager steps, the same sampler). A row that
        allows nothing (-1) feeds token 0 on: the caller drops the drafts from there. Returns (tokens per lane,
        the last step's logits)."""
        import cupy

        from ninfer.cuda.sampling import sample_requests_dev

        steps, ids = len(reqs[0]), [dl.lane for dl in lanes]
        assert steps >= 1 and all(len(r) == steps for r in reqs), "every lane drafts the same number of steps"
        logits = self.draft(lanes)
        toks = []
        for s in range(steps):
            with self.net.stream:
                toks.append(sample_requests_dev(logits, [r[s] for r in reqs], token_limit))
                if s + 1 == steps:
                    break
                if forced is not None:
                    nxt = np.asarray([f[s] for f in forced], np.int32)
                else:  # int32 like the sampler's ids; a -1 (nothing allowed) feeds token 0
                    nxt = cupy.maximum(toks[-1], 0).astype(np.int32, copy=False)
            logits = self._next(ids, nxt)
        with self.net.stream:  # the one synchronization of the drafting
            got = cupy.asnumpy(cupy.stack(toks, axis=1), stream=self.net.stream).tolist()
        return ([[int(t) for t in f] for f in forced] if forced is not None else got), logits

    def _next(self, lanes: Sequence[int], ids: Any) -> Any:
        """A later draft step of ``lanes`` (one row each: the previous step's chain row and token ``ids``, host
        or device), as ``draft`` does it from host tokens."""
        hid, segs = [], []
        for lane in lanes:
            ln = self._lane(lane)
            assert ln.chain is not None, f"lane {lane}: a later draft step before the first"
            hid.append(ln.chain)
            segs.append((lane, ln.length, 1, self._pages[lane]))
            ln.length += 1
        return self._step(lanes, hid, ids, segs, list(range(len(lanes))))

    def _step(self, lanes: Sequence[int], hid: list[Any], ids: Any, segs: list[Any], last: list[int]) -> Any:
        """One packed head step (a graph replay for up to 8 rows with ``snapshots``, else eager); keeps each
        lane's chain row and draft logits row; returns the logits ``[len(lanes), V]``."""
        import cupy

        got = self.drafts.run(hid, ids, segs, last) if self.drafts is not None else None
        self.counts["draft_eager" if got is None else "draft_graph"] += 1
        if got is not None:
            chain, logits = got
        else:
            with self.net.stream:
                hid_all = cupy.concatenate(hid, axis=0) if len(hid) > 1 else hid[0]
            d = mtp_hidden(self.net, hid_all, ids, segs)
            with self.net.stream:
                chain = d[cupy.asarray(np.asarray(last, np.int64))]
                logits = self.net.logits_dev(chain)
        for i, lane in enumerate(lanes):
            ln = self._lane(lane)
            ln.chain = chain[i : i + 1]
            ln.rows.append(logits[i : i + 1])
        return logits

    # ---- verification -------------------------------------------------------------------------------------
    def forward(self, work: Sequence[Any], lane_len: Sequence[int]) -> None:
        """The verify forward of ``work`` (``LaneWork`` with ``verify``); keeps hiddens and logits, and the GDN
        snapshots (``snapshots``) or the pre-round copy and the GDN inputs (replay)."""
        net = self.net
        segs, ids, snap, row = [], [], [], 0
        for w in work:
            assert lane_len[w.lane] == w.start
            assert len(w.token_ids) <= self.k + 1 or not self.snapshots, (
                "more verify rows than snapshot slots"
            )
            if not self.snapshots:
                net.copy_slot(w.lane, self.spare_base + w.lane)  # the pre-round GDN state
            segs.append((w.lane, w.start, len(w.token_ids), self._pages[w.lane]))
            snap.append(self.snap_slot(w.lane))
            ids.extend(w.token_ids)
            self._rows_of[w.lane] = (row, len(w.token_ids))
            row += len(w.token_ids)
        ids_np = np.asarray(ids, np.int32)
        got = self.graphs.run(ids_np, segs, snap) if self.graphs is not None else None
        self.counts["verify_eager" if got is None else "verify_graph"] += 1
        if got is not None:
            h, logits, self._capture = got
        else:
            h = self._eager(segs, ids_np, snap if self.snapshots else None)
            logits = net.logits_dev(h)
        for w in work:
            r, n = self._rows_of[w.lane]
            self._verify[w.lane] = (w.start, r, h[r : r + n], logits[r : r + n])

    def _eager(self, segs: Sequence[Any], ids: np.ndarray, snap: Sequence[int] | None) -> Any:
        """The verify forward launched eagerly with the decode kernels (every row bitwise its decode step)."""
        import cupy

        from ninfer.cuda.model_graph import Meta, host_meta

        net = self.net
        gemm, net.prefill_gemm = net.prefill_gemm, False
        net.gdn_capture = self._capture = {} if snap is None else None
        try:
            with net.stream:
                m = Meta.from_host(host_meta(segs, net.pool[2], net.pool[3]), net.attn_chunk)
                m.snap = None if snap is None else cupy.asarray(np.asarray(snap, np.int32))
                return net.body(m.ids_from(ids), m)
        finally:
            net.prefill_gemm, net.gdn_capture = gemm, None
            self._capture = self._capture or {}

    def verify(
        self,
        lanes: Sequence[int],
        drafts: Sequence[Sequence[int]],
        reqs: Sequence[Sequence[SampleRequest]],
        token_limit: int | None,
    ) -> list[list[int]]:
        """Greedy lanes: targets drawn on the device by the sampler (one call for every greedy lane of the round),
        compared on the host; sampled lanes: their target and draft rows copied to the host for ``verify_lane``."""
        import cupy

        from ninfer.cuda.sampling import sample_requests

        greedy = [i for i, r in enumerate(reqs) if all(x.params.temperature <= 0.0 for x in r)]
        targets: dict[int, list[int]] = {}
        if greedy:
            with self.net.stream:
                rows = [self._verify[lanes[i]][3] for i in greedy]
                x = cupy.concatenate(rows, axis=0) if len(rows) > 1 else rows[0]
                t = sample_requests(x, [q for i in greedy for q in reqs[i]], token_limit)
            at = 0
            for i in greedy:
                targets[i], at = t[at : at + len(reqs[i])], at + len(reqs[i])
        out: list[list[int]] = []
        for i, (lane, d, r) in enumerate(zip(lanes, drafts, reqs, strict=True)):
            if i in targets:
                res: list[int] = []
                for j, tok in enumerate(targets[i]):
                    res.append(tok)
                    if tok < 0 or j == len(d) or tok != d[j]:
                        break
                out.append(res)
                continue
            logits = self._verify[lane][3]
            rows_d = self._lane(lane).rows[: len(d)]
            with self.net.stream:
                target = cupy.asnumpy(logits, stream=self.net.stream)
                draft = cupy.asnumpy(cupy.concatenate(rows_d, axis=0), stream=self.net.stream)
            out.append(verify_lane(target, draft, d, r, token_limit))
        return out

    def commit(self, lane: int, length: int) -> int:
        """Keep the lane's first ``length`` tokens; returns the lane's new length. Unless every position is kept:
        copies snapshot ``kept`` to the lane's slot (``snapshots``), or replays the GDN recurrence over the kept
        rows from the pre-round copy."""
        start, r, hidden, _ = self._verify.pop(lane)
        kept = length - start
        n = self._rows_of.pop(lane)[1]
        assert 0 <= kept <= n
        if kept < n and self.snapshots:
            self.net.copy_slot(self.snap_slot(lane) + kept, lane)  # the state before position `kept`
        elif kept < n:
            self._replay(lane, r, kept)
        ln = self._lane(lane)
        ln.length, ln.chain, ln.rows = ln.base, None, []
        with self.net.stream:  # a copy: a verify graph's buffer is rewritten by its next replay
            ln.pending = [hidden[:kept].copy()] if kept else []
        return length

    def _replay(self, lane: int, row: int, kept: int) -> None:
        import cupy

        from ninfer.cuda.gdn import gdn_decode

        net, cfg = self.net, self.net.cfg
        net.copy_slot(self.spare_base + lane, lane)
        if not kept:
            return
        with net.stream:
            starts = cupy.asarray(np.asarray([0, kept], np.int32))
            slots = cupy.asarray(np.asarray([lane], np.int32))
            for i, kind in enumerate(cfg.layer_types):
                if kind != "linear_attention":
                    continue
                j = net._mix[i]  # noqa: SLF001 - the GDN slot index of layer i
                p = f"layers.{i}.linear_attn."
                qkv, z, a, b = (x[row : row + kept] for x in self._capture[j])
                gdn_decode(
                    cupy.ascontiguousarray(qkv), net.w[p + "conv1d.weight"], net.conv[j], cupy.ascontiguousarray(a),
                    cupy.ascontiguousarray(b), net.w[p + "A_log"], net.w[p + "dt_bias"], net.rec[j], starts, slots,
                    cupy.ascontiguousarray(z), net.w[p + "norm.weight"], cfg.rms_norm_eps,
                    n_k_heads=cfg.linear_num_key_heads,
                )  # fmt: skip

    def _lane(self, lane: int) -> _Lane:
        ln = self._lanes[lane]
        assert ln is not None, f"lane {lane} has no MTP state"
        return ln
