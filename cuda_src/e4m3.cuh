// e4m3fn storage of the fp8 KV cache: the code type, and a float -> code encoder shared by host and device.
//
// The encoder is bitwise ninfer.formats.fp8.e4m3_encode (tests/test_cuda_kv_fp8.py compiles it for the host with
// nvcc and compares it with NumPy): round to nearest, ties to even; finite and infinite magnitudes >= 448
// saturate to 448 (0x7E); NaN -> 0x7F; the sign bit is kept (-0 -> 0x80). Integer and exact float arithmetic
// only, so the result cannot depend on compiler flags (fast-math, FTZ) or on host vs device.
#pragma once
#include "common.cuh"

// One e4m3fn code in memory (uint8 arrays on the Python side). to_f widens the code alone: the caller owns the
// scale. from_f encodes an already scaled value.
struct __align__(1) e4m3 {
    u8 bits;
};

__host__ __device__ __forceinline__ u8 f_to_e4m3(float x) {
    const u32 u = f32_bits(x), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (u8)(s | 0x7fu);   // NaN
    if (a >= 0x43e00000u) return (u8)(s | 0x7eu);  // |x| >= 448, inf included
    if (a >= 0x3c800000u) {
        // normal (|x| >= 2^-6): RNE on the 20 mantissa bits dropped; a carry moves into the exponent, and nothing
        // below 448 rounds past 448. f32 exponent E (121..135) -> e4m3 exponent E - 120.
        const u32 r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
        return (u8)(s | (r - (120u << 3)));
    }
    // subnormal: m * 2^-9 with m = RNE(|x| * 2^9) in 0..8 (8 is the smallest normal, code 0x08). The product, the
    // truncation and the fraction are exact.
    const float m = f32_from_bits(a) * 512.f;
    u32 i = (u32)m;
    const float f = m - (float)i;
    i += (f > 0.5f || (f == 0.5f && (i & 1u))) ? 1u : 0u;
    return (u8)(s | i);
}

__device__ __forceinline__ float to_f(e4m3 x) { return e4m3_to_f(x.bits); }
template <> __device__ __forceinline__ e4m3 from_f<e4m3>(float x) {
    e4m3 r;
    r.bits = f_to_e4m3(x);
    return r;
}
