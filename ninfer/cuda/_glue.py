"""Elementwise glue of ``CudaQwen36`` as CuPy ElementwiseKernels: bf16 widening, the bf16 residual add and the MoE
combine. Compiled on first use; ``CudaQwen36.warmup`` calls each once."""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["glue"]


@functools.cache
def glue() -> dict[str, Any]:
    """Elementwise glue (bf16 widening, residual add, MoE combine) as CuPy ElementwiseKernels."""
    import cupy

    pre = r"""
    __device__ __forceinline__ float bf2f(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
    __device__ __forceinline__ unsigned short f2bf(float f) {
        unsigned int u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (unsigned short)(u >> 16);
    }
    __device__ __forceinline__ float tof(float x) { return x; }
    __device__ __forceinline__ float tof(unsigned short x) { return bf2f(x); }
    __device__ __forceinline__ void fromf(float x, float& y) { y = x; }
    __device__ __forceinline__ void fromf(float x, unsigned short& y) { y = f2bf(x); }
    """
    # routed experts in rank order (best first), then the sigmoid-gated shared expert; fp32 accumulation
    combine = r"""
    const long long t = i / H, c = i % H;
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc = fmaf(w[t * k + j], tof(dn[(long long)where[t * k + j] * H + c]), acc);
    acc = fmaf(1.f / (1.f + expf(-sg[t * ldsg])), tof(sh[i]), acc);
    fromf(acc, y);
    """
    args = "raw T dn, raw int32 where, raw float32 w, raw T sh, raw float32 sg, int32 k, int64 H, int64 ldsg"
    return {
        "widen": cupy.ElementwiseKernel("uint16 x", "float32 y", "y = bf2f(x)", "ninfer_widen", preamble=pre),
        "add": cupy.ElementwiseKernel(
            "uint16 x", "float32 y", "y += bf2f(x)", "ninfer_add_bf16", preamble=pre
        ),
        "combine": cupy.ElementwiseKernel(args, "T y", combine, "ninfer_moe_combine", preamble=pre),
    }
