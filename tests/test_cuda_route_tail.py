"""The MoE router GEMV with the routing in its tail (``gemv(..., route=...)``, gemv.cu gemv_mma_rr;
``CudaQwen36.moe_route_router``) on the GPU. Per launch, over router formats, 1-11 token rows (the 1-, 4- and 8-row
instances and several lane blocks), E of 33-256 experts, with and without the shared expert's slots: the logits,
ids and weights bitwise the plain GEMV followed by router.moe_route; the same replayed from a captured PDL graph
(the arrival counters back at zero between replays). Per network: greedy decode of eight sequences of an MoE model,
eager and from the decode graph, the same tokens and logits with the switch on and off.

The host emulation (tests/test_gemv_fused_host.py -k route_tail) checks the kernel text on the CPU. Run:
``python -m pytest -m gpu tests/test_cuda_route_tail.py``.
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


def _routed(cp: Any, x: Any, w: Any, e: int, k: int, shared: bool) -> tuple[Any, Any, Any]:
    from ninfer.cuda.linear import gemv

    b = x.shape[0]
    ids = cp.full(b * k + (b if shared else 0), -7, np.int32)
    ew = cp.full((b, k), np.nan, F32)
    y = gemv(x, w, route=(e, k, e if shared else None, ids, ew))
    return y, ids, ew


@pytest.mark.parametrize("fmt", [NVFP4, "BF16", "FP8E4M3_F32ROW", "Q4G64_F16S"])
def test_route_tail_is_gemv_then_moe_route(cp: Any, fmt: str) -> None:
    from ninfer.cuda.linear import gemv
    from ninfer.cuda.router import moe_route

    rng = np.random.default_rng(43)
    for e, k, kdim in ((256, 8, 2048), (33, 5, 512), (128, 4, 1024)):
        w = _weight(rng, fmt, e + 1, kdim)  # the routed experts' rows, then the shared expert's gate row
        for b in (1, 3, 8, 11):
            x = cp.asarray(rng.standard_normal((b, kdim)).astype(F32))
            for shared in (False, True):
                what = f"{fmt} E={e} k={k} K={kdim} {b} rows shared={shared}"
                y = gemv(x, w)
                ids, ew = moe_route(y[:, :e], k, shared=e if shared else None)
                got_y, got_ids, got_ew = _routed(cp, x, w, e, k, shared)
                assert np.array_equal(_bits(got_y), _bits(y)), f"{what}: logits"
                assert np.array_equal(_bits(got_ids), _bits(ids.reshape(-1))), f"{what}: ids"
                assert np.array_equal(_bits(got_ew), _bits(ew)), f"{what}: weights"


def test_route_tail_in_a_pdl_graph(cp: Any) -> None:
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(47)
    w = _weight(rng, NVFP4, 257, 2048)
    x = cp.asarray(rng.standard_normal((1, 2048)).astype(F32))
    want = [_bits(a) for a in _routed(cp, x, w, 256, 8, True)]
    stream = cp.cuda.Stream(non_blocking=True)
    y, ids, ew = cp.empty((1, 257), F32), cp.empty(9, np.int32), cp.empty((1, 8), F32)
    with stream:
        gemv(x, w, y, route=(256, 8, 256, ids, ew))  # compile and allocate outside the capture
        stream.begin_capture()
        gemv(x, w, y, route=(256, 8, 256, ids, ew))
        graph = stream.end_capture()
        for _ in range(3):
            ids.fill(-7)
            ew.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            for name, got, ref in zip(("logits", "ids", "weights"), (y, ids, ew), want, strict=True):
                assert np.array_equal(_bits(got), ref), f"replay: {name}"


def test_route_tail_rejects_what_it_cannot_route(cp: Any) -> None:
    from ninfer.cuda._common import KernelError
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(5)
    w = _weight(rng, NVFP4, 300, 256)
    x = cp.asarray(rng.standard_normal((2, 256)).astype(F32))
    ids, ew = cp.empty(2 * 8, np.int32), cp.empty((2, 8), F32)
    with pytest.raises(KernelError, match="route"):  # more than 256 experts
        gemv(x, w, route=(300, 8, None, ids, ew))
    with pytest.raises(KernelError, match="ids"):  # no room for the shared expert's slots
        gemv(x, w, route=(256, 8, 256, ids, ew))


def test_decode_of_eight_sequences_is_the_same_with_the_route_tail() -> None:
    pytest.importorskip("cupy")
    from test_cuda_gemv_w8 import _dense

    seqs = _dense(True)
    prompts = [np.random.default_rng(95 + i).integers(0, 2048, 9 + 4 * i) for i in range(8)]
    got = {}
    for graph in (False, True):
        seqs.net.cuda_graph = graph
        for on in (False, True):
            seqs.net.moe_route_router = on
            seqs.net.graphs.clear()  # a graph captured with the other setting would replay its launches
            got[graph, on] = greedy(seqs, prompts, 4)
    seqs.net.moe_route_router = False
    seqs.net.graphs.clear()
    for graph in (False, True):
        assert got[graph, False][0] == got[graph, True][0], f"graph={graph}: tokens"
        assert np.array_equal(got[graph, False][1].view(np.uint8), got[graph, True][1].view(np.uint8)), (
            f"graph={graph}: logits"
        )
