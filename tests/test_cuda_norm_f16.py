"""Norms that write the fp16 GEMM mode's input rows themselves (norm.rmsnorm / moe_combine_rmsnorm with ``f16=True``,
cuda_src/norm.cu rmsnorm_f16 / moe_combine_rmsnorm_f16) on the device: bitwise split_f16row of the float norm's
output, the same residual, a GEMM over them bitwise the GEMM over the float rows, and a whole prefill bitwise the
same with and without the fusion (the model takes it where a norm's only reader is an fp16-mode GEMM). Skipped
without an sm_90a device.

    python -m pytest -m gpu tests/test_cuda_norm_f16.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_cuda_gemm_pair import _weight

pytestmark = pytest.mark.gpu

F32 = np.float32
EPS = 1e-6


@pytest.fixture
def cp() -> Any:
    cupy = pytest.importorskip("cupy")
    from ninfer.cuda.loader import compute_capability, target_arch

    if not target_arch("gemm_sm90.cu", compute_capability()).endswith("a"):
        pytest.skip("the fp16 GEMM mode needs sm_90a (compute capability 9.0)")
    return cupy


def _split(cp: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """split_f16row of float rows y (the GEMM's own row split), as host arrays."""
    from ninfer.cuda.gemm import _sm90_kernel
    from ninfer.cuda.gemm_pair import f16_rows

    xh, rowf = f16_rows(y, y.shape[1], _sm90_kernel)
    return cp.asnumpy(xh).reshape(y.shape), cp.asnumpy(rowf)


def _same(cp: Any, got: Any, xh: np.ndarray, rowf: np.ndarray, what: str) -> None:
    assert np.array_equal(cp.asnumpy(got.xh), xh), f"{what}: fp16 words"
    assert np.array_equal(cp.asnumpy(got.rowf).view(np.uint32), rowf.view(np.uint32)), f"{what}: row factors"


@pytest.mark.parametrize("h", [2048, 5120, 8192])
@pytest.mark.parametrize("offset", [True, False])
def test_rmsnorm_f16_is_the_row_split(cp: Any, h: int, offset: bool) -> None:
    from ninfer.cuda.norm import rmsnorm

    rng = np.random.default_rng(h + offset)
    rows = 300
    x = (rng.standard_normal((rows, h)) * 3).astype(F32)
    x[1] *= 1e-30  # a tiny row: the clamped factor
    x[2, :64] = 1e-35  # subnormal products beside O(1) ones
    r = rng.standard_normal((rows, h)).astype(F32)
    w = cp.asarray((rng.standard_normal(h) * 0.3).astype(F32))
    for resid in (True, False):
        r1, r2 = cp.asarray(r), cp.asarray(r)
        y = rmsnorm(cp.asarray(x), w, EPS, offset=offset, residual=r1 if resid else None)
        got = rmsnorm(cp.asarray(x), w, EPS, offset=offset, residual=r2 if resid else None, f16=True)
        _same(cp, got, *_split(cp, y), f"H={h} offset={offset} resid={resid}")
        assert np.array_equal(cp.asnumpy(r1), cp.asnumpy(r2))


def test_moe_combine_rmsnorm_f16_is_the_row_split(cp: Any) -> None:
    from ninfer.cuda.norm import MoeCombine, moe_combine_rmsnorm

    rng = np.random.default_rng(3)
    rows, h, k = 257, 2048, 8
    slots = rows * k + rows
    dn = cp.asarray((rng.standard_normal((slots, h)) * 2).astype(F32))
    sh = cp.asarray(rng.standard_normal((rows, h)).astype(F32))
    where = cp.asarray(rng.permutation(slots)[: rows * k].reshape(rows, k).astype(np.int32))
    ew, sg = cp.asarray(rng.random((rows, k)).astype(F32)), cp.asarray(rng.standard_normal(rows).astype(F32))
    c = MoeCombine(dn, where, ew, sh, sg, 1)
    w = cp.asarray((rng.standard_normal(h) * 0.3).astype(F32))
    r = rng.standard_normal((rows, h)).astype(F32)
    r1, r2 = cp.asarray(r), cp.asarray(r)
    y = moe_combine_rmsnorm(c, w, EPS, residual=r1)
    got = moe_combine_rmsnorm(c, w, EPS, residual=r2, f16=True)
    _same(cp, got, *_split(cp, y), "combine")
    assert np.array_equal(cp.asnumpy(r1), cp.asnumpy(r2))


@pytest.mark.parametrize("heads,d", [(48, 128), (32, 128), (5, 96)])
def test_gated_rmsnorm_f16_is_the_row_split(cp: Any, heads: int, d: int) -> None:
    """The GDN output norm's token rows [T, heads·D] as fp16 GEMM rows: bitwise split_f16row of the float norm, z a
    column slice of a wider projection (its row stride)."""
    from ninfer.cuda.norm import gated_rmsnorm

    rng = np.random.default_rng(heads * d)
    t = 260
    o = cp.asarray((rng.standard_normal((t * heads, d)) * 2).astype(F32))
    zw = cp.asarray(rng.standard_normal((t, heads * d + 40)).astype(F32))
    z = zw[:, 24 : 24 + heads * d]
    w = cp.asarray((rng.standard_normal(d) * 0.5).astype(F32))
    y = gated_rmsnorm(o, z, w, EPS)
    got = gated_rmsnorm(o, z, w, EPS, f16=True)
    _same(cp, got, *_split(cp, cp.ascontiguousarray(y.reshape(t, heads * d))), f"{heads}x{d}")


@pytest.mark.parametrize("fmt", ["NVFP4G16_E4M3S", "NVFP4G16_E4M3S_ROWG", "FP8E4M3_F32ROW"])
def test_gemm_of_f16_rows_is_the_gemm_of_float_rows(cp: Any, fmt: str) -> None:
    from ninfer.cuda.gemm import f16_rows_input, gemm
    from ninfer.cuda.norm import rmsnorm
    from ninfer.cuda.operands import OperandStore

    rng = np.random.default_rng(11)
    for m, n, k in ((128, 300, 2048), (600, 4100, 5120)):
        wt, _ = _weight(rng, fmt, n, k)
        assert f16_rows_input(wt, m) and not f16_rows_input(wt, 127)
        x = cp.asarray((rng.standard_normal((m, k)) * 2).astype(F32))
        w = cp.asarray((rng.standard_normal(k) * 0.3).astype(F32))
        want = cp.asnumpy(gemm(rmsnorm(x, w, EPS), wt, inputs="fp16"))
        rows = rmsnorm(x, w, EPS, f16=True)
        for operands in (None, OperandStore(1 << 30)):
            got = cp.asnumpy(gemm(rows, wt, inputs="fp16", operands=operands))
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{fmt} {m}x{n}x{k}"
    with pytest.raises(Exception, match="F16Rows"):
        gemm(rows, wt, inputs="exact")


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_prefill_bitwise_with_and_without_f16_norms(
    cp: Any, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mid-size models' 300-token prefill: the norms write the GEMMs' rows (dense: all of them; MoE: the input
    norms, the combine fused in; both: the GDN output norms) or the GEMMs split the float rows: the same logits
    bits."""
    from test_cuda_model import _mid_reference, _sequences

    import ninfer.cuda.model_layers as ml
    import ninfer.cuda.norm as norm
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import upload_encoded

    cfg, enc, ids, _ = _mid_reference(kind)
    net = CudaQwen36(cfg, upload_encoded(cfg, enc))
    seqs = _sequences(net)

    def run() -> np.ndarray:
        s = seqs.new()
        out = np.concatenate([net.lm_head(seqs.forward(s, ids[:300]))])
        seqs.free(s)
        return out

    calls: list[bool] = []
    real = norm._f16_out

    def counted(*a: Any) -> Any:
        calls.append(True)
        return real(*a)

    monkeypatch.setattr(norm, "_f16_out", counted)
    fused = run()
    assert len(calls) >= cfg.num_hidden_layers, "the norms wrote the rows"
    monkeypatch.setattr(ml, "f16_norm_out", lambda *a: False)
    plain = run()
    assert np.array_equal(fused.view(np.uint32), plain.view(np.uint32))
