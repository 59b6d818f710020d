"""Decoder-layer building blocks of the Qwen3.6 family, composed from ``ops`` (docs/model-math.md §2–§5).

A call processes the rows of several independent sequences at once: ``segments`` lists, for each sequence, its
``SequenceState`` and the slice of rows that belong to it (contiguous, in order). Row-wise work (projections,
norms, FFN) runs on all rows together; the parts that read or write sequence state (conv window, GDN recurrence,
KV cache) run per segment. Because every op is row independent (see ``ops``), a row's result does not depend on
which other segments share the call. A segment's rows sit at cache rows ``state.length ..``; the caller advances
``length`` after the last layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ninfer.config import ModelConfig
from ninfer.reference import ops
from ninfer.reference.kv import SequenceState

__all__ = ["Segment", "Getter", "attention_block", "gdn_block", "ffn_block", "decoder_layer"]

Segment = tuple[SequenceState, slice]
Getter = Callable[[str], np.ndarray]  # canonical name -> float32 weight (CachedWeights)


def attention_block(
    w: Getter,
    cfg: ModelConfig,
    p: str,
    h: np.ndarray,
    segments: Sequence[Segment],
    attn_idx: int,
    rope: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """Gated full attention (§3) of normed ``h[T,H]``; writes K (normed, rotated) and raw V to each segment's KV."""
    t = h.shape[0]
    hq, hkv, d, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    q, gate = ops.split_q_gate(ops.linear(h, w(p + "self_attn.q_proj.weight")), hq, d)
    q = ops.rmsnorm_offset(q, w(p + "self_attn.q_norm.weight"), eps)
    k = ops.linear(h, w(p + "self_attn.k_proj.weight")).reshape(t, hkv, d)
    k = ops.rmsnorm_offset(k, w(p + "self_attn.k_norm.weight"), eps)
    v = ops.linear(h, w(p + "self_attn.v_proj.weight")).reshape(t, hkv, d)
    q, k = ops.apply_rope(q, *rope), ops.apply_rope(k, *rope)
    o = np.empty_like(q)
    for state, rows in segments:
        n = rows.stop - rows.start
        state.kv.write(attn_idx, state.length, k[rows], v[rows])
        k_all, v_all = state.kv.read(attn_idx, state.length + n)
        o[rows] = ops.attention(q[rows], k_all, v_all, state.length)
    o = ops.sigmoid_gate(o, gate).reshape(t, hq * d)
    return ops.linear(o, w(p + "self_attn.o_proj.weight"))


def gdn_block(
    w: Getter, cfg: ModelConfig, p: str, h: np.ndarray, segments: Sequence[Segment], gdn_idx: int
) -> np.ndarray:
    """Gated DeltaNet (§4) of normed ``h[T,H]``; a segment of T>1 rows takes the chunked form, T=1 the step."""
    t = h.shape[0]
    p += "linear_attn."
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, kd = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.gdn_key_dim
    qkv = ops.linear(h, w(p + "in_proj_qkv.weight"))
    z = ops.linear(h, w(p + "in_proj_z.weight")).reshape(t, hv, dv)
    a = ops.linear(h, w(p + "in_proj_a.weight"))
    b = ops.linear(h, w(p + "in_proj_b.weight"))
    conv_w = w(p + "conv1d.weight")[:, 0, :]
    a_log, dt_bias = w(p + "A_log"), w(p + "dt_bias")
    o = np.empty((t, hv, dv), np.float32)
    for state, rows in segments:
        n = rows.stop - rows.start
        y, state.conv[gdn_idx] = ops.conv1d_causal(qkv[rows], state.conv[gdn_idx], conv_w)
        y = ops.silu(y)  # only q|k|v are convolved and activated
        q = ops.l2norm(y[:, :kd].reshape(n, hk, dk))
        k = ops.l2norm(y[:, kd : 2 * kd].reshape(n, hk, dk))
        v = y[:, 2 * kd :].reshape(n, hv, dv)
        beta, g = ops.gdn_gates(a[rows], b[rows], a_log, dt_bias)
        core = ops.gdn_chunked if n > 1 else ops.gdn_recurrent
        o[rows], state.rec[gdn_idx] = core(q, k, v, g, beta, state.rec[gdn_idx])
    on = ops.gated_rmsnorm(o, w(p + "norm.weight"), z, cfg.rms_norm_eps).reshape(t, hv * dv)
    return ops.linear(on, w(p + "out_proj.weight"))


def ffn_block(w: Getter, cfg: ModelConfig, p: str, h: np.ndarray) -> np.ndarray:
    """SwiGLU (dense) or routed experts plus the gated shared expert (MoE), §5."""
    p += "mlp."
    if not cfg.is_moe:
        return ops.dense_ffn(h, w(p + "gate_proj.weight"), w(p + "up_proj.weight"), w(p + "down_proj.weight"))
    idx, weights = ops.moe_route(ops.linear(h, w(p + "gate.weight")), cfg.num_experts_per_tok)
    routed = ops.moe_experts(h, idx, weights, w(p + "experts.gate_up_proj"), w(p + "experts.down_proj"))
    shared = ops.shared_expert(
        h,
        w(p + "shared_expert.gate_proj.weight"),
        w(p + "shared_expert.up_proj.weight"),
        w(p + "shared_expert.down_proj.weight"),
        w(p + "shared_expert_gate.weight"),
    )
    return ops.add_residual(routed, shared)


def decoder_layer(
    w: Getter,
    cfg: ModelConfig,
    p: str,
    kind: str,
    x: np.ndarray,
    segments: Sequence[Segment],
    mixer_idx: int,
    rope: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """Pre-norm residual layer (§2): x += Mixer(RMSNormOff(x)); x += FFN(RMSNormOff(x))."""
    eps = cfg.rms_norm_eps
    h = ops.rmsnorm_offset(x, w(p + "input_layernorm.weight"), eps)
    if kind == "linear_attention":
        mixed = gdn_block(w, cfg, p, h, segments, mixer_idx)
    else:
        mixed = attention_block(w, cfg, p, h, segments, mixer_idx, rope)
    x = ops.add_residual(x, mixed)
    h = ops.rmsnorm_offset(x, w(p + "post_attention_layernorm.weight"), eps)
    return ops.add_residual(x, ffn_block(w, cfg, p, h))
