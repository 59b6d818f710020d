"""MoE routing inside the expert launch on the GPU (gemv.cu ``gemv_mma_rt``, ``linear.gemv_experts_routed``,
``CudaQwen36.moe_route_fused``): the gate | up launch selects each slot's expert itself with router.cu's selection
(route_row.cuh), so a decode MoE layer runs one launch less.

- per launch: ids, weights and the gate | up product bitwise those of ``moe_route`` followed by ``gemv_experts``
  (1, 3 and 8 tokens; 256 and 40 experts; with and without the shared expert's slots; a NaN router row), and with
  the L2 hint of the down projection;
- per network (small MoE models, the shared expert fused into the routed weight and kept apart): greedy decode with
  the routing fused bitwise the same tokens and logits as with ``moe_route``, eagerly and from the decode graph, and
  no ``moe_route`` call left in an eager decode step.

The host emulation (tests/test_gemv_lanes_host.py ``-k routed``) checks the kernel itself on the CPU.
Run: ``python -m pytest -m gpu tests/test_cuda_moe_route_fused.py`` (skips without a CUDA device).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer.config import ModelConfig
from ninfer.demo import random_weights
from ninfer.formats import FORMATS
from ninfer.reference import DictWeights

pytestmark = pytest.mark.gpu

F32 = np.float32
NVFP4 = "NVFP4G16_E4M3S"


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _weight(rng: np.random.Generator, fmt: str, shape: tuple[int, int]) -> Any:
    from ninfer.cuda.weights import upload_weight

    return upload_weight(
        fmt, shape, FORMATS[fmt].encode((rng.standard_normal(shape) * 0.5).astype(F32), shape)
    )


def _bits(a: Any) -> np.ndarray:
    import cupy

    return cupy.asnumpy(a).view(np.uint8)


# tokens, routed experts, top-k, shared expert fused, weight format
CASES = [
    (1, 256, 8, True, NVFP4),
    (3, 40, 4, False, NVFP4),
    (8, 256, 8, True, NVFP4),
    (2, 33, 5, True, "BF16"),
]


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"t{c[0]}-e{c[1]}k{c[2]}-{'sh' if c[3] else 'no'}-{c[4][:5]}"
)
def test_routed_launch_is_route_then_experts(cp: Any, case: tuple) -> None:
    from ninfer.cuda.linear import gemv_experts, gemv_experts_routed
    from ninfer.cuda.router import moe_route

    t, e, k, shared, fmt = case
    rng = np.random.default_rng(t * 1000 + e)
    inter, hid = 128, 256
    w_gu = _weight(rng, fmt, ((e + shared) * 2 * inter, hid))
    w_dn = _weight(rng, fmt, ((e + shared) * hid, inter))
    x = cp.asarray(rng.standard_normal((t, hid)).astype(F32))
    lg = rng.standard_normal((t, e + 1)).astype(F32) * 3
    if t > 1:
        lg[1, 5] = np.nan  # a NaN row: still k distinct real experts, NaN weights
    lg = cp.asarray(lg)
    n = t * k
    ns = n + (t if shared else 0)
    xrow = cp.asarray(np.concatenate([np.arange(n) // k, np.arange(t if shared else 0)]).astype(np.int32))
    ids0, w0 = moe_route(lg[:, :e], k, shared=e if shared else None)
    want = gemv_experts(x, w_gu, ids0.reshape(-1), xrow, 2 * inter)
    for hint in (None, w_dn):
        ids, ew = cp.full(ns, -7, dtype=np.int32), cp.full((t, k), np.nan, dtype=F32)
        got = gemv_experts_routed(
            x, w_gu, lg, k, xrow, 2 * inter, None, ids, ew, shared=e if shared else None, prefetch=hint
        )
        assert np.array_equal(_bits(ids), _bits(ids0.reshape(-1))), "ids"
        assert np.array_equal(_bits(ew), _bits(w0)), "weights"
        assert np.array_equal(_bits(got), _bits(want)), "gate | up"


def test_routed_launch_rejects_bad_arguments(cp: Any) -> None:
    from ninfer.cuda.linear import KernelError, gemv_experts_routed

    rng = np.random.default_rng(5)
    w = _weight(rng, NVFP4, (8 * 64, 128))
    x = cp.zeros((1, 128), F32)
    lg = cp.zeros((1, 9), F32)
    ids, ew = cp.zeros(4, np.int32), cp.zeros((1, 4), F32)
    xrow = cp.zeros(4, np.int32)
    gemv_experts_routed(x, w, lg, 4, xrow, 64, None, ids, ew)  # 8 routed experts, no shared: fine
    with pytest.raises(KernelError):  # a shared expert id that is not E
        gemv_experts_routed(x, w, lg, 4, cp.zeros(5, np.int32), 64, None, cp.zeros(5, np.int32), ew, shared=3)
    with pytest.raises(KernelError):  # bf16 router rows
        gemv_experts_routed(x, w, lg.astype(cp.float16), 4, xrow, 64, None, ids, ew)
    with pytest.raises(KernelError):  # top-k above the experts
        gemv_experts_routed(
            x, w, lg, 9, cp.zeros(9, np.int32), 64, None, cp.zeros(9, np.int32), cp.zeros((1, 9), F32)
        )


# ---- networks ------------------------------------------------------------------------------------------------------
def _net(shared_width: int) -> Any:
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences
    from ninfer.cuda.upload import encode_weights, upload_encoded

    cfg = ModelConfig(
        arch="qwen3_5_moe", vocab_size=2048, hidden_size=512, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=128, linear_value_head_dim=128, partial_rotary_factor=0.25, mrope_section=(6, 5, 5),
        layer_types=("linear_attention", "linear_attention", "linear_attention", "full_attention"),
        num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256, shared_expert_intermediate_size=shared_width,
    )  # fmt: skip
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=4)), NVFP4)
    return Sequences(CudaQwen36(cfg, upload_encoded(cfg, enc)), slots=9, context=512, page_size=16)


def _greedy(seqs: Any, prompts: list[np.ndarray], steps: int) -> tuple[list[list[int]], np.ndarray]:
    net, sids = seqs.net, [seqs.new() for _ in prompts]
    last = np.stack([net.lm_head(seqs.forward(s, p)[-1:])[0] for p, s in zip(prompts, sids, strict=True)])
    toks, logits = [], []
    for _ in range(steps):
        nxt = last.argmax(-1)
        toks.append(nxt.tolist())
        last = net.lm_head(seqs.forward_batch(nxt, sids))
        logits.append(last)
    for s in sids:
        seqs.free(s)
    return [list(t) for t in zip(*toks, strict=True)], np.stack(logits)


@pytest.mark.parametrize("shared_width", [256, 512], ids=["shared-fused", "shared-apart"])
def test_decode_bitwise_with_routing_fused(monkeypatch: pytest.MonkeyPatch, shared_width: int) -> None:
    pytest.importorskip("cupy")
    import ninfer.cuda.router as router

    seqs = _net(shared_width)
    net = seqs.net
    prompts = [np.random.default_rng(60 + i).integers(0, 2048, 12 + 5 * i) for i in range(3)]
    real = router.moe_route
    calls: list[int] = []

    def spy(lg: Any, *a: Any, **kw: Any) -> Any:
        calls.append(lg.shape[0])
        return real(lg, *a, **kw)

    monkeypatch.setattr(router, "moe_route", spy)
    runs = {}
    for fused in (False, True):
        for graph in (True, False):
            net.moe_route_fused, net.cuda_graph = fused, graph
            net.graphs.clear()
            calls.clear()
            runs[fused, graph] = _greedy(seqs, prompts, 6)
            if fused and not graph:  # eager: every decode call (<= 8 rows) routes inside the expert launch
                assert calls and all(r > 8 for r in calls), f"moe_route still called for {calls} rows"
            if not fused and not graph:  # the spy sees the decode calls when they route apart
                assert any(r <= 8 for r in calls)
    net.moe_route_fused, net.cuda_graph = False, True
    net.graphs.clear()
    base_t, base_l = runs[False, True]
    for key, (t, lg) in runs.items():
        assert t == base_t, f"{key}: tokens differ"
        assert np.array_equal(lg, base_l), f"{key}: logits differ"
