"""The GDN output norm of a prefill chunk on the GPU: ``gated_rmsnorm(f16=True)`` (norm.cu: the norm writing the
out-projection's fp16 rows itself, one block per token; ``gated_rmsnorm_f16r`` with a token's values in registers,
and the two-pass ``gated_rmsnorm_f16``) against ``gated_rmsnorm`` (one warp
per (token, head) row, float32 out) followed by ``split_f16row`` (the GEMM's own row split), and a device copy of
the bytes the fused kernel must move at least (o and z read, the fp16 rows written) for scale. Random inputs at
the 27B (48 value heads) and 35B-A3B (32) shapes, dk = dv = 128, z a column slice of a wider projection as served.

    python -m perf.bench_gated_norm [--tokens 4096] [--reps 20]
"""

from __future__ import annotations

import argparse

import numpy as np

from .bench_peers import event_seconds

__all__ = ["main"]

HEADS = {"27b": 48, "35b": 32}


def bench(model: str, tokens: int, reps: int) -> str:
    """One line: microseconds per call of each way, and the copy ceiling."""
    import cupy

    from ninfer.cuda import norm
    from ninfer.cuda.gemm import _sm90_kernel
    from ninfer.cuda.gemm_pair import f16_rows
    from ninfer.cuda.norm import gated_rmsnorm

    hv, d = HEADS[model], 128
    rng = np.random.default_rng(0)
    o = cupy.asarray(rng.standard_normal((tokens * hv, d), dtype=np.float32))
    wide = cupy.asarray(rng.standard_normal((tokens, 2 * hv * d + 64), dtype=np.float32))
    z = wide[:, hv * d : 2 * hv * d]  # a column slice, row stride of the wider array
    w = cupy.asarray(rng.uniform(0.5, 1.5, d).astype(np.float32))
    fused = gated_rmsnorm(o, z, w, 1e-6, f16=True)
    y = gated_rmsnorm(o, z, w, 1e-6)
    xh, rowf = f16_rows(y.reshape(tokens, hv * d), hv * d, _sm90_kernel)
    same = bool(cupy.array_equal(fused.xh.reshape(-1), xh.reshape(-1)) and cupy.array_equal(fused.rowf, rowf))
    t_fused = event_seconds(lambda: gated_rmsnorm(o, z, w, 1e-6, f16=True), reps)
    resident = norm._gated_f16_kernel(hv, d)
    saved, norm._gated_f16_kernel = norm._gated_f16_kernel, lambda heads, dd: "gated_rmsnorm_f16"
    try:
        two = gated_rmsnorm(o, z, w, 1e-6, f16=True)
        same = same and bool(cupy.array_equal(two.xh, fused.xh) and cupy.array_equal(two.rowf, fused.rowf))
        t_two = event_seconds(lambda: gated_rmsnorm(o, z, w, 1e-6, f16=True), reps)
    finally:
        norm._gated_f16_kernel = saved
    t_norm = event_seconds(lambda: gated_rmsnorm(o, z, w, 1e-6, out=y), reps)
    t_split = event_seconds(lambda: f16_rows(y.reshape(tokens, hv * d), hv * d, _sm90_kernel), reps)
    src = cupy.empty(o.size * 2 + o.size // 2, dtype=np.float32)  # o + z read, fp16 rows written: 2.5 x o
    dst = cupy.empty_like(src)
    t_copy = event_seconds(lambda: cupy.copyto(dst, src), reps) / 2  # a copy reads and writes: half its time
    return (
        f"{model} {tokens} tokens x {hv} heads: fused f16 {resident} {t_fused * 1e6:.1f} us, two-pass"
        f" {t_two * 1e6:.1f} us | gated_rmsnorm {t_norm * 1e6:.1f}"
        f" + split_f16row {t_split * 1e6:.1f} us | bytes at copy rate {t_copy * 1e6:.1f} us | same bits {same}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    for model in HEADS:
        print(bench(model, a.tokens, a.reps), flush=True)


if __name__ == "__main__":
    main()
