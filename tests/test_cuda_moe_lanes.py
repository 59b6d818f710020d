"""The MoE expert lanes on the GPU (ninfer/cuda/moe_lanes.py, cuda_src/moe_lanes.cu, gemv.cu ``experts == 2``).

Kernels: the device slot table equals the NumPy model of tests/test_gemv_lanes_host.py; the lanes GEMV (every
weight format, float and bf16 activations, 4 and 8 lanes, the SwiGLU prologue, launches split at any slot count)
matches the NumPy reference on fresh random inputs and is bitwise the one-lane ``gemv_experts`` per row. Model: a
35B-A3B-like tiny MoE (64 experts, top 8, shared expert) prefills through the lanes (8- and 4-lane chunks, checked
by a spy) within the GEMM path's tolerance of the NumPy reference, and in the exact mode a prefill chunk's logits
are bitwise its token-by-token decode. Skipped without a CUDA device (conftest).

    python -m pytest -m gpu tests/test_cuda_moe_lanes.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from moe_lanes_model import routing, table_model

from ninfer.cuda.sequences import Sequences
from ninfer.formats import FORMATS, bf16_decode, bf16_encode, bf16_round
from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32
TOL = {"float": 2e-5, "bf16": 1.2e-2}  # as tests/test_cuda_ops.py
MATRIX_FMTS = ("BF16", "FP8E4M3_F32ROW", "FP8E4M3_F32T", "NVFP4G16_E4M3S", "Q4G64_F16S", "Q5G64_F16S",
               "Q6G64_F16S", "W8G32_F16S")  # fmt: skip


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _weight(rng: np.random.Generator, fmt: str, shape: tuple[int, ...]) -> tuple[Any, np.ndarray]:
    from ninfer.cuda.weights import upload_weight

    codec = FORMATS[fmt]
    buf = codec.encode((rng.standard_normal(shape) * 0.5).astype(F32), shape)
    return upload_weight(fmt, shape, buf), codec.decode(buf, shape)


def _dev(cp: Any, x: np.ndarray, t: str) -> Any:
    return cp.asarray(bf16_encode(x) if t == "bf16" else np.asarray(x, dtype=F32))


def _host(cp: Any, a: Any) -> np.ndarray:
    h = cp.asnumpy(a)
    return bf16_decode(h) if h.dtype == np.uint16 else h.astype(F32)


def _poison(cp: Any, shape: tuple[int, ...], t: str) -> Any:
    return cp.full(shape, 0x7FC0, dtype=np.uint16) if t == "bf16" else cp.full(shape, np.nan, dtype=F32)


@pytest.mark.parametrize(
    "case", [(256, 8, 256, True, 8), (64, 8, 256, True, 4), (40, 3, 5, False, 8), (9, 1, 1, False, 4)]
)
def test_slot_table_on_device(cp: Any, case: tuple) -> None:
    from ninfer.cuda.moe_lanes import expert_lanes

    t, k, e, shared, nb = case
    ids, xrow, experts = routing(np.random.default_rng(t + e), t, k, e, shared)
    got = expert_lanes(cp.asarray(ids), cp.asarray(xrow), experts, nb)
    want = table_model(ids, xrow, experts, nb)
    for name, g, w in zip(("sid", "tx", "ts"), (got.sid, got.tx, got.ts), want, strict=True):
        assert np.array_equal(cp.asnumpy(g), w), f"{case}: {name} differs from the model"


def _lanes_case(
    cp: Any, rng: np.random.Generator, fmt: str, t: str, nb: int, n: int, k: int, swiglu: bool
) -> None:
    """Token rows routed top-3 over 5 experts + shared (uneven: experts with 0..many rows); gate|up style (x by
    token row) or down style (x by pair row, SwiGLU prologue)."""
    from ninfer.cuda.activation import swiglu as swiglu_kernel
    from ninfer.cuda.gemv_experts import gemv_experts
    from ninfer.cuda.moe_lanes import expert_lanes, expert_lanes_product

    tokens, top, e = 13, 3, 5
    ids, xrow, experts = routing(rng, tokens, top, e, True)
    s = ids.size
    w, wf = _weight(rng, fmt, (experts, n, k))
    xrows = s if swiglu else tokens
    x = (rng.standard_normal((xrows, 2 * k if swiglu else k)) * 2).astype(F32)
    x = bf16_round(x) if t == "bf16" else x
    xd = _dev(cp, x, t)
    table = expert_lanes(cp.asarray(ids), cp.asarray(xrow), experts, nb)
    out = _poison(cp, (s, n), t)
    expert_lanes_product(xd, w, table, n, out, gate_up=not swiglu, swiglu=swiglu)
    got = _host(cp, out)
    # one lane per pair (decode's dispatch): bitwise per row
    rows = np.arange(s, dtype=np.int32) if swiglu else xrow
    one = gemv_experts(xd, w, cp.asarray(ids), cp.asarray(rows), n, swiglu=swiglu)
    assert np.array_equal(cp.asnumpy(out), cp.asnumpy(one)), f"{fmt} {t} nb={nb}: a row differs from one lane"
    xin = _host(cp, swiglu_kernel(xd)) if swiglu else x  # the prologue is bitwise the standalone kernel
    ref = np.stack([ops.linear(xin[r : r + 1], wf[i])[0] for i, r in zip(ids, rows, strict=True)])
    assert np.isfinite(got).all(), f"{fmt} {t} nb={nb}: rows left unwritten"
    err = float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    assert err <= TOL[t], f"{fmt} {t} nb={nb} {n}x{k} swiglu={swiglu}: normalised error {err:.3e}"


@pytest.mark.parametrize("fmt", MATRIX_FMTS)
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_lanes_gemv_vs_reference_and_one_lane(cp: Any, fmt: str, t: str) -> None:
    """(96, 256): whole row blocks; (37, 2056): N off the row groups, K off the chunk widths, several K splits."""
    rng = np.random.default_rng(17)
    for nb in (4, 8):
        for (n, k), swiglu in (((96, 256), False), ((37, 2056), True), ((37, 2056), False)):
            _lanes_case(cp, rng, fmt, t, nb, n, k, swiglu)


def test_lanes_35b_shapes(cp: Any) -> None:
    """The 35B-A3B's expert shapes (gate|up 1024 x 2048: 4 K splits; down 2048 x 512), NVFP4, float activations."""
    rng = np.random.default_rng(5)
    _lanes_case(cp, rng, "NVFP4G16_E4M3S", "float", 8, 1024, 2048, False)
    _lanes_case(cp, rng, "NVFP4G16_E4M3S", "float", 8, 2048, 512, True)


