"""fp32 NumPy ops that Qwen3.8-Flash-Next adds to the Qwen3.6 set, one function per future CUDA kernel.

Formulas follow docs/flash-next.md (section numbers below). Ops whose math is identical to Qwen3.6
(linear, RMSNormOff, RoPE, GDN conv/recurrence/chunked, MoE routing and experts) are reused from
``ninfer.reference.ops`` by the model; only the variants live here. The n-gram hashing is in ``ops_ngram``.

Layout conventions: activations are row-major ``[T, ...]``; the hyper-connection state is ``[T, S·D]``,
stream-major (stream s = columns s·D..(s+1)·D-1); weights are HF ``[out, in]``.
"""

from __future__ import annotations

import numpy as np

from ninfer.reference.ops import (
    apply_rope,
    linear,
    moe_route,
    moe_topk,
    rmsnorm_offset,
    rmsnorm_plain,
    sigmoid,
    silu,
)

__all__ = [
    "rmsnorm_offset_grouped",
    "hc_expand",
    "hc_mix",
    "hc_combine",
    "gated_rmsnorm_act",
    "qsa_index_qk",
    "qsa_pool_keys",
    "qsa_block_scores",
    "qsa_select_blocks",
    "qsa_token_set",
    "sparse_gated_attention",
    "ple_gate",
    "dilated_conv_silu",
    "moe_route_ext",
    "mtp_fuse_input",
]

F32 = np.float32


