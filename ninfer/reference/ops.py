"""fp32 NumPy ops of the Qwen3.6 family, one function per kernel the CUDA backend implements one for one.

Every function takes and returns plain arrays (float32 activations, HF-layout weights ``[out, in]``); none holds
state or knows about the model. Formulas follow docs/model-math.md (section numbers below).

Row independence (measured decision): ``linear`` multiplies each row on its own (a stack of 1-row products, which
NumPy sends to BLAS gemv one row at a time). A plain ``x @ w.T`` picks gemm for several rows and gemv for one, and
the two differ in the last bits, so a token's result would depend on which other rows share its batch. With the
stacked form a row's output is bitwise the same alone or in any batch, which is what lets the engine's batched
decode reproduce solo decode exactly. It costs about 3x on a [128,256]x[256,1024] prefill product on CPU.
All other ops here are elementwise or reduce over the last axis only, so they are row independent as well.

The Gated DeltaNet ops live in ``ops_gdn`` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ninfer.reference.activations import sigmoid, silu, softplus
from ninfer.reference.ops_gdn import (
    conv1d_causal,
    gated_rmsnorm,
    gdn_chunked,
    gdn_gates,
    gdn_recurrent,
    l2norm,
    solve_unit_lower,
)

__all__ = [
    "embedding",
    "rmsnorm_offset",
    "rmsnorm_plain",
    "add_residual",
    "linear",
    "sigmoid",
    "silu",
    "softplus",
    "split_q_gate",
    "mrope_axes",
    "rope_cos_sin",
    "apply_rope",
    "attention",
    "attention_scores",
    "attention_values",
    "sigmoid_gate",
    "swiglu",
    "dense_ffn",
    "moe_topk",
    "moe_route",
    "expert_ffn",
    "moe_experts",
    "shared_expert",
    "lm_head",
    # Gated DeltaNet (ops_gdn)
    "conv1d_causal",
    "l2norm",
    "gdn_gates",
    "gdn_chunked",
    "gdn_recurrent",
    "solve_unit_lower",
    "gated_rmsnorm",
]

F32 = np.float32


# ---- elementwise -------------------------------------------------------------------------------------------
def add_residual(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x + y).astype(F32, copy=False)


# ---- embedding, norms, linear --------------------------------------------------------------------------------
def embedding(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rows of ``table[V,H]`` for token ids ``[T]`` (no scaling, §2)."""
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        bad = int(ids[(ids < 0) | (ids >= table.shape[0])][0])
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {table.shape[0]})")
    return table[ids]


def rmsnorm_plain(x: np.ndarray, eps: float) -> np.ndarray:
    """x·rsqrt(mean(x²)+eps) over the last axis."""
    var = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    return (x * (F32(1.0) / np.sqrt(var + F32(eps)))).astype(F32, copy=False)


def rmsnorm_offset(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMSNormOff (§2): x·rsqrt(mean(x²)+eps)·(1+w); every norm but the GDN gated norm."""
    return (rmsnorm_plain(x, eps) * (F32(1.0) + w)).astype(F32, copy=False)


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y = x·wᵀ for ``x[..., in]`` and ``w[out, in]``; each row computed on its own (see module docstring)."""
    # contiguous operands keep NumPy on its BLAS path (a strided x would fall back to a different loop)
    x = np.ascontiguousarray(x, dtype=F32)
    return np.matmul(x[..., None, :], np.ascontiguousarray(w).T)[..., 0, :]


def round_fp16_rows(x: np.ndarray) -> np.ndarray:
    """The CUDA prefill GEMM's fp16 inputs (``prefill_inputs="fp16"``, docs/cuda.md "Prefill GEMM inputs"): each
    row of ``x`` times 2^k, with k = clamp(141 - E, -126, 126) for E the float32 exponent field of the row's largest
    |x| (so that it lands in [2^14, 2^15)), rounded to fp16 (nearest even), times 2^-k. Exactly what the kernel
    multiplies, as float32."""
    x = np.ascontiguousarray(x, dtype=F32)
    amax = np.max(np.abs(x), axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,), F32)
    e = ((amax.view(np.uint32) >> 23) & 0xFF).astype(np.int32)
    k = np.clip(141 - e, -126, 126)
    s = ((127 + k).astype(np.uint32) << 23).view(F32)
    inv = ((127 - k).astype(np.uint32) << 23).view(F32)
    with np.errstate(over="ignore", under="ignore"):
        return ((x * s).astype(np.float16).astype(F32) * inv).astype(F32)