def test_launch_split_changes_nothing(cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Launches of 3 slots (reusing the split partials and counters in turn) give the bits of one launch."""
    import ninfer.cuda.moe_lanes as ml

    rng = np.random.default_rng(3)
    ids, xrow, experts = routing(rng, 20, 4, 6, True)
    w, _ = _weight(rng, "NVFP4G16_E4M3S", (experts, 40, 1032))
    x = cp.asarray((rng.standard_normal((20, 1032))).astype(F32))
    table = ml.expert_lanes(cp.asarray(ids), cp.asarray(xrow), experts, 8)
    whole = ml.expert_lanes_product(x, w, table, 40, _poison(cp, (ids.size, 40), "float"), gate_up=True)
    monkeypatch.setattr(ml, "SLOTS_PER_LAUNCH", 3)
    parts = ml.expert_lanes_product(x, w, table, 40, _poison(cp, (ids.size, 40), "float"), gate_up=True)
    assert np.array_equal(cp.asnumpy(whole), cp.asnumpy(parts))


# ---- model level ---------------------------------------------------------------------------------------------
def _moe35_like() -> tuple[Any, dict[str, np.ndarray]]:
    """A tiny 35B-A3B-like MoE: 64 experts, top 8, a shared expert of an expert's width (fused as expert 64)."""
    from hf_tiny import tiny_config_kwargs

    from ninfer.config import ModelConfig
    from ninfer.demo import random_weights

    kw = tiny_config_kwargs("moe", hidden_size=128, num_experts=64, num_experts_per_tok=8,
                            moe_intermediate_size=64, shared_expert_intermediate_size=64)  # fmt: skip
    kw["model_type"] = "qwen3_5_moe_text"
    cfg = ModelConfig.from_hf(kw)
    return cfg, random_weights(cfg, seed=3)


def _net(cfg: Any, weights: dict, **opts: Any) -> tuple[Any, Any]:
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import encode_weights, upload_encoded
    from ninfer.reference import DictWeights, Qwen36

    enc = encode_weights(cfg, DictWeights(weights), "NVFP4G16_E4M3S")
    deq = {n: FORMATS[f].decode(b, s) for n, (f, s, b) in enc.items()}
    return CudaQwen36(cfg, upload_encoded(cfg, enc), **opts), Qwen36(cfg, DictWeights(deq))


@pytest.fixture
def lanes_spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lanes per slot of every slot table built (ffn_block imports expert_lanes at call time)."""
    import ninfer.cuda.moe_lanes as ml

    seen: list[int] = []
    real = ml.expert_lanes

    def spy(ids: Any, xrow: Any, experts: int, nb: int) -> Any:
        seen.append(nb)
        return real(ids, xrow, experts, nb)

    monkeypatch.setattr(ml, "expert_lanes", spy)
    return seen


def test_moe_prefill_through_lanes_matches_reference(cp: Any, lanes_spy: list[int], monkeypatch: Any) -> None:
    """Chunks of 40 tokens (5 rows per expert on average: 8 lanes) and 12 (1.5: 4 lanes with the 4-lane switch at 2
    rows, so both instances run on this 64-expert model), then 4 decode steps,
    against the NumPy reference; the same with the lanes switched off (grouped GEMM) for scale."""
    import ninfer.cuda.model_layers as layers
    import ninfer.cuda.moe_lanes as ml

    monkeypatch.setattr(ml, "LANES_NB4_MAX_AVG_ROWS", 2)
    cfg, weights = _moe35_like()
    net, ref = _net(cfg, weights)
    ids = np.random.default_rng(4).integers(0, cfg.vocab_size, 56)
    want = ref.lm_head(ref.forward(ids, ref.new_state()))

    def run() -> np.ndarray:
        seqs = Sequences(net, slots=1, context=64)
        st = seqs.new()
        got = [net.lm_head(seqs.forward(st, ids[a:b])) for a, b in ((0, 40), (40, 52))]
        got += [net.lm_head(seqs.forward_batch(ids[i : i + 1], [st])) for i in range(52, 56)]
        return np.concatenate(got)

    def err(got: np.ndarray) -> float:
        assert np.isfinite(got).all()
        return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))

    lanes = err(run())
    layers_moe = cfg.num_hidden_layers  # every layer of this model is MoE
    assert lanes_spy == [8] * layers_moe + [4] * layers_moe, f"lanes per chunk and layer: {lanes_spy}"
    monkeypatch.setattr(layers, "use_lanes", lambda pairs, experts: False)
    gemm = err(run())
    assert lanes <= 2e-2, (
        f"lanes prefill: logits differ from the reference by {lanes:.3e} (GEMM path {gemm:.3e})"
    )


def test_exact_mode_prefill_is_decode_bitwise(cp: Any, lanes_spy: list[int]) -> None:
    """prefill_gemm=False: a 24-token chunk (lanes, shared expert fused) gives every row's logits bitwise as 24
    single-token decode calls (one-lane expert GEMV)."""
    cfg, weights = _moe35_like()
    net, _ = _net(cfg, weights, prefill_gemm=False)
    ids = np.random.default_rng(6).integers(0, cfg.vocab_size, 24)
    seqs = Sequences(net, slots=2, context=32)
    chunk = net.lm_head(seqs.forward(seqs.new(), ids))
    assert lanes_spy, "the exact-mode chunk did not take the expert lanes"
    st = seqs.new()
    steps = np.concatenate([net.lm_head(seqs.forward(st, ids[i : i + 1])) for i in range(24)])
    assert np.array_equal(chunk, steps), f"max |diff| {np.max(np.abs(chunk - steps)):.3e}"
