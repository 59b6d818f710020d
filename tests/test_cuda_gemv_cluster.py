"""The decode GEMV's K-split reduction through thread-block clusters on the GPU (gemv.cu ``gv_store_cl``,
``linear.GV_CLUSTER``): a row block's splits launched as one cluster, rank 0 adding the others' partial tiles from
their shared memory. It adds the same floats in the same order as the arrival-counter path, so every output must be
bitwise the counter path's: weight formats NVFP4 (and its per-row-global fusion), BF16, FP8 and a group-int format,
float and bf16 activations, 1/2/4/5/8 rows, K from 1 to 20 splits (above GV_CLUSTER_MAX the counter path stays),
row windows, expert slots (``experts`` 1) and expert lanes (2), norm folding (producer and consumer), and a chain
captured into a CUDA graph with PDL (``GV_CLUSTER = "graph"``) against the eager counter path. The host emulation
(tests/test_gemv_{lanes,dense,fused}_host.py, ``*cluster*``) checks the same contract on the CPU.

Run: ``python -m pytest -m gpu tests/test_cuda_gemv_cluster.py`` (skips without a CUDA device).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from moe_lanes_model import routing

from ninfer.formats import FORMATS, bf16_encode

pytestmark = pytest.mark.gpu

F32 = np.float32
NVFP4 = "NVFP4G16_E4M3S"
FMTS = (NVFP4, "NVFP4G16_E4M3S_ROWG", "BF16", "FP8E4M3_F32ROW", "Q4G64_F16S")
# K -> splits of a one-row-block weight (gemv_plan: 4 tiles per split): 1, 2, 3, 5, 8, 12, 16, 20 (the counter)
KS = (128, 256, 384, 640, 1024, 1536, 2048, 2560)  # a 1-row-block dense launch: 1..20 splits of 1 K-tile
ROWS = (1, 2, 4, 5, 8)


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


@contextmanager
def _mode(mode: str) -> Iterator[None]:
    import ninfer.cuda.linear as lin

    old = lin.GV_CLUSTER
    lin.GV_CLUSTER = mode
    try:
        yield
    finally:
        lin.GV_CLUSTER = old


def _both(cp: Any, run: Callable[[], list[Any]]) -> None:
    """``run`` (fresh outputs from fixed inputs) with the counter path and with clusters: bitwise the same."""
    with _mode("off"):
        want = [cp.asnumpy(a) for a in run()]
    with _mode("always"):
        got = [cp.asnumpy(a) for a in run()]
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), (
            f"output {i} differs"
        )


def _weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> Any:
    from ninfer.cuda.fuse import concat_rows
    from ninfer.cuda.weights import upload_weight

    if not fmt.endswith("ROWG"):
        buf = FORMATS[fmt].encode((rng.standard_normal((n, k)) * 0.5).astype(F32), (n, k))
        return upload_weight(fmt, (n, k), buf)
    parts = []  # three NVFP4 parts of different scales fused: a per-row global (fuse.py)
    for rows, s in ((n // 2, 1.0), (n // 4, 30.0), (n - n // 2 - n // 4, 0.01)):
        buf = FORMATS[NVFP4].encode((rng.standard_normal((rows, k)) * s).astype(F32), (rows, k))
        parts.append(upload_weight(NVFP4, (rows, k), buf))
    w = concat_rows(parts)
    assert w.fmt == fmt
    return w


def _x(cp: Any, rng: np.random.Generator, shape: tuple[int, int], t: str) -> Any:
    x = (rng.standard_normal(shape) * 2).astype(F32)
    return cp.asarray(bf16_encode(x) if t == "bf16" else x)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_dense_cluster_bitwise_counter(cp: Any, fmt: str, t: str) -> None:
    """Dense products over 1..20 splits and 1-8 rows (the 1-, 4- and 8-row instances, two lane blocks at 10 rows),
    a row window, and a 4-row-block weight (several clusters side by side)."""
    from ninfer.cuda.linear import gemv, gemv_plan

    rng = np.random.default_rng(5)
    n = 40 if fmt != "BF16" else 60
    cases = []
    for k in KS:
        w = _weight(rng, fmt, n, k)
        cases += [(w, _x(cp, rng, (b, k), t), {}) for b in ROWS]
    assert {gemv_plan(fmt, n, k, dense=True).splits for k in KS} == {1, 2, 3, 5, 8, 12, 16, 20}
    w = _weight(rng, fmt, 500, 1536)  # 4 (BF16: 8) row blocks x 12 splits
    assert gemv_plan(fmt, 500, 1536, dense=True).splits == 12
    cases += [(w, _x(cp, rng, (b, 1536), t), {}) for b in (1, 8, 10)]
    cases.append((w, _x(cp, rng, (3, 1536), t), {"row0": 24, "n": 300}))
    _both(cp, lambda: [gemv(x, w, **kw) for w, x, kw in cases])


@pytest.mark.parametrize("t", ["float", "bf16"])
def test_experts_cluster_bitwise_counter(cp: Any, t: str) -> None:
    """MoE decode slots (experts == 1) and expert lanes (experts == 2, 4 and 8 lanes, the SwiGLU prologue) with
    4 and 12 splits."""
    from ninfer.cuda.gemv_experts import gemv_experts
    from ninfer.cuda.moe_lanes import expert_lanes, expert_lanes_product

    rng = np.random.default_rng(9)
    tokens, top, e, n = 13, 3, 5, 24
    ids, xrow, experts = routing(rng, tokens, top, e, True)
    runs = []
    idd, xrd = cp.asarray(ids), cp.asarray(xrow)
    for k in (2048, 6144):
        w = _weight(rng, NVFP4, experts * n, k)
        x, x2 = _x(cp, rng, (tokens, k), t), _x(cp, rng, (ids.size, 2 * k), t)
        runs.append(lambda w=w, x=x: [gemv_experts(x, w, idd, xrd, n)])
        for nb in (4, 8):
            table = expert_lanes(idd, xrd, experts, nb)

            def lanes(w: Any = w, x: Any = x, x2: Any = x2, table: Any = table) -> list[Any]:
                a = cp.full((ids.size, n), 0x7FC0 if t == "bf16" else np.nan, dtype=x.dtype)
                b = a.copy()
                expert_lanes_product(x, w, table, n, a, gate_up=True)
                expert_lanes_product(x2, w, table, n, b, gate_up=False, swiglu=True)
                return [a, b]

            runs.append(lanes)
    _both(cp, lambda: [o for r in runs for o in r()])


@pytest.mark.parametrize("rows", [1, 5, 8])
def test_fold_cluster_bitwise_counter(cp: Any, rows: int) -> None:
    """Norm folding: the producer (residual update, partial sums of squares by rank 0) and the consumers (dense and
    expert slots) with their splits as clusters."""
    from ninfer.cuda.gemv_experts import gemv_experts
    from ninfer.cuda.linear import gemv, gemv_plan
    from ninfer.cuda.norm import Normed

    rng = np.random.default_rng(rows)
    n, k, n2 = 2048, 1536, 1024  # dense splits 12 and 16, the expert slot's 4: all clusters
    w1, w2 = _weight(rng, NVFP4, n, k), _weight(rng, "BF16", n2, n)
    assert 1 < gemv_plan(NVFP4, n, k, dense=True).splits <= 16 and 1 < gemv_plan("BF16", n2, n).splits
    assert gemv_plan("BF16", n2, n, dense=True).splits <= 16
    x = cp.asarray((rng.standard_normal((rows, k)) * 0.3).astype(F32))
    res0 = cp.asarray((rng.standard_normal((rows, n)) * 2).astype(F32))
    nw = cp.asarray((rng.standard_normal(n) * 0.2).astype(F32))

    def run() -> list[Any]:
        r = res0.copy()
        part = cp.full((gemv_plan(NVFP4, n, k).blocks_x, rows), np.nan, dtype=F32)
        gemv(x, w1, r, fold=part)
        h = Normed(r, part, nw, 1e-6, True)
        xr = cp.asarray(np.arange(rows, dtype=np.int32)[::-1].copy())
        return [r, part, gemv(h, w2), gemv_experts(h, w2, cp.zeros(rows, dtype=np.int32), xr, n2)]

    _both(cp, run)


def test_cluster_launches_take_the_cluster_path(cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under "always", split launches go through launch_ex with clusters of their splits, one-split and over-16 launches
    do not; "off": no cluster launch."""
    import ninfer.cuda.linear as lin

    seen: list[Any] = []
    real = lin.launch_ex
    monkeypatch.setattr(lin, "launch_ex", lambda *a, **kw: (seen.append(kw.get("cluster")), real(*a, **kw)))
    rng = np.random.default_rng(2)
    xs = {k: cp.asarray(rng.standard_normal((1, k)).astype(F32)) for k in (128, 1536, 2560)}
    ws = {k: _weight(rng, NVFP4, 40, k) for k in xs}
    with _mode("always"):
        for k, w in ws.items():
            lin.gemv(xs[k], w)
    assert seen == [(1, 12, 1)], seen  # 1 split: a plain launch; 20 splits: the counter, plain
    seen.clear()
    with _mode("off"):
        lin.gemv(xs[1536], ws[1536])
    assert seen == []


