"""Unit tests of the Flash-Next ops against direct fp64 formulas (docs/flash-next.md §3, §4, §6, §7)."""

from __future__ import annotations

import numpy as np

from ninfer.flash_next import ops as fops
from ninfer.flash_next.ops_ngram import ngram_context_after, ngram_row_ids, ngram_shifted_ids, splitmix64

RNG = np.random.default_rng(7)


def _rms1(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1 + w)


def _sig(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def test_hc_mix_and_combine_match_formula() -> None:
    t, s, d, r = 3, 4, 8, 5
    h = RNG.normal(size=(t, s * d)).astype(np.float32)
    nw, wd, wu, wi = (
        RNG.normal(0, 0.3, shp).astype(np.float32) for shp in ((s * d,), (r, s * d), (s * d, r), (s, s * d))
    )
    bi, inj = fops.hc_mix(h, nw, wd, wu, wi, s, 1e-6)
    h64 = h.astype(np.float64)
    xn = np.concatenate(
        [_rms1(h64[:, i * d : (i + 1) * d], nw[i * d : (i + 1) * d]) for i in range(s)], axis=1
    )
    rr = xn @ wd.T / s
    g = _sig((rr * _sig(rr)) @ wu.T).reshape(t, s, d)
    want = (g * xn.reshape(t, s, d)).sum(axis=1) / s
    want_inj = 2 * _sig(xn @ wi.T / s)
    np.testing.assert_allclose(bi, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inj, want_inj, rtol=1e-5, atol=1e-6)
    y = RNG.normal(size=(t, d)).astype(np.float32)
    out = fops.hc_combine(h, y, inj)
    for i in range(s):  # stream i gets inj_i · y, nothing from other streams
        np.testing.assert_allclose(
            out[:, i * d : (i + 1) * d], h[:, i * d : (i + 1) * d] + inj[:, i : i + 1] * y, rtol=1e-6
        )


def test_select_blocks_ties_go_to_lowest_index() -> None:
    scores = np.array([0.0, 2.0, 0.0, 0.0, 1.0, 2.0], np.float32)
    assert fops.qsa_select_blocks(scores, 2).tolist() == [1, 5]
    assert fops.qsa_select_blocks(scores, 4).tolist() == [0, 1, 4, 5]  # zero-score tie: block 0 before 2, 3
    assert fops.qsa_select_blocks(scores, 10).tolist() == list(range(6))


def test_token_set_has_blocks_and_open_tail() -> None:
    assert fops.qsa_token_set(13, np.array([0, 2]), 4).tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 12, 13]
    # (p+1) multiple of 4: no tail, the current token's own block competes in the top-k like any other
    assert fops.qsa_token_set(11, np.array([2]), 4).tolist() == [8, 9, 10, 11]


def test_block_scores_relu_sum() -> None:
    q = RNG.normal(size=(4, 16)).astype(np.float32)
    keys = RNG.normal(size=(7, 16)).astype(np.float32)
    want = np.maximum(keys.astype(np.float64) @ q.T, 0).sum(axis=1) / 4.0
    np.testing.assert_allclose(fops.qsa_block_scores(q, keys), want, rtol=1e-5)


