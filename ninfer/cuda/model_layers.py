"""Mixer and FFN blocks of ``CudaQwen36`` (docs/model-math.md §3–§5), as compositions of the kernel wrappers.

Each block takes the normed activation ``h[T, H]`` (bf16 words or float32, or a folded ``norm.Normed`` that only
GEMVs read) and the call's ``Meta`` and returns the block output in the same dtype; state (KV pages, GDN
conv/recurrent slots) is updated in place on the device. With ``resid`` (norm folding, docs/cuda.md) the block's
output projection adds its result into that float32 residual instead and returns ``norm.Folded`` (the partial sums
of squares the next norm needs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The wrappers' modules, their functions read as module attributes at each call (tests patch them: router.moe_route,
# moe_lanes.expert_lanes, gemm.gemm_gate_up_swiglu): a ``from ninfer.cuda.x import f`` inside the per-layer functions
# cost ~1 us apiece on Python 3.11 (the import machinery raises and clears an AttributeError probing a plain
# module's ``__path__``), ~20 per layer of an eager prefill chunk.
from ninfer.cuda import attention as attention_ops
from ninfer.cuda import attention_prefill as prefill_ops
from ninfer.cuda import gdn as gdn_ops
from ninfer.cuda import gemm as gemm_ops
from ninfer.cuda import gemm_pair as pair_ops
from ninfer.cuda import gemv_experts as experts_ops
from ninfer.cuda import launch as launch_ops
from ninfer.cuda import linear as linear_ops
from ninfer.cuda import moe_lanes as lanes_ops
from ninfer.cuda import norm as norm_ops
from ninfer.cuda import router as router_ops
from ninfer.cuda.fuse import FusedRuns, fused_splits
from ninfer.cuda.model_graph import Meta, next_product
from ninfer.cuda.moe_lanes import lanes_nb, use_lanes
from ninfer.cuda.norm import Folded, MoeCombine, Normed
from ninfer.cuda.weights import DeviceWeight

__all__ = ["linear", "attention_block", "gdn_block", "ffn_block", "combine"]

_SLOTS_PER_LAUNCH = 65535  # gridDim.y limit of gemv_experts


def _gemm(net: Any, t: int, exact: bool = False) -> bool:
    """Whether a product over ``t`` rows runs as the tensor-core GEMM (prefill) rather than the GEMV."""
    return t > 8 and net.prefill_gemm and not exact


def linear(
    net: Any,
    x: Any,
    name: str,
    out: Any = None,
    *,
    exact: bool = False,
    swiglu: bool = False,
    gate: Any = None,
    resid: Any = None,
) -> Any:
    """``x · Wᵀ``: GEMV for up to 8 rows; above, tensor-core GEMM (exact weight operands; float32 ``x`` split into
    two bf16 halves), or (``exact`` or ``prefill_gemm=False``) the decode GEMV in 8-row blocks, which gives every
    row bitwise its decode result. ``swiglu`` (``x`` = [gate | up]) and ``gate=(qg, head_dim)`` apply the SwiGLU or
    the attention output gate to the input first: fused into the GEMV's staging or the fp16 GEMM's row split,
    else a separate kernel before the GEMM. ``resid``: the GEMV adds the product into that float32 residual and
    returns ``Folded`` (norm folding; GEMV calls only: the caller folds only where ``fold_rows`` allows)."""
    w = net.w[name]
    if isinstance(x, Normed) and _gemm(net, x.shape[0], exact):
        raise ValueError(f"{name}: a folded norm feeds GEMVs only")
    if resid is not None:
        return _fold_product(net, x, w, name, resid, swiglu=swiglu, gate=gate)
    if isinstance(w, FusedRuns):  # runs of different formats: one product each, into its columns of ``out``
        if swiglu or gate is not None:
            raise ValueError(f"{name}: a fused weight of several formats takes no input transform")
        import cupy

        out = cupy.empty((x.shape[0], w.cols[-1]), dtype=x.dtype) if out is None else out
        for run, a, b in zip(w.runs, w.cols, w.cols[1:], strict=False):
            _product(net, x, run, out[:, a:b], exact)
        return out
    return _product(net, x, w, out, exact, swiglu=swiglu, gate=gate)


def f16_norm_out(net: Any, t: int) -> bool:
    """Whether this call's norms may write the fp16 GEMM mode's rows themselves (norm.rmsnorm(..., f16=True):
    bitwise what the GEMM's row split makes of the float rows, without storing and re-reading them): the fp16 mode
    runs (prefill GEMMs of float32 rows from PAIR_MIN_ROWS, fp16 inputs, the Hopper kernels, no graph capture).
    Checked once per call; ``f16_norm_reader`` then says it of each norm's reader."""
    mode = _gemm(net, t) and net.prefill_inputs == "fp16" and net.act == np.float32
    mode = mode and t >= gemm_ops.PAIR_MIN_ROWS
    return mode and gemm_ops.hopper_gemm() and not launch_ops.capturing()


def f16_norm_reader(w: Any) -> bool:
    """Whether a product with weight ``w`` takes its input as fp16 rows in a call where ``f16_norm_out`` holds (the
    conditions of gemm.f16_rows_input left to check: one foldable format; a row the norm keeps in registers)."""
    return isinstance(w, DeviceWeight) and pair_ops.f16_foldable(w.fmt) and norm_ops.f16_out_ok(int(w.cols))


def fold_rows(net: Any, t: int) -> bool:
    """Whether a call of ``t`` rows folds the residual + RMS norms into its GEMVs: ``net.fold_norms``, float32
    activations, and every product of the call a GEMV (decode, and the exact prefill mode)."""
    return bool(getattr(net, "fold_norms", False)) and net.act == np.float32 and not _gemm(net, t)


def _fold_product(net: Any, x: Any, w: Any, name: str, resid: Any, **xf: Any) -> Folded:
    import cupy

    from ninfer.cuda.linear import gemv, gemv_plan

    if isinstance(w, FusedRuns) or _gemm(net, x.shape[0]):
        raise ValueError(f"{name}: only a single-format GEMV folds the residual add")
    part = cupy.empty((gemv_plan(w.fmt, w.rows, w.cols).blocks_x, x.shape[0]), dtype=np.float32)
    gemv(x, w, resid, fold=part, prefetch=next_product(net, w), **xf)
    return Folded(part)


def _product(
    net: Any, x: Any, w: Any, out: Any, exact: bool, *, swiglu: bool = False, gate: Any = None
) -> Any:
    if not _gemm(
        net, x.shape[0], exact
    ):  # more than 8 rows: 8-row blocks, each row bitwise its decode result
        return linear_ops.gemv(x, w, out, swiglu=swiglu, gate=gate, prefetch=next_product(net, w))
    # swiglu, gate: the fp16 mode's row split applies them (no [T, I] or [T, heads * D] array); other GEMM paths
    # run the swiglu / sigmoid_gate kernel first (the same values)
    return gemm_ops.gemm(
        x, w, out, inputs=net.prefill_inputs, swiglu=swiglu, gate=gate, operands=net.operands
    )


def attention_block(net: Any, p: str, h: Any, m: Meta, j: int, *, resid: Any = None) -> Any:
    cfg, w = net.cfg, net.w
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    c = fused_splits(cfg, "self_attn.qkvg_proj")
    qkvg = linear(net, h, p + "self_attn.qkvg_proj")  # [query | gate] per head | k | v
    qg, k, v = qkvg[:, : c[1]], qkvg[:, c[1] : c[2]], qkvg[:, c[2] :]
    scales = {"k_scale": net.ks[j], "v_scale": net.vs[j]} if net.ks else {}  # fp8 KV only
    q = attention_ops.qk_norm_rope_kv_write(
        qg, k, v, w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"], m.pos, m.kv_slots,
        net.kc[j], net.vc[j], heads=hq, kv_heads=hkv, head_dim=d, rotary_dim=cfg.rotary_dim,
        theta=cfg.rope_theta, mrope_section=cfg.mrope_section, interleaved=cfg.mrope_interleaved,
        eps=cfg.rms_norm_eps, **scales,
    )  # fmt: skip
    if m.t > 8 and net.prefill_gemm and net.kc[j].dtype == np.uint16:  # bf16 cache: tensor-core prefill
        o = prefill_ops.attention_prefill(
            q, net.kc[j], net.vc[j], m.page_table, m.row_seq, m.row_pos, max_len=m.max_len,
            precision=net.prefill_attention,
        )  # fmt: skip
    else:
        o = attention_ops.attention(
            q, net.kc[j], net.vc[j], m.page_table, m.row_seq, m.row_pos, max_len=m.max_len, chunk=m.chunk,
            **scales,
        )  # fmt: skip
    return linear(net, o.reshape(m.t, hq * d), p + "self_attn.o_proj.weight", gate=(qg, d), resid=resid)


def gdn_block(net: Any, p: str, h: Any, m: Meta, j: int, *, resid: Any = None, f16: bool = False) -> Any:
    """GDN mixer. The delta rule runs chunked (``gdn_chunked``, 64-token chunks) for prefill calls (more rows than
    sequences) when ``net.prefill_gemm``: that mode's results already depend on chunking (``f16``: the call's
    ``f16_norm_out``, for the output norm to write the out-projection's rows). Decode, and prefill
    with ``prefill_gemm=False``, run ``gdn_decode`` (conv, exact recurrence token by token and gated norm in two
    launches), so a token's result matches its decode bitwise."""
    cfg, w = net.cfg, net.w
    p += "linear_attn."
    hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    c = fused_splits(cfg, "linear_attn.in_proj")
    proj = linear(net, h, p + "in_proj")  # qkv | z | a | b
    qkv, z, a, b = (proj[:, c[i] : c[i + 1]] for i in range(4))
    if (
        getattr(net, "gdn_capture", None) is not None
    ):  # a speculative verify round keeps the inputs to replay the kept prefix
        net.gdn_capture[j] = (qkv, z, a, b)
    rule = (a, b, w[p + "A_log"], w[p + "dt_bias"], net.rec[j], m.starts, m.gslots)
    nk, nw, eps = cfg.linear_num_key_heads, w[p + "norm.weight"], cfg.rms_norm_eps
    if net.prefill_gemm and m.t > m.nseq:
        if m.snap is not None:
            raise ValueError("GDN snapshots need the exact recurrence (prefill_gemm off)")
        conv = (w[p + "conv1d.weight"], net.conv[j])
        # the conv inside the chunked prep (tc variants; gdn_chunked runs causal_conv first for the others)
        if net.gdn_conv_prep:
            o = gdn_ops.gdn_chunked(qkv, *rule, n_k_heads=nk, variant=net.gdn_variant, conv=conv)
        else:  # the same bits through the conv output
            y = gdn_ops.causal_conv(qkv, *conv, m.starts, m.gslots)
            o = gdn_ops.gdn_chunked(y, *rule, n_k_heads=nk, variant=net.gdn_variant)
        # the out-projection's fp16-mode rows straight from the norm where that GEMM runs (bitwise the same)
        f16 = f16 and f16_norm_reader(w[p + "out_proj.weight"]) and norm_ops.gated_f16_ok(hv, dv)
        on = norm_ops.gated_rmsnorm(o.reshape(m.t * hv, dv), z, nw, eps, f16=f16)
        if f16:
            return linear(net, on, p + "out_proj.weight")
    else:
        on = gdn_ops.gdn_decode(
            qkv, w[p + "conv1d.weight"], net.conv[j], *rule, z, nw, eps, n_k_heads=nk, snap=m.snap
        )
    return linear(net, on.reshape(m.t, hv * dv), p + "out_proj.weight", resid=resid)


def _swiglu_ffn(net: Any, h: Any, gate_up: str, down: str, resid: Any = None) -> Any:
    t, wg, wd = h.shape[0], net.w[gate_up], net.w[down]
    # the SwiGLU in gate | up's epilogue (gemm_swiglu.py): bitwise the two-array path below
    if resid is None and f16_norm_out(net, t) and gemm_ops.swiglu_gemm_ok(wg, wd, t):
        hs = gemm_ops.gemm_gate_up_swiglu(h, wg, operands=net.operands)
        return gemm_ops.gemm(hs, wd, inputs="fp16", operands=net.operands)
    # the GEMV's SwiGLU epilogue (net.gemv_swiglu_out; gemv.cu gemv_mma_gu): gate | up stores silu(gate) * up [t, I]
    # and the down product reads it plainly, bitwise the two-array path below
    if (
        getattr(net, "gemv_swiglu_out", False)
        and net.act == np.float32
        and not _gemm(net, t)
        and linear_ops.swiglu_out_ok(wg)
    ):
        hs = linear_ops.gemv(h, wg, swiglu_out=True, prefetch=next_product(net, wg))
        return linear(net, hs, down, resid=resid)
    return linear(net, linear(net, h, gate_up), down, swiglu=True, resid=resid)


def _experts(
    x: Any, w: Any, ids: Any, xrow: Any, n: int, out: Any, *, swiglu: bool = False, prefetch: Any = None,
    swiglu_out: bool = False,
) -> None:  # fmt: skip
    from ninfer.cuda.gemv_experts import gemv_experts

    for s0 in range(0, ids.shape[0], _SLOTS_PER_LAUNCH):
        s1 = min(ids.shape[0], s0 + _SLOTS_PER_LAUNCH)
        gemv_experts(
            x,
            w,
            ids[s0:s1],
            xrow[s0:s1],
            n,
            out[s0:s1],
            swiglu=swiglu,
            prefetch=prefetch,
            swiglu_out=swiglu_out,
        )


def _lanes(net: Any, h: Any, p: str, ids: Any, xrow: Any, ns: int, experts: int, nb: int) -> tuple[Any, Any]:
    """(gate|up, down) products of every sorted (token, expert) pair through the expert lanes (moe_lanes.py): one
    slot table, then each projection in launches of up to SLOTS_PER_LAUNCH slots; the down projection applies the
    SwiGLU while staging, as in decode."""
    import cupy

    inter, hid = net.cfg.moe_intermediate_size, net.cfg.hidden_size
    table = lanes_ops.expert_lanes(ids, xrow, experts, nb)
    gu = cupy.empty((ns, 2 * inter), dtype=h.dtype)
    lanes_ops.expert_lanes_product(h, net.w[p + "experts.gate_up_proj"], table, 2 * inter, gu, gate_up=True)
    dn = cupy.empty((ns, hid), dtype=h.dtype)
    lanes_ops.expert_lanes_product(
        gu, net.w[p + "experts.down_proj"], table, hid, dn, gate_up=False, swiglu=True
    )
    return gu, dn


def ffn_block(net: Any, p: str, h: Any, m: Meta, *, defer_combine: bool = False, resid: Any = None) -> Any:
    """Dense SwiGLU, or routed experts + gated shared expert. The router runs in fp32 (float32 input, exact
    GEMV) so that expert choice sees the reference's logits up to accumulation order. ``defer_combine``: an MoE
    layer returns its uncombined parts (``norm.MoeCombine``) for the next norm to combine in the same launch.
    ``resid``: dense layers only (the down projection folds the residual add)."""
    import cupy

    cfg, w, p = net.cfg, net.w, p + "mlp."
    if not cfg.is_moe:
        return _swiglu_ffn(net, h, p + "gate_up_proj", p + "down_proj.weight", resid)
    if resid is not None:
        raise ValueError("ffn_block: an MoE layer's output is combined into the next norm, not folded")
    t, k, inter, hid, e = (
        m.t,
        cfg.num_experts_per_tok,
        cfg.moe_intermediate_size,
        cfg.hidden_size,
        cfg.num_experts,
    )
    gemm = t > 8 and net.prefill_gemm  # tensor-core GEMMs (the shared expert; routed experts unless lanes)
    # expert lanes (moe_lanes.py): up to 8 rows of one expert per GEMV slot, for chunks whose experts get few rows
    # each (bitwise the decode products, so also every multi-row chunk of the exact mode)
    lanes = t > 8 and (not net.prefill_gemm or use_lanes(t * k, e))
    # the shared expert as expert e of the routed weights (fuse.append_shared_expert): its t slots follow the
    # routed t * k in the same expert launches, and its outputs are dn[n:] (the standalone GEMVs' sums, in the
    # expert plan's K splits: gemv_geometry._GV_DENSE_MIN_TILES gives dense launches more)
    shared = not gemm and w[p + "experts.gate_up_proj"].shape[0] == e + 1
    n = t * k
    ns = n + (t if shared else 0)
    # decode with net.moe_route_fused: the top-k runs inside the gate | up launch, which writes ids and ew
    routed = _route_in_experts(net, h, t, lanes, gemm)
    x, wr = net.widen(h), w[p + "router_gates"]  # router logits | shared-expert gate, fp32
    in_router = not routed and _route_in_router(net, x, wr, t, lanes, gemm)  # net.moe_route_router
    if routed or in_router:
        ids, ew = cupy.empty(ns, dtype=np.int32), cupy.empty((t, k), dtype=np.float32)
    if routed:
        rg = _router(net, x, p + "router_gates")
    elif in_router:  # moe_route in the router's tail
        from ninfer.cuda.linear import gemv

        rg = gemv(x, wr, route=(e, k, e if shared else None, ids, ew), prefetch=next_product(net, wr))
    else:
        rg = _router(net, x, p + "router_gates")
        eid, ew = router_ops.moe_route(rg[:, :e], k, shared=e if shared else None)
        ids = eid.reshape(-1)
    if t > 8:  # prefill: visit slots grouped by expert so the expert's weights stay in L2 (one launch: the
        # stable argsort's order, the slots' token rows and each pair's slot; the CuPy sort, gathers and scatter it
        # replaced were ~10 launches per layer, host-bound in a 256-token follow-up turn)
        ids, xrow, where = router_ops.moe_sort(ids, n, k, e)
    else:  # decode: constant tables, one per (lanes, k, shared) (a prefill length would add one per prompt length)
        slot = net.const_i32(("slot", ns), np.arange(ns))
        xr = np.concatenate([np.arange(n) // k, np.arange(t if shared else 0)])
        xrow, where = net.const_i32(("xrow", ns, k, shared), xr), slot[:n]
    down = None  # a decode down launch left to the next norm (_pending_down)
    if lanes:
        gu, dn = _lanes(net, h, p, ids, xrow, ns, e + int(shared), lanes_nb(t * k, e))
    elif gemm:
        import ninfer.cuda.experts_swiglu as es
        from ninfer.cuda.gemm import gemm_experts

        # the prefill GEMM inputs' mode (fp16 by default: each slot's row rounded under its own power-of-two scale,
        # tests/test_cuda_gemm_f16.py; the NumPy emulation with the experts so rounded, perf/fidelity_prefill.py,
        # agrees on 0.997 of the mid-size MoE's positions); the rows' scratch: memory_plan._gemm_scratch
        # (the slots read their token's row and the SwiGLU in the row split: no gathered or SwiGLU'd copy)
        mode, wg, wd = net.prefill_inputs, w[p + "experts.gate_up_proj"], w[p + "experts.down_proj"]
        if es.experts_swiglu_ok(h, wg, wd, 2 * inter, inputs=mode):  # the SwiGLU in gate | up's epilogue (no
            # [slots, 2 inter] array; experts_swiglu.py): bitwise the two-array path below
            hs = es.gemm_experts_gate_up_swiglu(h, wg, ids, 2 * inter, rows=xrow)
            dn = es.gemm_experts_down(hs, wd, ids, hid)
        else:
            gu = gemm_experts(h, wg, ids, 2 * inter, inputs=mode, rows=xrow)
            dn = gemm_experts(gu, wd, ids, hid, inputs=mode, swiglu=True)
    else:
        wg = w[p + "experts.gate_up_proj"]
        # net.gemv_swiglu_out: the gate | up launch stores silu(gate) * up (gemv_mma_gu), the down launch reads it
        # plainly (bitwise the staging's SwiGLU); not with the routing or the combine inside the expert launches
        gu_out = _experts_swiglu_out(net, h, wg, 2 * inter, routed)
        gu = cupy.empty((ns, inter if gu_out else 2 * inter), dtype=h.dtype)
        # with the decode GEMVs' L2 hints on, each slot's gate | up blocks fetch its expert's down rows
        nxt = w[p + "experts.down_proj"] if getattr(net, "gemv_prefetch", False) else None
        if routed:
            from ninfer.cuda.gemv_experts import gemv_experts_routed

            gemv_experts_routed(
                h, wg, rg, k, xrow, 2 * inter, gu, ids, ew, shared=e if shared else None, prefetch=nxt
            )
        else:
            _experts(h, wg, ids, xrow, 2 * inter, gu, prefetch=nxt, swiglu_out=gu_out)
        dn = cupy.empty((ns, hid), dtype=h.dtype)
        down = _pending_down(net, gu, w[p + "experts.down_proj"], ids, slot, dn, swiglu=not gu_out)
    sp = p + "shared_expert."
    sh = dn[n:] if shared else _swiglu_ffn(net, h, sp + "gate_up_proj", sp + "down_proj.weight")
    sg = rg.reshape(-1)[e:]  # column e of the fused router product [t, e + 1]: element t * (e + 1)
    c = MoeCombine(dn, where.reshape(t, k), ew, sh, sg, e + 1, down)
    return c if defer_combine else combine(c)


# Rows from which an MoE router runs as the pair-mode GEMM (its split, and the GEMM, are two launches where the
# GEMV is one: a 256-token follow-up turn is host-bound, so it keeps the GEMV; a 4096-token chunk gains ~2 ms).
ROUTER_GEMM_ROWS = 512


def _router(net: Any, x: Any, name: str) -> Any:
    """The router's fp32 logits on exact operands (weights exact, float32 x as bf16 hi + lo): the GEMV in 8-row
    blocks (a row bitwise its decode product) below ``ROUTER_GEMM_ROWS`` rows, the pair-mode GEMM from there, when the
    other prefill products run as GEMMs too (the same operands, another fp32 accumulation order; never the fp16
    inputs' rounding). Measured (H200, 1e66f7e): the 8-row blocks took 5.2 ms of a 35B-A3B 4096-token chunk, each
    block dequantizing the whole router weight again."""
    w = net.w[name]
    if (
        x.shape[0] < ROUTER_GEMM_ROWS
        or not net.prefill_gemm
        or isinstance(w, FusedRuns)
        or x.dtype != np.float32
    ):
        return linear(net, x, name, exact=True)
    return gemm_ops.gemm(x, w, inputs="exact", operands=net.operands)


def _route_in_router(net: Any, x: Any, wr: Any, t: int, lanes: bool, gemm: bool) -> bool:
    """Whether a call's MoE routing runs in the router GEMV's tail (``net.moe_route_router``; decode-sized calls,
    float32 rows, a single-format router of at most 256 experts; not with ``moe_route_fused``)."""
    return (
        bool(getattr(net, "moe_route_router", False))
        and t <= 8
        and not lanes
        and not gemm
        and x.dtype == np.float32
        and isinstance(wr, DeviceWeight)
        and net.cfg.num_experts <= 256
    )


def _route_in_experts(net: Any, h: Any, t: int, lanes: bool, gemm: bool) -> bool:
    """Whether a call's MoE routing runs inside the gate | up expert launch (``net.moe_route_fused``; decode-sized
    calls whose experts run as one-lane GEMV slots, float32 activations)."""
    return (
        bool(getattr(net, "moe_route_fused", False))
        and t <= 8
        and not lanes
        and not gemm
        and h.dtype == np.float32
    )


def _experts_swiglu_out(net: Any, h: Any, wg: Any, n: int, routed: bool) -> bool:
    """Whether a decode MoE layer's gate | up expert launch stores the SwiGLU (``net.gemv_swiglu_out``; float32
    rows, neither MoE fusion in the expert launches, experts whose row blocks hold whole features)."""
    from ninfer.cuda.gemv_experts import experts_swiglu_out_ok

    return (
        bool(getattr(net, "gemv_swiglu_out", False))
        and not routed
        and not getattr(net, "moe_combine_fused", False)
        and h.dtype == np.float32
        and experts_swiglu_out_ok(wg, n)
    )


def _pending_down(
    net: Any, gu: Any, w: Any, ids: Any, slot: Any, dn: Any, *, swiglu: bool = True
) -> tuple[Any, ...] | None:
    """A decode MoE layer's down launch: left to the next norm (``MoeCombine.down``: it runs the down with the
    combine and the norm in its tail, ``net.moe_combine_fused``), else run now into ``dn`` (None). ``swiglu``:
    ``gu`` is the [gate | up] rows (the launch stages their SwiGLU), else already the SwiGLU (the combine fusion
    never takes that form)."""
    down = (gu, w, ids, slot)
    if getattr(net, "moe_combine_fused", False):
        return down
    _run_down(down, dn, swiglu=swiglu)
    return None


def _run_down(down: tuple[Any, ...], dn: Any, *, swiglu: bool = True) -> None:
    """The down launch ``down`` = (gate | up rows, or their SwiGLU with ``swiglu=False``; the fused down weight,
    slot ids, slot rows) on its own, into ``dn`` (decode: one launch for every slot)."""
    from ninfer.cuda.gemv_experts import gemv_experts

    gu, w, ids, slot = down
    gemv_experts(gu, w, ids, slot, int(dn.shape[1]), dn, swiglu=swiglu)


def settle(c: MoeCombine) -> MoeCombine:
    """``c`` with its expert rows written: a pending down launch (``MoeCombine.down``) run on its own."""
    if c.down is None:
        return c
    _run_down(c.down, c.dn)
    return c._replace(down=None)


def combine_norm(
    c: MoeCombine, w: Any, eps: float, *, residual: Any, offset: bool = True, f16: bool = False
) -> Any:
    """``norm.moe_combine_rmsnorm`` of an MoE layer's output; a pending down launch runs with the combine and the
    norm in its tail (``gemv_experts.gemv_experts_down_combine``: one launch, the same bits) where that applies, else on
    its own first."""
    import cupy

    if c.down is not None and not f16:
        y = cupy.empty((c.rows, int(c.dn.shape[1])), dtype=c.dn.dtype)
        gu, wd, ids, slot = c.down
        if experts_ops.gemv_experts_down_combine(
            gu, wd, ids, slot, c.dn, where=c.where, ew=c.ew, sh=c.sh, sg=c.sg, ldsg=c.ldsg, residual=residual,
            weight=w, eps=eps, offset=offset, out=y,
        ):  # fmt: skip
            return y
    return norm_ops.moe_combine_rmsnorm(settle(c), w, eps, residual=residual, offset=offset, f16=f16)


def combine(c: MoeCombine) -> Any:
    """An MoE layer's output ``[T, H]`` from its parts (the standalone combine kernel)."""
    import cupy

    from ninfer.cuda._glue import glue

    c = settle(c)
    (t, k), hid = c.where.shape, c.dn.shape[1]
    y = cupy.empty((t, hid), dtype=c.dn.dtype)
    glue()["combine"](c.dn, c.where, c.ew, c.sh, c.sg, np.int32(k), np.int64(hid), np.int64(c.ldsg), y)
    return y
