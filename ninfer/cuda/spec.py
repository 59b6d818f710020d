"""Speculative decoding on the device (docs/speculative.md): the MTP head, the verify forward and the rollback of a
lane's GDN state, for ``CudaModelRunner``.

- MTP head (``mtp_hidden``): docs/model-math.md §6 with the model's own kernels; its attention layer keeps KV in
  the extra plane ``len(full_attention_layers)`` of the device page pool (allocated with ``extra_kv=1``), through
  the lane's page table. Bookkeeping per lane as the reference (``ninfer/engine/reference_draft.py``): ``base``,
  pending target hiddens, the chain of a round, its draft logits rows.
- Verify: one eager forward over ``[last token, d_1..d_m]`` of every verified lane with ``prefill_gemm`` off
  (the GEMV in 8-row blocks, the decode attention kernel and the exact GDN recurrence ``gdn_decode``), so every
  position's hidden and logits are bitwise those of its decode step (fp32 GDN state).
- CUDA graphs: with ``net.cuda_graph`` the verify forward of ``b`` lanes with ``k+1`` positions each replays a
  graph captured for ``(b, k+1)`` (``spec_graphs.VerifyGraphs``; the runner's memory plan counts them); rounds cut short (fewer
  drafts) and a capture that fails run eagerly with the same kernels.
- Rollback by replay: before the round the lane's GDN slot is copied to the lane's spare slot; the forward keeps
  each GDN layer's inputs (``in_proj`` qkv, z, a, b rows: a few KiB per position and layer); ``commit`` to fewer
  than all positions copies the spare slot back and re-runs ``gdn_decode`` over the kept rows of every GDN layer
  (state traffic only, no weight reads). KV of rejected positions is left behind the lane's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ninfer.engine.core import DraftLane, SampleRequest
from ninfer.engine.spec_verify import verify_lane

__all__ = ["CudaSpec", "mtp_hidden"]

F32 = np.float32


def mtp_hidden(
    net: Any, hidden: Any, ids: np.ndarray, segs: Sequence[tuple[int, int, int, list[int]]]
) -> Any:
    """MTP outputs ``d[T, H]`` float32 (after ``mtp.norm``) for target hiddens ``[T, H]`` and next tokens ``ids``;
    ``segs``: packed ``(slot, start, n, pages)``, ``start`` the position of the segment's first hidden."""
    import cupy

    from ninfer.cuda.embedding import embed
    from ninfer.cuda.model_graph import Meta, host_meta
    from ninfer.cuda.model_layers import attention_block, ffn_block, linear
    from ninfer.cuda.norm import rmsnorm

    cfg, w, eps = net.cfg, net.w, net.cfg.rms_norm_eps
    p, j = "mtp.layers.0.", len(cfg.full_attention_layers)
    with net.stream:
        m = Meta.from_host(host_meta(segs, net.pool[2], net.pool[3]), net.attn_chunk)
        e = rmsnorm(
            embed(w["embed_tokens.weight"], m.ids_from(ids), dtype=F32),
            w["mtp.pre_fc_norm_embedding.weight"],
            eps,
        )
        hn = rmsnorm(cupy.ascontiguousarray(hidden, dtype=F32), w["mtp.pre_fc_norm_hidden.weight"], eps)
        u = linear(
            net, cupy.ascontiguousarray(cupy.concatenate([e, hn], axis=1)), "mtp.fc.weight", exact=True
        )
        res = cupy.zeros((m.t, cfg.hidden_size), F32)
        h = rmsnorm(u, w[p + "input_layernorm.weight"], eps, residual=res)
        mixed = attention_block(net, p, h, m, j)
        h = rmsnorm(mixed, w[p + "post_attention_layernorm.weight"], eps, residual=res)
        res += ffn_block(net, p, h, m)
        return rmsnorm(res, w["mtp.norm.weight"], eps)


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
    """The runner's speculative state; ``spare(lane)`` is the lane's GDN slot for the pre-round copy."""

    def __init__(self, net: Any, lanes: int, spare_base: int) -> None:
        self.net, self.spare_base = net, spare_base
        from ninfer.cuda.spec_graphs import VerifyGraphs

        self.graphs = VerifyGraphs(net) if net.cuda_graph else None
        self._lanes: list[_Lane | None] = [None] * lanes
        self._pages: list[list[int]] = [[] for _ in range(lanes)]
        self._verify: dict[int, tuple[int, int, Any, Any]] = {}  # lane -> (start, first row, hidden, logits)
        self._capture: dict[int, Any] = {}
        self._rows_of: dict[int, tuple[int, int]] = {}  # lane -> (first row, rows) in the verify forward

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
        """One draft step for every lane in one packed MTP call; returns the logits rows ``[len(lanes), V]``."""
        import cupy

        hid, ids, segs, last, total = [], [], [], [], 0
        for dl in lanes:
            ln = self._lane(dl.lane)
            computed = ln.base + sum(int(x.shape[0]) for x in ln.pending)
            if len(dl.tokens) == computed + 1:  # first step of a round: catch up with the computed tokens
                ln.length, ln.rows, ln.chain = ln.base, [], None
                with self.net.stream:
                    h = cupy.concatenate(ln.pending, axis=0) if len(ln.pending) > 1 else ln.pending[0]
                tok = list(dl.tokens[ln.base + 1 : computed + 1])
                ln.base, ln.pending = computed, []
            else:
                assert ln.chain is not None and len(dl.tokens) == computed + 1 + len(ln.rows)
                h, tok = ln.chain, [int(dl.tokens[-1])]
            segs.append((dl.lane, ln.length, len(tok), self._pages[dl.lane]))
            hid.append(h)
            ids.extend(tok)
            ln.length += len(tok)
            total += len(tok)
            last.append(total - 1)
        with self.net.stream:
            hid_all = cupy.concatenate(hid, axis=0)
        d = mtp_hidden(self.net, hid_all, np.asarray(ids, np.int32), segs)
        with self.net.stream:
            idx = cupy.asarray(np.asarray(last, np.int64))
            chain = d[idx]
            logits = self.net.logits_dev(chain)
        for i, dl in enumerate(lanes):
            ln = self._lane(dl.lane)
            ln.chain = chain[i : i + 1]
            ln.rows.append(logits[i : i + 1])
        return logits

    # ---- verification -------------------------------------------------------------------------------------
    def forward(self, work: Sequence[Any], lane_len: Sequence[int]) -> None:
        """The verify forward of ``work`` (``LaneWork`` with ``verify``); keeps hiddens, logits and GDN inputs."""
        net = self.net
        segs, ids, row = [], [], 0
        for w in work:
            assert lane_len[w.lane] == w.start
            net.copy_slot(w.lane, self.spare_base + w.lane)  # the pre-round GDN state
            segs.append((w.lane, w.start, len(w.token_ids), self._pages[w.lane]))
            ids.extend(w.token_ids)
            self._rows_of[w.lane] = (row, len(w.token_ids))
            row += len(w.token_ids)
        got = self.graphs.run(np.asarray(ids, np.int32), segs) if self.graphs is not None else None
        if got is not None:
            h, logits, self._capture = got
        else:
            gemm, net.prefill_gemm = net.prefill_gemm, False  # every row bitwise its decode step
            net.gdn_capture = self._capture = {}
            try:
                h = net.run(segs, np.asarray(ids, np.int32))
            finally:
                net.prefill_gemm, net.gdn_capture = gemm, None
            logits = net.logits_dev(h)
        for w in work:
            r, n = self._rows_of[w.lane]
            self._verify[w.lane] = (w.start, r, h[r : r + n], logits[r : r + n])

    def verify(
        self,
        lanes: Sequence[int],
        drafts: Sequence[Sequence[int]],
        reqs: Sequence[Sequence[SampleRequest]],
        token_limit: int | None,
    ) -> list[list[int]]:
        """Greedy lanes: targets drawn on the device by the sampler, compared on the host; sampled lanes: their
        target and draft rows copied to the host for ``verify_lane``."""
        import cupy

        from ninfer.cuda.sampling import sample_requests

        out: list[list[int]] = []
        for lane, d, r in zip(lanes, drafts, reqs, strict=True):
            _, _, _, logits = self._verify[lane]
            if all(x.params.temperature <= 0.0 for x in r):
                with self.net.stream:
                    t = sample_requests(logits, list(r), token_limit)
                res: list[int] = []
                for i, tok in enumerate(t):
                    res.append(tok)
                    if tok < 0 or i == len(d) or tok != d[i]:
                        break
                out.append(res)
                continue
            rows = self._lane(lane).rows[: len(d)]
            with self.net.stream:
                target = cupy.asnumpy(logits, stream=self.net.stream)
                draft = cupy.asnumpy(cupy.concatenate(rows, axis=0), stream=self.net.stream)
            out.append(verify_lane(target, draft, d, r, token_limit))
        return out

    def commit(self, lane: int, length: int) -> int:
        """Keep the lane's first ``length`` tokens; returns the lane's new length. Replays the GDN recurrence
        over the kept rows from the pre-round copy unless every position is kept."""
        start, r, hidden, _ = self._verify.pop(lane)
        kept = length - start
        n = self._rows_of.pop(lane)[1]
        assert 0 <= kept <= n
        if kept < n:
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