# ---- gated attention (§3) ----------------------------------------------------------------------------------
def split_q_gate(qg: np.ndarray, n_heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``q_proj`` output ``[T, Hq·2D]`` -> query, gate ``[T,Hq,D]`` each: every head holds [query D | gate D]."""
    per_head = qg.reshape(qg.shape[0], n_heads, 2 * head_dim)
    return per_head[..., :head_dim], per_head[..., head_dim:]


def mrope_axes(half: int, section: Sequence[int], interleaved: bool) -> np.ndarray:
    """Position axis (0=T, 1=H, 2=W) of each of the ``half`` rotary frequency pairs.

    Interleaved (§3.3): H if i%3==1 and i<3·section[1], W if i%3==2 and i<3·section[2], else T.
    Contiguous: the first section[0] pairs T, the next section[1] H, the rest W.
    """
    i = np.arange(half)
    if interleaved:
        return np.where(
            (i % 3 == 1) & (i < 3 * section[1]), 1, np.where((i % 3 == 2) & (i < 3 * section[2]), 2, 0)
        )
    return np.where(i < section[0], 0, np.where(i < section[0] + section[1], 1, 2))


def rope_cos_sin(
    positions: np.ndarray, rotary_dim: int, theta: float, section: Sequence[int], interleaved: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin ``[T, rotary_dim/2]`` for 3-axis positions ``[3,T]`` (text: all three rows equal).

    Pair i uses the inverse frequency θ^(−2i/rotary_dim) and the position of axis ``mrope_axes(i)``; the angle is
    formed in fp32 as HF does.
    """
    half = rotary_dim // 2
    inv_freq = (1.0 / (F32(theta) ** (np.arange(0, rotary_dim, 2, dtype=F32) / F32(rotary_dim)))).astype(F32)
    axes = mrope_axes(half, section, interleaved)
    pos = np.asarray(positions).astype(F32)[axes]  # [half, T]: the position each pair reads
    ang = (pos.T * inv_freq).astype(F32)
    return np.cos(ang).astype(F32), np.sin(ang).astype(F32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX rotation of dims 0..rotary-1 of ``x[T,Hh,D]`` (pairs i, i+rotary/2); the other dims pass through."""
    half = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    out = x.copy()
    out[..., :half] = x1 * c - x2 * s
    out[..., half : 2 * half] = x2 * c + x1 * s
    return out


def attention_scores(q: np.ndarray, k: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Causal GQA scores of ``q[T,Hq,D]`` at cache rows start..start+T-1 against ``k[L,Hkv,D]`` (L ≥ start+T):
    ``[Hkv, G, T, start+T]`` scaled by 1/√D (query head j reads KV head j // G, G = Hq/Hkv), unmasked, and the
    ``[T, start+T]`` mask of each query's future keys."""
    t, hq, d = q.shape
    n_kv = k.shape[1]
    group = hq // n_kv
    length = start + t
    qh = q.reshape(t, n_kv, group, d).transpose(1, 2, 0, 3).reshape(n_kv, group * t, d)
    scores = np.matmul(qh, k[:length].transpose(1, 2, 0)) * F32(1.0 / np.sqrt(d))  # [Hkv, G·T, L]
    future = np.arange(length)[None, :] > (start + np.arange(t))[:, None]  # [T, L]
    return scores.reshape(n_kv, group, t, length), future


def attention_values(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``p[Hkv, G, T, L] · v[:L]`` for ``v[≥L, Hkv, D]`` (the layout of :func:`attention_scores`) as ``[T, Hq, D]``."""
    n_kv, group, t, length = p.shape
    d = v.shape[-1]
    out = np.matmul(p.reshape(n_kv, group * t, length), v[:length].transpose(1, 0, 2))  # [Hkv, G·T, D]
    return out.reshape(n_kv, group, t, d).transpose(2, 0, 1, 3).reshape(t, n_kv * group, d)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
    """Causal GQA over a cache: ``q[T,Hq,D]`` at cache rows start..start+T-1, ``k, v[L,Hkv,D]`` with L ≥ start+T.

    Query head j reads KV head j // (Hq/Hkv); scores scaled by 1/√D, fp32 softmax; returns ``[T,Hq,D]``.
    """
    scores, future = attention_scores(q, k, start)
    scores = np.where(future, -np.inf, scores)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = (scores / scores.sum(axis=-1, keepdims=True)).astype(F32)
    return attention_values(probs, v)


def sigmoid_gate(o: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """Output gate of gated attention: o ⊙ sigmoid(gate)."""
    return (o * sigmoid(gate)).astype(F32, copy=False)


# ---- FFN (§5) ----------------------------------------------------------------------------------------------
def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return (silu(gate) * up).astype(F32, copy=False)


def dense_ffn(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """down(SiLU(gate·x) ⊙ up·x)."""
    return linear(swiglu(linear(x, w_gate), linear(x, w_up)), w_down)


def moe_topk(router_logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """fp32 softmax over all experts, top-k (ties to the lower id: stable sort), not renormalised.

    Returns expert ids ``[T,k]`` (int64, best first) and their softmax probabilities ``[T,k]``.
    """
    z = router_logits.astype(F32)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    return idx.astype(np.int64), np.take_along_axis(p, idx, axis=-1).astype(F32, copy=False)


def moe_route(router_logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """``moe_topk`` renormalised: expert ids ``[T,k]`` (int64, best first) and weights ``[T,k]`` summing to 1."""
    idx, sel = moe_topk(router_logits, top_k)
    return idx, (sel / sel.sum(axis=-1, keepdims=True)).astype(F32)


def expert_ffn(x: np.ndarray, gate_up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """One expert: ``gate_up[2I,H]`` holds G rows then U rows; ``down[H,I]``."""
    inter = down.shape[1]
    gu = linear(x, gate_up)
    return linear(swiglu(gu[:, :inter], gu[:, inter:]), down)


def moe_experts(
    x: np.ndarray, idx: np.ndarray, weights: np.ndarray, gate_up: np.ndarray, down: np.ndarray
) -> np.ndarray:
    """Σ_slots w·expert(x) for routed ``idx/weights[T,k]``; experts visited in ascending id, so each row's
    accumulation order depends only on its own routing (row independent)."""
    y = np.zeros_like(x, dtype=F32)
    for e in np.unique(idx):
        rows, slots = np.nonzero(idx == e)
        y[rows] += expert_ffn(x[rows], gate_up[e], down[e]) * weights[rows, slots, None]
    return y


def shared_expert(
    x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray, w_scalar_gate: np.ndarray
) -> np.ndarray:
    """sigmoid(x·shared_expert_gateᵀ) · SwiGLU(x): always runs, outside the top-k."""
    return (sigmoid(linear(x, w_scalar_gate)) * dense_ffn(x, w_gate, w_up, w_down)).astype(F32, copy=False)


def lm_head(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Logits ``[T,V]`` from final-normed hidden ``[T,H]``."""
    return linear(h, w)
