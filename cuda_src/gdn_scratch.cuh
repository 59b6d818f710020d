// The chunked GDN's scratch element type SC (gdn_chunk.cu's q | k, W and A sections; U and γ stay float): float
// (every variant; the exact form) or bf16 (variant "wspb": the prep rounds what it stores to bf16, round to nearest
// even, and the state pass reads half the bytes). A bf16 value is exact in tf32, so where a scratch value is a
// product's A operand its tf32 split has no low half and the 3xTF32 product's lo·hi mma adds zeros: sc_mma3 drops
// it, and the two mmas left (hi·lo, hi·hi, in the 3xTF32 order) give the bits of the float pass run over a scratch
// rounded to bf16 (tests/test_gdn_chunked_host.py). Included by gdn_state_mma.cuh.
#pragma once
#include "tf32_frag.cuh"

// sc_t<SC>: SC in a non-deduced context (the scratch type of a product is always given, its pointers may be nullptr)
template <typename X> struct sc_id {
    using type = X;
};
template <typename X> using sc_t = typename sc_id<X>::type;

__device__ __forceinline__ void sc_put(float* p, float x) { *p = x; }
__device__ __forceinline__ void sc_put(bf16* p, float x) { *p = from_f<bf16>(x); }
__device__ __forceinline__ void sc_put2(float* p, float x, float y) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
__device__ __forceinline__ void sc_put2(bf16* p, float x, float y) {  // p 4-byte aligned
    *reinterpret_cast<u32*>(p) = (u32)f_to_bf16_bits(x) | ((u32)f_to_bf16_bits(y) << 16);
}

// four consecutive scratch values from p (16- or 8-byte aligned); zeros where !ok (p is not read)
__device__ __forceinline__ float4 sc_ld4(const float* p, bool ok) {
    return ok ? *reinterpret_cast<const float4*>(p) : make_float4(0.f, 0.f, 0.f, 0.f);
}
__device__ __forceinline__ float4 sc_ld4(const bf16* p, bool ok) {
    if (!ok) return make_float4(0.f, 0.f, 0.f, 0.f);
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}
// two consecutive scratch values (8- or 4-byte aligned)
__device__ __forceinline__ float2 sc_ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 sc_ld2(const bf16* p) {
    const u32 u = *reinterpret_cast<const u32*>(p);
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// an A fragment of scratch values: split (float) or exact (bf16: hi only, lo never read)
template <typename SC> __device__ __forceinline__ Tf32A sc_a(float a0, float a1, float a2, float a3) {
    if constexpr (sizeof(SC) == 4) {
        return tf32_a(a0, a1, a2, a3);
    } else {
        Tf32A r;
        r.h[0] = a0, r.h[1] = a1, r.h[2] = a2, r.h[3] = a3;
        r.l[0] = r.l[1] = r.l[2] = r.l[3] = 0.f;
        return r;
    }
}
// d += a·b for an A fragment from sc_a<SC>: tf32_mma3, without its lo·hi mma where a is exact
template <typename SC>
__device__ __forceinline__ void sc_mma3(float (&d)[4], const Tf32A& a, float bh0, float bh1, float bl0, float bl1) {
    if constexpr (sizeof(SC) == 4) {
        tf32_mma3(d, a, bh0, bh1, bl0, bl1);
    } else {
        tf32_mma(d, a.h[0], a.h[1], a.h[2], a.h[3], bl0, bl1);
        tf32_mma(d, a.h[0], a.h[1], a.h[2], a.h[3], bh0, bh1);
    }
}

// Staged rows (gdn_state_mma.cuh's gsm_stage, the wsp pass's W rows): a float row's 16-byte chunk q sits at chunk
// q ^ sc_swz(row) of its row (DK floats, no padding), so that the 8 rows 2g (or 2g + 1) a warp reads per float4
// load of gsm_ws_qs fall on 8 different bank groups (4 wavefronts, the minimum for 512 bytes) instead of one; a bf16 row (2·DK bytes) has its 32-byte chunk c at c ^ sc_swz(row), so that the 8 rows 2g
// (or 2g + 1) a warp reads per 8-byte load (rows 2g: 32 bytes each at the same offset) fall on 4 different bank
// groups, 2 wavefronts for 256 bytes, instead of one group (8 wavefronts). Rows 2g and 2g + 1 share a swizzle.
template <typename SC, int DK> __device__ __forceinline__ int sc_swz(int row) {
    if constexpr (sizeof(SC) == 4)
        return (row >> 1) & (DK >= 32 ? 7 : DK / 4 - 1);
    else
        return (row >> 1) & (DK >= 64 ? 3 : DK / 16 - 1);
}
// the element offset of key dims 16kb + 4t .. + 3 in a staged row of swizzle sw
template <typename SC> __device__ __forceinline__ int sc_swz_off(int kb, int t, int sw) {
    if constexpr (sizeof(SC) == 4)
        return 4 * ((4 * kb + t) ^ sw);
    else
        return 16 * (kb ^ sw) + 4 * t;
}
// the element offset at which 16-byte piece q of a row (4 floats or 8 bf16 values from element 4q or 8q) is staged
template <typename SC, int DK> __device__ __forceinline__ int sc_stage_off(int q, int row) {
    if constexpr (sizeof(SC) == 4)
        return 4 * (q ^ sc_swz<SC, DK>(row));
    else
        return 16 * ((q >> 1) ^ sc_swz<SC, DK>(row)) + 8 * (q & 1);
}
