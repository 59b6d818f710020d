"""ninfer.reference.ops vs straightforward independent formulations (fp64 loops written from the spec)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ninfer.config import ModelConfig
from ninfer.reference import ContiguousKV, DictWeights, Qwen36, WeightError, expected_shapes, ops

RNG = np.random.default_rng


def f32(*shape, seed=0, scale=1.0):
    return (RNG(seed).standard_normal(shape) * scale).astype(np.float32)


def rel(x, ref):
    return float(np.abs(np.asarray(x, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


# ---- Gated DeltaNet ---------------------------------------------------------------------------------------
def gdn_naive(q, k, v, g, beta, s0):
    """§4.5 per head and token in fp64: S ← e^g S; δ = β(v − Sᵀk); S ← S + kδᵀ; o = Sᵀq/√dk; V head j → QK j//r."""
    t, hk, dk = q.shape
    hv = v.shape[1]
    s = s0.astype(np.float64).copy()
    o = np.zeros(v.shape)
    for j in range(hv):
        qk = j // (hv // hk)
        for i in range(t):
            s[j] *= np.exp(g[i, j])
            delta = beta[i, j] * (v[i, j] - s[j].T @ k[i, qk])
            s[j] += np.outer(k[i, qk], delta)
            o[i, j] = s[j].T @ q[i, qk] / np.sqrt(dk)
    return o, s


def gdn_inputs(t, hk, hv, dk=16, dv=8, seed=0, strong_decay=False):
    rng = RNG(seed)
    q = ops.l2norm(rng.standard_normal((t, hk, dk)).astype(np.float32))
    k = ops.l2norm(rng.standard_normal((t, hk, dk)).astype(np.float32))
    v = rng.standard_normal((t, hv, dv)).astype(np.float32)
    a, b = rng.standard_normal((t, hv)).astype(np.float32), rng.standard_normal((t, hv)).astype(np.float32)
    a_log = np.log(rng.uniform(0.5, 40.0 if strong_decay else 4.0, hv)).astype(np.float32)
    beta, g = ops.gdn_gates(a, b, a_log, rng.standard_normal(hv).astype(np.float32))
    s0 = (rng.standard_normal((hv, dk, dv)) * 0.5).astype(np.float32)
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("t", [1, 2, 63, 64, 65, 150])
@pytest.mark.parametrize("hk,hv", [(2, 2), (2, 4), (1, 3)])
def test_gdn_chunked_and_recurrent_match_naive(t, hk, hv):
    q, k, v, g, beta, s0 = gdn_inputs(t, hk, hv, seed=t + hv)
    o_ref, s_ref = gdn_naive(q, k, v, g, beta, s0)
    for fn in (ops.gdn_chunked, ops.gdn_recurrent):
        o, s = fn(q, k, v, g, beta, s0)
        assert o.dtype == np.float32 and s.dtype == np.float32
        assert rel(o, o_ref) < 2e-5 and rel(s, s_ref) < 2e-5, fn.__name__


def test_gdn_chunked_strong_decay_has_no_overflow():
    """Cumulative log-decay far below −88 inside one chunk: masking before exp keeps every exponent ≤ 0."""
    q, k, v, g, beta, s0 = gdn_inputs(130, 2, 2, seed=4, strong_decay=True)
    assert np.cumsum(g[:64], axis=0).min() < -200
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o, s = ops.gdn_chunked(q, k, v, g, beta, s0)
    o_ref, s_ref = gdn_naive(q, k, v, g, beta, s0)
    assert np.isfinite(o).all() and rel(o, o_ref) < 2e-5 and rel(s, s_ref) < 2e-5


def test_gdn_chunked_state_carries_across_calls():
    q, k, v, g, beta, s0 = gdn_inputs(140, 2, 4, seed=9)
    o_all, s_all = ops.gdn_chunked(q, k, v, g, beta, s0)
    o1, s1 = ops.gdn_chunked(q[:70], k[:70], v[:70], g[:70], beta[:70], s0)
    o2, s2 = ops.gdn_chunked(q[70:], k[70:], v[70:], g[70:], beta[70:], s1)
    assert rel(np.concatenate([o1, o2]), o_all) < 1e-5 and rel(s2, s_all) < 1e-5


