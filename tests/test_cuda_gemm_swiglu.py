"""The SwiGLU in the fp16-mode gate | up GEMM's epilogue (ninfer/cuda/gemm_swiglu.py; cuda_src/gemm_sm90_ws.cu
gemm90_f16_ws_swiglu, gemm_sm90.cu split_f16row_max) on the device, against the two-array path it replaces: ``h``
bitwise the swiglu kernel of ``gemm(x, w_gu, inputs="fp16")``, each row's tile maxima bitwise the row's largest
``|h|``, the down projection bitwise ``gemm(gu, w_dn, inputs="fp16", swiglu=True)``; ``h`` against NumPy with the
same input rounding; the MLP block (model_layers._swiglu_ffn) bitwise with the epilogue on and off. Fresh random
inputs with hostile rows (zeros, tiny, above fp16's range). Skipped without an sm_90a device.

    python -m pytest -m gpu tests/test_cuda_gemm_swiglu.py
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
# (M, I, K, N_out): M from the ws threshold (gemm_plan.F16_WS_ROWS = 384) up, ragged row tiles; I a multiple of 128;
# K short enough that the split-K rule keeps S = 1 (swiglu_shape_ok), off the 64-wide K tile
SHAPES = ((384, 128, 192, 136), (700, 384, 520, 300), (1000, 256, 1032, 64))


@pytest.fixture
def cp() -> Any:
    cupy = pytest.importorskip("cupy")
    from ninfer.cuda.loader import compute_capability, target_arch

    if not target_arch("gemm_sm90_ws.cu", compute_capability()).endswith("a"):
        pytest.skip("the ws kernel needs sm_90a (compute capability 9.0)")
    return cupy


def _bits(a: Any) -> np.ndarray:
    import cupy

    return (cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else np.asarray(a)).view(np.uint32)


@pytest.mark.parametrize("fmt", FMTS)
def test_swiglu_epilogue_bitwise_the_two_array_path(cp: Any, fmt: str) -> None:
    from ninfer.cuda._common import F16Rows
    from ninfer.cuda.activation import swiglu
    from ninfer.cuda.gemm import _sm90_kernel, gemm, gemm_gate_up_swiglu, swiglu_gemm_ok
    from ninfer.cuda.gemm_pair import f16_rows

    rng = np.random.default_rng(97)
    for m, i, k, n in SHAPES:
        wg, wgf = _weight(rng, fmt, 2 * i, k)
        wd, _ = _weight(rng, fmt, n, i)
        assert swiglu_gemm_ok(wg, wd, m), f"{fmt} {m}x{i}x{k}: the epilogue should apply"
        x = cp.asarray(_x(rng, m, k))
        gu = gemm(x, wg, inputs="fp16")
        want_h = swiglu(gu)
        hs = gemm_gate_up_swiglu(x, wg)
        assert np.array_equal(_bits(hs.h), _bits(want_h)), f"{fmt} {m}x{i}x{k}: h differs from swiglu(gemm)"
        a = np.abs(cp.asnumpy(want_h))
        a[np.isnan(a)] = 0.0
        assert np.array_equal(cp.asnumpy(hs.tmax).max(axis=1), a.max(axis=1)), f"{fmt}: row maxima differ"
        want = gemm(gu, wd, inputs="fp16", swiglu=True)
        assert np.array_equal(_bits(gemm(hs, wd, inputs="fp16")), _bits(want)), f"{fmt} {m}x{i}: down differs"
        # F16Rows input (a norm's fp16 rows): the same h
        xh, rowf = f16_rows(x, k, _sm90_kernel)
        hs2 = gemm_gate_up_swiglu(F16Rows(xh.reshape(m, k).copy(), rowf.copy()), wg)
        assert np.array_equal(_bits(hs2.h), _bits(hs.h)), f"{fmt}: F16Rows input differs"
        # against NumPy with the same input rounding (the finite rows)
        g = ops.linear(ops.round_fp16_rows(cp.asnumpy(x)), wgf)
        ref = g[:, :i] / (1.0 + np.exp(-g[:, :i].astype(np.float64))) * g[:, i:]
        ok = np.isfinite(ref).all(axis=1) & (np.abs(ref).max(axis=1) < 1e30)
        got = cp.asnumpy(hs.h)[ok]
        assert _err(got, ref[ok]) <= 4 * TOL, f"{fmt} {m}x{i}x{k}: h against NumPy"


def test_swiglu_epilogue_where_it_does_not_apply(cp: Any) -> None:
    """Shapes outside the epilogue (gate rows off the 128 tile, too few rows for the ws kernel, K long enough to
    split) are refused by swiglu_gemm_ok, and gemm_gate_up_swiglu raises rather than computing something else."""
    from ninfer.cuda._common import KernelError
    from ninfer.cuda.gemm import gemm_gate_up_swiglu, swiglu_gemm_ok

    rng = np.random.default_rng(98)
    fmt = "NVFP4G16_E4M3S"
    for m, i, k in ((700, 200, 256), (200, 256, 256), (300, 256, 16384)):
        wg, _ = _weight(rng, fmt, 2 * i, k)
        wd, _ = _weight(rng, fmt, 64, i)
        assert not swiglu_gemm_ok(wg, wd, m), f"{m}x{i}x{k}: the epilogue should not apply"
        with pytest.raises(KernelError):
            gemm_gate_up_swiglu(cp.asarray(_x(rng, m, k)), wg)


def test_swiglu_ffn_block_bitwise_with_and_without(cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """model_layers._swiglu_ffn on a prefill chunk: the epilogue path (taken: counted) gives the two-array path's
    bits, from float rows and from a norm's fp16 rows."""
    import ninfer.cuda.gemm as gemm_mod
    from ninfer.cuda import model_layers
    from ninfer.cuda.norm import rmsnorm

    rng = np.random.default_rng(99)
    m, hid, i = 520, 256, 384
    wg, _ = _weight(rng, "NVFP4G16_E4M3S_ROWG", 2 * i, hid)
    wd, _ = _weight(rng, "NVFP4G16_E4M3S", hid, i)
    net = SimpleNamespace(
        w={"gu": wg, "dn": wd}, prefill_gemm=True, prefill_inputs="fp16", act=np.float32, operands=None
    )
    x = cp.asarray(_x(rng, m, hid))
    nw = cp.asarray(rng.standard_normal(hid).astype(F32) * 0.1)
    taken = []
    real = gemm_mod.gemm_gate_up_swiglu
    monkeypatch.setattr(gemm_mod, "gemm_gate_up_swiglu", lambda *a, **kw: taken.append(1) or real(*a, **kw))
    for h in (x, rmsnorm(x, nw, 1e-6, f16=True)):
        on = cp.asnumpy(model_layers._swiglu_ffn(net, h, "gu", "dn"))
        with monkeypatch.context() as mp:
            mp.setattr(gemm_mod, "swiglu_gemm_ok", lambda *a: False)
            off = cp.asnumpy(model_layers._swiglu_ffn(net, h, "gu", "dn"))
        assert np.array_equal(on.view(np.uint32), off.view(np.uint32)), "the MLP block's bits changed"
    assert len(taken) == 2, "the epilogue path was not taken"


