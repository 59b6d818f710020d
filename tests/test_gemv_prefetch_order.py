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