def test_gdn_chunked_scratch_hook():
    """``scratch`` (perf/fidelity_prefill.py's narrower-scratch experiment) sees the state pass's inputs only:
    the identity keeps every bit, a bf16 rounding moves the result by about bf16's precision, not more."""
    from ninfer.formats import bf16_round

    q, k, v, g, beta, s0 = gdn_inputs(150, 2, 4, seed=5)
    o, s = ops.gdn_chunked(q, k, v, g, beta, s0)
    seen = []
    o_id, s_id = ops.gdn_chunked(q, k, v, g, beta, s0, scratch=lambda x: seen.append(x.shape) or x)
    assert np.array_equal(o, o_id) and np.array_equal(s, s_id)
    assert len(seen) == 4 * 3  # q, k, W, A of each of the 3 chunks
    o_b, s_b = ops.gdn_chunked(q, k, v, g, beta, s0, scratch=bf16_round)
    assert 1e-5 < rel(o_b, o) < 1e-2 and 1e-5 < rel(s_b, s) < 1e-2


def test_fidelity_candidates_parse():
    from perf.fidelity_prefill import _rounded

    with pytest.raises(ValueError, match="unknown rounding"):
        with _rounded("fp16-row+gdn-fp8"):
            pass
    chunked, attention = ops.gdn_chunked, ops.attention
    with _rounded("exact+p-bf16+gdn-bf16"):
        assert ops.gdn_chunked is not chunked and ops.attention is not attention
    assert ops.gdn_chunked is chunked and ops.attention is attention


def test_solve_unit_lower():
    rng = RNG(2)
    lower = np.tril(rng.standard_normal((3, 10, 10)), -1).astype(np.float32) * 0.3
    rhs = rng.standard_normal((3, 10, 5)).astype(np.float32)
    x = ops.solve_unit_lower(lower, rhs)
    assert rel(np.eye(10) @ x + lower.astype(np.float64) @ x, rhs) < 1e-5


def test_gdn_gates_softplus_threshold():
    a = np.array([[-30.0, 0.0, 19.0, 25.0, 80.0]], np.float32)
    beta, g = ops.gdn_gates(a, a, np.zeros(5, np.float32), np.zeros(5, np.float32))
    sp = np.where(a > 20, a, np.log1p(np.exp(np.minimum(a, 20.0).astype(np.float64))))
    assert rel(g, -sp) < 1e-6
    assert rel(beta, 1 / (1 + np.exp(-a.astype(np.float64)))) < 1e-6


def conv_naive(x, w, history):
    """y_t[c] = Σ_j w[c,j] x_{t−K+1+j}[c] over the stream history ++ x (history = the previous raw inputs)."""
    full = np.concatenate([history, x]).astype(np.float64)
    kk, n0 = w.shape[1], history.shape[0]
    return np.stack(
        [[w[c] @ full[n0 + t - kk + 1 : n0 + t + 1, c] for c in range(x.shape[1])] for t in range(len(x))]
    )


def test_conv_matches_naive_and_carries_state_across_splits():
    c, kk, t = 6, 4, 20
    x, w = f32(t, c, seed=1), f32(c, kk, seed=2)
    ref = conv_naive(x, w, np.zeros((kk - 1, c)))
    y, st = ops.conv1d_causal(x, np.zeros((c, kk - 1), np.float32), w)
    assert rel(y, ref) < 1e-6
    assert np.array_equal(st, x[-(kk - 1) :].T)  # the state is the last K−1 raw inputs, oldest first
    for cuts in [(1, 2, 3, 14), (7, 13), (2, 1, 1, 16)]:
        state, parts, at = np.zeros((c, kk - 1), np.float32), [], 0
        for n in cuts:
            out, state = ops.conv1d_causal(x[at : at + n], state, w)
            parts.append(out)
            at += n
        assert rel(np.concatenate(parts), ref) < 1e-6 and np.array_equal(state, st)


def test_l2norm_and_gated_norm():
    x, z, w = f32(5, 3, 16, seed=1), f32(5, 3, 16, seed=2), f32(16, seed=3)
    x64 = x.astype(np.float64)
    assert rel(ops.l2norm(x), x64 / np.sqrt((x64**2).sum(-1, keepdims=True) + 1e-6)) < 1e-6
    ref = (
        x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * w * (z / (1 + np.exp(-z.astype(np.float64))))
    )
    assert rel(ops.gated_rmsnorm(x, w, z, 1e-6), ref) < 1e-6  # plain w, no +1


