"""MTP head (docs/model-math.md §6) vs an independent fp64 NumPy computation written here from the spec.

Nothing below the ``Qwen36`` call uses ``ninfer.reference``: norms, the interleaved q/gate split, interleaved
MRoPE, causal GQA, SwiGLU and the MoE router are re-derived in float64 with plain loops where that is clearer.
"""

from __future__ import annotations

import numpy as np
import pytest

from ninfer.config import ModelConfig
from ninfer.reference import DictWeights, Qwen36, WeightError, expected_shapes

EPS = 1e-6


def tiny_cfg(moe: bool) -> ModelConfig:
    common = dict(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=4,
        layer_types=("linear_attention",) * 3 + ("full_attention",),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        rope_theta=1e4,  # faster frequencies than 1e7 so that the position rows visibly matter
        partial_rotary_factor=0.25,
        mrope_section=(2, 1, 1),
        mtp_num_hidden_layers=1,
    )
    if moe:
        return ModelConfig(
            arch="qwen3_5_moe",
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=24,
            **common,
        )
    return ModelConfig(arch="qwen3_5", intermediate_size=96, **common)


def random_weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        scale = 0.3 if name.endswith("norm.weight") else 0.15
        out[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return out


# ---- fp64 reference from §2, §3, §5, §6 ---------------------------------------------------------------------
def norm_off(x, w):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * (1.0 + w)


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope(x, pos, cfg):
    """x[T,heads,D]; pos[3,T]. Pair i (i < rotary/2) rotates dims i and i+rotary/2 by pos[axis(i)]·θ^(−2i/rotary)."""
    r = cfg.rotary_dim
    half = r // 2
    out = x.copy()
    for i in range(half):
        if i % 3 == 1 and i < 3 * cfg.mrope_section[1]:
            axis = 1
        elif i % 3 == 2 and i < 3 * cfg.mrope_section[2]:
            axis = 2
        else:
            axis = 0
        ang = pos[axis] * cfg.rope_theta ** (-2.0 * i / r)
        c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
        out[:, :, i] = x[:, :, i] * c - x[:, :, i + half] * s
        out[:, :, i + half] = x[:, :, i + half] * c + x[:, :, i] * s
    return out


def gated_attention(h, w, p, cfg, pos):
    t, d, hq, hkv = h.shape[0], cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    qg = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, hq, 2 * d)
    q, gate = qg[:, :, :d], qg[:, :, d:]
    q = rope(norm_off(q, w[p + "self_attn.q_norm.weight"]), pos, cfg)
    k = rope(
        norm_off(
            (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, hkv, d), w[p + "self_attn.k_norm.weight"]
        ),
        pos,
        cfg,
    )
    v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, hkv, d)
    o = np.zeros((t, hq, d))
    for j in range(hq):
        kvh = j // (hq // hkv)
        for i in range(t):
            s = k[: i + 1, kvh] @ q[i, j] / np.sqrt(d)
            pr = np.exp(s - s.max())
            o[i, j] = (pr / pr.sum()) @ v[: i + 1, kvh]
    o = o / (1.0 + np.exp(-gate))
    return o.reshape(t, hq * d) @ w[p + "self_attn.o_proj.weight"].T


def swiglu(x, g, u, dn):
    return (silu(x @ g.T) * (x @ u.T)) @ dn.T


def ffn(h, w, p, cfg):
    p += "mlp."
    if not cfg.is_moe:
        return swiglu(h, w[p + "gate_proj.weight"], w[p + "up_proj.weight"], w[p + "down_proj.weight"])
    inter = cfg.moe_intermediate_size
    y = np.zeros_like(h)
    for t in range(h.shape[0]):
        z = w[p + "gate.weight"] @ h[t]
        prob = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        top = sorted(range(len(prob)), key=lambda e: (-prob[e], e))[: cfg.num_experts_per_tok]
        for e in top:
            gu = w[p + "experts.gate_up_proj"][e]
            y[t] += (
                prob[e]
                / prob[top].sum()
                * swiglu(h[t : t + 1], gu[:inter], gu[inter:], w[p + "experts.down_proj"][e])[0]
            )
    shared = swiglu(
        h,
        w[p + "shared_expert.gate_proj.weight"],
        w[p + "shared_expert.up_proj.weight"],
        w[p + "shared_expert.down_proj.weight"],
    )
    return y + shared / (1.0 + np.exp(-(h @ w[p + "shared_expert_gate.weight"].T)))


