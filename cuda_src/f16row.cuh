// The fp16 mode's activation rows (docs/cuda.md "Prefill GEMM inputs"): fp16 rounding and the per-row power-of-two
// scale, shared by split_f16row (gemm_sm90.cu), the norms that write those rows themselves (norm.cu) and the host
// tests.
#pragma once
#include "common.cuh"

#ifndef HD
#define HD __host__ __device__ __forceinline__
#endif

// float -> fp16 bits, rounded to nearest even (subnormals kept, >= 65520 to inf, NaN quiet): the device's
// cvt.rn.f16.f32, and the same rule in software for the host tests.
HD u32 f16_rne_bits(float f) {
#ifdef __CUDA_ARCH__
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    const u32 x = f32_bits(f);
    const u32 sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (ax >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520
    if (ax <= 0x33000000u) return sign;            // <= 2^-25 (the tie rounds to even: 0)
    const int e = (int)(ax >> 23) - 127;
    if (e >= -14) {  // normal: 10 of the 23 fraction bits, the rest rounded (a carry moves into the exponent)
        const u32 m = ax & 0x7fffffu, rem = m & 0x1fffu;
        u32 h = ((u32)(e + 15) << 10) | (m >> 13);
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
        return sign | h;
    }
    const int sh = -e - 1;  // subnormal: units of 2^-24; e in [-25, -15]
    const u32 m = (ax & 0x7fffffu) | 0x800000u, half = 1u << (sh - 1), rem = m & ((1u << sh) - 1u);
    u32 h = m >> sh;
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return sign | h;
#endif
}

// The fp16 mode's row scale (split_f16row and its NumPy twin ninfer.reference.ops.round_fp16_rows): for the row's
// largest |x| with float exponent field E, k = clamp(141 - E, -126, 126), so that max |x| 2^k lies in [2^14, 2^15)
// (below fp16's 65504; fp16 keeps 11 significant bits of every value above 2^-14 of it) and both 2^k and 2^-k are
// normal floats. Returns 2^k; the GEMM multiplies the row's products by 2^-k (exact: powers of two).
HD float f16row_scale(float amax, float& inv) {
    const u32 b = f32_bits(amax);
    int k = 141 - (int)((b >> 23) & 0xffu);
    k = k < -126 ? -126 : (k > 126 ? 126 : k);
    inv = f32_from_bits((u32)(127 - k) << 23);
    return f32_from_bits((u32)(127 + k) << 23);
}