# ---- norms, linear, attention ---------------------------------------------------------------------------
def test_rmsnorm_offset_uses_one_plus_w():
    x, w = f32(4, 64, seed=1), f32(64, seed=2)
    x64 = x.astype(np.float64)
    plain = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6)
    assert rel(ops.rmsnorm_plain(x, 1e-6), plain) < 1e-6
    assert rel(ops.rmsnorm_offset(x, w, 1e-6), plain * (1 + w)) < 1e-6


def test_linear_rows_are_batch_independent():
    x, w = f32(13, 64, seed=1), f32(96, 64, seed=2)
    full = ops.linear(x, w)
    assert rel(full, x.astype(np.float64) @ w.T.astype(np.float64)) < 1e-5
    for i in range(13):
        assert np.array_equal(ops.linear(x[i : i + 1], w)[0], full[i])
    assert np.array_equal(ops.linear(x[3:9], w), full[3:9])


def test_split_q_gate_is_per_head_interleaved():
    hq, d = 3, 4
    qg = np.arange(2 * hq * d, dtype=np.float32)[None]
    q, gate = ops.split_q_gate(qg, hq, d)
    for j in range(hq):
        assert np.array_equal(q[0, j], qg[0, 2 * d * j : 2 * d * j + d])
        assert np.array_equal(gate[0, j], qg[0, 2 * d * j + d : 2 * d * (j + 1)])


def test_mrope_axis_pattern_of_the_real_models():
    axes = ops.mrope_axes(32, (11, 11, 10), interleaved=True)
    assert set(np.nonzero(axes == 0)[0]) == set(range(0, 31, 3))
    assert set(np.nonzero(axes == 1)[0]) == set(range(1, 32, 3))
    assert set(np.nonzero(axes == 2)[0]) == set(range(2, 30, 3))
    contiguous = ops.mrope_axes(32, (11, 11, 10), interleaved=False)
    assert list(contiguous) == [0] * 11 + [1] * 11 + [2] * 10


def test_rope_rotates_pairs_by_their_axis_position():
    rot, d, t, theta, section = 16, 24, 5, 1e4, (3, 3, 2)
    pos = np.stack([np.arange(t), 10 + 2 * np.arange(t), 100 + np.arange(t) * 7])
    x = f32(t, 2, d, seed=4)
    cos, sin = ops.rope_cos_sin(pos, rot, theta, section)
    out = ops.apply_rope(x, cos, sin)
    half = rot // 2
    for i in range(half):
        axis = 1 if (i % 3 == 1 and i < 9) else 2 if (i % 3 == 2 and i < 6) else 0
        ang = pos[axis] * theta ** (-2.0 * i / rot)
        z = (x[..., i] + 1j * x[..., i + half]) * np.exp(1j * ang)[
            :, None
        ]  # NeoX pair (i, i+half) as complex
        assert rel(out[..., i], z.real) < 1e-5 and rel(out[..., i + half], z.imag) < 1e-5
    assert np.array_equal(out[..., rot:], x[..., rot:])  # dims beyond the rotary part pass through
    text = ops.rope_cos_sin(np.broadcast_to(np.arange(t), (3, t)), rot, theta, section)
    plain = ops.rope_cos_sin(np.arange(t)[None].repeat(3, 0), rot, theta, (half, 0, 0))
    assert np.array_equal(text[0], plain[0])  # text positions: ordinary partial RoPE


def test_attention_matches_naive_gqa_with_cache_offset():
    hq, hkv, d, start, t = 6, 2, 8, 5, 4
    q, k, v = f32(t, hq, d, seed=1), f32(start + t + 3, hkv, d, seed=2), f32(start + t + 3, hkv, d, seed=3)
    out = ops.attention(q, k, v, start)
    for i in range(t):
        for j in range(hq):
            kv = j // (hq // hkv)
            s = k[: start + i + 1, kv].astype(np.float64) @ q[i, j] / np.sqrt(d)
            p = np.exp(s - s.max())
            assert rel(out[i, j], (p / p.sum()) @ v[: start + i + 1, kv]) < 1e-5


