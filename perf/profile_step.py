"""Where a step's GPU time goes: every launch of the cuda_src kernels timed with CUDA events, by family.

    python -m perf.profile_step --model 27b          # on a GPU: eager decode at 8K context, a 4096-token prefill
    python -m perf.profile_step --fold both          # decode with the norms folded into the GEMVs and without
    python -m perf.profile_step --chunk 256 --prefill-at 8192   # a follow-up turn's chunk after an 8K prefix
    python -m perf.profile_step --timeline      # also every kernel of the prefill chunk (CuPy's glue included)

``--timeline`` records the prefill chunk again under the PyTorch profiler (CUPTI sees every kernel of the process,
CuPy's element-wise and sorting kernels too) and prints the GPU's busy and idle time over the chunk and the kernels
that took the most time, so ``other`` above can be told apart into glue kernels and idle gaps.

Every launch of the cuda_src kernels is timed with a CUDA event pair around it and counted under its family, one
name per cuda_src file (``gemm_sm90_ws``, ``gdn_chunk``, ``norm``, ...; ``--by kernel``: per kernel, its template
arguments dropped): perf/launch_spans.py, which intercepts the loader (every kernel function comes from
``loader.kernel``) and the driver launch (``launch._driver``), so no call site escapes it. Per-wrapper names (the
public functions of ``ninfer.cuda.FAMILY_MODULES``, patched one by one) missed every launch from modules outside
that list and from call sites holding a wrapper directly. What no kernel of ours covers (CuPy's element-wise glue,
copies, fills and sorts, and the GPU's idle gaps, host scheduling and launch latency) shows as ``other``: the wall
time less the sum. Decode is eager here (no CUDA graph), so ``other`` includes launch overhead that graph replay
removes.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

import numpy as np

from .launch_spans import by_kernel, by_source, profile

__all__ = ["profile", "main"]


def _summary(calls: dict[str, list], wall: float) -> dict[str, float]:
    import cupy

    cupy.cuda.Device().synchronize()
    out = {n: sum(cupy.cuda.get_elapsed_time(s, e) for s, e in ev) * 1e-3 for n, ev in calls.items()}
    out["other"] = wall - sum(out.values())
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _run(label: str, fn: Any, by: str = "source") -> dict[str, float]:
    import cupy

    fn()  # warm-up (allocations, first launches)
    cupy.cuda.Device().synchronize()
    with profile(by_kernel if by == "kernel" else by_source) as calls:
        t0 = time.perf_counter()
        fn()
        cupy.cuda.Device().synchronize()
        wall = time.perf_counter() - t0
    res = _summary(calls, wall)
    print(
        f"{label}: {wall * 1e3:.1f} ms  "
        + "  ".join(f"{k} {v * 1e3:.1f}" for k, v in res.items() if v > 5e-5)
    )
    return {"wall_s": wall, **res}


def _short(name: str) -> str:
    """A kernel's name without its argument list (templates kept), at most 90 characters."""
    depth, out = 0, []
    for ch in name:
        if ch == "(" and depth == 0:
            break
        depth += ch == "<"
        depth -= ch == ">"
        out.append(ch)
    return "".join(out)[:90]


def timeline(label: str, fn: Any, top: int = 25) -> dict[str, Any]:
    """``fn`` once under the PyTorch profiler (CUDA activity): busy / idle GPU time over its span and the kernels
    that took the most time. Needs torch (the device image has it); returns {} without it."""
    import cupy

    try:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as tprofile
    except ImportError:
        print(f"{label}: timeline needs torch")
        return {}
    cupy.cuda.Device().synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        cupy.cuda.Device().synchronize()
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type.name == "CUDA" and "Memcpy" not in e.name and "Memset" not in e.name
    )
    if not spans:
        return {}
    busy, end, by = 0.0, spans[0][0], defaultdict(lambda: [0, 0.0])
    for s0, s1, name in spans:
        busy += max(0.0, s1 - max(s0, end))
        end = max(end, s1)
        by[_short(name)][0] += 1
        by[_short(name)][1] += s1 - s0
    span = end - spans[0][0]
    rows = sorted(by.items(), key=lambda kv: -kv[1][1])[:top]
    print(
        f"{label} timeline: {len(spans)} kernels over {span / 1e3:.2f} ms, busy {busy / 1e3:.2f} ms, idle {(span - busy) / 1e3:.2f} ms"
    )
    for name, (n, us) in rows:
        print(f"  {us / 1e3:8.3f} ms  {n:5d}x  {name}")
    return {
        "kernels": len(spans),
        "span_ms": span / 1e3,
        "busy_ms": busy / 1e3,
        "top": [[k, n, us / 1e3] for k, (n, us) in rows],
    }


