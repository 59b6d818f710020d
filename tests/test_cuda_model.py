"""CUDA network and runner against the NumPy reference, transformers and the engine (issue 5 acceptance).

GPU tests (marked ``gpu``) skip without a CUDA device. Errors are max |got - ref| / max |ref| over logits. The CPU
tests at the end check the pure-host parts (row metadata, memory plan arithmetic).
Set NINFER_GPU_REPORT_MODEL=<path> to collect the measured errors and agreements as JSON.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import numpy as np
import pytest
from cuda_decode import greedy

from ninfer.config import ModelConfig
from ninfer.cuda.memory_plan import plan_memory, snapshot_bytes
from ninfer.cuda.model_graph import host_meta
from ninfer.demo import midsize_config, random_weights
from ninfer.evaluate.perplexity import mean_kl
from ninfer.reference import DictWeights, Qwen36

gpu = pytest.mark.gpu
NVFP4 = "NVFP4G16_E4M3S"
# fp32 activations (GEMV, or tensor-core GEMM with exact operands): bf16 KV cache and accumulation order only
TOL_HF = {"fp32": 3e-2}  # BF16-encoded weights vs fp32 transformers
TOL_REF = {"fp32": 2e-2}  # same weights
# bf16 activations on the tiny parity checkpoints: this checkpoint amplifies rounding (NumPy reference with every
# linear's input and output rounded to bf16 plus a bf16 KV cache: 0.51 dense, 0.51 MoE; bf16 GEMM operands alone,
# emulated: 0.374 / 0.541, exactly what the H200 measured before the GEMM took exact operands), so bf16 modes get a
# bound that only catches gross errors; their kernels are checked op by op and on the mid-size models.
TOL_TINY_BF16 = 0.75


@pytest.fixture(scope="session")
def report() -> Any:
    rows: dict[str, Any] = {}
    yield rows
    path = os.environ.get("NINFER_GPU_REPORT_MODEL")
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def _err(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(got).all(), "non-finite logits"
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def _pair(cfg: ModelConfig, weights: Any, fmt: str, **opts: Any) -> tuple[Any, Any]:
    """(CUDA net, reference net) over the same encoded weights (the reference sees them dequantized)."""
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import encode_weights, upload_encoded
    from ninfer.formats import FORMATS

    enc = encode_weights(cfg, weights, fmt)
    deq = {n: FORMATS[f].decode(b, s) for n, (f, s, b) in enc.items()}
    return CudaQwen36(cfg, upload_encoded(cfg, enc), **opts), Qwen36(cfg, DictWeights(deq))


def _sequences(net: Any) -> Any:
    """Sequences over fresh pools of ``net``, sized as the network's own standalone pool was (8 slots, 16K
    positions each, 2048 pages of 16)."""
    from ninfer.cuda.sequences import Sequences

    return Sequences(net, slots=8, context=16384, pages=2048, page_size=16)


# ---- tiny transformers-parity checkpoints ------------------------------------------------------------------
def _round_matrices_bf16(hf: Any) -> None:
    """Round the HF model's matrices to bf16 in place, as the CUDA net stores them (BF16; conv taps stay float32).

    This checkpoint amplifies bf16 weight rounding: against the fp32 original the exact fp32 CUDA path measured
    0.070 (dense) and 0.63 (MoE) on the H200 while matching the reference on the same weights to 6e-4; with the
    rounded weights the NumPy reference matches transformers to 3e-5."""
    import torch

    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.ndim >= 2 and "conv1d" not in name:
                p.copy_(p.to(torch.bfloat16).to(p.dtype))


def _tiny(kind: str) -> tuple[ModelConfig, dict[str, np.ndarray], Any]:
    """The tiny parity checkpoint (config, canonical weights, HF model) or, where this transformers cannot build
    it, the same config with demo-style random weights and no HF model."""
    try:
        from hf_tiny import canonical_state_dict, make_tiny_hf

        hf, hf_cfg = make_tiny_hf(kind, 0)
        _round_matrices_bf16(hf)
        return ModelConfig.from_hf(hf_cfg), canonical_state_dict(hf), hf
    except Exception:  # noqa: BLE001 - an older transformers on the GPU machine: keep the reference check
        from hf_tiny import tiny_config_kwargs

        kw = tiny_config_kwargs(kind)
        kw["model_type"] = "qwen3_5_text" if kind == "dense" else "qwen3_5_moe_text"
        cfg = ModelConfig.from_hf(kw)
        return cfg, random_weights(cfg, seed=0), None


MODES = ["bf16", "bf16-gemv", "fp32", "fp32-gemv"]


@gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_tiny_logits_vs_reference_and_transformers(kind: str, mode: str, report: dict) -> None:
    """Chunked prefill (5 rows by GEMV, 32 by GEMM or GEMV blocks, 3 by GEMV) then 8 decode steps."""
    cfg, weights, hf = _tiny(kind)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, 48)
    act = mode.split("-")[0]
    net, ref = _pair(cfg, DictWeights(weights), "BF16", act_dtype=act, prefill_gemm=not mode.endswith("gemv"))
    seqs = _sequences(net)
    s = seqs.new()
    got = [net.lm_head(seqs.forward(s, ids[a:b])) for a, b in ((0, 5), (5, 37), (37, 40))]
    got += [net.lm_head(seqs.forward_batch(ids[i : i + 1], [s])) for i in range(40, 48)]  # decode steps
    got = np.concatenate(got)
    tol_ref, tol_hf = (TOL_REF[act], TOL_HF[act]) if act == "fp32" else (TOL_TINY_BF16, TOL_TINY_BF16)
    src = "hf" if hf is not None else "random"
    err_ref = _err(got, ref.lm_head(ref.forward(ids, ref.new_state())))
    report[f"tiny-{kind}-{mode}-vs-reference"] = {"err": err_ref, "weights": src}
    if hf is not None:
        import torch

        with torch.no_grad():
            want = hf(torch.as_tensor(ids[None])).logits[0].double().numpy()
        report[f"tiny-{kind}-{mode}-vs-transformers"] = _err(got, want)
    assert err_ref <= tol_ref, (
        f"{kind}/{mode} ({src} weights): logits differ from the reference by {err_ref:.3e}"
    )
    if hf is not None:
        err_hf = report[f"tiny-{kind}-{mode}-vs-transformers"]
        assert err_hf <= tol_hf, f"{kind}/{mode}: logits differ from transformers by {err_hf:.3e}"


# ---- mid-size random models: teacher-forced top-1 agreement with the reference ------------------------------
@functools.cache
def _mid_reference(kind: str) -> tuple[ModelConfig, dict, np.ndarray, np.ndarray]:
    """(config, NVFP4 encodings, token ids, reference logits: 300-token prefill then 20 decode steps)."""
    from ninfer.cuda.upload import encode_weights
    from ninfer.formats import FORMATS

    cfg = midsize_config(kind)
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=7)), NVFP4)
    ref = Qwen36(cfg, DictWeights({n: FORMATS[f].decode(b, s) for n, (f, s, b) in enc.items()}))
    ids = np.random.default_rng(2).integers(0, cfg.vocab_size, 320)
    rs = ref.new_state()
    want = [ref.lm_head(ref.forward(ids[:300], rs))]
    want += [ref.lm_head(ref.forward(ids[i : i + 1], rs)) for i in range(300, 320)]
    return cfg, enc, ids, np.concatenate(want)


# Top-1 floors. fp32 activations (GEMV, or GEMM with exact operands) follow the reference up to accumulation
# order: 1.000 measured with GEMV. bf16 activations flip near-tied random logits and, in the MoE, router choices:
# the NumPy reference with every linear's input and output rounded to bf16 and a bf16 KV cache agrees on 0.994
# (dense) and 0.897 (MoE) of these positions, so the bf16 floors sit below that emulation.
# fp32-f16in (float32 activations, prefill GEMM inputs rounded to fp16 per row, ``prefill_inputs="fp16"``): the
# NumPy reference with every prefill linear's input so rounded (perf/fidelity_prefill.py, experts included, which
# the CUDA MoE keeps exact) agrees on 1.000 (dense) and 0.997 (MoE), mean KL 4e-7 / 2e-5.
TOP1_FLOOR = {("dense", "fp32"): 0.99, ("moe", "fp32"): 0.99, ("dense", "bf16"): 0.97, ("moe", "bf16"): 0.85,
              ("dense", "fp32-f16in"): 0.99, ("moe", "fp32-f16in"): 0.98}  # fmt: skip


@gpu
@pytest.mark.parametrize("mode", [*MODES, "fp32-f16in"])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_midsize_top1_agreement(kind: str, mode: str, report: dict) -> None:
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import upload_encoded

    cfg, enc, ids, want = _mid_reference(kind)
    act = mode.split("-")[0]
    inputs = "fp16" if mode.endswith("f16in") else "exact"
    net = CudaQwen36(cfg, upload_encoded(cfg, enc), act_dtype=act, prefill_gemm=not mode.endswith("gemv"),
                     prefill_inputs=inputs)  # fmt: skip
    seqs = _sequences(net)
    s = seqs.new()
    got = [net.lm_head(seqs.forward(s, ids[:300]))]
    got += [net.lm_head(seqs.forward_batch(ids[i : i + 1], [s])) for i in range(300, 320)]
    got = np.concatenate(got)
    agree = float(np.mean(got.argmax(-1) == want.argmax(-1)))
    report[f"mid-{kind}-{mode}"] = {"top1": agree, "err": _err(got, want), "kl": mean_kl(want, got)}
    floor = TOP1_FLOOR[kind, "fp32-f16in" if inputs == "fp16" else act]
    assert agree >= floor, (
        f"{kind}/{mode}: top-1 agreement {agree:.3f} < {floor} (max err {_err(got, want):.3e})"
    )


@gpu
def test_head256_prefill_wgmma_attention_gives_the_mma_sync_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The served models' head size (256) takes the wgmma prefill attention by default on Hopper; a mid-size dense
    model with that head size prefills a prompt in two turns (the second resumed after the first) to the same
    logits, bit for bit, with the mma.sync kernel forced instead. (Resumed and one-turn prefills are not compared
    here: in this mode they differ by design, docs/cuda.md "Prefill GEMM inputs".)"""
    import dataclasses

    from ninfer.cuda import attention_prefill as ap
    from ninfer.cuda.loader import compute_capability, family_supported
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import encode_weights, upload_encoded

    if not family_supported("attention_wg.cu", compute_capability()):
        pytest.skip("the wgmma attention compiles for sm_90a only")
    cfg = dataclasses.replace(midsize_config("dense"), head_dim=256, partial_rotary_factor=0.125)
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=11)), NVFP4)
    net = CudaQwen36(cfg, upload_encoded(cfg, enc), prefill_gemm=True, prefill_attention="exact")
    ids = np.random.default_rng(5).integers(0, cfg.vocab_size, 700)
    assert ap.pick_variant(256, cfg.num_attention_heads // cfg.num_key_value_heads) == "wg"

    def prefill(parts: tuple[slice, ...]) -> np.ndarray:
        seqs = _sequences(net)
        s = seqs.new()
        out = [net.lm_head(seqs.forward(s, ids[p])) for p in parts]
        return np.concatenate(out)

    turns = (slice(0, 450), slice(450, 700))
    wg = prefill(turns)
    monkeypatch.setattr(ap, "pick_variant", lambda d, group, precision="exact": "gqa")
    sync = prefill(turns)
    assert np.array_equal(sync.view(np.uint32), wg.view(np.uint32)), (
        f"wgmma and mma.sync attention give different logits: max |diff| {np.max(np.abs(sync - wg)):.3e}"
    )


@gpu
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_head256_prefill_ws_attention_gives_the_wg_bits(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the default precision ("bf16") "auto" takes the warp-specialized attention (attention_ws.cu); a mid-size
    model with head size 256 prefills a prompt in two turns to the same logits, bit for bit, as with the wgmma
    kernel it reorganises ("wg")."""
    import dataclasses

    from ninfer.cuda import attention_prefill as ap
    from ninfer.cuda.loader import compute_capability, family_supported
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import encode_weights, upload_encoded

    if not family_supported("attention_ws.cu", compute_capability()):
        pytest.skip("the warp-specialized attention compiles for sm_90a only")
    cfg = dataclasses.replace(midsize_config(kind), head_dim=256, partial_rotary_factor=0.125)
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=17)), NVFP4)
    net = CudaQwen36(cfg, upload_encoded(cfg, enc), prefill_gemm=True, prefill_attention="bf16")
    ids = np.random.default_rng(8).integers(0, cfg.vocab_size, 700)
    assert ap.pick_variant(256, cfg.num_attention_heads // cfg.num_key_value_heads, "bf16") == "ws"

    def prefill() -> np.ndarray:
        seqs = _sequences(net)
        s = seqs.new()
        return np.concatenate(
            [net.lm_head(seqs.forward(s, ids[p])) for p in (slice(0, 450), slice(450, 700))]
        )

    ws = prefill()
    monkeypatch.setattr(ap, "WS_AUTO", False)
    wg = prefill()
    assert np.array_equal(ws.view(np.uint32), wg.view(np.uint32)), (
        f"ws and wg attention give different logits: max |diff| {np.max(np.abs(ws - wg)):.3e}"
    )


@gpu
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_head256_prefill_attention_precision(kind: str, report: dict) -> None:
    """The default prefill attention (q and P rounded to bf16, the wgmma kernel at head size 256) against the exact
    one on a mid-size model with that head size: a 700-token prompt in two turns, then 20 decode steps; the rounding
    is applied (logits differ), teacher-forced top-1 agrees and the mean KL stays at the rounding's scale (the NumPy
    estimate, perf/fidelity_prefill.py: 1e-8 dense, 2e-6 MoE)."""
    import dataclasses

    from ninfer.cuda.loader import compute_capability, family_supported
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import encode_weights, upload_encoded

    if not family_supported("attention_wg.cu", compute_capability()):
        pytest.skip("the rounded precisions are the wgmma attention's (sm_90a)")
    cfg = dataclasses.replace(midsize_config(kind), head_dim=256, partial_rotary_factor=0.125)
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=13)), NVFP4)
    ids = np.random.default_rng(6).integers(0, cfg.vocab_size, 720)

    def logits(precision: str) -> np.ndarray:
        net = CudaQwen36(cfg, upload_encoded(cfg, enc), prefill_gemm=True, prefill_attention=precision)
        seqs = _sequences(net)
        s = seqs.new()
        out = [net.lm_head(seqs.forward(s, ids[p])) for p in (slice(0, 450), slice(450, 700))]
        out += [net.lm_head(seqs.forward_batch(ids[i : i + 1], [s])) for i in range(700, 720)]
        return np.concatenate(out).astype(np.float64)

    exact, got = logits("exact"), logits("bf16")
    assert not np.array_equal(exact, got), "the bf16 attention changed no logit"
    agree, kl = float(np.mean(got.argmax(-1) == exact.argmax(-1))), mean_kl(exact, got)
    report[f"head256-{kind}-attention-bf16"] = {"top1": agree, "kl": kl, "err": _err(got, exact)}
    assert agree >= 0.98 and kl <= 1e-4, (
        f"{kind}: top-1 {agree:.3f}, mean KL {kl:.2e} against exact attention"
    )


# ---- graphs, batch invariance ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moe_seqs() -> Any:
    """Sequences over the mid-size MoE network (one set of pools and graphs for the module)."""
    pytest.importorskip("cupy")
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import upload_encoded

    cfg, enc, _, _ = _mid_reference("moe")
    return _sequences(CudaQwen36(cfg, upload_encoded(cfg, enc)))


@gpu
def test_graph_and_eager_decode_bitwise_equal(moe_seqs: Any) -> None:
    prompts = [np.random.default_rng(i).integers(0, 4096, 40 + 9 * i) for i in range(3)]
    moe_seqs.net.cuda_graph = True
    t_graph, l_graph = greedy(moe_seqs, prompts, 16)
    moe_seqs.net.cuda_graph = False
    t_eager, l_eager = greedy(moe_seqs, prompts, 16)
    moe_seqs.net.cuda_graph = True
    assert t_graph == t_eager
    assert np.array_equal(l_graph, l_eager)


@gpu
def test_gemv_prefetch_changes_no_decode_value(moe_seqs: Any) -> None:
    """The decode GEMVs' L2 prefetch hints (``gemv_prefetch``: the order traced from the graph's warm-up step):
    graph-replayed greedy decode bitwise the decode without them, at 1 and 3 lanes; the hints were really on."""
    net = moe_seqs.net
    prompts = [np.random.default_rng(20 + i).integers(0, 4096, 30 + 11 * i) for i in range(3)]
    want = [greedy(moe_seqs, prompts[:1], 8), greedy(moe_seqs, prompts, 8)]
    net.gemv_prefetch, net.gemv_next = True, {}
    net.graphs.clear()
    try:
        got = [greedy(moe_seqs, prompts[:1], 8), greedy(moe_seqs, prompts, 8)]
        hinted = len(net.gemv_next)
    finally:
        net.gemv_prefetch, net.gemv_next = False, {}
        net.graphs.clear()
    assert hinted > 2 * net.cfg.num_hidden_layers, f"only {hinted} GEMVs traced for the prefetch order"
    for (tw, lw), (tg, lg) in zip(want, got, strict=True):
        assert tw == tg
        assert np.array_equal(lw.view(np.uint8), lg.view(np.uint8))


@gpu
def test_greedy_identical_at_1_and_8_lanes(moe_seqs: Any) -> None:
    prompts = [np.random.default_rng(10 + i).integers(0, 4096, 20 + 13 * i) for i in range(8)]
    batched, _ = greedy(moe_seqs, prompts, 12)
    solo = [greedy(moe_seqs, [p], 12)[0][0] for p in prompts]
    assert batched == solo


# ---- the engine on the CUDA runner -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda_models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(Model whose net is a CudaQwen36, a second Model over the same device weights) for the demo artifact."""
    pytest.importorskip("cupy")
    from ninfer.cuda.model import CudaQwen36, load_cuda
    from ninfer.demo import build_demo
    from ninfer.model import load

    path = build_demo(tmp_path_factory.mktemp("cuda-engine") / "demo.ninfer")
    a, b = load(path), load(path)
    a.net = load_cuda(path, prefill_gemm=False, progress=False)  # bitwise prefill == decode: reuse exact
    b.net = CudaQwen36(a.config, a.net.w, prefill_gemm=False)
    a.backend = b.backend = "cuda"  # the engine takes the backend's runner (Model.runner)
    return a, b