def test_sigmoid_and_silu_do_not_overflow():
    x = np.array([-1000.0, -90.0, 0.0, 90.0, 1000.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = ops.sigmoid(x)
        ops.silu(x)
    assert list(s) == [0.0, pytest.approx(0.0, abs=1e-38), 0.5, 1.0, 1.0]


# ---- MoE --------------------------------------------------------------------------------------------------
def test_router_ties_go_to_lower_id_and_weights_renormalise():
    logits = np.array(
        [[1.0, 3.0, 3.0, 0.5, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0], [0.0, -1.0, 5.0, 5.0, 4.0]], np.float32
    )
    idx, w = ops.moe_route(logits, 2)
    assert idx.tolist() == [[1, 2], [0, 1], [2, 3]]
    for row in range(3):
        p = np.exp(logits[row] - logits[row].max())
        p /= p.sum()
        assert rel(w[row], p[idx[row]] / p[idx[row]].sum()) < 1e-6


def test_moe_experts_and_shared_expert_match_loops():
    t, h, e, inter, k = 7, 16, 5, 6, 2
    x = f32(t, h, seed=1)
    gate_up, down = f32(e, 2 * inter, h, seed=2), f32(e, h, inter, seed=3)
    idx, w = ops.moe_route(f32(t, e, seed=4), k)
    got = ops.moe_experts(x, idx, w, gate_up, down)
    x64 = x.astype(np.float64)
    for i in range(t):
        ref = np.zeros(h)
        for slot in range(k):
            g, u = gate_up[idx[i, slot], :inter] @ x64[i], gate_up[idx[i, slot], inter:] @ x64[i]
            ref += w[i, slot] * (down[idx[i, slot]] @ (g / (1 + np.exp(-g)) * u))
        assert rel(got[i], ref) < 1e-5
    wg, wu, wd, ws = f32(6, h, seed=5), f32(6, h, seed=6), f32(h, 6, seed=7), f32(1, h, seed=8)
    g, u = x64 @ wg.T, x64 @ wu.T
    ref = (1 / (1 + np.exp(-(x64 @ ws.T)))) * ((g / (1 + np.exp(-g)) * u) @ wd.T)
    assert rel(ops.shared_expert(x, wg, wu, wd, ws), ref) < 1e-5


# ---- errors, weights, KV --------------------------------------------------------------------------------
def tiny_cfg() -> ModelConfig:
    return ModelConfig(
        arch="qwen3_5",
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=4,
        layer_types=("linear_attention",) * 3 + ("full_attention",),
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=4,
        linear_value_head_dim=4,
        intermediate_size=24,
        mrope_section=(1, 0, 0),
    )


def test_embedding_rejects_out_of_range_ids():
    with pytest.raises(ValueError, match=r"token id 40 is outside the vocabulary \[0, 32\)"):
        ops.embedding(np.zeros((32, 4), np.float32), np.array([1, 40]))


def test_weight_errors_name_the_tensor():
    cfg = tiny_cfg()
    w = {n: np.zeros(s, np.float32) for n, s in expected_shapes(cfg).items()}
    del w["layers.2.linear_attn.A_log"]
    with pytest.raises(WeightError, match=r"layers\.2\.linear_attn\.A_log: missing"):
        Qwen36(cfg, DictWeights(w))
    w["layers.2.linear_attn.A_log"] = np.zeros(3, np.float32)
    model = Qwen36(cfg, DictWeights(w))
    with pytest.raises(WeightError, match=r"layers\.2\.linear_attn\.A_log: shape \[3\] .* expected \[2\]"):
        model.forward([1, 2], model.new_state())
    with pytest.raises(ValueError, match="token_ids"):
        model.forward([], model.new_state())
    with pytest.raises(ValueError, match=r"positions: expected integer \[3,2\]"):
        model.forward([1, 2], model.new_state(), positions=np.zeros((2, 2), np.int64))


def test_contiguous_kv_grows_and_refuses_gaps():
    kv = ContiguousKV(2, 1, 4, capacity=2)
    a = f32(5, 1, 4, seed=1)
    kv.write(1, 0, a[:3], a[:3] * 2)
    kv.write(1, 3, a[3:], a[3:] * 2)
    k, v = kv.read(1, 5)
    assert np.array_equal(k, a) and np.array_equal(v, 2 * a)
    with pytest.raises(ValueError, match="gap"):
        kv.write(0, 1, a[:1], a[:1])
    with pytest.raises(ValueError, match="holds only 5"):
        kv.read(1, 6)
    with pytest.raises(IndexError, match="attn_idx 2"):
        kv.read(2, 1)
