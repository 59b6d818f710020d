"""Prefill GEMM (``ninfer.cuda.linear.gemm``: the wgmma kernel on an H200, cuda_src/gemm_sm90.cu) against cuBLAS
bf16 (torch) on the 27B projection shapes, measured in the same run.

    python -m perf.bench_gemm                      # on a GPU; prints a table, returns the rows
    python -m perf.bench_gemm --impl mma           # the mma.sync kernel (cuda_src/gemm.cu) instead

NVFP4, BF16, FP8 (row scales) and Q4 weights (random codes generated on the device, perf/synthetic.py), M = 2048
and 8192 rows, bf16 and float32 activations. FLOP/s counts 2·M·N·K; float32 activations run two MMAs per k-step
(exact hi/lo split), so their ceiling is half of cuBLAS's: the ``vs ceiling`` column is the fraction of cuBLAS for
bf16 and of half of cuBLAS for float32. CUDA-event timing, median of repeats after a warm-up (about 40 s warm on
an H200; the first run also compiles the gemm_sm90.cu family, ~2 min, unless CuPy's cache has it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .bench_peers import event_seconds

__all__ = ["main", "SHAPES", "FORMATS", "ROWS"]

SHAPES = (
    ("qkv_gdn", 10240, 5120),
    ("mlp_up", 17408, 5120),
    ("mlp_down", 5120, 17408),
    ("o_proj", 5120, 6144),
)
FORMATS = ("NVFP4G16_E4M3S", "BF16", "FP8E4M3_F32ROW", "Q4G64_F16S")
ROWS = (2048, 8192)


def _cublas(m: int, n: int, k: int) -> float:
    import torch

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / 10


def main(
    rows: tuple[int, ...] = ROWS, fmts: tuple[str, ...] = FORMATS, reps: int = 5, impl: str = "auto"
) -> list[dict[str, Any]]:
    import cupy

    from ninfer.cuda.linear import gemm

    from .synthetic import random_weight

    rs = cupy.random.RandomState(0)
    ref = {(m, n, k): _cublas(m, n, k) for m in rows for _, n, k in SHAPES}
    out_rows = []
    for fmt in fmts:
        for name, n, k in SHAPES:
            w = random_weight(fmt, (n, k), rs, 0.02)
            for m in rows:
                xf = rs.standard_normal((m, k), dtype=np.float32)
                for act, x in (("bf16", (xf.view(np.uint32) >> 16).astype(np.uint16)), ("fp32", xf)):
                    out = cupy.empty((m, n), dtype=x.dtype)
                    t = event_seconds(lambda x=x, out=out, w=w: gemm(x, w, out, impl=impl), reps=reps)
                    fl, tc = 2 * m * n * k, ref[(m, n, k)]
                    out_rows.append({
                        "shape": name, "m": m, "n": n, "k": k, "fmt": fmt, "act": act, "s": t,
                        "tflops": fl / t / 1e12, "cublas_tflops": fl / tc / 1e12, "frac_cublas": tc / t,
                        "frac_ceiling": tc / t * (2 if act == "fp32" else 1),
                    })  # fmt: skip
                del out
            del w
    print(
        f"{'gemm':26s} {'format':15s} {'act':4s} {'TFLOP/s':>8s} {'cuBLAS':>8s} {'ratio':>6s} {'vs ceiling':>10s}"
    )
    for r in out_rows:
        print(
            f"{r['shape']:8s} {r['m']:5d}x{r['n']:5d}x{r['k']:<5d} {r['fmt']:15s} {r['act']:4s} {r['tflops']:8.1f} "
            f"{r['cublas_tflops']:8.1f} {r['frac_cublas']:6.1%} {r['frac_ceiling']:10.1%}"
        )
    return out_rows


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m perf.bench_gemm")
    ap.add_argument("--impl", default="auto", choices=("auto", "wgmma", "mma"))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--formats", default=",".join(FORMATS))
    a = ap.parse_args()
    main(tuple(int(v) for v in a.rows.split(",")), tuple(a.formats.split(",")), impl=a.impl)