def test_sparse_attention_over_all_rows_is_causal_dense() -> None:
    from ninfer.reference.ops import attention, sigmoid_gate

    t, hq, hkv, d = 5, 4, 2, 8
    q, gate = (RNG.normal(size=(t, hq, d)).astype(np.float32) for _ in range(2))
    k, v = (RNG.normal(size=(t, hkv, d)).astype(np.float32) for _ in range(2))
    out = fops.sparse_gated_attention(q, k, v, [np.arange(i + 1) for i in range(t)], gate)
    want = sigmoid_gate(attention(q, k, v, 0), gate).reshape(t, -1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_dilated_conv_chunks_equal_whole() -> None:
    c, taps, dil = 6, 4, 3
    x = RNG.normal(size=(20, c)).astype(np.float32)
    w = RNG.normal(size=(c, taps)).astype(np.float32)
    y_all, st_all = fops.dilated_conv_silu(x, np.zeros((9, c), np.float32), w, dil)
    xp = np.concatenate([np.zeros((9, c)), x.astype(np.float64)])
    pre = sum(xp[9 - (taps - 1 - j) * dil : 9 - (taps - 1 - j) * dil + 20] * w[:, j] for j in range(taps))
    np.testing.assert_allclose(y_all, pre * _sig(pre), rtol=1e-5, atol=1e-6)
    st, parts = np.zeros((9, c), np.float32), []
    for a, b in ((0, 1), (1, 8), (8, 20)):
        y, st = fops.dilated_conv_silu(x[a:b], st, w, dil)
        parts.append(y)
    np.testing.assert_allclose(np.concatenate(parts), y_all, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(st, st_all)


def test_ple_gate_sign_sqrt() -> None:
    t, s, d, dp = 2, 4, 8, 16
    e = RNG.normal(size=(t, dp)).astype(np.float32)
    h = RNG.normal(size=(t, s * d)).astype(np.float32)
    kp, vp = (
        RNG.normal(0, 0.3, (s * d, dp)).astype(np.float32),
        RNG.normal(0, 0.3, (d, dp)).astype(np.float32),
    )
    nk, nq = RNG.normal(0, 0.3, s * d).astype(np.float32), RNG.normal(0, 0.3, s * d).astype(np.float32)
    u = fops.ple_gate(e, h, kp, vp, nk, nq, s, 1e-6)
    kk = fops.rmsnorm_offset_grouped(e @ kp.T, nk, d, 1e-6).reshape(t, s, d).astype(np.float64)
    qq = fops.rmsnorm_offset_grouped(h, nq, d, 1e-6).reshape(t, s, d).astype(np.float64)
    sc = (kk * qq).sum(-1) / np.sqrt(d)
    gate = np.sign(sc) * np.sqrt(np.maximum(np.abs(sc), 1e-6))
    want = _sig(gate)[:, :, None] * (e.astype(np.float64) @ vp.T)[:, None, :]
    np.testing.assert_allclose(u, want.reshape(t, -1), rtol=1e-5, atol=1e-6)


def test_router_softmax_topk_renormalised() -> None:
    logits = np.array([[1.0, 3.0, 3.0, 0.5, 2.0]], np.float32)
    idx, w = fops.moe_route_ext(logits, 3, True)
    assert idx.tolist() == [[1, 2, 4]]  # tie between 1 and 2 -> lower id first
    p = np.exp(logits[0, [1, 2, 4]] - 3.0)
    np.testing.assert_allclose(w[0], p / p.sum(), rtol=1e-6)
    _, w_raw = fops.moe_route_ext(logits, 3, False)
    assert w_raw.sum() < 1.0


def test_ngram_shift_stops_at_eos() -> None:
    eos = 2
    sh = ngram_shifted_ids(np.array([eos, eos]), np.array([5, 6, 7, eos, 8, 9]), eos, 3)
    assert sh[0].tolist() == [5, 6, 7, 2, 8, 9]
    assert sh[1].tolist() == [2, 5, 6, 7, 2, 8]  # the EOS itself is a valid t1 (its value is the pad id)
    assert sh[2].tolist() == [2, 2, 5, 6, 2, 2]  # never across an EOS
    # a continuation sees the same ids as one pass
    ctx = ngram_context_after(np.array([eos, eos]), np.array([5, 6, 7]))
    assert ctx.tolist() == [6, 7]
    assert np.array_equal(ngram_shifted_ids(ctx, np.array([eos, 8, 9]), eos, 3), sh[:, 3:])
    assert ngram_context_after(np.array([eos, eos]), np.array([5])).tolist() == [eos, 5]


def test_ngram_rows_formula() -> None:
    sh = np.array([[7, 9], [3, 2], [2, 2]], np.int64)
    mult = np.array([11, 13, 17], np.int64)
    sizes, offs = np.array([101, 103, 107, 109]), np.array([0, 101, 204, 311])
    rows = ngram_row_ids(sh, mult, sizes, offs, 2)
    big0 = (7 * 11) ^ (3 * 13)
    tri0 = big0 ^ (2 * 17)
    assert rows[0].tolist() == [big0 % 101, big0 % 103 + 101, tri0 % 107 + 204, tri0 % 109 + 311]
    assert splitmix64(0) == 0xE220A8397B1DCDAF  # reference value of the standard splitmix64 step