def rmsnorm_offset_grouped(x: np.ndarray, w: np.ndarray, group: int, eps: float) -> np.ndarray:
    """Per-group RMSNormOff over the last axis: each ``group``-wide slice normalised on its own, scale (1+w)
    with the full-width ``w`` (the HC / PLE per-stream norms, §3, §7)."""
    shape = x.shape
    xn = rmsnorm_plain(x.reshape(*shape[:-1], shape[-1] // group, group), eps).reshape(shape)
    return (xn * (F32(1.0) + w)).astype(F32, copy=False)


# ---- hyper-connections (§3) ------------------------------------------------------------------------------
def hc_expand(x: np.ndarray, count: int) -> np.ndarray:
    """Embedding ``[T, D]`` copied into all ``count`` streams -> ``[T, count·D]``."""
    return np.tile(x.astype(F32, copy=False), (1, count))


def hc_mix(
    h: np.ndarray,
    norm_w: np.ndarray,
    w_down: np.ndarray,
    w_up: np.ndarray,
    w_inject: np.ndarray | None,
    count: int,
    eps: float,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Mix: the block input ``[T, D]`` and, when ``w_inject`` is given, the inject weights ``[T, count]``.

    Xn = per-stream RMSNormOff(h); r = silu((W_down·Xn)/count) (divided before silu); G = sigmoid(W_up·r);
    block input = mean_s G_s ⊙ Xn_s; inject = 2·sigmoid((W_inject·Xn)/count). Without ``w_inject`` this is the
    final collapse (``hyper_connection_mixer``).
    """
    t, width = h.shape
    d = width // count
    xn = rmsnorm_offset_grouped(h, norm_w, d, eps)
    r = silu((linear(xn, w_down) / F32(count)).astype(F32))
    g = sigmoid(linear(r, w_up)).reshape(t, count, d)
    block_input = (g * xn.reshape(t, count, d)).mean(axis=1, dtype=F32)
    if w_inject is None:
        return block_input.astype(F32, copy=False), None
    inject = (F32(2.0) * sigmoid((linear(xn, w_inject) / F32(count)).astype(F32))).astype(F32)
    return block_input.astype(F32, copy=False), inject


def hc_combine(h: np.ndarray, y: np.ndarray, inject: np.ndarray) -> np.ndarray:
    """H_s <- H_s + inject_s·y for the un-normalised state ``h[T, S·D]`` that went into the mix (no stream mixing)."""
    t, count = inject.shape
    upd = inject[:, :, None] * y[:, None, :]
    return (h + upd.reshape(t, -1)).astype(F32, copy=False)


# ---- GDN output gate (§5) ----------------------------------------------------------------------------------
def gated_rmsnorm_act(x: np.ndarray, w: np.ndarray, z: np.ndarray, eps: float, act: str) -> np.ndarray:
    """GDN output norm per head: (x·rsqrt(mean(x²)+eps))·w·act(z), plain w; act = "sigmoid" for this model
    (Qwen3.5/3.6 use silu, ``ninfer.reference.ops.gated_rmsnorm``)."""
    gate = sigmoid(z) if act == "sigmoid" else silu(z)
    return (rmsnorm_plain(x, eps) * w * gate).astype(F32, copy=False)


# ---- QSA (§4) ----------------------------------------------------------------------------------------------
def qsa_index_qk(
    x: np.ndarray,
    w_qk: np.ndarray,
    q_norm_w: np.ndarray,
    n_heads: int,
    eps: float,
    cos: np.ndarray,
    sin: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Indexer projection: queries ``[T, n_heads, Dix]`` (RMSNormOff, RoPE at their own positions) and the raw
    token keys ``[T, Dix]`` (un-normalised, un-roped: they are pooled per block before norm and RoPE)."""
    t = x.shape[0]
    qk = linear(x, w_qk)
    dix = qk.shape[-1] // (n_heads + 1)
    q = rmsnorm_offset(qk[:, : n_heads * dix].reshape(t, n_heads, dix), q_norm_w, eps)
    return apply_rope(q, cos, sin), np.ascontiguousarray(qk[:, n_heads * dix :])


def qsa_pool_keys(
    raw: np.ndarray, k_norm_w: np.ndarray, eps: float, cos: np.ndarray, sin: np.ndarray
) -> np.ndarray:
    """Block keys ``[nb, Dix]`` from raw keys ``[nb, ratio, Dix]``: fp32 mean over the block, RMSNormOff, RoPE at
    the block's start position (``cos/sin[nb, rotary/2]`` taken at 4b for block b)."""
    pooled = rmsnorm_offset(raw.mean(axis=1, dtype=F32), k_norm_w, eps)
    return apply_rope(pooled[:, None, :], cos, sin)[:, 0, :]


def qsa_block_scores(q: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """score_b = Σ_h relu(q_h·key_b)/√Dix for one query row ``q[n_heads, Dix]`` over ``keys[nb, Dix]`` (fp32)."""
    dots = np.matmul(keys, q.T)  # [nb, n_heads]
    return (np.maximum(dots, F32(0.0)).sum(axis=1, dtype=F32) / F32(np.sqrt(q.shape[-1]))).astype(F32)


def qsa_select_blocks(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices (ascending) of the ``k`` best blocks; among equal scores the LOWEST block index wins.

    This tie rule is ours: transformers uses torch.topk, whose choice among ties is undocumented, and zero scores
    (all heads' dots <= 0) are common enough that the rule changes outputs (docs/flash-next.md §4).
    """
    if k >= scores.shape[0]:
        return np.arange(scores.shape[0])
    order = np.argsort(-scores, kind="stable")[:k]
    return np.sort(order)


def qsa_token_set(pos: int, blocks: np.ndarray, ratio: int) -> np.ndarray:
    """Cache rows a query at ``pos`` attends: the tokens of the selected complete blocks plus the open tail
    ``ratio·nb .. pos`` (nb = (pos+1)//ratio complete blocks), ascending."""
    nb = (pos + 1) // ratio
    toks = (blocks[:, None] * ratio + np.arange(ratio)[None, :]).reshape(-1)
    return np.concatenate([toks, np.arange(nb * ratio, pos + 1)]).astype(np.int64)


def sparse_gated_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, rows: list[np.ndarray], gate: np.ndarray
) -> np.ndarray:
    """Gated GQA over a per-row key subset: ``q, gate[T, Hq, D]``, ``k, v[L, Hkv, D]`` (cache), ``rows[t]`` the
    cache rows query t attends. fp32 softmax(q·kᵀ/√D) over the subset, then ⊙ sigmoid(gate). Returns
    ``[T, Hq·D]`` (before o_proj)."""
    t, hq, d = q.shape
    n_kv = k.shape[1]
    group = hq // n_kv
    out = np.empty((t, hq, d), F32)
    scale = F32(1.0 / np.sqrt(d))
    for i, sel in enumerate(rows):
        ks, vs = k[sel], v[sel]  # [n, Hkv, D]
        qh = q[i].reshape(n_kv, group, d)
        s = np.matmul(qh, ks.transpose(1, 2, 0)) * scale  # [Hkv, G, n]
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p = (p / p.sum(axis=-1, keepdims=True)).astype(F32)
        out[i] = np.matmul(p, vs.transpose(1, 0, 2)).reshape(hq, d)
    return (out * sigmoid(gate)).reshape(t, hq * d).astype(F32, copy=False)


# ---- PLE block (§7) ----------------------------------------------------------------------------------------
def ple_gate(
    e: np.ndarray,
    h: np.ndarray,
    key_proj: np.ndarray,
    value_proj: np.ndarray,
    norm_key_w: np.ndarray,
    norm_query_w: np.ndarray,
    count: int,
    eps: float,
) -> np.ndarray:
    """Gated values U ``[T, S·D]`` from the n-gram embedding ``e[T, Dple]`` and the incoming HC state ``h``.

    K = per-stream norm_key(key_proj·e), V = value_proj·e, Q = per-stream norm_query(h);
    s_j = <K_j, Q_j>/√D, gate_j = sign(s_j)·√max(|s_j|, 1e-6) (sign(0)=0); U_j = sigmoid(gate_j)·V.
    """
    t = e.shape[0]
    d = value_proj.shape[0]
    kk = rmsnorm_offset_grouped(linear(e, key_proj), norm_key_w, d, eps).reshape(t, count, d)
    qq = rmsnorm_offset_grouped(h, norm_query_w, d, eps).reshape(t, count, d)
    vv = linear(e, value_proj)
    s = ((kk * qq).sum(axis=-1, dtype=F32) / F32(np.sqrt(d))).astype(F32)
    gate = (np.sign(s) * np.sqrt(np.maximum(np.abs(s), F32(1e-6)))).astype(F32)
    return (sigmoid(gate)[:, :, None] * vv[:, None, :]).reshape(t, count * d).astype(F32, copy=False)


def dilated_conv_silu(
    xn: np.ndarray, state: np.ndarray, w: np.ndarray, dilation: int
) -> tuple[np.ndarray, np.ndarray]:
    """silu of a depthwise causal dilated conv: ``y_t = Σ_j w[c, j]·x_{t-(K-1-j)·dilation}`` over ``xn[T, C]``.

    ``state[(K-1)·dilation, C]`` holds the previous inputs (oldest first, zero at sequence start); ``w[C, K]``
    (tap K-1 = current token). Returns ``y[T, C]`` and the new state (the last (K-1)·dilation inputs).
    """
    t = xn.shape[0]
    taps = w.shape[1]
    span = state.shape[0]
    xx = np.concatenate([state, xn], axis=0)  # [span + T, C]
    y = np.zeros_like(xn, dtype=F32)
    for j in range(taps):
        start = span - (taps - 1 - j) * dilation
        y = y + xx[start : start + t] * w[:, j]
    return silu(y.astype(F32)), np.ascontiguousarray(xx[t:])


# ---- MoE router (§6) ---------------------------------------------------------------------------------------
def moe_route_ext(router_logits: np.ndarray, top_k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """fp32 softmax over all experts (512 here), top-k with ties to the lower id, renormalised when
    ``normalize`` (norm_topk_prob; true for Flash-Next): ``ops.moe_route``, else ``ops.moe_topk``. Returns ids
    ``[T, k]`` (best first) and weights."""
    return moe_route(router_logits, top_k) if normalize else moe_topk(router_logits, top_k)


# ---- MTP input (§8) ----------------------------------------------------------------------------------------
def mtp_fuse_input(
    r: np.ndarray,
    e: np.ndarray,
    norm_hidden_w: np.ndarray,
    norm_emb_w: np.ndarray,
    fc_hidden: np.ndarray,
    fc_embedding: np.ndarray,
    count: int,
    eps: float,
) -> np.ndarray:
    """MTP layer input ``[T, S·D]``: stream s = fc_hidden(norm_hidden(R)_s) + fc_embedding(norm_emb(e)).

    ``r[T, S·D]`` is the target's pre-mixer 4-stream state (norm_hidden is ONE RMSNorm over all S·D, not per
    stream); ``e[T, D]`` the embedding of the next token, its term added to every stream.
    """
    t = r.shape[0]
    d = e.shape[-1]
    rn = rmsnorm_offset(r, norm_hidden_w, eps).reshape(t * count, d)
    hid = linear(rn, fc_hidden).reshape(t, count, d)
    emb = linear(rmsnorm_offset(e, norm_emb_w, eps), fc_embedding)
    return (hid + emb[:, None, :]).reshape(t, count * d).astype(F32, copy=False)