BATCHING = [
    ("test_batch_invariance", {"sampling": {}}),
    ("test_batch_invariance", {"sampling": {"temperature": 0.9, "top_p": 0.95, "top_k": 50}}),
    ("test_queue_full_fifo_and_cancel", {}),
    ("test_reservation_admission_waits_for_kv", {}),
    ("test_finish_reasons_and_usage", {}),
    ("test_stop_string_split_across_tokens", {}),
    ("test_stream_events_and_msgspec_roundtrip", {}),
    ("test_token_mask_hook", {}),
]
REUSE = [
    "test_six_turn_session_appending_tokens",
    "test_six_turn_session_rerendered_by_template",
    "test_pressure_ten_interleaved_sessions",
]


@gpu
@pytest.mark.parametrize("name,kw", BATCHING, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BATCHING)])
def test_engine_batching_on_cuda(name: str, kw: dict, cuda_models: Any) -> None:
    import test_engine_batching

    getattr(test_engine_batching, name)(cuda_models[0], **kw)


@gpu
@pytest.mark.parametrize("name", REUSE)
def test_engine_reuse_on_cuda(name: str, cuda_models: Any) -> None:
    import test_engine_reuse

    from ninfer.engine import Engine

    model, other = cuda_models
    kw = dict(test_engine_reuse.BASE, max_concurrency=1, queue_depth=64, kv_capacity=4096, prefix_reuse=False)
    with Engine.from_model(other, **kw) as plain:
        getattr(test_engine_reuse, name)(model, plain)


