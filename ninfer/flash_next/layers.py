"""The blocks of one Flash-Next layer as pure functions of (weights, input, state pieces): GDN, QSA, MoE, PLE.

``w(name)`` returns a float32 weight by canonical name; ``p`` is the layer's name prefix (``layers.{i}.`` or
``mtp.layers.0.``). Each block returns its output and leaves state updates to explicit return values or to the
cache objects it is handed, so the model file only wires them together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ninfer.flash_next import ops as fops
from ninfer.flash_next.config import FlashNextConfig
from ninfer.flash_next.state import IndexStore
from ninfer.reference import ops
from ninfer.reference.kv import KVCache

__all__ = ["Rope", "QsaCaches", "gdn_block", "qsa_block", "moe_block", "ple_block", "SelectHook"]

F32 = np.float32
W = Callable[[str], np.ndarray]
# (qsa ordinal, query position, block scores [nb], chosen block ids) -> None; a test hook to inspect selection
SelectHook = Callable[[int, int, np.ndarray, np.ndarray], None]


@dataclass(frozen=True, slots=True)
class Rope:
    """Text RoPE tables: all three mRoPE axes equal the token position (1-D RoPE on the first rotary dims)."""

    rotary_dim: int
    theta: float
    section: tuple[int, ...]

    def at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.asarray(positions, np.int64)
        return ops.rope_cos_sin(np.stack([pos, pos, pos]), self.rotary_dim, self.theta, self.section, True)


@dataclass(slots=True)
class QsaCaches:
    """The caches one QSA layer call reads and writes: K/V and pooled index keys (positional), the open block."""

    kv: KVCache
    index: IndexStore
    attn_idx: int
    open_keys: np.ndarray  # [start % ratio, Dix] raw keys after the last complete block


def gdn_block(
    cfg: FlashNextConfig, w: W, p: str, x: np.ndarray, conv: np.ndarray, rec: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gated DeltaNet (§5): returns (output ``[T, D]``, new conv window, new recurrent state)."""
    t = x.shape[0]
    a = f"{p}linear_attn."
    nk, dk, nv, dv = (
        cfg.linear_num_key_heads,
        cfg.linear_key_head_dim,
        cfg.linear_num_value_heads,
        cfg.linear_value_head_dim,
    )
    qkv = ops.linear(x, w(a + "in_proj_qkv.weight"))
    z = ops.linear(x, w(a + "in_proj_z.weight")).reshape(t, nv, dv)
    b = ops.linear(x, w(a + "in_proj_b.weight"))
    aa = ops.linear(x, w(a + "in_proj_a.weight"))
    y, conv = ops.conv1d_causal(qkv, conv, w(a + "conv1d.weight")[:, 0, :])
    y = ops.silu(y)
    kd = cfg.gdn_key_dim
    q = ops.l2norm(y[:, :kd].reshape(t, nk, dk))
    k = ops.l2norm(y[:, kd : 2 * kd].reshape(t, nk, dk))
    v = np.ascontiguousarray(y[:, 2 * kd :].reshape(t, nv, dv))
    beta, g = ops.gdn_gates(aa, b, w(a + "A_log"), w(a + "dt_bias"))
    core = ops.gdn_recurrent if t == 1 else ops.gdn_chunked
    o, rec = core(q, k, v, g, beta, rec)
    o = fops.gated_rmsnorm_act(o, w(a + "norm.weight"), z, cfg.rms_norm_eps, cfg.output_gate_type)
    return ops.linear(o.reshape(t, nv * dv), w(a + "out_proj.weight")), conv, rec


def _index_update(
    cfg: FlashNextConfig, w: W, p: str, rope: Rope, raw: np.ndarray, start: int, c: QsaCaches
) -> np.ndarray:
    """Pool the blocks the new raw keys complete, write them to the index cache, keep the rest open.
    Returns all pooled keys of the sequence after this call."""
    ratio = cfg.indexer_compress_ratio
    pending = np.concatenate([c.open_keys, raw], axis=0)
    first = start // ratio  # the open block's index (it starts at first·ratio)
    n_new = pending.shape[0] // ratio
    if n_new:
        cos, sin = rope.at((first + np.arange(n_new)) * ratio)
        blocks = pending[: n_new * ratio].reshape(n_new, ratio, -1)
        pooled = fops.qsa_pool_keys(
            blocks, w(f"{p}self_attn.indexer.k_layernorm.weight"), cfg.rms_norm_eps, cos, sin
        )
        c.index.write_index(c.attn_idx, first, pooled)
    c.open_keys = np.ascontiguousarray(pending[n_new * ratio :])
    return c.index.read_index(c.attn_idx, first + n_new)


