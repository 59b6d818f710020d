"""Prefill GEMM (cuda_src/gemm.cu) against cuBLAS bf16 (torch) on the 27B projection shapes, same run.

    python -m perf.bench_gemm            # on a GPU; prints a table, returns the rows

FLOP/s counts 2·M·N·K; float32 activations run two MMAs per fragment (exact hi/lo split), so their ceiling is half
of cuBLAS's. CUDA-event timing, median of repeats after a warm-up.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .bench_peers import event_seconds

__all__ = ["main"]

SHAPES = (
    ("qkv_gdn", 10240, 5120),
    ("mlp_up", 17408, 5120),
    ("mlp_down", 5120, 17408),
    ("o_proj", 5120, 6144),
)


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


def main(m: int = 2048, fmt: str = "NVFP4G16_E4M3S") -> list[dict[str, Any]]:
    import cupy

    from ninfer.cuda.linear import gemm
    from ninfer.cuda.weights import upload_weight
    from ninfer.formats import FORMATS

    rng = np.random.default_rng(0)
    rows = []
    for name, n, k in SHAPES:
        buf = FORMATS[fmt].encode((rng.standard_normal((n, k)) * 0.02).astype(np.float32), (n, k))
        w = upload_weight(fmt, (n, k), buf)
        ref = _cublas(m, n, k)
        for act, dt in (("fp32", np.float32), ("bf16", np.uint16)):
            x = cupy.asarray(rng.standard_normal((m, k)).astype(np.float32))
            if dt == np.uint16:
                x = (x.view(np.uint32) >> 16).astype(np.uint16)
            out = cupy.empty((m, n), dtype=dt)
            t = event_seconds(lambda x=x, out=out, w=w: gemm(x, w, out))
            fl = 2 * m * n * k
            rows.append({"shape": name, "m": m, "n": n, "k": k, "fmt": fmt, "act": act, "s": t,
                         "tflops": fl / t / 1e12, "cublas_tflops": fl / ref / 1e12, "frac_cublas": ref / t})  # fmt: skip
    print(f"{'gemm ' + fmt:28s} {'act':4s} {'TFLOP/s':>8s} {'cuBLAS':>8s} {'ratio':>6s}")
    for r in rows:
        print(
            f"{r['shape']:10s} {r['m']}x{r['n']}x{r['k']:<6d} {r['act']:4s} {r['tflops']:8.1f} "
            f"{r['cublas_tflops']:8.1f} {r['frac_cublas']:6.1%}"
        )
    return rows


if __name__ == "__main__":
    main()
