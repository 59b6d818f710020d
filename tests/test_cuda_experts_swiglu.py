"""The MoE gate | up GEMM with the SwiGLU in its epilogue (ninfer/cuda/experts_swiglu.py; cuda_src/gemm_sm90.cu
gemm90_experts_f16g_swiglu, cuda_src/gate_up.cuh) on the device, against the two-array path it replaces
(``gemm_experts(x, w_gu, ids, 2I, inputs="fp16", rows=r)`` then ``gemm_experts(gu, w_dn, ids, hid, inputs="fp16",
swiglu=True)``): ``h`` bitwise the swiglu kernel of the [gate | up] output, the tile maxima bitwise its rows'
largest ``|h|`` per 128 features, the down projection's fp16 rows, factors and output bitwise; ``h`` against NumPy
with the same input rounding; the MoE FFN block and a mid-size MoE model's prefill logits bitwise with the fold on
and off. Fresh random inputs with hostile rows (zeros, tiny, above fp16's range), ragged expert groups, empty
experts, slot counts off the 128-row tile. Skipped without an sm_90a device.

    python -m pytest -m gpu tests/test_cuda_experts_swiglu.py
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_cuda_gemm_f16 import _x
from test_cuda_gemm_pair import TOL, _err, _weight

from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32
FMTS = ("NVFP4G16_E4M3S", "NVFP4G16_E4M3S_ROWG", "FP8E4M3_F32ROW", "FP8E4M3_F32T")
# (tokens, I, K, hid, slots per expert): empty experts first / inner / last, an expert over two or three row tiles,
# one-row experts, ragged last tiles, fewer slots than tokens and more; I of one to four column tiles; K off the
# 64-wide K tile and NVFP4's 128 padding
CASES = (
    (97, 128, 136, 72, [0, 150, 1, 0, 64, 65, 3, 0]),
    (40, 256, 264, 130, [0, 5, 0, 131, 0, 0, 7, 1]),
    (300, 384, 1032, 64, [257, 0, 130, 2]),
    (200, 512, 2048, 256, [1, 0, 2, 0]),
)


@pytest.fixture
def cp() -> Any:
    cupy = pytest.importorskip("cupy")
    from ninfer.cuda.loader import compute_capability, target_arch

    if not target_arch("gemm_sm90.cu", compute_capability()).endswith("a"):
        pytest.skip("the fp16 mode needs the sm_90a wgmma kernels (compute capability 9.0)")
    return cupy


def _bits(a: Any) -> np.ndarray:
    import cupy

    return (cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else np.asarray(a)).view(np.uint32)


@pytest.mark.parametrize("fmt", FMTS)
def test_fold_bitwise_the_two_array_path(cp: Any, fmt: str) -> None:
    from ninfer.cuda.activation import swiglu
    from ninfer.cuda.experts_swiglu import experts_swiglu_ok, gemm_experts_down, gemm_experts_gate_up_swiglu
    from ninfer.cuda.gemm import EXPERTS_LAUNCHES, _sm90_kernel, gemm_experts
    from ninfer.cuda.gemm_pair import PAIR_STRUCTS, f16_rows
    from ninfer.cuda.gemm_swiglu import swiglu_f16_rows

    rng = np.random.default_rng(101)
    for tokens, i, k, hid, counts in CASES:
        e, n = len(counts), 2 * i
        wg, wgf = _weight(rng, fmt, e * n, k)
        wd, _ = _weight(rng, fmt, e * hid, i)
        ids_h = np.repeat(np.arange(e, dtype=np.int32), counts)
        rows_h = rng.integers(0, tokens, ids_h.size).astype(np.int32)
        ids, rows = cp.asarray(ids_h), cp.asarray(rows_h)
        xbuf = cp.asarray(np.pad(_x(rng, tokens, k), ((0, 0), (8, 16)), constant_values=np.nan))
        x = xbuf[:, 8 : 8 + k]  # row stride k + 24
        what = f"{fmt} T={tokens} I={i} K={k} {counts}"
        assert experts_swiglu_ok(x, wg, wd, n), f"{what}: the fold should apply"
        gu = gemm_experts(x, wg, ids, n, inputs="fp16", rows=rows)
        want_h = swiglu(gu)
        before = EXPERTS_LAUNCHES.copy()
        hs = gemm_experts_gate_up_swiglu(x, wg, ids, n, rows=rows)
        assert EXPERTS_LAUNCHES - before == {f"gemm90_experts_f16g_swiglu<{PAIR_STRUCTS[fmt][1]}>": 1}
        assert np.array_equal(_bits(hs.h), _bits(want_h)), f"{what}: h differs from swiglu(gemm_experts)"
        a = np.abs(cp.asnumpy(want_h))
        a[np.isnan(a)] = 0.0
        tiles = np.stack([a[:, j : j + 128].max(axis=1) for j in range(0, i, 128)], axis=1)
        assert np.array_equal(cp.asnumpy(hs.tmax), tiles), f"{what}: tile maxima differ"
        # the down projection's fp16 rows and factors (both in the one fp16 row scratch: copied in turn)
        xh0, f0 = (v.copy() for v in f16_rows(gu, n, _sm90_kernel, swiglu=True))
        xh1, f1 = swiglu_f16_rows(hs, _sm90_kernel)
        assert np.array_equal(cp.asnumpy(xh1).reshape(-1), cp.asnumpy(xh0)), f"{what}: fp16 words differ"
        assert np.array_equal(_bits(f1), _bits(f0)), f"{what}: row factors differ"
        want = gemm_experts(gu, wd, ids, hid, inputs="fp16", swiglu=True)
        got = gemm_experts_down(hs, wd, ids, hid)
        # (rows whose h overflowed, which the random weights give, are non-finite in both: compared by their bits)
        assert np.array_equal(_bits(got), _bits(want)), f"{what}: down projection differs"
        # against NumPy with the same input rounding (the finite rows)
        g = np.stack([ops.linear(ops.round_fp16_rows(cp.asnumpy(x)[r : r + 1]), wgf[q * n : (q + 1) * n])[0]
                      for r, q in zip(rows_h, ids_h, strict=True)])  # fmt: skip
        ref = g[:, :i] / (1.0 + np.exp(-g[:, :i].astype(np.float64))) * g[:, i:]
        ok = np.isfinite(ref).all(axis=1) & (np.abs(ref).max(axis=1) < 1e30)
        assert ok.sum() >= ids_h.size // 2 and _err(cp.asnumpy(hs.h)[ok], ref[ok]) <= 4 * TOL, what


def test_fold_where_it_does_not_apply(cp: Any) -> None:
    """Shapes and modes outside the fold are refused by experts_swiglu_ok (I off the 128 tile, the exact mode,
    bf16 activations, the down input width), and gemm_experts_gate_up_swiglu raises rather than computing something
    else."""
    from ninfer.cuda._common import KernelError
    from ninfer.cuda.experts_swiglu import experts_swiglu_ok, gemm_experts_gate_up_swiglu

    rng = np.random.default_rng(102)
    fmt, e, k = "NVFP4G16_E4M3S", 3, 256
    x = cp.asarray(_x(rng, 50, k))
    ids, rows = cp.zeros(60, dtype=np.int32), cp.asarray(rng.integers(0, 50, 60).astype(np.int32))
    wg, _ = _weight(rng, fmt, e * 400, k)
    wd, _ = _weight(rng, fmt, e * 64, 200)
    assert not experts_swiglu_ok(x, wg, wd, 400)
    with pytest.raises(KernelError):
        gemm_experts_gate_up_swiglu(x, wg, ids, 400, rows=rows)
    wg, _ = _weight(rng, fmt, e * 512, k)
    wd, _ = _weight(rng, fmt, e * 64, 256)
    assert experts_swiglu_ok(x, wg, wd, 512)
    assert not experts_swiglu_ok(x, wg, wd, 512, inputs="exact")
    assert not experts_swiglu_ok(x.astype(np.uint16), wg, wd, 512)
    assert not experts_swiglu_ok(x, wg, _weight(rng, fmt, e * 64, 128)[0], 512)


def _moe_net(cp: Any) -> Any:
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import encode_weights, upload_encoded
    from ninfer.demo import midsize_config, random_weights
    from ninfer.reference import DictWeights

    cfg = midsize_config("moe")  # 16 experts of I = 256, top 4
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=17)), "NVFP4G16_E4M3S")
    return CudaQwen36(cfg, upload_encoded(cfg, enc), prefill_gemm=True)


def test_moe_ffn_block_bitwise_with_and_without(cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """model_layers.ffn_block of a mid-size MoE layer on prefill chunks (routed experts on the grouped GEMM): the
    fold (taken: counted) gives the two-array path's bits."""
    import ninfer.cuda.experts_swiglu as es
    from ninfer.cuda import model_layers

    net = _moe_net(cp)
    rng = np.random.default_rng(103)
    taken = []
    real = es.experts_swiglu_ok
    monkeypatch.setattr(es, "experts_swiglu_ok", lambda *a, **kw: taken.append(real(*a, **kw)) or taken[-1])
    for t in (300, 777):
        h = cp.asarray((rng.standard_normal((t, net.cfg.hidden_size)) * 0.7).astype(F32))
        on = cp.asnumpy(model_layers.ffn_block(net, "layers.1.", h, SimpleNamespace(t=t)))
        with monkeypatch.context() as mp:
            mp.setattr(es, "experts_swiglu_ok", lambda *a, **kw: False)
            off = cp.asnumpy(model_layers.ffn_block(net, "layers.1.", h, SimpleNamespace(t=t)))
        assert np.isfinite(on).all() and np.array_equal(on.view(np.uint32), off.view(np.uint32)), t
    assert taken == [True, True], "the fold was not taken"


