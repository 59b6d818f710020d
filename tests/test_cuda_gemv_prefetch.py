"""The decode GEMV's L2 prefetch of the next product (``gemv(..., prefetch=next_weight)``, gemv.cu
gv_prefetch_next) on the GPU: a hint that never changes a value. Every output bitwise the output without it, for
the 1-, 4- and 8-row instances, K splits, N off the 16-row groups, next weights smaller and larger than one wave
(and smaller than this launch's grid), a next weight of another format (ignored), and a graph-captured chain
launched with programmatic dependent launch (the decode step's path) against the same chain run eagerly.

Run: ``python -m pytest -m gpu tests/test_cuda_gemv_prefetch.py`` (skips without a CUDA device).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer.formats import FORMATS

pytestmark = pytest.mark.gpu

F32 = np.float32
NVFP4 = "NVFP4G16_E4M3S"


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> Any:
    from ninfer.cuda.weights import upload_weight

    wf = (rng.standard_normal((n, k)) * 0.5).astype(F32)
    return upload_weight(fmt, (n, k), FORMATS[fmt].encode(wf, (n, k)))


def test_prefetch_never_changes_a_product(cp: Any) -> None:
    from ninfer.cuda.linear import gemv, gemv_plan

    rng = np.random.default_rng(91)
    # (N, K) of this product, then of the next: one block vs a multi-wave grid, K splits on both sides
    cases = (((40, 1032), (2100, 5120)), ((300, 5128), (40, 264)), ((2048, 6144), (34816 // 4, 5120)))
    for (n, k), (qn, qk) in cases:
        w, nxt = _weight(rng, NVFP4, n, k), _weight(rng, NVFP4, qn, qk)
        assert gemv_plan(NVFP4, qn, qk).splits >= 1
        for b in (1, 3, 8):
            x = cp.asarray((rng.standard_normal((b, k)) * 2).astype(F32))
            plain = cp.asnumpy(gemv(x, w))
            hinted = cp.asnumpy(gemv(x, w, prefetch=nxt))
            assert np.array_equal(plain.view(np.uint8), hinted.view(np.uint8)), (
                f"{n}x{k} -> {qn}x{qk}, {b} rows"
            )
    other = _weight(rng, "BF16", 64, 256)  # not NVFP4: ignored
    x = cp.asarray(rng.standard_normal((1, 1032)).astype(F32))
    w = _weight(rng, NVFP4, 40, 1032)
    assert np.array_equal(cp.asnumpy(gemv(x, w, prefetch=other)), cp.asnumpy(gemv(x, w)))


def test_prefetch_rejects_a_non_weight(cp: Any) -> None:
    from ninfer.cuda.linear import KernelError, gemv

    rng = np.random.default_rng(92)
    w = _weight(rng, NVFP4, 40, 256)
    with pytest.raises(KernelError):
        gemv(cp.zeros((1, 256), F32), w, prefetch=cp.zeros(4, F32))


def test_captured_prefetch_chain_equals_eager(cp: Any) -> None:
    """A decode-like chain (each product's output the next one's input), captured into a CUDA graph with PDL and
    the prefetch hints, replayed: bitwise the eager chain without hints."""
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(93)
    shapes = ((2048, 1024), (1024, 2048), (4096, 1024), (1024, 4096))
    ws = [_weight(rng, NVFP4, n, k) for n, k in shapes]
    x0 = cp.asarray(rng.standard_normal((1, 1024)).astype(F32))

    def chain(hint: bool) -> list[Any]:
        outs, x = [], x0
        for i, w in enumerate(ws):
            x = gemv(x, w, prefetch=ws[(i + 1) % len(ws)] if hint else None)
            outs.append(x)
        return outs

    want = [cp.asnumpy(o) for o in chain(False)]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        chain(True)  # warm-up outside the capture (workspaces, compiles)
        stream.begin_capture()
        outs = chain(True)
        graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    for i, (a, b) in enumerate(zip([cp.asnumpy(o) for o in outs], want, strict=True)):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"product {i} differs in the graph"


def test_expert_prefetch_never_changes_a_product(cp: Any) -> None:
    """An expert launch's hint of its slots' down-projection rows (gemv_experts(..., prefetch=down), gemv.cu
    gv_prefetch_expert): gate | up and the down product after it bitwise as without the hint, for one token's
    slots and for slots repeating an expert, eagerly and in a captured PDL graph."""
    from ninfer.cuda.gemv_experts import KernelError, gemv_experts

    rng = np.random.default_rng(94)
    e, inter, hid = 6, 64, 256
    gu_w = _weight(rng, NVFP4, e * 2 * inter, hid)
    dn_w = _weight(rng, NVFP4, e * hid, inter)
    x = cp.asarray(rng.standard_normal((2, hid)).astype(F32))
    for ids_np, rows_np in (([3, 0, 5], [0, 0, 0]), ([1, 1, 4, 2, 1], [0, 1, 1, 0, 1])):
        ids = cp.asarray(np.array(ids_np, np.int32))
        xrow = cp.asarray(np.array(rows_np, np.int32))
        slots = cp.asarray(np.arange(len(ids_np), dtype=np.int32))

        def pair(hint: bool, ids: Any = ids, xrow: Any = xrow, slots: Any = slots) -> tuple[Any, Any]:
            gu = gemv_experts(x, gu_w, ids, xrow, 2 * inter, prefetch=dn_w if hint else None)
            return gu, gemv_experts(gu, dn_w, ids, slots, hid, swiglu=True)

        want = [cp.asnumpy(o) for o in pair(False)]
        got = [cp.asnumpy(o) for o in pair(True)]
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            pair(True)
            stream.begin_capture()
            outs = pair(True)
            graph = stream.end_capture()
            graph.launch(stream)
        stream.synchronize()
        for a, b in zip(got + [cp.asnumpy(o) for o in outs], want * 2, strict=True):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"ids {ids_np}"
    with pytest.raises(KernelError):  # rows per expert not a multiple of 16
        gemv_experts(x, gu_w, ids, xrow, 2 * inter, prefetch=_weight(rng, NVFP4, e * 24, inter))
