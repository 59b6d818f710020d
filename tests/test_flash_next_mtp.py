"""The MTP head (docs/flash-next.md §8) against an independent float64 NumPy computation written here from the spec.

transformers has no qwen4_exp MTP forward, so the oracle below re-derives everything in fp64 from the formulas
(fused input, HC mix/combine, one QSA layer with its indexer and block selection, MoE, final mixer) without
using the ninfer ops. The MTP runs in chunks with its own caches; the oracle does one full pass.
"""

from __future__ import annotations

import numpy as np
import pytest
from hf_tiny_flash import random_weights, tiny_hf_config

from ninfer.flash_next import FlashNext, FlashNextConfig
from ninfer.reference.weights import DictWeights, WeightError

F64 = np.float64


def _rms(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * (1.0 + w)


def _sig(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _rope(x: np.ndarray, pos: np.ndarray, rot: int, theta: float) -> np.ndarray:
    """NeoX rotation of dims 0..rot-1 of x[T, H, D] at positions pos[T] (pairs i, i + rot/2)."""
    half = rot // 2
    ang = pos[:, None].astype(F64) * theta ** (-np.arange(half) * 2.0 / rot)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    out[..., :half] = x[..., :half] * c - x[..., half:rot] * s
    out[..., half:rot] = x[..., half:rot] * c + x[..., :half] * s
    return out


class Oracle:
    def __init__(self, cfg: FlashNextConfig, w: dict[str, np.ndarray]) -> None:
        self.c, self.w = cfg, {k: v.astype(F64) for k, v in w.items()}

    def hc(self, h: np.ndarray, p: str, inject: bool) -> tuple[np.ndarray, np.ndarray | None]:
        c, w = self.c, self.w
        t, s, d = h.shape[0], c.hc_count, c.hidden_size
        xn = (
            _rms(h.reshape(t, s, d), None, c.rms_norm_eps) * (1 + w[p + "hc_norm.weight"].reshape(s, d))
        ).reshape(t, -1)
        r = xn @ w[p + "input_mix_weight_down.weight"].T / s
        g = _sig((r * _sig(r)) @ w[p + "input_mix_weight_up.weight"].T).reshape(t, s, d)
        bi = (g * xn.reshape(t, s, d)).mean(axis=1)
        inj = 2 * _sig(xn @ w[p + "block_inject_weight.weight"].T / s) if inject else None
        return bi, inj

    def select(self, qi: np.ndarray, raw: np.ndarray, pos: int, p: str) -> list[int]:
        c, ratio = self.c, self.c.indexer_compress_ratio
        nb = (pos + 1) // ratio
        if nb <= c.block_topk:
            return list(range(pos + 1))
        pooled = _rms(
            raw[: nb * ratio].reshape(nb, ratio, -1).mean(axis=1),
            self.w[p + "k_layernorm.weight"],
            c.rms_norm_eps,
        )
        keys = _rope(pooled[:, None, :], np.arange(nb) * ratio, c.rotary_dim, c.rope_theta)[:, 0]
        scores = np.maximum(keys @ qi.T, 0).sum(axis=1) / np.sqrt(c.indexer_head_dim)
        order = sorted(range(nb), key=lambda b: (-scores[b], b))[: c.block_topk]
        ranked = np.sort(scores)[::-1]
        assert abs(ranked[c.block_topk - 1] - ranked[c.block_topk]) > 1e-9, "near-tie at the top-k boundary"
        toks = [b * ratio + i for b in sorted(order) for i in range(ratio)]
        return toks + list(range(nb * ratio, pos + 1))

    def qsa(self, x: np.ndarray, p: str) -> np.ndarray:
        c, w, t = self.c, self.w, x.shape[0]
        hq, hkv, d, eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
        pos = np.arange(t)
        qg = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(t, hq, 2 * d)
        q = _rope(_rms(qg[..., :d], w[p + "self_attn.q_norm.weight"], eps), pos, c.rotary_dim, c.rope_theta)
        k = _rms(
            (x @ w[p + "self_attn.k_proj.weight"].T).reshape(t, hkv, d), w[p + "self_attn.k_norm.weight"], eps
        )
        k = _rope(k, pos, c.rotary_dim, c.rope_theta)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(t, hkv, d)
        ip, nh, dix = p + "self_attn.indexer.", c.indexer_n_heads, c.indexer_head_dim
        qk = x @ w[ip + "index_qk_proj.weight"].T
        qi = _rope(
            _rms(qk[:, : nh * dix].reshape(t, nh, dix), w[ip + "q_layernorm.weight"], eps),
            pos,
            c.rotary_dim,
            c.rope_theta,
        )
        out = np.zeros((t, hq, d))
        for i in range(t):
            sel = self.select(qi[i], qk[:, nh * dix :], i, ip)
            for h in range(hq):
                kk, vv = k[sel, h // c.kv_group], v[sel, h // c.kv_group]
                a = np.exp(kk @ q[i, h] / np.sqrt(d) - (kk @ q[i, h] / np.sqrt(d)).max())
                out[i, h] = (a / a.sum()) @ vv
        return (out.reshape(t, -1) * _sig(qg[..., d:].reshape(t, -1))) @ w[p + "self_attn.o_proj.weight"].T

    def moe(self, x: np.ndarray, p: str) -> np.ndarray:
        c, w = self.c, self.w
        z = x @ w[p + "mlp.gate.weight"].T
        pr = np.exp(z - z.max(axis=1, keepdims=True))
        pr /= pr.sum(axis=1, keepdims=True)
        y = np.zeros_like(x)
        inter = c.moe_intermediate_size
        for t in range(x.shape[0]):
            top = np.argsort(-pr[t], kind="stable")[: c.num_experts_per_tok]
            for e in top:
                gu = w[p + "mlp.experts.gate_up_proj"][e] @ x[t]
                act = gu[:inter] * _sig(gu[:inter]) * gu[inter:]
                y[t] += pr[t, e] / pr[t, top].sum() * (w[p + "mlp.experts.down_proj"][e] @ act)
        sp = p + "mlp.shared_expert."
        g, u = x @ w[sp + "gate_proj.weight"].T, x @ w[sp + "up_proj.weight"].T
        shared = (g * _sig(g) * u) @ w[sp + "down_proj.weight"].T
        return y + _sig(x @ w[p + "mlp.shared_expert_gate.weight"].T) * shared

    def mtp_logits(self, streams: np.ndarray, next_ids: np.ndarray) -> np.ndarray:
        c, w, t = self.c, self.w, streams.shape[0]
        s, d, eps = c.hc_count, c.hidden_size, c.rms_norm_eps
        rn = _rms(streams.astype(F64), w["mtp.pre_fc_norm_hidden.weight"], eps)  # one RMS over all S·D
        hid = rn.reshape(t, s, d) @ w["mtp.fc_hidden.weight"].T
        emb = _rms(w["embed_tokens.weight"][next_ids], w["mtp.pre_fc_norm_embedding.weight"], eps)
        h = (hid + (emb @ w["mtp.fc_embedding.weight"].T)[:, None, :]).reshape(t, -1)
        p = "mtp.layers.0."
        for block in ("attn", "mlp"):
            bi, inj = self.hc(h, f"{p}{block}_hyper_connection.", True)
            y = self.qsa(bi, p) if block == "attn" else self.moe(bi, p)
            h = h + (inj[:, :, None] * y[:, None, :]).reshape(t, -1)
        out, _ = self.hc(h, "mtp.hyper_connection_mixer.", False)
        return out @ w["lm_head.weight"].T


def test_mtp_matches_fp64_oracle() -> None:
    cfg = FlashNextConfig.from_hf(tiny_hf_config(budget=8, ratio=4, num_experts=8, top_k=3))
    weights = random_weights(cfg, seed=11, mtp=True)
    model = FlashNext(cfg, DictWeights(weights))
    ids = np.random.default_rng(5).integers(3, 256, 25)
    _, streams = model.forward_streams(ids[:-1], model.new_state())
    mtp_state = model.new_mtp_state()
    parts = [
        model.mtp_forward(streams[a:b], ids[a + 1 : b + 1], np.arange(a, b), mtp_state) for a, b in ((0, 10), (10, 11), (11, 24))
    ]  # fmt: skip
    got = np.concatenate(parts)
    want = Oracle(cfg, weights).mtp_logits(streams, ids[1:])
    assert mtp_state.length == 24 > cfg.dense_max_visible
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_mtp_errors() -> None:
    cfg = FlashNextConfig.from_hf(tiny_hf_config())
    model = FlashNext(cfg, DictWeights(random_weights(cfg, seed=1, mtp=False)))
    with pytest.raises(WeightError, match="no MTP head"):
        model.mtp_forward(np.zeros((1, cfg.hc_dim), np.float32), [5], None, model.new_mtp_state())
    full = FlashNext(cfg, DictWeights(random_weights(cfg, seed=1, mtp=True)))
    with pytest.raises(ValueError, match="positions"):
        full.mtp_forward(np.zeros((1, cfg.hc_dim), np.float32), [5], np.array([3]), full.new_mtp_state())