def test_model_prefill_bitwise_with_and_without_the_epilogue(
    cp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mid-size dense model's prefill (700 tokens, then 450 more) gives the same logits bit for bit with the
    SwiGLU epilogue (counted as taken) as without it."""
    import ninfer.cuda.gemm as gemm_mod
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences
    from ninfer.cuda.upload import encode_weights, upload_encoded
    from ninfer.demo import midsize_config, random_weights
    from ninfer.reference import DictWeights

    cfg = midsize_config("dense")
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=13)), "NVFP4G16_E4M3S")
    net = CudaQwen36(cfg, upload_encoded(cfg, enc), prefill_gemm=True)
    ids = np.random.default_rng(7).integers(0, cfg.vocab_size, 1150)

    def logits() -> np.ndarray:
        seqs = Sequences(net, slots=2, pages=160, page_size=16, context=1200)
        s = seqs.new()
        return np.concatenate([net.lm_head(seqs.forward(s, ids[a:b])) for a, b in ((0, 700), (700, 1150))])

    taken = []
    real = gemm_mod.swiglu_gemm_ok
    monkeypatch.setattr(gemm_mod, "swiglu_gemm_ok", lambda *a: taken.append(real(*a)) or taken[-1])
    on = logits()
    assert any(taken), "the SwiGLU epilogue was not taken"
    monkeypatch.setattr(gemm_mod, "swiglu_gemm_ok", lambda *a: False)
    off = logits()
    assert np.array_equal(on.view(np.uint32), off.view(np.uint32)), (
        f"logits differ with the epilogue: max |diff| {np.max(np.abs(on - off)):.3e}"
    )
