"""The NVFP4 decode GEMV's weight ring filled by bulk copies (cuda_src/gemv_bulk.cuh; gemv_bulk.cu and
gemv_w8_bulk.cu behind ``linear.GV_BULK``, an experiment, off by default) on the GPU: the same bits as the
cp.async ring. Per launch: 1, 4 and 8 rows (the 8-warp blocks of gemv_w8.cu too), plain and SwiGLU inputs, the
fold producer, one and several K splits, N off the 16-row groups and off the row blocks, and the MoE expert launch;
per network: greedy decode of eight sequences (dense and MoE), eager and from the decode graph, the same tokens and
logits with the switch on and off. The host emulation (tests/test_gemv_bulk_host.py) checks the kernel text on the
CPU. Run: ``python -m pytest -m gpu tests/test_cuda_gemv_bulk.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda_decode import greedy
from test_cuda_gemv_w8 import _bits, _dense, _weight

pytestmark = pytest.mark.gpu

F32 = np.float32
NVFP4 = "NVFP4G16_E4M3S"


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


@pytest.fixture
def bulk_switch() -> Iterator[Any]:
    import ninfer.cuda.linear as linear

    default = linear.GV_BULK
    yield linear
    linear.GV_BULK = default


def _calls(cp: Any, rng: np.random.Generator, w: Any) -> dict[str, Any]:
    from ninfer.cuda.linear import gemv, gemv_plan

    k = w.cols
    x = cp.asarray((rng.standard_normal((8, 2 * k)) * 2).astype(F32))
    r = cp.asarray(rng.standard_normal((8, w.rows)).astype(F32))
    bx = gemv_plan(w.fmt, w.rows, k).blocks_x

    def fold() -> Any:  # the residual update and its partial sums of squares from a fixed residual
        res, part = r.copy(), cp.full((bx, 8), np.nan, F32)
        gemv(x[:, :k], w, res, fold=part)
        return cp.concatenate([res.reshape(-1), part.reshape(-1)])

    calls = {f"x{b}": (lambda b=b: gemv(x[:b, :k], w)) for b in (1, 4, 8)}
    return {**calls, "swiglu": lambda: gemv(x, w, swiglu=True), "fold": fold}


@pytest.mark.parametrize("n,k", [(600, 2048), (300, 1032), (136, 4096), (2048, 512), (40, 256)])
def test_bulk_ring_gives_the_cp_async_bits(cp: Any, bulk_switch: Any, n: int, k: int) -> None:
    rng = np.random.default_rng(n * 7 + k)
    calls = _calls(cp, rng, _weight(rng, NVFP4, n, k))
    got = {}
    for on in (False, True):
        bulk_switch.GV_BULK = on
        got[on] = {name: _bits(call()) for name, call in calls.items()}
    for name in calls:
        assert np.array_equal(got[False][name], got[True][name]), f"{n}x{k} {name}: bulk ring differs"


def test_bulk_ring_expert_launch(cp: Any, bulk_switch: Any) -> None:
    from ninfer.cuda.gemv_experts import gemv_experts

    rng = np.random.default_rng(5)
    ne, n, k = 6, 256, 1024
    w = _weight(rng, NVFP4, ne * n, k)
    x = cp.asarray(rng.standard_normal((3, k)).astype(F32))
    ids = cp.asarray(np.array([4, 0, 5, 2, 4], dtype=np.int32))
    xrow = cp.asarray(np.array([0, 1, 2, 0, 1], dtype=np.int32))
    got = {}
    for on in (False, True):
        bulk_switch.GV_BULK = on
        got[on] = _bits(gemv_experts(x, w, ids, xrow, n))
    assert np.array_equal(got[False], got[True]), "bulk ring differs (expert launch)"


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_decode_of_eight_sequences_is_the_same_with_bulk(bulk_switch: Any, moe: bool) -> None:
    pytest.importorskip("cupy")
    seqs = _dense(moe)
    prompts = [np.random.default_rng(90 + i).integers(0, 2048, 9 + 4 * i) for i in range(8)]
    got = {}
    for graph in (False, True):
        seqs.net.cuda_graph = graph
        for on in (False, True):
            bulk_switch.GV_BULK = on
            seqs.net.graphs.clear()  # a graph captured with the other setting would replay its launches
            got[graph, on] = greedy(seqs, prompts, 4)
    seqs.net.graphs.clear()
    for graph in (False, True):
        toks_off, lg_off = got[graph, False]
        toks_on, lg_on = got[graph, True]
        assert toks_off == toks_on, f"graph={graph}: tokens"
        assert np.array_equal(lg_off.view(np.uint8), lg_on.view(np.uint8)), f"graph={graph}: logits"