@gpu
def test_runner_reports_memory_plan(cuda_models: Any) -> None:
    from ninfer.engine import Engine

    with Engine.from_model(cuda_models[0], max_context=512, kv_capacity=2048, max_concurrency=2) as eng:
        runner = eng._runner
        plan = runner.plan
        assert plan.weights > 0 and plan.kv_pool == (2048 // 16 + 1) * runner.net.kc[0][0].nbytes * 2 * len(
            runner.net.kc
        )
        assert sorted(runner.net.graphs.captured) == [1, 2]
        assert "device memory plan" in plan.report()
        assert eng.memory_plan() == plan.as_dict() and plan.reserve == 0


@gpu
def test_runner_honours_the_memory_reserve(cuda_models: Any) -> None:
    """``--memory-reserve-gib``'s bytes reach the runner's plan: a reserve larger than the free memory makes the
    engine refuse to start with a MemoryPlanError naming the reserve; a small one is recorded in the plan."""
    import cupy

    from ninfer.cuda.memory_plan import MemoryPlanError
    from ninfer.engine import Engine

    net = cuda_models[0].net
    free, _ = cupy.cuda.runtime.memGetInfo()
    try:
        net.memory_reserve_bytes = 1 << 20
        with Engine.from_model(cuda_models[0], max_context=512, kv_capacity=2048, max_concurrency=1) as eng:
            assert eng.memory_plan()["reserve"] == 1 << 20
        net.memory_reserve_bytes = free + (1 << 30)
        with pytest.raises(MemoryPlanError, match="reserve"):
            Engine.from_model(cuda_models[0], max_context=512, kv_capacity=2048, max_concurrency=1)
    finally:
        net.memory_reserve_bytes = 0


