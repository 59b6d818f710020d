// Fragments of the split-KV attention (attention.cu `attention`) on tensor cores: mma.sync m16n8k16, bf16
// operands, fp32 accumulation. PTX fragment layout, g = lane / 4, t = lane % 4 (low half of a word = lower k):
//   A (16 x 16, row): a0 (row g, k 2t..2t+1), a1 (row g+8, same k), a2 (row g, k 2t+8..2t+9), a3 (row g+8, same)
//   B (16 x 8, col):  b0 (k 2t..2t+1, column g), b1 (k 2t+8..2t+9, column g)
//   C (16 x 8):       c0 (row g, column 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
//
// S = Q K^T per 8 positions: A = the query heads as rows (rows >= G, g+8 included, are zero), B = K^T (column g =
//   the position loaded by lanes with that g). Lane t owns the 8-dim chunks c = 4u + t (u < D/32) of a K row: a 16B
//   bf16 load; step s = 2u + h takes the chunk's pairs 2h (k 2t..) and 2h+1 (k 2t+8..). The Q fragments are staged
//   in the same order, so each step multiplies matching dims: a dot product in a permuted, fixed dim order.
// O^T += V^T P^T per 16 positions: A = V^T (rows = dims, k = positions), B = P^T (column g = head g), whose
//   fragment is exactly the S accumulators of the lane (c0, c1 of the two 8-position halves: positions 2t, 2t+1,
//   8+2t, 9+2t). Lane g owns V units (U = 8 dims, 4 when D = 32) g + 8j of those four positions; pair q of unit j
//   gives m-tile i = j U/2 + q its rows g (dim U(g+8j)+2q) and g+8 (the next dim), re-paired by byte permutes.
//   So the O^T accumulators of lane (g, t) are heads 2t, 2t+1 (columns) at those dims (rows).
// Operands are exact: bf16 K/V as stored; e4m3 codes widened exactly (every e4m3 value is a bf16); float32 K/V,
// float q and the fp32 probabilities are split x = hi + lo into two bf16 (one more mma per split operand, the
// lo x lo product dropped: relative 2^-16). Everything that is not an mma or a shuffle has a plain C++ path, so
// tests/host/attn_emu.cpp can run the kernel itself on the CPU.
#pragma once
#include "common.cuh"
#include "e4m3.cuh"

#define ATT_TILE 16  // positions per warp step; a chunk is a whole number of tiles

__device__ __forceinline__ u32 att_rne(float f) {  // float -> bf16 bits, round to nearest even
    u32 u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

__device__ __forceinline__ u32 att_pack(float lo, float hi) {  // two floats -> bf16x2 (RNE)
#ifdef __CUDA_ARCH__
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return att_rne(lo) | (att_rne(hi) << 16);
#endif
}

// x = hi + lo with hi, lo bf16 pairs (x - hi is exact in fp32)
__device__ __forceinline__ void att_split(float x0, float x1, u32& hi, u32& lo) {
    hi = att_pack(x0, x1);
    lo = att_pack(x0 - f32_from_bits(hi << 16), x1 - f32_from_bits(hi & 0xffff0000u));
}

__device__ __forceinline__ u32 att_prmt(u32 x, u32 y, u32 s) {  // __byte_perm
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const u64 v = ((u64)y << 32) | x;
    u32 r = 0;
    for (int i = 0; i < 4; ++i) r |= (u32)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
#endif
}

__device__ __forceinline__ u32 att_mul_bf16x2(u32 a, u32 b) {  // per half, RNE, subnormals kept (exact uses)
#ifdef __CUDA_ARCH__
    u32 r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return att_pack(f32_from_bits(a << 16) * f32_from_bits(b << 16),
                    f32_from_bits(a & 0xffff0000u) * f32_from_bits(b & 0xffff0000u));
#endif
}

__device__ __forceinline__ void att_mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#ifdef __CUDA_ARCH__
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif defined(ATT_HOST_EMU)
    emu_mma(d, a0, a1, a2, a3, b0, b1);
#endif
}

// ---- raw loads: N dims of C at p (N * sizeof(C) bytes, aligned to that size), read once: no L1 allocation ----
template <typename C, int N> struct AttRaw {
    u32 w[N * (int)sizeof(C) / 4];
};

template <typename C, int N> __device__ __forceinline__ void att_load(const C* p, AttRaw<C, N>& r) {
    constexpr int NW = N * (int)sizeof(C) / 4;
#ifdef __CUDA_ARCH__
    if constexpr (NW == 1) {
        asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r.w[0]) : "l"(p));
    } else if constexpr (NW == 2) {
        asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.w[0]), "=r"(r.w[1]) : "l"(p));
    } else {
#pragma unroll
        for (int i = 0; i < NW; i += 4)
            asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                : "=r"(r.w[i]), "=r"(r.w[i + 1]), "=r"(r.w[i + 2]), "=r"(r.w[i + 3])
                : "l"((const u8*)p + 4 * i));
    }
#else
    __builtin_memcpy(r.w, p, 4 * NW);
#endif
}

