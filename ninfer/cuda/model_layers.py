"""Mixer and FFN blocks of ``CudaQwen36`` (docs/model-math.md §3–§5), as compositions of the kernel wrappers.

Each block takes the normed activation ``h[T, H]`` (bf16 words or float32) and the call's ``Meta`` and returns the
block output in the same dtype; state (KV pages, GDN conv/recurrent slots) is updated in place on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda.model_graph import Meta

__all__ = ["linear", "attention_block", "gdn_block", "ffn_block"]

_SLOTS_PER_LAUNCH = 65535  # gridDim.y limit of gemv_experts


def linear(net: Any, x: Any, name: str, out: Any = None, *, exact: bool = False) -> Any:
    """``x · Wᵀ``: GEMV for up to 8 rows; above, tensor-core GEMM (exact weight operands; float32 ``x`` split into
    two bf16 halves), or (``exact`` or ``prefill_gemm=False``) the decode GEMV in 8-row blocks, which gives every
    row bitwise its decode result."""
    from ninfer.cuda.linear import gemm, gemv

    w = net.w[name]
    t = x.shape[0]
    if t > 8 and net.prefill_gemm and not exact:
        return gemm(x, w, out)
    return gemv(x, w, out)  # more than 8 rows: 8-row blocks of one launch, each row bitwise its decode result


def attention_block(net: Any, p: str, h: Any, m: Meta, j: int) -> Any:
    from ninfer.cuda.activation import sigmoid_gate
    from ninfer.cuda.attention import attention, qk_norm_rope_kv_write
    from ninfer.cuda.attention_prefill import attention_prefill

    cfg, w = net.cfg, net.w
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qg = linear(net, h, p + "self_attn.q_proj.weight")
    k = linear(net, h, p + "self_attn.k_proj.weight")
    v = linear(net, h, p + "self_attn.v_proj.weight")
    scales = {"k_scale": net.ks[j], "v_scale": net.vs[j]} if net.ks else {}  # fp8 KV only
    q = qk_norm_rope_kv_write(
        qg, k, v, w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"], m.pos, m.kv_slots,
        net.kc[j], net.vc[j], heads=hq, kv_heads=hkv, head_dim=d, rotary_dim=cfg.rotary_dim,
        theta=cfg.rope_theta, mrope_section=cfg.mrope_section, interleaved=cfg.mrope_interleaved,
        eps=cfg.rms_norm_eps, **scales,
    )  # fmt: skip
    if m.t > 8 and net.prefill_gemm and net.kc[j].dtype == np.uint16:  # bf16 cache: tensor-core prefill
        o = attention_prefill(q, net.kc[j], net.vc[j], m.page_table, m.row_seq, m.row_pos, max_len=m.max_len)
    else:
        o = attention(
            q, net.kc[j], net.vc[j], m.page_table, m.row_seq, m.row_pos, max_len=m.max_len, chunk=m.chunk,
            **scales,
        )  # fmt: skip
    g = sigmoid_gate(o.reshape(m.t, hq * d), qg, hq, d)
    return linear(net, g, p + "self_attn.o_proj.weight")


def gdn_block(net: Any, p: str, h: Any, m: Meta, j: int) -> Any:
    """GDN mixer. The delta rule runs chunked (``gdn_chunked``, 64-token chunks) for prefill calls (more rows than
    sequences) when ``net.prefill_gemm``: that mode's results already depend on chunking. Decode, and prefill
    with ``prefill_gemm=False``, run the exact recurrence, so a token's result matches its decode bitwise."""
    from ninfer.cuda.gdn import causal_conv, gdn_chunked, gdn_recurrent
    from ninfer.cuda.norm import gated_rmsnorm

    cfg, w = net.cfg, net.w
    p += "linear_attn."
    hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    qkv = linear(net, h, p + "in_proj_qkv.weight")
    z = linear(net, h, p + "in_proj_z.weight")
    a = linear(net, h, p + "in_proj_a.weight")
    b = linear(net, h, p + "in_proj_b.weight")
    y = causal_conv(qkv, w[p + "conv1d.weight"], net.conv[j], m.starts, m.gslots)
    rule = gdn_chunked if net.prefill_gemm and m.t > m.nseq else gdn_recurrent
    o = rule(
        y,
        a,
        b,
        w[p + "A_log"],
        w[p + "dt_bias"],
        net.rec[j],
        m.starts,
        m.gslots,
        n_k_heads=cfg.linear_num_key_heads,
    )
    on = gated_rmsnorm(
        o.reshape(m.t * hv, dv), z.reshape(m.t * hv, dv), w[p + "norm.weight"], cfg.rms_norm_eps
    )
    return linear(net, on.reshape(m.t, hv * dv), p + "out_proj.weight")