def test_moe_model_prefill_bitwise_with_and_without_the_fold(
    cp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mid-size MoE model's prefill (700 tokens, then 450 more) gives the same logits bit for bit with the fold
    (counted as taken) as without it."""
    import ninfer.cuda.experts_swiglu as es
    from ninfer.cuda.sequences import Sequences

    net = _moe_net(cp)
    ids = np.random.default_rng(7).integers(0, net.cfg.vocab_size, 1150)

    def logits() -> np.ndarray:
        seqs = Sequences(net, slots=2, pages=160, page_size=16, context=1200)
        s = seqs.new()
        return np.concatenate([net.lm_head(seqs.forward(s, ids[a:b])) for a, b in ((0, 700), (700, 1150))])

    taken = []
    real = es.experts_swiglu_ok
    monkeypatch.setattr(es, "experts_swiglu_ok", lambda *a, **kw: taken.append(real(*a, **kw)) or taken[-1])
    on = logits()
    assert any(taken), "the fold was not taken"
    monkeypatch.setattr(es, "experts_swiglu_ok", lambda *a, **kw: False)
    off = logits()
    assert np.array_equal(on.view(np.uint32), off.view(np.uint32)), (
        f"logits differ with the fold: max |diff| {np.max(np.abs(on - off)):.3e}"
    )
