"""The decode GEMVs' prefetch order (ninfer/cuda/model_graph.py, CPU): the traced step's weights each map to the one
launched after them, the last to the first; ``next_product`` records while tracing and answers only when on."""

from __future__ import annotations

from types import SimpleNamespace

from ninfer.cuda.model_graph import next_product, prefetch_order


def test_order_is_cyclic_over_the_step() -> None:
    a, b, c = object(), object(), object()
    nxt = prefetch_order([a, b, c])
    assert nxt == {id(a): b, id(b): c, id(c): a}
    assert prefetch_order([]) == {}


def test_next_product_traces_and_answers_only_when_on() -> None:
    a, b = object(), object()
    net = SimpleNamespace(gemv_prefetch=False, gemv_trace=[], gemv_next={})
    assert next_product(net, a) is None and next_product(net, b) is None
    assert net.gemv_trace == [a, b]
    net.gemv_next, net.gemv_trace = prefetch_order(net.gemv_trace), None
    assert next_product(net, a) is None  # off: no hint even with an order
    net.gemv_prefetch = True
    assert next_product(net, a) is b and next_product(net, b) is a
    assert next_product(net, object()) is None  # a product outside the traced step
    assert next_product(SimpleNamespace(), a) is None  # a network without the attributes


def test_prefetch_arguments_only_between_nvfp4_weights() -> None:
    """linear._prefetch_args: gemv_mma_pf's (q0, q1, qn, qk, qbx, qsplits) for an NVFP4 successor of an NVFP4
    product (its grid from gemv_plan), none otherwise (gemv_mma: no successor, or either weight in another format)."""
    from ninfer.cuda.linear import _prefetch_args, gemv_plan

    def weight(fmt: str, rows: int, cols: int) -> SimpleNamespace:
        planes = (f"{fmt}-codes", f"{fmt}-scales", f"{fmt}-global")
        return SimpleNamespace(fmt=fmt, rows=rows, cols=cols, planes=lambda: planes)

    nv4, rowg, bf16 = "NVFP4G16_E4M3S", "NVFP4G16_E4M3S_ROWG", "BF16"
    nxt = weight(rowg, 34816, 5120)
    q0, q1, qn, qk, qbx, qsplits = _prefetch_args(weight(nv4, 5120, 6144), nxt)
    plan = gemv_plan(rowg, 34816, 5120)
    assert (q0, q1) == (f"{rowg}-codes", f"{rowg}-scales")
    assert (int(qn), int(qk), int(qbx), int(qsplits)) == (34816, 5120, plan.blocks_x, plan.splits)
    for w, n in (
        (weight(nv4, 64, 256), None),
        (weight(bf16, 64, 256), nxt),
        (weight(nv4, 64, 256), weight(bf16, 8, 8)),
    ):
        assert _prefetch_args(w, n) == (), f"{w.fmt} -> {n and n.fmt}: the plain kernel"


def test_traced_step_records_the_order_once() -> None:
    """traced_step: with prefetching on and no order yet, the step's products in launch order become gemv_next; a
    later step, or prefetching off, leaves it as it is."""
    from ninfer.cuda.model_graph import traced_step

    a, b, c = object(), object(), object()
    net = SimpleNamespace(gemv_prefetch=True, gemv_trace=None, gemv_next={})

    def step(*ws: object) -> None:
        for w in ws:
            next_product(net, w)

    traced_step(net, lambda: step(a, b, c))
    assert net.gemv_next == prefetch_order([a, b, c]) and net.gemv_trace is None
    traced_step(net, lambda: step(c, b))
    assert net.gemv_next == prefetch_order([a, b, c])
    net.gemv_prefetch, net.gemv_next = False, {}
    traced_step(net, lambda: step(a))
    assert net.gemv_next == {}