def test_graph_chain_cluster_pdl_equals_eager_counter(cp: Any) -> None:
    """A decode-like chain (each output the next input; 1 and 8 rows; a fold producer and its normed consumer)
    captured with ``GV_CLUSTER = "graph"`` (clusters and PDL in the graph), replayed twice: bitwise the eager
    counter path."""
    from ninfer.cuda.linear import gemv, gemv_plan
    from ninfer.cuda.norm import Normed

    rng = np.random.default_rng(11)
    shapes = ((1536, 1024), (1024, 1536), (2048, 1024), (1024, 2048))  # (N, K): dense splits 8, 12, 8, 16
    ws = [_weight(rng, NVFP4, n, k) for n, k in shapes]
    assert all(1 < gemv_plan(NVFP4, n, k, dense=True).splits <= 16 for n, k in shapes)
    nw = cp.asarray((rng.standard_normal(1024) * 0.2).astype(F32))
    xs = {b: cp.asarray(rng.standard_normal((b, 1024)).astype(F32)) for b in (1, 8)}
    res0 = {b: cp.asarray(rng.standard_normal((b, 1024)).astype(F32)) for b in (1, 8)}

    def chain() -> list[Any]:
        outs = []
        for b, x in xs.items():
            for w in ws:
                x = gemv(x, w)
                outs.append(x)
            r = res0[b].copy()
            part = cp.empty((gemv_plan(NVFP4, 1024, 2048).blocks_x, b), dtype=F32)
            gemv(gemv(x, ws[2]), ws[3], r, fold=part)
            outs += [r, part, gemv(Normed(r, part, nw, 1e-6, True), ws[0])]
        return outs

    with _mode("off"):
        want = [cp.asnumpy(o) for o in chain()]
    with _mode("graph"):
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            chain()  # warm-up outside the capture (workspaces, compiles)
            stream.begin_capture()
            outs = chain()
            graph = stream.end_capture()
            for _ in range(2):
                graph.launch(stream)
        stream.synchronize()
    for i, (a, b) in enumerate(zip([cp.asnumpy(o) for o in outs], want, strict=True)):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"product {i} differs in the graph"