def mtp_reference(w, cfg, hidden, next_ids, pos):
    w = {k: v.astype(np.float64) for k, v in w.items()}
    e = norm_off(w["embed_tokens.weight"][next_ids], w["mtp.pre_fc_norm_embedding.weight"])
    hn = norm_off(hidden.astype(np.float64), w["mtp.pre_fc_norm_hidden.weight"])
    u = np.concatenate([e, hn], axis=-1) @ w["mtp.fc.weight"].T
    p = "mtp.layers.0."
    u = u + gated_attention(norm_off(u, w[p + "input_layernorm.weight"]), w, p, cfg, pos)
    u = u + ffn(norm_off(u, w[p + "post_attention_layernorm.weight"]), w, p, cfg)
    return norm_off(u, w["mtp.norm.weight"]) @ w["lm_head.weight"].T


def rel_err(x, ref):
    return float(np.abs(x - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_mtp_forward_matches_fp64_spec(moe):
    cfg = tiny_cfg(moe)
    w = random_weights(cfg, seed=11 + moe)
    model = Qwen36(cfg, DictWeights(w))
    rng = np.random.default_rng(5)
    t = 21
    hidden = rng.standard_normal((t, cfg.hidden_size)).astype(np.float32)
    next_ids = rng.integers(0, cfg.vocab_size, t)
    text = np.broadcast_to(np.arange(t), (3, t))
    ref = mtp_reference(w, cfg, hidden, next_ids, text)

    state = model.new_mtp_state()
    got = model.mtp_forward(hidden, next_ids, None, state)
    assert got.shape == (t, cfg.vocab_size) and got.dtype == np.float32
    assert state.length == t
    assert rel_err(got, ref) <= 1e-4

    # in pieces (prefill, a 1-token step, the rest): the head's own KV cache carries the context
    state, parts = model.new_mtp_state(), []
    for a, b in [(0, 9), (9, 10), (10, t)]:
        parts.append(model.mtp_forward(hidden[a:b], next_ids[a:b], None, state))
    assert rel_err(np.concatenate(parts), ref) <= 1e-4

    # the hidden feeds back for further drafts; lm_head of it is the logits
    d = model.mtp_hidden(hidden, next_ids, None, model.new_mtp_state())
    assert np.array_equal(model.lm_head(d), got)


def test_mtp_positions_are_used():
    cfg = tiny_cfg(moe=False)
    w = random_weights(cfg, seed=3)
    model = Qwen36(cfg, DictWeights(w))
    rng = np.random.default_rng(9)
    t = 16
    hidden = rng.standard_normal((t, cfg.hidden_size)).astype(np.float32)
    next_ids = rng.integers(0, cfg.vocab_size, t)
    pos = np.stack([np.arange(t) + 4, 3 * np.arange(t), 7 * np.arange(t) + 1]).astype(np.int64)
    ref = mtp_reference(w, cfg, hidden, next_ids, pos)
    got = model.mtp_forward(hidden, next_ids, pos, model.new_mtp_state())
    assert rel_err(got, ref) <= 1e-4
    text = mtp_reference(w, cfg, hidden, next_ids, np.broadcast_to(np.arange(t), (3, t)))
    assert rel_err(text, ref) > 1e-2


def test_mtp_weights_missing_is_a_clear_error():
    cfg = tiny_cfg(moe=False)
    w = {k: v for k, v in random_weights(cfg, seed=1).items() if not k.startswith("mtp.")}
    model = Qwen36(cfg, DictWeights(w))
    assert not model.has_mtp
    with pytest.raises(WeightError, match=r"mtp\..*missing"):
        model.mtp_forward(np.zeros((1, cfg.hidden_size), np.float32), [1], None, model.new_mtp_state())
