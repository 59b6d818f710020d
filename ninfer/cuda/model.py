"""The Qwen3.6 network on the GPU: ``CudaQwen36`` composes the ``ninfer.cuda`` kernel wrappers.

Use (the reference ``Qwen36``'s ``new_state``/``forward`` have their counterpart in ``Sequences``, below)::

    net = load_cuda("model.ninfer")             # or CudaQwen36(cfg, device_tensors)
    net.allocate(num_slots=2, num_pages=64, page_size=16, max_context=512)   # the pools, by integer id
    h = net.run([(slot, start, n, pages)], ids)  # final-normed hidden [T, H] float32 (a cupy array)
    logits = net.lm_head(h)                      # numpy [T, V] float32
    h, lg = net.decode(ids, [(slot, start, pages), ...])  # one token per lane (CUDA graph when enabled)

Whoever calls ``allocate`` owns the pools and chooses the slot and page ids: the engine's runner
(``ninfer/cuda/runner.py``), or ``ninfer.cuda.sequences.Sequences`` (whole sequences by integer id, for
``Model.logits``, perplexity, perf/ and tests). The network keeps no free lists of its own.

Device state: paged KV per attention layer ``[pages + 1, page_size, HKV, D]`` (fp8: uint8 e4m3 codes plus float32
scales ``ks``/``vs`` ``[pages + 1, page_size, HKV]``, the reference runner's encoding) and GDN state per layer
``[slots + 1, ...]`` (the last page and slot are scratch for graph warm-up). Activations are float32 (the
default) or bf16 words (uint16, ``act_dtype="bf16"``); the residual stream, the final hidden and the logits are
float32.

Why float32 activations by default: with them the tensor-core prefill uses exact operands (bf16-exact weight codes,
activations split into two bf16 halves) and every path follows the reference up to accumulation order (teacher-
forced top-1 agreement 1.000 on the mid-size random models). Rounding activations to bf16 flips near-tied logits and
MoE router choices (0.98 dense, 0.93 MoE measured): a speed option that changes what the model computes, so opt-in.

Numerics (invariants the tests check):
- every kernel reduces in a fixed order per row, so a row's result never depends on the other rows of a launch;
- decode attention splits the KV length in fixed chunks (``attn_chunk``), and prefill uses the same chunks, so a
  token's attention output does not depend on whether it ran in prefill or decode or on the graph's capacity
  (256 by default: measured on the H200, perf/bench_attention_decode.py, the 27B's layer at 8K context takes
  24.0 us for one sequence and 91 us for eight, against 24.3 / 120 us at 128 and 28.6 / 83 us at 512);
- ``prefill_gemm=False`` runs prefill projections as the decode GEMV in 8-row blocks and the GDN delta rule as
  the exact token-by-token recurrence: then prefill and decode of a token agree bitwise, and prompt chunking or
  prefix reuse never changes results (slower prefill). With ``prefill_gemm=True`` prefill calls use the GEMM and
  the chunked delta rule (``gdn_chunked``, 64-token chunks from the call's first row), equal to the recurrence
  within fp32 noise; decode always runs the recurrence.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ninfer.artifact.inventory import expected_shapes, lm_head_name
from ninfer.config import ModelConfig
from ninfer.cuda._glue import glue
from ninfer.cuda.fuse import fuse_projections, missing_tensors
from ninfer.cuda.model_graph import GraphSet, Meta, host_meta, next_product

__all__ = ["CudaQwen36", "load_cuda"]

F32 = np.float32
KV_DTYPES = {"bf16": np.uint16, "fp32": F32, "fp8": np.uint8}  # KV storage -> cache array dtype


class CudaQwen36:
    """One Qwen3.6 text model on the device (dense ``qwen3_5`` or MoE ``qwen3_5_moe``)."""

    def __init__(
        self,
        cfg: ModelConfig,
        tensors: dict[str, Any],
        *,
        act_dtype: str = "fp32",
        state_dtype: str = "fp32",
        kv_dtype: str = "bf16",
        prefill_gemm: bool = True,
        cuda_graph: bool = True,
        attn_chunk: int = 256,
        memory_reserve_bytes: int = 0,
        fold_norms: bool = True,
        prefill_inputs: str = "fp16",
        gemv_prefetch: bool = False,
        prefill_weights: str = "auto",
        prefill_attention: str = "bf16",
        prefill_gdn: str = "exact",
    ) -> None:
        import cupy

        missing = missing_tensors(cfg, tensors, list(expected_shapes(cfg, mtp=False)))
        if missing:
            raise ValueError(f"CudaQwen36: {len(missing)} tensors missing, first {missing[0]!r}")
        if act_dtype not in ("bf16", "fp32") or state_dtype not in ("bf16", "fp32"):
            raise ValueError(f"act_dtype/state_dtype: 'bf16' or 'fp32', got {act_dtype!r}/{state_dtype!r}")
        if kv_dtype not in KV_DTYPES:
            raise ValueError(
                f"kv_dtype: the CUDA backend stores KV as one of {tuple(KV_DTYPES)}, got {kv_dtype!r}"
            )
        self.cfg, self.w = (
            cfg,
            fuse_projections(cfg, tensors),
        )  # q|k|v, GDN in-projections, gate|up: one product each
        self.act = np.dtype(np.uint16 if act_dtype == "bf16" else F32)
        self.state_dtype, self.kv_dtype = state_dtype, kv_dtype
        self.prefill_gemm, self.cuda_graph, self.attn_chunk = prefill_gemm, cuda_graph, attn_chunk
        # float32 prefill GEMM inputs: "exact" (bf16 hi + lo, two MMAs) or "fp16" (one MMA per product, each row
        # rounded to fp16 under a power-of-two scale; docs/cuda.md "Prefill GEMM inputs"); decode never changes
        from ninfer.cuda.gemm import GEMM_INPUTS

        if prefill_inputs not in GEMM_INPUTS:
            raise ValueError(f"prefill_inputs: one of {GEMM_INPUTS}, got {prefill_inputs!r}")
        self.prefill_inputs = prefill_inputs
        # the prefill attention's operand rounding (ninfer/cuda/attention_prefill.py PRECISIONS; docs/cuda.md
        # "Prefill attention precision"): exact float q and probabilities (two MMAs per product) or rounded to bf16
        from ninfer.cuda.attention_prefill import PRECISIONS

        if prefill_attention not in PRECISIONS:
            raise ValueError(f"prefill_attention: one of {PRECISIONS}, got {prefill_attention!r}")
        self.prefill_attention = prefill_attention
        # the fp16 prefill GEMM's weight operands kept between calls where memory allows (ninfer/cuda/operands.py):
        # the store's budget is 0 (none kept) until the runner's memory plan sets it, or a caller does
        from ninfer.cuda.operands import PREFILL_WEIGHTS, OperandStore

        if prefill_weights not in PREFILL_WEIGHTS:
            raise ValueError(f"prefill_weights: one of {PREFILL_WEIGHTS}, got {prefill_weights!r}")
        self.prefill_weights = prefill_weights
        self.operands = OperandStore()
        # residual + RMS norms folded into the neighbouring GEMVs where every product is a GEMV (decode, exact
        # prefill; docs/cuda.md "Norm folding"); a perf or test comparison flips it and clears the graphs
        self.fold_norms = bool(fold_norms)
        # each decode GEMV prefetches the next one's first tiles into L2 (docs/cuda.md "L2 prefetch of the next
        # product"): off until measured on a GPU. The order comes from tracing the warm-up step before a graph
        # capture (model_graph.GraphSet.capture): ``gemv_next`` maps a weight's id to the weight launched after it
        self.gemv_prefetch = bool(gemv_prefetch)
        self.gemv_trace: list[Any] | None = None
        self.gemv_next: dict[int, Any] = {}
        # the chunked GDN prefill's kernels (gdn.STATE_VARIANTS; a benchmark's A/B switches it, perf/bench_chunk.py)
        # by its scratch precision: "exact" (float) or "bf16" (normed q, k, W and A rounded to bf16 where the state
        # pass reads them; docs/cuda.md "The bf16 scratch's fidelity, measured")
        from ninfer.cuda.gdn import PREFILL_GDN

        if prefill_gdn not in PREFILL_GDN:
            raise ValueError(f"prefill_gdn: one of {tuple(PREFILL_GDN)}, got {prefill_gdn!r}")
        self.gdn_variant = PREFILL_GDN[prefill_gdn]
        # the chunked prefill's causal conv computed inside the GDN prep (gdn_chunked(conv=...): no conv output
        # array; bitwise the separate causal_conv); off only for A/B runs (ninfer-perf --gdn-conv-prep; measured
        # on the H200: 8K prompts +1.7% 27B, +4.0% 35B-A3B, docs/cuda.md)
        self.gdn_conv_prep = True
        # decode MoE layers choose their experts inside the gate | up launch (model_layers.ffn_block, gemv.cu
        # gemv_mma_rt: moe_route's selection, the same bits, one launch less per layer); off until measured and run
        # through the GPU tests (docs/cuda.md "Routing inside the expert launch")
        self.moe_route_fused = False
        # decode MoE layers run their down projection with the combine and the next norm in its tail (norm.MoeCombine
        # .down, gemv.cu gemv_mma_cb: moe_combine_rmsnorm's bits, one launch less per layer); off until measured
        self.moe_combine_fused = False
        # decode MoE layers choose their experts in the router GEMV's tail (model_layers._route_in_router, gemv.cu
        # gemv_mma_rr: the last row block runs moe_route's selection, the same bits, one launch less per layer);
        # measured 5-10% slower on the H100 (35B-A3B), so off (docs/cuda.md "Routing in the router's tail")
        self.moe_route_router = False
        # decode's gate | up GEMVs (dense, and the MoE experts' launch) store silu(gate) * up (their SwiGLU epilogue,
        # linear.gemv / gemv_experts(swiglu_out=True)) and the down GEMV reads that half-width row plainly: the same
        # bits (tests/test_gemv_fused_host.py -k swiglu_out); measured no faster on the H100 (27B 1.00x, 35B-A3B
        # 0.97-1.00x), so off (docs/cuda.md "SwiGLU in the gate | up GEMV's epilogue")
        self.gemv_swiglu_out = False
        if memory_reserve_bytes < 0:
            raise ValueError(f"memory_reserve_bytes: must be >= 0, got {memory_reserve_bytes}")
        self.memory_reserve_bytes = memory_reserve_bytes  # left free by the runner's memory plan
        self._mix = [cfg.layer_types[:i].count(kind) for i, kind in enumerate(cfg.layer_types)]
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.graphs = GraphSet(self)
        self._consts: dict[tuple[Any, ...], Any] = {}
        self.kc: list[Any] = []
        self.ks: list[Any] = []  # fp8 KV scales per attention layer (empty for bf16/fp32 KV)
        self.vs: list[Any] = []
        self.pool: tuple[int, int, int, int] | None = None  # slots, pages, page_size, max_pages
        self.generation = 0  # counts allocate() calls: an owner of the pools checks it is still the owner
        # GDN conv / recurrent states [layers, slots + 1, ...] (``conv``, ``rec``: their per-layer views)
        self.conv_all: Any = None
        self.rec_all: Any = None
        self.gdn_capture: dict[int, Any] | None = (
            None  # set by a verify round: GDN layer -> its inputs (replay)
        )
        cupy.cuda.Device().synchronize()  # uploads on other streams are complete before this stream reads them

    # ---- memory --------------------------------------------------------------------------------------------
    def allocate(
        self, *, num_slots: int, num_pages: int, page_size: int, max_context: int, extra_kv: int = 0
    ) -> None:
        """(Re)allocate the KV pages and GDN state slots (zeroed) and drop the captured graphs. The pools are the
        network's only sequence memory; the caller owns them, addressing pages ``0 .. num_pages-1`` and slots
        ``0 .. num_slots-1`` by integer id (the engine's runner, or a ``ninfer.cuda.sequences.Sequences``).
        ``extra_kv``: KV planes after the model's attention layers (1: the MTP head's, for speculation)."""
        import cupy

        cfg = self.cfg
        self.graphs.clear()
        self.kc = self.vc = self.ks = self.vs = self.conv = self.rec = []
        self.conv_all = self.rec_all = None
        kvt = KV_DTYPES[self.kv_dtype]
        kv_shape = (num_pages + 1, page_size, cfg.num_key_value_heads, cfg.head_dim)
        n_attn, n_gdn = len(cfg.full_attention_layers) + extra_kv, len(cfg.linear_attention_layers)
        self.kc = [cupy.zeros(kv_shape, kvt) for _ in range(n_attn)]
        self.vc = [cupy.zeros(kv_shape, kvt) for _ in range(n_attn)]
        if self.kv_dtype == "fp8":
            self.ks = [cupy.zeros(kv_shape[:3], F32) for _ in range(n_attn)]
            self.vs = [cupy.zeros(kv_shape[:3], F32) for _ in range(n_attn)]
        conv = (num_slots + 1, cfg.gdn_conv_channels, cfg.linear_conv_kernel_dim - 1)
        rec = (num_slots + 1, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
        rect = np.uint16 if self.state_dtype == "bf16" else F32
        # one array per kind, a view per layer: a slot copy or zero fill is one launch per kind, not per layer
        self.conv_all, self.rec_all = cupy.zeros((n_gdn, *conv), F32), cupy.zeros((n_gdn, *rec), rect)
        self.conv, self.rec = list(self.conv_all), list(self.rec_all)
        self.pool = (num_slots, num_pages, page_size, -(-max_context // page_size))
        self.generation += 1
        cupy.cuda.Device().synchronize()  # the zero fills ran on the current stream, not on self.stream

    def prefill_operand_bytes(self) -> int:
        """Device bytes that keeping the fp16 operand of every dense prefill weight takes (ninfer/cuda/operands.py):
        0 where the fp16 GEMM mode does not run (``prefill_weights="scratch"``, exact inputs, bf16 activations,
        ``prefill_gemm=False``, no Hopper wgmma GEMM)."""
        from ninfer.cuda.gemm import hopper_gemm
        from ninfer.cuda.gemm_bf16 import bf16_operand_extra, bf16_operands
        from ninfer.cuda.gemm_group import group_operand_extra, group_operands
        from ninfer.cuda.gemm_pair import f16_foldable
        from ninfer.cuda.operands import eligible_bytes

        if self.prefill_weights == "scratch" or self.prefill_inputs != "fp16" or self.act != F32:
            return 0
        if not self.prefill_gemm or not hopper_gemm():
            return 0
        return eligible_bytes(
            self.w.items(),
            lambda f, n, k: f16_foldable(f) or group_operands(f) or bf16_operands(f, n, k),
            lambda f, n, k: group_operand_extra(f, n, k) + bf16_operand_extra(f, n, k),
        )

    def keep_prefill_operands(self, leave: int) -> int:
        """Outside the engine (perf scripts, ``Sequences`` users; the runner sizes them by its memory plan instead):
        keep the fp16 prefill operands in the device memory free now, less ``leave`` bytes for the prefill's own
        temporaries; returns the budget. ``prefill_weights="resident"`` raises MemoryError if not all fit."""
        import cupy

        from ninfer.cuda.operands import budget

        want = self.prefill_operand_bytes()
        room = cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes() - leave
        keep = budget(self.prefill_weights, want, room)
        if keep > max(room, 0):
            raise MemoryError(
                f"prefill_weights='resident': {want} bytes of operands, {room} free to keep them"
            )
        self.operands.set_budget(keep)
        return keep

    @property
    def scratch(self) -> tuple[int, int]:
        """(slot, page) reserved for graph warm-up writes."""
        assert self.pool is not None
        return self.pool[0], self.pool[1]

    def copy_slot(self, src: int, dst: int) -> None:
        """GDN state slot ``src`` -> ``dst``, every layer: one pitched copy per kind (the bench's speculative
        commit, a strided elementwise copy, took ~0.4 ms per 27B slot of 157 MB)."""
        for a in (self.conv_all, self.rec_all):
            _copy_slot(a, src, dst, self.stream)

    def zero_slot(self, slot: int) -> None:
        with self.stream:
            self.conv_all[:, slot] = 0
            self.rec_all[:, slot] = 0

    def copy_page(self, src: int, dst: int, n: int) -> None:
        with self.stream:
            for a in self.kc + self.vc + self.ks + self.vs:
                a[dst, :n] = a[src, :n]

    # ---- entry points used by the runner -----------------------------------------------------------------
    def run(
        self, segs: Sequence[tuple[int, int, int, list[int]]], ids: np.ndarray, positions: Any = None
    ) -> Any:
        """Eager forward over packed segments ``(slot, start, n, pages)``; returns hidden ``[T, H]`` float32."""
        assert self.pool is not None, "allocate() first"
        with self.stream:
            m = Meta.from_host(host_meta(segs, self.pool[2], self.pool[3], positions), self.attn_chunk)
            h = self.body(m.ids_from(ids), m)
        self.stream.synchronize()
        return h

    def decode(
        self,
        ids: np.ndarray,
        lanes: Sequence[tuple[int, int, list[int]]],
        *,
        logits: bool = True,
        sync: bool = True,
    ) -> tuple[Any, Any]:
        """One token per lane ``(slot, start, pages)``: hidden ``[B, H]`` and (optionally) logits ``[B, V]``,
        by CUDA-graph replay when ``cuda_graph`` is set, else eagerly with the same kernels. ``sync=False``: the
        caller synchronizes ``self.stream`` before the next decode (the graph's pinned inputs are reused then)."""
        segs = [(slot, start, 1, pages) for slot, start, pages in lanes]
        if self.cuda_graph:
            h, lg = self.graphs.replay(np.asarray(ids), segs)
            with self.stream:  # the buffers are rewritten by the next replay
                h, lg = h.copy(), (lg.copy() if logits else None)
            # one synchronization per step (below) also frees the pinned staging buffer for the next replay
        else:
            h = self.run(segs, np.asarray(ids))
            lg = self.logits_dev(h) if logits else None
        if sync:
            self.stream.synchronize()
        return h, lg

    def warmup(self, workers: int = 1) -> None:
        """Compile every kernel family and the glue kernels (never in the middle of a request); ``workers > 1``:
        the families compile in that many subprocesses first (``ninfer.cuda.warmup``)."""
        import cupy

        from ninfer.cuda import warmup

        warmup(workers)
        g = glue()
        a = cupy.zeros((1, 8), np.uint16)
        g["widen"](a, cupy.empty((1, 8), F32))
        g["add"](a, cupy.zeros((1, 8), F32))
        z = cupy.zeros(8, np.int32)
        for t in (np.uint16, F32):
            x = cupy.zeros((1, 8), t)
            g["combine"](
                x, z, cupy.zeros(8, F32), x, cupy.zeros(1, F32), np.int32(1), np.int64(8), np.int64(1), x
            )
        cupy.cuda.Device().synchronize()

    def warm_prefill(self, rows: int = 16) -> None:
        """Run a short prefill and one of ``rows`` rows (the engine's ``prefill_chunk``) over the scratch slot, so
        what the prefill path builds lazily happens at start-up, not in the first request: the kernels CuPy builds
        for the prefill's glue (the MoE tile table was searchsorted, cumsum and take until router.cu's
        expert_tiles: a cold first 35B-A3B prefill of 1K tokens took 1.5 s instead of 0.14 s), the grouped GEMM's
        tile table of the short chunks' expert lanes
        (the 35B-A3B's first 8K prefill of a run took 2.3 s instead of ~0.75 at e919d69), and the memory pool's
        blocks of a full chunk (the first 2048-token chunks of a run: 35B-A3B 8K prefill 0.55-0.71 s in
        ``ninfer-perf`` against 0.40 s once warm, ``perf.bench_chunk`` at ba43f57).
        Precondition: allocate() done and no sequence holds a page yet; the full chunk writes its KV into pages
        ``0 ..`` of the pool (a sequence writes every position it reads, so they need no clearing) and the scratch
        page."""

        assert self.pool is not None, "allocate() first"
        slot, page = self.scratch
        num_pages, page_size, max_pages = self.pool[1], self.pool[2], self.pool[3]
        # rows that fit the scratch page plus pages 0.. of the pool, within one sequence's page limit
        full = max(1, min(rows, (min(num_pages, max_pages - 1) + 1) * page_size))
        short = min(page_size, 16, full)  # one page; more than 8 rows, so the prefill (GEMM) path
        for n in sorted({short, full}):
            pages = [page] + list(range(-(-n // page_size) - 1))
            self.zero_slot(slot)
            self.run([(slot, 0, n, pages)], np.zeros(n, np.int64))
        self.logits_dev(np.zeros((1, self.cfg.hidden_size), F32))
        self.zero_slot(slot)
        self.stream.synchronize()

    # ---- the network ------------------------------------------------------------------------------------
    def body(self, ids: Any, m: Meta) -> Any:
        import cupy

        from ninfer.cuda.embedding import embed
        from ninfer.cuda.model_layers import (
            attention_block,
            combine,
            combine_norm,
            f16_norm_out,
            f16_norm_reader,
            ffn_block,
            fold_rows,
            gdn_block,
        )
        from ninfer.cuda.norm import Folded, MoeCombine, Normed, rmsnorm

        def add_norm(x: Any, weight: Any, reader: str | None = None) -> Any:
            """res += x (an MoE layer's combine fused in), then its norm; ``reader``: the one weight whose product
            reads the output, which takes it as the fp16 GEMM mode's rows where that mode runs (``F16Rows``)."""
            if isinstance(x, Folded):  # the producing GEMV added x into res: the consumers normalize
                return Normed(res, x.part, weight, eps)
            f16 = f16_call and reader is not None and f16_norm_reader(w[reader])
            if isinstance(x, MoeCombine):
                return combine_norm(x, weight, eps, residual=res, f16=f16)
            return rmsnorm(x, weight, eps, residual=res, f16=f16)

        cfg, w, eps = self.cfg, self.w, self.cfg.rms_norm_eps
        x = embed(w["embed_tokens.weight"], ids, dtype=self.act)
        res = cupy.zeros((m.t, cfg.hidden_size), F32)
        fold = res if fold_rows(self, m.t) else None  # the output projections add into res (GEMVs only)
        # whether this call's norms may write fp16 GEMM rows (checked once per call)
        f16_call = f16_norm_out(self, m.t)
        for i, kind in enumerate(cfg.layer_types):
            p = f"layers.{i}."
            gdn = kind == "linear_attention"
            h = add_norm(
                x,
                w[p + "input_layernorm.weight"],
                p + ("linear_attn.in_proj" if gdn else "self_attn.qkvg_proj"),
            )
            if gdn:
                mixed = gdn_block(self, p, h, m, self._mix[i], resid=fold, f16=f16_call)
            else:
                mixed = attention_block(self, p, h, m, self._mix[i], resid=fold)
            # an MoE layer's norm output also feeds its router (fp32, exact): float rows
            h = add_norm(
                mixed,
                w[p + "post_attention_layernorm.weight"],
                None if cfg.is_moe else p + "mlp.gate_up_proj",
            )
            down = None if cfg.is_moe else fold  # an MoE output is combined into the next norm instead
            x = ffn_block(self, p, h, m, defer_combine=True, resid=down)
        if isinstance(x, Folded):  # res holds the last layer's output already; the final norm is materialized
            return rmsnorm(res, w["norm.weight"], eps)
        if isinstance(x, MoeCombine) and self.act == F32:  # == res += x; rmsnorm(res): x + r either way round
            return combine_norm(x, w["norm.weight"], eps, residual=res)
        x = combine(x) if isinstance(x, MoeCombine) else x
        if self.act == np.uint16:
            glue()["add"](x, res)
        else:
            res += x
        return rmsnorm(res, w["norm.weight"], eps)  # float32 out whatever the activation dtype

    def const_i32(self, key: tuple[Any, ...], values: np.ndarray) -> Any:
        """A device int32 constant cached under ``key`` (e.g. the MoE slot tables of a decode batch): made on first
        use (the warm-up pass before a graph capture), then the same array, so graphs replay no fill kernels."""
        arr = self._consts.get(key)
        if arr is None:
            import cupy

            arr = self._consts[key] = cupy.asarray(np.asarray(values, np.int32))
        return arr

    def widen(self, x: Any) -> Any:
        """float32 copy of a bf16 activation (float32 input returned as is)."""
        return glue()["widen"](x) if x.dtype == np.uint16 else x

    def logits_dev(self, h: Any) -> Any:
        """Logits ``[T, V]`` float32 on the device, by the GEMV in 8-row blocks (fp32, the same for every batch)."""
        import cupy

        from ninfer.cuda.linear import gemv

        w = self.w[lm_head_name(self.cfg)]
        with self.stream:
            h = cupy.ascontiguousarray(cupy.asarray(h, dtype=F32))
            # 8-row blocks of one launch: every row bitwise its decode logits
            out = gemv(h, w, prefetch=next_product(self, w))
        return out

    def lm_head(self, h: Any) -> np.ndarray:
        """Logits ``[T, V]`` float32 (numpy) of final-normed hidden ``[T, H]`` (row independent)."""
        import cupy

        with self.stream:
            out = cupy.asnumpy(self.logits_dev(h), stream=self.stream)
        return out


def _copy_slot(a: Any, src: int, dst: int, stream: Any) -> None:
    """``a[:, dst] = a[:, src]`` on ``stream`` for a C-contiguous ``[layers, slots, ...]`` array: one
    ``cudaMemcpy2DAsync`` (a row per layer, the layer stride as pitch), the same bytes as the elementwise copy,
    which is the fallback where the pitch exceeds the device's limit."""
    import cupy

    rt = cupy.cuda.runtime
    if src == dst or not a.size:
        return
    pitch, width = a.strides[0], a.strides[1]
    if a.flags.c_contiguous and pitch <= _max_pitch():
        base = a.data.ptr
        kind = rt.memcpyDeviceToDevice
        rt.memcpy2DAsync(
            base + dst * width, pitch, base + src * width, pitch, width, a.shape[0], kind, stream.ptr
        )
        return
    with stream:
        a[:, dst] = a[:, src]


@functools.cache
def _max_pitch() -> int:
    import cupy

    rt = cupy.cuda.runtime
    return int(rt.deviceGetAttribute(rt.cudaDevAttrMaxPitch, cupy.cuda.Device().id))


def load_cuda(artifact: Any, **opts: Any) -> CudaQwen36:
    """Upload an artifact (path or opened ``Artifact``) to the GPU as a ``CudaQwen36``.

    ``opts``: ``act_dtype``, ``state_dtype``, ``kv_dtype``, ``prefill_gemm``, ``cuda_graph``, ``attn_chunk``,
    ``memory_reserve_bytes``, ``prefill_inputs``, ``prefill_weights``, ``prefill_attention``, ``prefill_gdn`` (see
    ``CudaQwen36``) and ``progress`` (upload bar, default on)."""
    from ninfer.artifact import open_artifact
    from ninfer.cuda.upload import upload_artifact

    progress = opts.pop("progress", True)
    art = open_artifact(artifact, verify="manifest") if isinstance(artifact, str | os.PathLike) else artifact
    return CudaQwen36(art.model_config, upload_artifact(art, progress=progress), **opts)