def qsa_block(
    cfg: FlashNextConfig,
    w: W,
    p: str,
    rope: Rope,
    x: np.ndarray,
    start: int,
    c: QsaCaches,
    hook: SelectHook | None = None,
) -> np.ndarray:
    """QSA layer (§4) for tokens at positions start..start+T-1: gated attention over the indexer's selection.

    A query at position p keeps the top ``block_topk`` complete blocks by indexer score (all of them while there
    are no more than that: exactly dense up to ``dense_max_visible`` tokens) plus the open tail.
    """
    t = x.shape[0]
    a = f"{p}self_attn."
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    cos, sin = rope.at(start + np.arange(t))
    q, gate = ops.split_q_gate(ops.linear(x, w(a + "q_proj.weight")), hq, d)
    q = ops.apply_rope(ops.rmsnorm_offset(q, w(a + "q_norm.weight"), cfg.rms_norm_eps), cos, sin)
    k = ops.linear(x, w(a + "k_proj.weight")).reshape(t, hkv, d)
    k = ops.apply_rope(ops.rmsnorm_offset(k, w(a + "k_norm.weight"), cfg.rms_norm_eps), cos, sin)
    v = ops.linear(x, w(a + "v_proj.weight")).reshape(t, hkv, d)
    c.kv.write(c.attn_idx, start, k, v)
    kc, vc = c.kv.read(c.attn_idx, start + t)

    qi, raw = fops.qsa_index_qk(
        x, w(a + "indexer.index_qk_proj.weight"), w(a + "indexer.q_layernorm.weight"), cfg.indexer_n_heads,
        cfg.rms_norm_eps, cos, sin,
    )  # fmt: skip
    keys = _index_update(cfg, w, p, rope, raw, start, c)
    ratio, topk = cfg.indexer_compress_ratio, cfg.block_topk
    rows = []
    for i in range(t):
        pos = start + i
        nb = (pos + 1) // ratio
        if nb <= topk:
            blocks = np.arange(nb)
        else:
            scores = fops.qsa_block_scores(qi[i], keys[:nb])
            blocks = fops.qsa_select_blocks(scores, topk)
            if hook is not None:
                hook(c.attn_idx, pos, scores, blocks)
        rows.append(fops.qsa_token_set(pos, blocks, ratio))
    o = fops.sparse_gated_attention(q, kc, vc, rows, gate)
    return ops.linear(o, w(a + "o_proj.weight"))


def moe_block(cfg: FlashNextConfig, w: W, p: str, x: np.ndarray) -> np.ndarray:
    """Routed experts (softmax over all, top-k, renormalised) plus the sigmoid-gated shared expert (§6)."""
    m = f"{p}mlp."
    idx, wts = fops.moe_route_ext(
        ops.linear(x, w(m + "gate.weight")), cfg.num_experts_per_tok, cfg.norm_topk_prob
    )
    y = ops.moe_experts(x, idx, wts, w(m + "experts.gate_up_proj"), w(m + "experts.down_proj"))
    shared = ops.shared_expert(
        x, w(m + "shared_expert.gate_proj.weight"), w(m + "shared_expert.up_proj.weight"),
        w(m + "shared_expert.down_proj.weight"), w(m + "shared_expert_gate.weight"),
    )  # fmt: skip
    return (y + shared).astype(F32, copy=False)


def ple_block(
    cfg: FlashNextConfig, w: W, p: str, h: np.ndarray, e: np.ndarray, conv: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """PLE (§7): the per-stream update U + silu(dilated conv(norm_conv(U))) for the incoming HC state ``h`` and
    the looked-up n-gram embedding ``e[T, Dple]``; returns (update ``[T, S·D]``, new conv window)."""
    a = f"{p}ple."
    eps, count = cfg.rms_norm_eps, cfg.hc_count
    u = fops.ple_gate(
        e, h, w(a + "key_proj.weight"), w(a + "value_proj.weight"), w(a + "norm_key.weight"),
        w(a + "norm_query.weight"), count, eps,
    )  # fmt: skip
    un = fops.rmsnorm_offset_grouped(u, w(a + "norm_conv.weight"), cfg.hidden_size, eps)
    c, conv = fops.dilated_conv_silu(un, conv, w(a + "conv1d.weight")[:, 0, :], cfg.ngram_size)
    return (u + c).astype(F32, copy=False), conv