def _swiglu_ffn(net: Any, h: Any, gate: str, up: str, down: str, inter: int) -> Any:
    import cupy

    from ninfer.cuda.activation import swiglu

    gu = cupy.empty((h.shape[0], 2 * inter), dtype=h.dtype)
    linear(net, h, gate, gu[:, :inter])
    linear(net, h, up, gu[:, inter:])
    return linear(net, swiglu(gu), down)


def _experts(x: Any, w: Any, ids: Any, xrow: Any, n: int, out: Any) -> None:
    from ninfer.cuda.linear import gemv_experts

    for s0 in range(0, ids.shape[0], _SLOTS_PER_LAUNCH):
        s1 = min(ids.shape[0], s0 + _SLOTS_PER_LAUNCH)
        gemv_experts(x, w, ids[s0:s1], xrow[s0:s1], n, out[s0:s1])


def ffn_block(net: Any, p: str, h: Any, m: Meta) -> Any:
    """Dense SwiGLU, or routed experts + gated shared expert. The router runs in fp32 (float32 input, exact
    GEMV) so that expert choice sees the reference's logits up to accumulation order."""
    import cupy

    from ninfer.cuda._glue import glue
    from ninfer.cuda.activation import swiglu
    from ninfer.cuda.router import moe_route

    cfg, w, p = net.cfg, net.w, p + "mlp."
    if not cfg.is_moe:
        return _swiglu_ffn(net, h, p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight",
                           cfg.intermediate_size)  # fmt: skip
    t, k, inter, hid = m.t, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.hidden_size
    h32 = net.widen(h)
    eid, ew = moe_route(linear(net, h32, p + "gate.weight", exact=True), k)
    flat, n = eid.reshape(-1), t * k
    slot = cupy.arange(n, dtype=np.int32)
    if t > 8:  # prefill: visit slots grouped by expert so the expert's weights stay in L2
        order = cupy.argsort(flat).astype(np.int32)
        ids, xrow = flat[order], order // np.int32(k)
        where = cupy.empty(n, np.int32)
        where[order] = slot
    else:
        ids, xrow, where = flat, slot // np.int32(k), slot
    if t > 8 and net.prefill_gemm:  # grouped tensor-core GEMM over each expert's sorted rows
        from ninfer.cuda.linear import gemm_experts

        gu = gemm_experts(cupy.take(h, xrow, axis=0), w[p + "experts.gate_up_proj"], ids, 2 * inter)
        dn = gemm_experts(swiglu(gu), w[p + "experts.down_proj"], ids, hid)
    else:
        gu = cupy.empty((n, 2 * inter), dtype=h.dtype)
        _experts(h, w[p + "experts.gate_up_proj"], ids, xrow, 2 * inter, gu)
        dn = cupy.empty((n, hid), dtype=h.dtype)
        _experts(swiglu(gu), w[p + "experts.down_proj"], ids, slot, hid, dn)
    sp = p + "shared_expert."
    sh = _swiglu_ffn(net, h, sp + "gate_proj.weight", sp + "up_proj.weight", sp + "down_proj.weight",
                     cfg.shared_expert_intermediate_size)  # fmt: skip
    sg = linear(net, h32, p + "shared_expert_gate.weight", exact=True)
    y = cupy.empty((t, hid), dtype=h.dtype)
    glue()["combine"](dn, where, ew, sh, sg, np.int32(k), np.int64(hid), y)
    return y