// four e4m3 codes (byte i = dim i) -> bf16 pairs (dims 0,1) and (2,3), exact: the code's bits placed in a bf16
// (value * 2^-120, a bf16 subnormal for an e4m3 subnormal), times 2^120; a NaN code (S.1111.111, which would read
// as 480) gets its bf16 exponent and quiet bit set, branch-free.
__device__ __forceinline__ void att_e4m3x4(u32 w, u32& p01, u32& p23) {
    const u32 x01 = att_prmt(w, 0u, 0x4140u), x23 = att_prmt(w, 0u, 0x4342u);
    const u32 nan = (((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) >> 7;  // 1 in each NaN code's byte
    p01 = att_mul_bf16x2(((x01 & 0x007f007fu) << 4) | ((x01 & 0x00800080u) << 8), 0x7b807b80u);
    p23 = att_mul_bf16x2(((x23 & 0x007f007fu) << 4) | ((x23 & 0x00800080u) << 8), 0x7b807b80u);
    p01 |= att_prmt(nan, 0u, 0x4140u) * 0x7fc0u;
    p23 |= att_prmt(nan, 0u, 0x4342u) * 0x7fc0u;
}

// N raw dims -> N/2 bf16 pairs (pair i = dims 2i, 2i+1): hi, and lo for a float cache (x = hi + lo).
template <typename C, int N> struct AttPairs {
    u32 hi[N / 2], lo[N / 2];
};

template <int N> __device__ __forceinline__ void att_pairs(const AttRaw<bf16, N>& r, AttPairs<bf16, N>& p) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) p.hi[i] = r.w[i];
}
template <int N> __device__ __forceinline__ void att_pairs(const AttRaw<e4m3, N>& r, AttPairs<e4m3, N>& p) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) att_e4m3x4(r.w[i], p.hi[2 * i], p.hi[2 * i + 1]);
}
template <int N> __device__ __forceinline__ void att_pairs(const AttRaw<float, N>& r, AttPairs<float, N>& p) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) att_split(f32_from_bits(r.w[2 * i]), f32_from_bits(r.w[2 * i + 1]), p.hi[i], p.lo[i]);
}

// ---- merging partial softmax states (m, l, o): the same formula for warps, splits and groups of splits ----
// Parts b = 0..n-1 in order, online: M' = max(M, m_b), o = o 2^(M - M') + o_b 2^(m_b - M'), l likewise; parts with
// m_b = -inf (no positions) are skipped. Parts are read from shared memory: the block's warps, or batches of the
// split/group partials other blocks wrote, staged by att_stage (cp.async, so no registers hold them in flight).
struct AttAcc {
    float m, l, a[4];
};

template <int NI> __device__ __forceinline__ void att_merge_reset(AttAcc (&r)[NI]) {
#pragma unroll
    for (int k = 0; k < NI; ++k) r[k].m = NEG_INF, r[k].l = 0.f, r[k].a[0] = r[k].a[1] = r[k].a[2] = r[k].a[3] = 0.f;
}

// Item k (4 dims of one head) of this thread: (m, l) of part b at ml[k] + b * mls, its 4 dims at o[k] + b * os;
// ok[k] false: no item. Continues r (parts after the ones already merged).
template <int NI>
__device__ __forceinline__ void att_merge(const float* const (&ml)[NI], int mls, const float* const (&o)[NI], int os,
                                          const bool (&ok)[NI], int n, AttAcc (&r)[NI]) {
#pragma unroll
    for (int k = 0; k < NI; ++k) {
        if (!ok[k]) continue;
        for (int b = 0; b < n; ++b) {
            const float2 pm = *reinterpret_cast<const float2*>(ml[k] + b * mls);
            if (pm.x == NEG_INF) continue;
            const float4 v = *reinterpret_cast<const float4*>(o[k] + b * os);
            const float mn = fmaxf(r[k].m, pm.x), cs = exp2f(r[k].m - mn), cb = exp2f(pm.x - mn);
            r[k].l = fmaf(pm.y, cb, r[k].l * cs);
            r[k].a[0] = fmaf(v.x, cb, r[k].a[0] * cs), r[k].a[1] = fmaf(v.y, cb, r[k].a[1] * cs);
            r[k].a[2] = fmaf(v.z, cb, r[k].a[2] * cs), r[k].a[3] = fmaf(v.w, cb, r[k].a[3] * cs);
            r[k].m = mn;
        }
    }
}

__device__ __forceinline__ void att_cp_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

__device__ __forceinline__ void att_cp_wait1() {  // all but the newest committed group have landed
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}

// Copies nf floats (a multiple of 4, 16-byte aligned) of o and nm floats of (m, l) into shared memory, all threads.
__device__ __forceinline__ void att_stage(float* so, const float* go, int nf, float* sml, const float* gml, int nm) {
    // through the L2 only (cp_async_f4): the partials were written by other blocks of this launch
    for (int e = 4 * (int)threadIdx.x; e < nf; e += 4 * (int)blockDim.x) cp_async_f4(so + e, go + e);
    for (int e = threadIdx.x; e < nm; e += blockDim.x) sml[e] = __ldcg(gml + e);
    cp_async_f4_wait();
    __syncthreads();
}

template <typename T> __device__ __forceinline__ void att_store4(T* p, const float (&a)[4], float s);
template <> __device__ __forceinline__ void att_store4<float>(float* p, const float (&a)[4], float s) {
    *reinterpret_cast<float4*>(p) = make_float4(a[0] * s, a[1] * s, a[2] * s, a[3] * s);
}
template <> __device__ __forceinline__ void att_store4<bf16>(bf16* p, const float (&a)[4], float s) {
    uint2 w;
    w.x = att_rne(a[0] * s) | (att_rne(a[1] * s) << 16);
    w.y = att_rne(a[2] * s) | (att_rne(a[3] * s) << 16);
    *reinterpret_cast<uint2*>(p) = w;
}
