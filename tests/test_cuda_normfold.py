"""Norm folding on the GPU (docs/cuda.md, "Norm folding"): the residual add + RMS norm between two GEMVs folded into
them (gemv.cu: the producer's residual epilogue and partial sums of squares, the consumer's ``GV_NORM`` staging).

- per GEMV pair: folded against the unfolded path (GEMV, ``rmsnorm(residual=...)``, GEMV): the residual bitwise, the
  consumer's product within fp32 accumulation order; the folded rows bitwise the same with 1 and with 8 lanes and,
  where the dense and expert plans split K alike, through the expert-slot consumer (``gemv_experts``);
- per network (small dense and MoE models): folded vs unfolded logits within fp32 noise; with folding on, graph
  decode bitwise eager decode, greedy tokens identical at 1 and 8 lanes, exact prefill (``prefill_gemm=False``)
  bitwise decode; and the standalone norm launches a decode step keeps (dense: layer 0's input norm and the final
  norm; MoE: those plus the ``moe_combine_rmsnorm`` of every layer).

Run: ``python -m pytest -m gpu tests/test_cuda_normfold.py`` (skips without a CUDA device).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cuda_decode import greedy

from ninfer.config import ModelConfig
from ninfer.demo import random_weights
from ninfer.formats import FORMATS
from ninfer.reference import DictWeights, ops

pytestmark = pytest.mark.gpu

F32 = np.float32
NVFP4 = "NVFP4G16_E4M3S"


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _weight(rng: np.random.Generator, fmt: str, shape: tuple[int, int]) -> tuple[Any, np.ndarray]:
    from ninfer.cuda.weights import upload_weight

    codec = FORMATS[fmt]
    buf = codec.encode((rng.standard_normal(shape) * 0.5).astype(F32), shape)
    return upload_weight(fmt, shape, buf), codec.decode(buf, shape)


def _err(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(got).all(), "non-finite values"
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))


# producer fmt, consumer fmt, hidden N, producer K, consumer N2, rows: the 27B's hidden size (NVFP4, K-split
# producers and consumers), a BF16 producer of one split (64-row blocks, the last partial), 20 rows (exact prefill),
# a consumer wide enough (106 row blocks x 4 splits, a wave) that its dense and expert launches split K alike
PAIRS = [
    (NVFP4, NVFP4, 5120, 6144, 4096, 1),
    (NVFP4, NVFP4, 5120, 8704, 2048, 8),
    ("BF16", "FP8E4M3_F32ROW", 1000, 768, 520, 3),
    (NVFP4, "Q4G64_F16S", 2048, 1024, 1024, 20),
    (NVFP4, NVFP4, 2048, 1024, 13568, 2),
]


@pytest.mark.parametrize("case", PAIRS, ids=lambda c: f"{c[0][:5]}-{c[1][:5]}-n{c[2]}-k{c[3]}-r{c[5]}")
@pytest.mark.parametrize("offset", [True, False])
def test_fold_pair_matches_unfolded(cp: Any, case: tuple, offset: bool) -> None:
    from ninfer.cuda.gemv_experts import gemv_experts
    from ninfer.cuda.linear import gemv, gemv_plan
    from ninfer.cuda.norm import Normed, rmsnorm

    f1, f2, n, k, n2, rows = case
    rng = np.random.default_rng(n + k + rows)
    w1, _ = _weight(rng, f1, (n, k))
    w2, wd2 = _weight(rng, f2, (n2, n))
    x = cp.asarray((rng.standard_normal((rows, k)) * 0.3).astype(F32))
    res0 = cp.asarray((rng.standard_normal((rows, n)) * 2).astype(F32))
    nw = cp.asarray((rng.standard_normal(n) * 0.2).astype(F32))
    eps = 1e-6
    # unfolded: the product, the standalone residual add + norm, the consumer
    ra = res0.copy()
    h = rmsnorm(gemv(x, w1), nw, eps, offset=offset, residual=ra)
    want = cp.asnumpy(gemv(h, w2))
    # folded
    rb = res0.copy()
    part = cp.full((gemv_plan(f1, n, k).blocks_x, rows), np.nan, dtype=F32)
    gemv(x, w1, rb, fold=part)
    assert cp.array_equal(ra, rb), "the folded residual differs from rmsnorm's"
    r = cp.asnumpy(rb).astype(np.float64)
    assert np.allclose(cp.asnumpy(part).sum(axis=0), (r * r).sum(axis=1), rtol=1e-5), (
        "partial sums of squares"
    )
    got = cp.asnumpy(gemv(Normed(rb, part, nw, eps, offset), w2))
    assert _err(got, want) <= 2e-5, f"folded vs unfolded consumer: {_err(got, want):.3e}"
    hn = cp.asnumpy(h).astype(np.float64)
    assert _err(got, ops.linear(hn.astype(F32), wd2)) <= 2e-5, "folded consumer vs the reference"
    # a row's bits do not depend on the other rows (each row alone: the 1-lane instance), nor on expert slots
    for i in {0, rows - 1}:
        rr = res0[i : i + 1].copy()
        pp = cp.empty((part.shape[0], 1), dtype=F32)
        gemv(x[i : i + 1], w1, rr, fold=pp)
        assert cp.array_equal(rr, rb[i : i + 1]) and cp.array_equal(pp[:, 0], part[:, i]), (
            f"row {i}: producer"
        )
        one = cp.asnumpy(gemv(Normed(rr, pp, nw, eps, offset), w2))
        assert np.array_equal(one[0], got[i]), f"row {i}: the consumer depends on the other rows"
    # an expert slot of the same weight consumes the folded norm too; it gives the dense consumer's bits where
    # both launches split K alike (gemv_geometry._GV_DENSE_MIN_TILES may give dense launches more splits)
    xrow = cp.asarray(np.ascontiguousarray(np.arange(rows, dtype=np.int32)[::-1]))
    ids = cp.zeros(rows, dtype=np.int32)
    ex = cp.asnumpy(gemv_experts(Normed(rb, part, nw, eps, offset), w2, ids, xrow, n2))[::-1]
    if gemv_plan(f2, n2, n, dense=True) == gemv_plan(f2, n2, n):
        assert np.array_equal(ex, got), "the expert-slot consumer differs from the dense one"
    assert _err(ex, want) <= 2e-5, f"expert-slot consumer vs unfolded: {_err(ex, want):.3e}"


# ---- networks ------------------------------------------------------------------------------------------------------
def _config(kind: str) -> ModelConfig:
    base = dict(
        vocab_size=2048, hidden_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
        linear_value_head_dim=128, partial_rotary_factor=0.25, mrope_section=(6, 5, 5),
        layer_types=("linear_attention", "linear_attention", "linear_attention", "full_attention"),
    )  # fmt: skip
    if kind == "dense":
        return ModelConfig(arch="qwen3_5", intermediate_size=1408, **base)
    return ModelConfig(
        arch="qwen3_5_moe", num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256,
        shared_expert_intermediate_size=512, **base,
    )  # fmt: skip


def _net(kind: str, **opts: Any) -> Any:
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences
    from ninfer.cuda.upload import encode_weights, upload_encoded

    cfg = _config(kind)
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=3)), NVFP4)
    net = CudaQwen36(cfg, upload_encoded(cfg, enc), **opts)
    return Sequences(net, slots=9, context=512, page_size=16)


@pytest.fixture(scope="module", params=["dense", "moe"])
def seqs(request: pytest.FixtureRequest) -> Any:
    pytest.importorskip("cupy")
    return _net(request.param)


def _prompts(seed: int, n: int) -> list[np.ndarray]:
    return [np.random.default_rng(seed + i).integers(0, 2048, 12 + 7 * i) for i in range(n)]


def test_folded_logits_match_unfolded(seqs: Any) -> None:
    net = seqs.net
    assert net.fold_norms, "folding is on by default"
    prompts = _prompts(0, 3)
    t_fold, l_fold = greedy(seqs, prompts, 10)
    net.fold_norms = False
    net.graphs.clear()
    try:
        t_plain, l_plain = greedy(seqs, prompts, 10)
    finally:
        net.fold_norms = True
        net.graphs.clear()
    err = _err(l_fold, l_plain)
    assert err <= 1e-3, f"folded vs unfolded decode logits: {err:.3e}"
    agree = np.mean(l_fold.argmax(-1) == l_plain.argmax(-1))
    assert agree >= 0.95, f"top-1 agreement {agree:.3f}"


def test_graph_and_eager_decode_bitwise_equal_folded(seqs: Any) -> None:
    prompts = _prompts(20, 3)
    seqs.net.cuda_graph = True
    t_graph, l_graph = greedy(seqs, prompts, 8)
    seqs.net.cuda_graph = False
    try:
        t_eager, l_eager = greedy(seqs, prompts, 8)
    finally:
        seqs.net.cuda_graph = True
    assert t_graph == t_eager
    assert np.array_equal(l_graph, l_eager)


def test_greedy_identical_at_1_and_8_lanes_folded(seqs: Any) -> None:
    prompts = _prompts(40, 8)
    batched, lb = greedy(seqs, prompts, 6)
    solo = [greedy(seqs, [p], 6) for p in prompts]
    assert batched == [s[0][0] for s in solo]
    for b, (_, lg) in enumerate(solo):
        assert np.array_equal(lb[:, b], lg[:, 0]), f"lane {b}: logits differ from its 1-lane decode"


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_exact_prefill_is_decode_bitwise_folded(cp: Any, kind: str) -> None:
    """prefill_gemm=False: a 20-token chunk (the GEMVs in 8-row blocks, norms folded) gives every row bitwise the
    logits of 20 single-token decode calls."""
    seqs = _net(kind, prefill_gemm=False)
    net = seqs.net
    ids = np.random.default_rng(5).integers(0, 2048, 20)
    chunk = net.lm_head(seqs.forward(seqs.new(), ids))
    st = seqs.new()
    steps = np.concatenate([net.lm_head(seqs.forward(st, ids[i : i + 1])) for i in range(20)])
    assert np.array_equal(chunk, steps), f"max |diff| {np.max(np.abs(chunk - steps)):.3e}"


def test_decode_step_keeps_only_the_unfoldable_norms(seqs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An eager decode step with folding calls the standalone ``rmsnorm`` twice (layer 0's input norm after the
    embedding, the final norm; MoE: the final norm is ``moe_combine_rmsnorm``, as are the other input norms), and
    every post-attention norm (and, dense, every other input norm) is gone."""
    import ninfer.cuda.norm as norm

    calls: list[str] = []
    for name in ("rmsnorm", "moe_combine_rmsnorm"):
        fn = getattr(norm, name)
        monkeypatch.setattr(norm, name, lambda *a, _f=fn, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    net = seqs.net
    s = seqs.new()
    seqs.forward(s, np.arange(5))
    calls.clear()
    net.cuda_graph = False
    try:
        seqs.forward_batch(np.array([7]), [s])
    finally:
        net.cuda_graph = True
        seqs.free(s)
    layers = net.cfg.num_hidden_layers
    if net.cfg.is_moe:
        assert calls == ["rmsnorm"] + ["moe_combine_rmsnorm"] * layers, calls
    else:
        assert calls == ["rmsnorm", "rmsnorm"], calls
