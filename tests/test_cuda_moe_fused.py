"""The decode MoE fusions on the GPU: routing inside the gate | up launch (gemv.cu ``gemv_mma_rt``,
``gemv_experts.gemv_experts_routed``, ``CudaQwen36.moe_route_fused``) and the combine + next norm in the down launch's
tail (``gemv_mma_cb``, ``gemv_experts.gemv_experts_down_combine``, ``CudaQwen36.moe_combine_fused``): two launches less
per decode MoE layer, the same bits.

- per launch: ids, weights and the gate | up product bitwise those of ``moe_route`` followed by ``gemv_experts``
  (1, 3 and 8 tokens; 256 and 40 experts; with and without the shared expert's slots; a NaN router row), and with
  the L2 hint of the down projection; the down rows, the residual and the normed rows bitwise those of
  ``gemv_experts`` followed by ``moe_combine_rmsnorm`` (1, 3 and 8 tokens, the shared expert's rows as slots or
  apart, both norm forms);
- per network (small MoE models, the shared expert fused into the routed weight and kept apart): greedy decode with
  either fusion and both bitwise the same tokens and logits as without, eagerly and from the decode graph, and no
  ``moe_route`` call left in an eager decode step with the routing fused.

The host emulation (tests/test_gemv_lanes_host.py ``-k "routed or combine"``) checks the kernels on the CPU.
Run: ``python -m pytest -m gpu tests/test_cuda_moe_fused.py`` (skips without a CUDA device).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cuda_decode import greedy

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
    from ninfer.cuda.gemv_experts import gemv_experts, gemv_experts_routed
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
    from ninfer.cuda.gemv_experts import KernelError, gemv_experts_routed

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


# tokens, shared expert as slots, offset
COMBINE_CASES = [(1, True, True), (3, False, False), (8, True, True)]


@pytest.mark.parametrize("case", COMBINE_CASES, ids=lambda c: f"t{c[0]}-{'sh' if c[1] else 'apart'}-{c[2]}")
def test_down_with_combine_is_down_then_combine(cp: Any, case: tuple) -> None:
    from ninfer.cuda.gemv_experts import KernelError, gemv_experts, gemv_experts_down_combine
    from ninfer.cuda.model_layers import combine_norm
    from ninfer.cuda.norm import MoeCombine, moe_combine_rmsnorm

    t, shared, offset = case
    rng = np.random.default_rng(70 + t)
    e, k, inter, hid = 16, 4, 256, 2048
    w_dn = _weight(rng, NVFP4, ((e + 1) * hid, inter))
    n = t * k
    ns = n + (t if shared else 0)
    ids = cp.asarray(np.concatenate([rng.integers(0, e, n), np.full(ns - n, e)]).astype(np.int32))
    slot = cp.asarray(np.arange(ns, dtype=np.int32))
    gu = cp.asarray(rng.standard_normal((ns, 2 * inter)).astype(F32))
    ew = cp.asarray(rng.random((t, k)).astype(F32))
    sg = cp.asarray(rng.standard_normal(t).astype(F32))
    r0 = cp.asarray((rng.standard_normal((t, hid)) * 2).astype(F32))
    nw = cp.asarray((rng.standard_normal(hid) * 0.2).astype(F32))
    apart = cp.asarray(rng.standard_normal((t, hid)).astype(F32))

    def run(fused: bool) -> tuple[Any, ...]:
        dn, res = cp.full((ns, hid), np.nan, dtype=F32), r0.copy()
        sh = dn[n:] if shared else apart
        if fused:
            y = cp.full((t, hid), np.nan, dtype=F32)
            assert gemv_experts_down_combine(
                gu, w_dn, ids, slot, dn, where=slot[:n].reshape(t, k), ew=ew, sh=sh, sg=sg, ldsg=1, residual=res,
                weight=nw, eps=1e-6, offset=offset, out=y,
            )  # fmt: skip
        else:
            gemv_experts(gu, w_dn, ids, slot, hid, dn, swiglu=True)
            c = MoeCombine(dn, slot[:n].reshape(t, k), ew, sh, sg, 1)
            y = moe_combine_rmsnorm(c, nw, 1e-6, residual=res, offset=offset)
        return dn, res, y

    want = run(False)
    for _ in range(2):  # the per-token counters are back at zero after a launch
        for name, a, b in zip(("dn", "residual", "y"), run(True), want, strict=True):
            assert np.array_equal(_bits(a), _bits(b)), name
    # and through the pending down of a MoeCombine, as the model runs it (combine_norm); the standalone norm
    # refuses a pending one
    dn, res = cp.empty((ns, hid), dtype=F32), r0.copy()
    c = MoeCombine(dn, slot[:n].reshape(t, k), ew, dn[n:] if shared else apart, sg, 1, (gu, w_dn, ids, slot))
    with pytest.raises(KernelError):
        moe_combine_rmsnorm(c, nw, 1e-6, residual=res, offset=offset)
    y = combine_norm(c, nw, 1e-6, residual=res, offset=offset)
    for name, a, b in zip(("dn", "residual", "y"), (dn, res, y), want, strict=True):
        assert np.array_equal(_bits(a), _bits(b)), f"pending: {name}"


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


@pytest.mark.parametrize("shared_width", [256, 512], ids=["shared-fused", "shared-apart"])
def test_decode_bitwise_with_moe_fusions(monkeypatch: pytest.MonkeyPatch, shared_width: int) -> None:
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
    for fused in (False, True, "combine", "both"):
        for graph in (True, False):
            net.moe_route_fused = fused in (True, "both")
            net.moe_combine_fused = fused in ("combine", "both")
            net.cuda_graph = graph
            net.graphs.clear()
            calls.clear()
            runs[fused, graph] = greedy(seqs, prompts, 6)
            if (
                net.moe_route_fused and not graph
            ):  # eager: every decode call (<= 8 rows) routes in the experts
                assert calls and all(r > 8 for r in calls), f"moe_route still called for {calls} rows"
            if not fused and not graph:  # the spy sees the decode calls when they route apart
                assert any(r <= 8 for r in calls)
    net.moe_route_fused = net.moe_combine_fused = False
    net.cuda_graph = True
    net.graphs.clear()
    base_t, base_l = runs[False, True]
    for key, (t, lg) in runs.items():
        assert t == base_t, f"{key}: tokens differ"
        assert np.array_equal(lg, base_l), f"{key}: logits differ"