@gpu
def test_engine_device_sampling_matches_cpu_sampler(
    cuda_models: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row the CUDA runner samples on the device gets the NumPy sampler's token for the same logits and
    inputs, and the same requests with device sampling off (the CPU sampler) generate the same tokens."""
    import cupy

    from ninfer.cuda.runner import CudaModelRunner
    from ninfer.engine import Engine
    from ninfer.engine.sampler import MaskError, sample

    seen: list[tuple[np.ndarray, list, Any, list[int]]] = []
    device_sample = CudaModelRunner.sample

    def spy(self: Any, rows: Any, reqs: Any, token_limit: Any) -> list[int]:
        toks = device_sample(self, rows, reqs, token_limit)
        logits = cupy.asnumpy(self._logits[list(rows)])
        seen.append((logits, [r._replace(counts=dict(r.counts)) for r in reqs], token_limit, toks))
        return toks

    monkeypatch.setattr(CudaModelRunner, "sample", spy)
    vocab = cuda_models[0].config.vocab_size
    allowed = np.random.default_rng(5).random(vocab) < 0.2
    kinds = [
        {},
        {"temperature": 0.9, "top_p": 0.95, "top_k": 50},
        {"temperature": 1.2, "min_p": 0.02, "presence_penalty": 0.8, "frequency_penalty": 0.3},
        {"temperature": 0.7, "repetition_penalty": 1.4, "token_mask": lambda g: allowed},
        {"temperature": 1.0, "token_mask": lambda g: np.zeros(vocab, bool)},  # fails alone
    ]

    def run(device: bool) -> list[tuple[str, list[int]]]:
        monkeypatch.setattr(CudaModelRunner, "device_sampling", device)
        prompts = [np.random.default_rng(30 + i).integers(0, 1000, 8 + 5 * i).tolist() for i in range(10)]
        with Engine.from_model(cuda_models[0], max_context=512, kv_capacity=4096, max_concurrency=4,
                               queue_depth=16) as eng:  # fmt: skip
            hs = [eng.submit(p, max_tokens=12, ignore_eos=True, seed=i, **kinds[i % len(kinds)])
                  for i, p in enumerate(prompts)]  # fmt: skip
            return [(c.finish_reason, c.token_ids) for c in (h.result(timeout=300) for h in hs)]

    on_device = run(True)
    assert seen and sum(len(toks) for *_, toks in seen) >= 40
    for logits, reqs, limit, toks in seen:
        for row, r, tok in zip(logits, reqs, toks, strict=True):
            try:
                want = sample(row, r.params, seed=r.seed, position=r.position, counts=r.counts,
                              token_limit=limit, mask=r.mask)  # fmt: skip
            except MaskError:
                want = -1
            assert tok == want, f"device token {tok} != CPU sampler {want} ({r.params})"
    assert [f for f, _ in on_device].count("error") == 2  # the two requests whose mask allows nothing
    assert run(False) == on_device


# ---- CPU: host metadata and memory-plan arithmetic ---------------------------------------------------------------
def test_host_meta_slots_and_tables() -> None:
    hm = host_meta([(3, 5, 4, [7, 2, 5]), (0, 0, 2, [9])], page_size=4, max_pages=3)
    assert hm["kv_slots"].tolist() == [2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 5 * 4 + 0, 9 * 4, 9 * 4 + 1]
    assert hm["page_table"].tolist() == [[7, 2, 5], [9, 0, 0]]
    assert hm["row_seq"].tolist() == [0, 0, 0, 0, 1, 1] and hm["row_pos"].tolist() == [5, 6, 7, 8, 0, 1]
    assert hm["starts"].tolist() == [0, 4, 6] and hm["gslots"].tolist() == [3, 0] and hm["max_len"] == 9
    assert hm["pos"].shape == (3, 6)
    with pytest.raises(ValueError, match="KV pages"):
        host_meta([(0, 0, 9, [1, 2])], page_size=4, max_pages=3)


def test_memory_plan_matches_spec_sizes() -> None:
    from ninfer.artifact.registry import MODELS

    mc = MODELS["qwen3.6-27b"].config
    assert snapshot_bytes(mc, "fp32") == 48 * (10240 * 3 * 4 + 48 * 128 * 128 * 4)  # 144 MiB + conv windows
    plan = plan_memory(
        mc, weights=14 << 30, free=120 << 30, lanes=8, checkpoints=32, num_pages=4096, page_size=16,
        max_context=65536, prefill_chunk=512, attn_chunk=512, kv_dtype="bf16", state_dtype="fp32",
        act_bytes=2, graphs=True,
    )  # fmt: skip
    assert plan.kv_pool == 4097 * 16 * 64 * 1024  # 64 KiB of bf16 K+V per token (docs/model-math.md §4)
    assert plan.total == sum(v for k, v in plan.as_dict().items() if k not in ("free", "total"))
    plan.check()
    with pytest.raises(MemoryError, match="does not fit"):
        plan_memory(mc, weights=14 << 30, free=20 << 30, **_PLAN_KW).check()


def test_memory_plan_leaves_the_reserve_free() -> None:
    """A plan that fits the free memory fails once a reserve for other programs is taken off it, and the
    report says so."""
    from ninfer.artifact.registry import MODELS

    mc = MODELS["qwen3.6-27b"].config
    kw = dict(_PLAN_KW, num_pages=4096)
    fits = plan_memory(mc, weights=14 << 30, free=40 << 30, **kw)
    fits.check()
    assert fits.reserve == 0 and fits.available == 40 << 30
    spare = fits.available - fits.total  # what the plan leaves over
    tight = plan_memory(mc, weights=14 << 30, free=40 << 30, reserve=spare + (1 << 30), **kw)
    assert tight.total == fits.total and tight.as_dict()["reserve"] == spare + (1 << 30)
    with pytest.raises(MemoryError, match="less a reserve"):
        tight.check()


_PLAN_KW = dict(
    lanes=8, checkpoints=32, num_pages=400000, page_size=16, max_context=65536, prefill_chunk=512,
    attn_chunk=512, kv_dtype="bf16", state_dtype="fp32", act_bytes=2, graphs=True,
)  # fmt: skip