def _profile_model(key: str, a: argparse.Namespace) -> dict[str, Any]:
    from ninfer.artifact.registry import MODELS as REG
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences

    from .cli import MODELS, OPERAND_LEAVE
    from .synthetic import synthetic_tensors

    mc = REG[MODELS[key]].config
    t0 = time.perf_counter()

    def mark(what: str) -> None:  # a run stopped by its time limit still shows how far it got
        print(f"[{time.perf_counter() - t0:7.1f} s] {key}: {what}", flush=True)

    mark("building")
    net = CudaQwen36(mc, synthetic_tensors(mc, a.profile), act_dtype=a.activations, cuda_graph=False)
    mark("built")
    net.warmup()
    mark("warm")
    pages = -(-(max(a.context, a.prefill_at) + a.chunk + 64) // 16)
    seqs = Sequences(
        net, slots=4, pages=pages * 2, page_size=16, context=max(a.context, a.prefill_at) + a.chunk + 64
    )
    net.prefill_weights = a.prefill_weights
    net.keep_prefill_operands(leave=OPERAND_LEAVE)  # as ninfer-perf: the server's default
    mark("allocated")
    st = seqs.new()
    seqs.reserve(st, a.context + 8)
    lane = (seqs.slot(st), a.context, seqs.pages(st))
    ids = np.zeros(1, np.int64)
    res = {}
    for fold in {"on": (True,), "off": (False,), "both": (False, True)}[a.fold]:
        net.fold_norms = fold  # docs/cuda.md, "Norm folding"
        name = "decode_1" if a.fold != "both" else f"decode_1_fold_{'on' if fold else 'off'}"
        res[name] = _run(f"{key} decode x1 @{a.context} fold={fold}", lambda: net.decode(ids, [lane]), a.by)
    net.fold_norms = True
    pre = seqs.new()
    chunk = np.random.default_rng(0).integers(0, mc.vocab_size, a.chunk)

    seqs.reserve(pre, a.prefill_at + a.chunk)

    def prefill() -> None:  # at prefill_at: a follow-up turn's chunk over a kept prefix (its KV values unset)
        seqs.seek(pre, a.prefill_at)
        seqs.forward(pre, chunk)

    res["prefill_chunk"] = _run(f"{key} prefill {a.chunk} @{a.prefill_at}", prefill, a.by)
    if a.timeline:
        res["timeline"] = timeline(f"{key} prefill {a.chunk} @{a.prefill_at}", prefill)
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m perf.profile_step")
    p.add_argument("--model", default="27b,35b")
    p.add_argument("--profile", default="nvfp4")
    p.add_argument("--activations", default="fp32")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--chunk", type=int, default=4096, help="prefill chunk (the server's default)")
    p.add_argument(
        "--prefill-at",
        type=int,
        default=0,
        help="the chunk's first position (e.g. 8192 with --chunk 256: a follow-up)",
    )
    p.add_argument(
        "--timeline", action="store_true", help="every kernel of the prefill chunk (torch profiler)"
    )
    p.add_argument("--fold", choices=("on", "off", "both"), default="on", help="decode with norm folding")
    p.add_argument("--prefill-weights", default="auto", choices=("auto", "resident", "scratch"))
    p.add_argument(
        "--by", choices=("source", "kernel"), default="source", help="time per cuda_src file or per kernel"
    )
    a = p.parse_args(argv)
    return {key: _profile_model(key, a) for key in a.model.split(",")}


if __name__ == "__main__":
    main()
