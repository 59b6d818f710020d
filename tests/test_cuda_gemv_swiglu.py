"""The decode GEMV's SwiGLU epilogue (``gemv(..., swiglu_out=True)``, gemv.cu gemv_mma_gu; ``CudaQwen36.gemv_swiglu_out``)
on the GPU. Per launch, over formats with one and two m-tiles per warp, float32 activations, 1-11 rows (the
1-, 4- and 8-row instances, the 8-warp blocks and several lane blocks), one split and several, plain and folded-norm
inputs: the epilogue's [B, I] output is bitwise activation.swiglu of the plain [B, 2I] product (the standalone
kernel), so the down product of it is bitwise the down product staging the SwiGLU; and the same in a captured PDL
graph; the MoE expert launch likewise. Per network: greedy decode of eight sequences of a dense and an MoE model,
eager and from the decode graph, the same tokens and logits with the switch on and off.

The host emulation (tests/test_gemv_fused_host.py -k swiglu_out) checks the kernel text on the CPU. Run:
``python -m pytest -m gpu tests/test_cuda_gemv_swiglu.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cuda_decode import greedy
from test_cuda_gemv_w8 import _bits, _weight

pytestmark = pytest.mark.gpu

F32 = np.float32
NVFP4 = "NVFP4G16_E4M3S"


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _x(cp: Any, rng: np.random.Generator, b: int, k: int, bf16: bool) -> Any:
    x = cp.asarray((rng.standard_normal((b, k)) * 2).astype(F32))
    return x if not bf16 else cp.asarray((cp.asnumpy(x).view(np.uint32) >> 16).astype(np.uint16))


@pytest.mark.parametrize("fmt", [NVFP4, "BF16", "FP8E4M3_F32ROW", "Q4G64_F16S"])
def test_swiglu_out_is_swiglu_of_the_product(cp: Any, fmt: str) -> None:
    from ninfer.cuda.activation import swiglu
    from ninfer.cuda.linear import gemv, swiglu_out_ok
    from ninfer.cuda.norm import Normed

    rng = np.random.default_rng(29)
    # (I, K): one split (K of 2 tiles), several (K = 5128: 41 tiles), the 27B's gate | up geometry in small
    for inter, k in ((256, 256), (512, 5128), (1024, 2048)):
        w = _weight(rng, fmt, 2 * inter, k)
        wd = _weight(rng, NVFP4, 384, inter)
        assert swiglu_out_ok(w)
        for b in (1, 3, 8, 11):
            res = cp.asarray(rng.standard_normal((b, k)).astype(F32))
            part = cp.asarray(rng.random((5, b)).astype(F32) * k)
            nw = cp.asarray(rng.standard_normal(k).astype(F32) * 0.1)
            for name, xin in (("plain", _x(cp, rng, b, k, False)), ("normed", Normed(res, part, nw, 1e-6))):
                what = f"{fmt} I={inter} K={k} {b} rows {name}"
                gu = gemv(xin, w)
                hs = gemv(xin, w, swiglu_out=True)
                assert hs.shape == (b, inter) and hs.dtype == gu.dtype, what
                assert np.array_equal(_bits(hs), _bits(swiglu(gu))), f"{what}: epilogue != swiglu"
                assert np.array_equal(_bits(gemv(hs, wd)), _bits(gemv(gu, wd, swiglu=True))), f"{what}: down"


@pytest.mark.parametrize("fmt", [NVFP4, "BF16"])
def test_expert_swiglu_out_is_swiglu_of_the_product(cp: Any, fmt: str) -> None:
    """The MoE decode expert launch with the epilogue (``gemv_experts(..., swiglu_out=True)``): every slot's row
    bitwise activation.swiglu of its plain [gate | up] row, and the down launch of it bitwise the down launch
    staging the SwiGLU."""
    from ninfer.cuda.activation import swiglu
    from ninfer.cuda.gemv_experts import experts_swiglu_out_ok, gemv_experts

    rng = np.random.default_rng(37)
    e, inter, k, hid = 9, 512, 2048, 2048
    w = _weight(rng, fmt, e * 2 * inter, k)
    wd = _weight(rng, NVFP4, e * hid, inter)
    assert experts_swiglu_out_ok(w, 2 * inter)
    for slots in (1, 9, 36):
        x = _x(cp, rng, 4, k, False)
        ids = cp.asarray(rng.integers(0, e, slots).astype(np.int32))
        xrow = cp.asarray(rng.integers(0, 4, slots).astype(np.int32))
        slot = cp.arange(slots, dtype=cp.int32)
        gu = gemv_experts(x, w, ids, xrow, 2 * inter)
        hs = gemv_experts(x, w, ids, xrow, 2 * inter, swiglu_out=True)
        assert hs.shape == (slots, inter)
        assert np.array_equal(_bits(hs), _bits(swiglu(gu))), f"{fmt} {slots} slots: epilogue != swiglu"
        want = gemv_experts(gu, wd, ids, slot, hid, swiglu=True)
        assert np.array_equal(_bits(gemv_experts(hs, wd, ids, slot, hid)), _bits(want)), (
            f"{slots} slots: down"
        )


def test_swiglu_out_in_a_pdl_graph(cp: Any) -> None:
    """Captured with PDL (the decode graphs' launches): gate | up with the epilogue, then down, replayed twice:
    the eager bits."""
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(31)
    w, wd = _weight(rng, NVFP4, 2048, 1024), _weight(rng, NVFP4, 1024, 1024)
    x = _x(cp, rng, 1, 1024, False)
    want = _bits(gemv(gemv(x, w, swiglu_out=True), wd))
    stream = cp.cuda.Stream(non_blocking=True)
    hs = cp.empty((1, 1024), F32)
    y = cp.empty((1, 1024), F32)
    with stream:
        gemv(x, w, hs, swiglu_out=True)  # compile and allocate outside the capture
        gemv(hs, wd, y)
        stream.begin_capture()
        gemv(x, w, hs, swiglu_out=True)
        gemv(hs, wd, y)
        graph = stream.end_capture()
        for _ in range(2):
            y.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            assert np.array_equal(_bits(y), want)


def test_swiglu_out_rejects_what_it_cannot_pair(cp: Any) -> None:
    from ninfer.cuda._common import KernelError
    from ninfer.cuda.linear import gemv, swiglu_out_ok

    rng = np.random.default_rng(3)
    w = _weight(rng, NVFP4, 2 * 200, 256)  # 200 features: a row block would straddle gate and up
    assert not swiglu_out_ok(w)
    with pytest.raises(KernelError, match="swiglu_out"):
        gemv(_x(cp, rng, 1, 256, False), w, swiglu_out=True)
    w = _weight(rng, NVFP4, 2 * 256, 256)
    assert swiglu_out_ok(w)
    with pytest.raises(KernelError, match="swiglu_out"):  # bf16 activations: no instance
        gemv(_x(cp, rng, 1, 256, True), w, swiglu_out=True)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_decode_of_eight_sequences_is_the_same_with_the_epilogue(moe: bool) -> None:
    pytest.importorskip("cupy")
    from test_cuda_gemv_w8 import _dense

    seqs = _dense(moe)
    prompts = [np.random.default_rng(90 + i).integers(0, 2048, 9 + 4 * i) for i in range(8)]
    got = {}
    for graph in (False, True):
        seqs.net.cuda_graph = graph
        for on in (False, True):
            seqs.net.gemv_swiglu_out = on
            seqs.net.graphs.clear()  # a graph captured with the other setting would replay its launches
            got[graph, on] = greedy(seqs, prompts, 4)
    seqs.net.gemv_swiglu_out = False
    seqs.net.graphs.clear()
    for graph in (False, True):
        assert got[graph, False][0] == got[graph, True][0], f"graph={graph}: tokens"
        assert np.array_equal(got[graph, False][1].view(np.uint8), got[graph, True][1].view(np.uint8)), (
            f"graph={graph}: logits"
        )
