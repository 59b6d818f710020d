"""Prefill attention micro-benchmark (GPU): tensor-core ``attention_prefill`` vs the warp-per-head ``attention``.

27B attention shape (24 query heads, 4 KV heads, head_dim 256, bf16 paged cache of 16-token pages), one sequence
prefilled from position 0 at 1K and 8K tokens, float32 and bf16 q. Timed with CUDA events (median of the reps
after a warm-up); TFLOP/s counts the causal FLOPs 4·HQ·D·T²/2, and ``frac_gemm`` compares with a torch bf16
8192³ GEMM measured in the same run. ``python -m perf.bench_attention`` (PYTHONPATH=.) prints one line per
case and returns the results as a dict.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .bench_peers import event_seconds, gemm_bf16

HQ, HKV, D, PAGE = 24, 4, 256, 16


def _case(t_len: int, qt: str, rng: np.random.Generator) -> dict[str, Any]:
    import cupy

    from ninfer.cuda.attention import attention
    from ninfer.cuda.attention_prefill import attention_prefill
    from ninfer.formats import bf16_encode

    pages = -(-t_len // PAGE)
    kc = cupy.asarray(bf16_encode(rng.standard_normal((pages, PAGE, HKV, D)).astype(np.float32)))
    vc = cupy.asarray(bf16_encode(rng.standard_normal((pages, PAGE, HKV, D)).astype(np.float32)))
    q = rng.standard_normal((t_len, HQ, D)).astype(np.float32)
    qd = cupy.asarray(bf16_encode(q) if qt == "bf16" else q)
    table = cupy.asarray(rng.permutation(pages).astype(np.int32)[None])
    row_seq = cupy.zeros(t_len, dtype=np.int32)
    row_pos = cupy.arange(t_len, dtype=np.int32)
    args = (qd, kc, vc, table, row_seq, row_pos)
    new_ms = 1e3 * event_seconds(lambda: attention_prefill(*args, max_len=t_len), 10)
    old_ms = 1e3 * event_seconds(lambda: attention(*args, max_len=t_len), 3 if t_len > 2048 else 10)
    a, b = attention_prefill(*args, max_len=t_len), attention(*args, max_len=t_len)
    if qt == "bf16":
        a, b = a.view(cupy.uint16).astype(cupy.uint32) << 16, b.view(cupy.uint16).astype(cupy.uint32) << 16
        a, b = a.view(cupy.float32), b.view(cupy.float32)
    diff = float(cupy.max(cupy.abs(a - b)) / cupy.max(cupy.abs(b)))
    flops = 4 * HQ * D * t_len**2 / 2
    return {"T": t_len, "q": qt, "new_ms": new_ms, "old_ms": old_ms, "speedup": old_ms / new_ms,
            "new_tflops": flops / (new_ms * 1e-3) / 1e12, "old_tflops": flops / (old_ms * 1e-3) / 1e12,
            "max_rel_diff": diff}  # fmt: skip


def main() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    gemm = gemm_bf16()["flops"] / 1e12
    print(f"torch bf16 GEMM 8192^3: {gemm:.0f} TFLOP/s")
    cases = []
    for t_len in (1024, 8192):
        for qt in ("float", "bf16"):
            c = _case(t_len, qt, rng)
            c["frac_gemm"] = c["new_tflops"] / gemm
            cases.append(c)
            print(f"attention T={t_len} q={qt} HQ={HQ} HKV={HKV} D={D}: tensor-core {c['new_ms']:.2f} ms "
                  f"({c['new_tflops']:.1f} TFLOP/s, {c['frac_gemm']:.1%} of GEMM) vs warp kernel "
                  f"{c['old_ms']:.2f} ms ({c['old_tflops']:.2f} TFLOP/s): {c['speedup']:.1f}x; "
                  f"max rel diff {c['max_rel_diff']:.1e}")  # fmt: skip
    res = {"gemm_tflops": gemm, "cases": cases}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
