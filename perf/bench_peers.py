"""Ceilings re-measured in the same run (copy bandwidth, cuBLAS bf16 GEMM) and the stock transformers peer.

transformers runs the real layer shapes with fewer layers (first ``layers`` of the layer pattern, which includes a
full-attention layer at 4), bf16 random weights, its torch fallbacks for GDN and conv; full-depth times are the
measured times scaled by ``num_hidden_layers / layers`` (so the embedding and LM head are over-counted a little,
which favours nobody by much: they are ~1/L of a step).
"""

from __future__ import annotations

import time
from typing import Any

from ninfer.config import ModelConfig

__all__ = ["copy_bandwidth", "event_seconds", "graph_seconds", "gemm_bf16", "transformers_peer"]


def event_seconds(fn: Any, reps: int = 10, warmup: int = 1) -> float:
    """Median seconds of one ``fn()`` on the current stream: CUDA events around each call, after ``warmup`` calls
    (the kernel micro-benchmarks' timer)."""
    import statistics

    import cupy

    for _ in range(warmup):
        fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e-3)
    return statistics.median(times)


def graph_seconds(fns: list[Any], reps: int = 10) -> float:
    """Median seconds per call of ``fns`` captured back to back in one CUDA graph (as a decode step replays its
    kernels: no Python launch cost, the graph's inter-kernel gaps included). Pass calls on different buffers
    (more bytes than the L2) so each one reads device memory, not the cache."""
    import statistics

    import cupy

    cupy.cuda.Device().synchronize()  # inputs written on other streams are complete before this one reads them
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for f in fns:  # warm-up: compiles, allocates workspaces outside the capture
            f()
        stream.synchronize()
        stream.begin_capture()
        try:
            for f in fns:
                f()
        finally:
            graph = stream.end_capture()
        graph.upload(stream)
        graph.launch(stream)
        stream.synchronize()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(reps):
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e-3 / len(fns))
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second (the convention of every ceiling here)."""
    import cupy

    a = cupy.ones(nbytes, dtype=cupy.uint8)
    b = cupy.empty_like(a)
    b[...] = a
    s, e = cupy.cuda.Event(), cupy.cuda.Event()
    s.record()
    for _ in range(reps):
        b[...] = a
    e.record()
    e.synchronize()
    dt = cupy.cuda.get_elapsed_time(s, e) * 1e-3 / reps
    del a, b
    cupy.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / dt


def gemm_bf16(n: int = 8192, reps: int = 10) -> dict[str, Any]:
    """cuBLAS bf16 GEMM n^3 through torch (random data); falls back to cupy float16 when torch is missing."""
    try:
        import torch

        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        torch.cuda.synchronize()
        dt, how = (time.perf_counter() - t0) / reps, "torch bf16"
        del a, b
        torch.cuda.empty_cache()
    except ImportError:
        import cupy

        a = cupy.random.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
        a @ a
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ a
        cupy.cuda.Device().synchronize()
        dt, how = (time.perf_counter() - t0) / reps, "cupy fp16"
    return {"flops": 2 * n**3 / dt, "n": n, "how": how}


def _hf_config(mc: ModelConfig, layers: int) -> Any:
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    kw = dict(
        vocab_size=mc.vocab_size, hidden_size=mc.hidden_size, num_hidden_layers=layers,
        layer_types=list(mc.layer_types[:layers]), num_attention_heads=mc.num_attention_heads,
        num_key_value_heads=mc.num_key_value_heads, head_dim=mc.head_dim,
        linear_num_key_heads=mc.linear_num_key_heads, linear_num_value_heads=mc.linear_num_value_heads,
        linear_key_head_dim=mc.linear_key_head_dim, linear_value_head_dim=mc.linear_value_head_dim,
        linear_conv_kernel_dim=mc.linear_conv_kernel_dim, rms_norm_eps=mc.rms_norm_eps,
        rope_parameters=dict(rope_type="default", rope_theta=mc.rope_theta,
                             partial_rotary_factor=mc.partial_rotary_factor,
                             mrope_section=list(mc.mrope_section), mrope_interleaved=mc.mrope_interleaved),
    )  # fmt: skip
    if not mc.is_moe:
        return Qwen3_5TextConfig(intermediate_size=mc.intermediate_size, **kw)
    return Qwen3_5MoeTextConfig(
        num_experts=mc.num_experts, num_experts_per_tok=mc.num_experts_per_tok,
        moe_intermediate_size=mc.moe_intermediate_size,
        shared_expert_intermediate_size=mc.shared_expert_intermediate_size, **kw,
    )  # fmt: skip


def transformers_peer(
    mc: ModelConfig, *, layers: int = 4, prompt: int = 1024, steps: int = 8
) -> dict[str, Any]:
    """Stock transformers (bf16, sdpa) prefill and decode tok/s, scaled to the full depth."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(_hf_config(mc, layers), dtype=torch.bfloat16)
    model.eval()
    ids = torch.randint(0, mc.vocab_size, (1, prompt), device="cuda")
    scale = mc.num_hidden_layers / layers
    with torch.no_grad():
        model(ids[:, :64])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        torch.cuda.synchronize()
        t_pre = time.perf_counter() - t0
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        out = model(nxt, past_key_values=past, use_cache=True)  # first decode step: warm-up
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        t_dec = (time.perf_counter() - t0) / steps
    del model, out, past
    torch.cuda.empty_cache()
    return {
        "version": transformers.__version__, "layers_run": layers, "prompt": prompt,
        "prefill_tok_s": prompt / (t_pre * scale), "decode_tok_s": 1.0 / (t_dec * scale),
        "prefill_s_measured": t_pre, "decode_step_ms_measured": t_dec * 1e3,
    }  # fmt: skip
