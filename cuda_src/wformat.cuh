// Weight-format readers shared by the GEMM and embedding families (the decode GEMV has its own: wfrag.cuh).
//
// Every format exposes `load8(p0, p1, p2, K, n, k0, w[8])`: the 8 dequantized float32 weights W[n, k0..k0+7]
// of row n (k0 % 8 == 0). Group and block sizes (16, 32, 64) are multiples of 8, so 8 lanes never straddle
// a group. Dequantization is exact where the format allows it (f16 scale x int code fits in 24 bits; NVFP4 and FP8
// round the same products in the same order as ninfer.formats' decoders), so the kernels see the reference's weights.
//
// For tensor-core products each format also splits W[n, k] = load8v(..)[k] * scale(.., n, k) where every load8v
// value is exactly representable in bf16 (codes, e2m1 x e4m3 block scale: at most 6 significant bits; BF16 as is),
// so rounding the B operand to bf16 loses nothing and the scale is applied to the fp32 sums. SGROUP is the K extent
// over which the scale is constant: 0 = the whole row (applied once after the K loop), else 32 or 64 (applied per
// 32-wide K tile, which never straddles a group).
//
// Planes (byte offsets computed on the host, docs/formats.md §2/§5/§6):
//   BF16            p0 = u16 [N, K]
//   FP8E4M3_F32ROW  p0 = e4m3 codes [N, K], p1 = f32 row scales [N]
//   FP8E4M3_F32T    p0 = e4m3 codes [N, K], p1 = one f32 scale
//   NVFP4G16_E4M3S  p0 = e2m1 codes, p1 = e4m3 block scales (one per 16 k), both in the device layout below;
//                   p2 = f32 global g; Kp = align_up(K, 128); w = e2m1 * f32(s_b * g) as ninfer.formats decodes
//   Q{4,5,6}G64     p0 = base nibbles [N, gpr*32], p1 = high-bit plane [N, gpr*H], p2 = f16 scales [N, gpr];
//                   gpr = Kp/64, H = 0/8/16; code = sign-extended (nibble | high << 4)
//   W8G32           p0 = int8 [N, gpr*32], p2 = f16 scales [N, gpr]; gpr = Kp/32
//
// The tensor-core decode GEMV reads the same planes through its own fragment readers (wfrag.cuh). The bit-pattern
// helpers below (subnormal placement of e4m3 codes, f16 widening) are shared with it; they are __host__ __device__ so a
// host program can check them. CuPy compiles with -ftz=true, so products that read a subnormal go through
// mul_keep_denorm (PTX mul.rn.f32 without .ftz) and stay exact.
#pragma once
#include "common.cuh"

// IEEE binary16 bits -> float (exact), usable on the host too.
__host__ __device__ __forceinline__ float hd_f16_to_f(u16 h) {
#ifdef __CUDA_ARCH__
    return f16_bits_to_f(h);
#else
    const u32 s = (u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return f32_from_bits(s | 0x7f800000u | (m << 13));
    if (e == 0) {
        const float v = (float)m * 5.9604644775390625e-8f;  // m * 2^-24
        return s ? -v : v;
    }
    return f32_from_bits(s | ((e + 112u) << 23) | (m << 13));
#endif
}

// e4m3 byte (bits 24..31 of `t`, others ignored) -> value * 2^-120 as f32 bits: sign to bit 31, exponent and
// mantissa to bits 26..20 (arithmetic shift keeps the sign); e = 0 lands on f32 subnormals, m * 2^-129, exactly.
// The NaN codes (S.1111.111, never written by the encoders, which saturate at 448) read as +-480.
__host__ __device__ __forceinline__ float e4m3_hi_scaled(u32 t) {
    return f32_from_bits((u32)((int)t >> 4) & 0x87f00000u);
}

#define WF_P127 1.7014118346046923e38f  // 2^127

__host__ __device__ __forceinline__ long long kpad128(int K) { return ((long long)K + 127) / 128 * 128; }

// ---- NVFP4 device layout (ninfer/cuda/nvfp4_layout.py) ------------------------------------------------------
// Rows in groups of 16, each group stored K-tile by K-tile (128 k: 64 code bytes, 8 scale bytes per row): byte
// offset of the code byte holding column k (k even) of row n, and of the scale byte of k's 16-wide block.
__host__ __device__ __forceinline__ long long nv4_codes(long long n, long long kp, int k) {
    return (n & ~15LL) * (kp / 2) + (long long)(k >> 7) * 1024 + (n & 15) * 64 + ((k & 127) >> 1);
}
__host__ __device__ __forceinline__ long long nv4_scales(long long n, long long kp, int k) {
    return (n & ~15LL) * (kp / 16) + (long long)(k >> 7) * 128 + (n & 15) * 8 + ((k & 127) >> 4);
}

// Codes c_i (low half) and c_(i+4) (high half) of a device word as bf16 bit patterns of e2m1 * 2^-126: magnitude
// bits at 6..8, sign at 15 (0.5 lands on a bf16 subnormal). Pairs 0-2 sit one shift away from that position, pair
// 3 takes the word's remaining bits (nvfp4_layout.POS).
__host__ __device__ __forceinline__ u32 nv4_pair(u32 q, int i) {
    if (i == 0) return q & 0x81C081C0u;
    if (i == 1) return (q << 3) & 0x81C081C0u;
    if (i == 2) return (q << 6) & 0x81C081C0u;
    return ((q >> 4) & 0x00C000C0u) | ((q >> 5) & 0x01000100u) | ((q << 1) & 0x80008000u);
}

// The e2m1 code (sign << 3 | magnitude) of column j (0..7) of a device word.
__host__ __device__ __forceinline__ u32 nv4_code(u32 q, int j) {
    const u32 v = nv4_pair(q, j & 3) >> (16 * (j >> 2));
    return ((v >> 6) & 7u) | ((v >> 12) & 8u);
}

struct FmtBF16 {
    static constexpr int SGROUP = 0;
    static __device__ __forceinline__ void load8v(const u8* p0, const u8* p1, const u8* p2, int K, long long n,
                                                  int k0, float w[8]) {
        load8(p0, p1, p2, K, n, k0, w);
    }
    static __device__ __forceinline__ float scale(const u8*, const u8*, const u8*, int, long long, int) {
        return 1.f;
    }
    static __device__ __forceinline__ void load8(const u8* p0, const u8*, const u8*, int K, long long n, int k0,
                                                 float w[8]) {
        const uint4 v = *reinterpret_cast<const uint4*>(p0 + (n * K + k0) * 2);
        const u32 u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[2 * i] = __uint_as_float(u[i] << 16);
            w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    }
};

struct FmtFP8Row {
    static constexpr int SGROUP = 0;
    static __device__ __forceinline__ void load8v(const u8* p0, const u8*, const u8*, int K, long long n, int k0,
                                                  float w[8]) {
        const uint2 v = *reinterpret_cast<const uint2*>(p0 + n * K + k0);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = e4m3_to_f(((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xffu);
    }
    static __device__ __forceinline__ float scale(const u8*, const u8* p1, const u8*, int, long long n, int) {
        return reinterpret_cast<const float*>(p1)[n];
    }
    static __device__ __forceinline__ void load8(const u8* p0, const u8* p1, const u8*, int K, long long n, int k0,
                                                 float w[8]) {
        const uint2 v = *reinterpret_cast<const uint2*>(p0 + n * K + k0);
        const float s = reinterpret_cast<const float*>(p1)[n];
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = e4m3_to_f(((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xffu) * s;
    }
};

struct FmtFP8Tensor {
    static constexpr int SGROUP = 0;
    static __device__ __forceinline__ void load8v(const u8* p0, const u8* p1, const u8* p2, int K, long long n,
                                                  int k0, float w[8]) {
        FmtFP8Row::load8v(p0, p1, p2, K, n, k0, w);
    }
    static __device__ __forceinline__ float scale(const u8*, const u8* p1, const u8*, int, long long, int) {
        return *reinterpret_cast<const float*>(p1);
    }
    static __device__ __forceinline__ void load8(const u8* p0, const u8* p1, const u8*, int K, long long n, int k0,
                                                 float w[8]) {
        const uint2 v = *reinterpret_cast<const uint2*>(p0 + n * K + k0);
        const float s = *reinterpret_cast<const float*>(p1);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = e4m3_to_f(((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xffu) * s;
    }
};

struct FmtNVFP4 {
    static constexpr int SGROUP = 0;
    // e2m1 x e4m3 block scale (exact in bf16); the f32 global scale g is the row scale.
    static __device__ __forceinline__ void load8v(const u8* p0, const u8* p1, const u8*, int K, long long n,
                                                  int k0, float w[8]) {
        const long long kp = kpad128(K);
        const u32 c = *reinterpret_cast<const u32*>(p0 + nv4_codes(n, kp, k0));
        const float d = e4m3_to_f(p1[nv4_scales(n, kp, k0)]);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = e2m1_to_f(nv4_code(c, i)) * d;
    }
    static __device__ __forceinline__ float scale(const u8*, const u8*, const u8* p2, int, long long, int) {
        return *reinterpret_cast<const float*>(p2);
    }
    static __device__ __forceinline__ void load8(const u8* p0, const u8* p1, const u8* p2, int K, long long n,
                                                 int k0, float w[8]) {
        const long long kp = kpad128(K);
        const u32 c = *reinterpret_cast<const u32*>(p0 + nv4_codes(n, kp, k0));
        const float d = e4m3_to_f(p1[nv4_scales(n, kp, k0)]) * *reinterpret_cast<const float*>(p2);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = e2m1_to_f(nv4_code(c, i)) * d;
    }
};

// NVFP4 whose global scale is per row (p2 = f32 [N]): fused projections of parts with different globals
// (ninfer/cuda/fuse.py); the codes and block scales are NVFP4's.
struct FmtNVFP4RowG : FmtNVFP4 {
    static __device__ __forceinline__ float scale(const u8*, const u8*, const u8* p2, int, long long n, int) {
        return reinterpret_cast<const float*>(p2)[n];
    }
    static __device__ __forceinline__ void load8(const u8* p0, const u8* p1, const u8* p2, int K, long long n,
                                                 int k0, float w[8]) {
        const long long kp = kpad128(K);
        const u32 c = *reinterpret_cast<const u32*>(p0 + nv4_codes(n, kp, k0));
        const float d = e4m3_to_f(p1[nv4_scales(n, kp, k0)]) * reinterpret_cast<const float*>(p2)[n];
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = e2m1_to_f(nv4_code(c, i)) * d;
    }
};

// The Q4/Q5/Q6 g64 formats' f16 group scales on the device (ninfer/cuda/qg64_layout.py): rows in groups of 16, each
// group stored K-tile (128 k: two groups) by K-tile, so a tile's scales of 16 rows are 64 contiguous bytes. The u16
// index of (row n, group g) in a plane of gpr groups per row (gpr = Kp/64, even). Every device reader (the decode
// GEMV's fragments, the prefill loaders, group_scales_t, this file's scalar reader) goes through it.
__host__ __device__ __forceinline__ long long qg_scale_word(long long n, long long gpr, long long g) {
    return ((n >> 4) * (gpr >> 1) + (g >> 1)) * 32 + (n & 15) * 2 + (g & 1);
}

template <int BITS>
struct FmtQG64 {
    static constexpr int H = BITS == 4 ? 0 : (BITS == 5 ? 8 : 16);
    static constexpr int SGROUP = 64;
    // the 8 signed codes (|q| <= 32: exact in bf16)
    static __device__ __forceinline__ void load8v(const u8* p0, const u8* p1, const u8*, int K, long long n,
                                                  int k0, float w[8]) {
        const long long grp = n * (kpad128(K) / 64) + k0 / 64;
        const int j0 = k0 & 63;
        const u32 base = *reinterpret_cast<const u32*>(p0 + grp * 32 + j0 / 2);
        u32 high = 0;
        if (BITS == 5) high = p1[grp * 8 + j0 / 8];  // lane i: bit i%8 of byte i/8
        if (BITS == 6) high = *reinterpret_cast<const u16*>(p1 + grp * 16 + j0 / 4);  // lane i: 2 bits at 2(i%4)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int u = (base >> (4 * i)) & 0xf;
            if (BITS == 5) u |= ((high >> i) & 1) << 4;
            if (BITS == 6) u |= ((high >> (2 * i)) & 3) << 4;
            w[i] = (float)(u - ((u >> (BITS - 1)) << BITS));  // two's complement
        }
    }
    static __device__ __forceinline__ float scale(const u8*, const u8*, const u8* p2, int K, long long n, int k0) {
        return f16_bits_to_f(reinterpret_cast<const u16*>(p2)[qg_scale_word(n, kpad128(K) / 64, k0 / 64)]);
    }
    static __device__ __forceinline__ void load8(const u8* p0, const u8* p1, const u8* p2, int K, long long n,
                                                 int k0, float w[8]) {
        load8v(p0, p1, p2, K, n, k0, w);
        const float s = scale(p0, p1, p2, K, n, k0);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = s * w[i];
    }
};

struct FmtW8G32 {
    static constexpr int SGROUP = 32;
    // the 8 int8 codes (exact in bf16)
    static __device__ __forceinline__ void load8v(const u8* p0, const u8*, const u8*, int K, long long n, int k0,
                                                  float w[8]) {
        const long long grp = n * (kpad128(K) / 32) + k0 / 32;
        const uint2 v = *reinterpret_cast<const uint2*>(p0 + grp * 32 + (k0 & 31));
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = (float)(int)(signed char)(((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xffu);
    }
    static __device__ __forceinline__ float scale(const u8*, const u8*, const u8* p2, int K, long long n, int k0) {
        return f16_bits_to_f(reinterpret_cast<const u16*>(p2)[n * (kpad128(K) / 32) + k0 / 32]);
    }
    static __device__ __forceinline__ void load8(const u8* p0, const u8* p1, const u8* p2, int K, long long n,
                                                 int k0, float w[8]) {
        load8v(p0, p1, p2, K, n, k0, w);
        const float s = scale(p0, p1, p2, K, n, k0);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = s * w[i];
    }
};

// 8 consecutive activations (16-byte aligned for bf16, 32-byte for float when k0 % 8 == 0 and rows are
// multiples of 8 long) widened to float.
__host__ __device__ __forceinline__ void load8x(const float* p, float x[8]) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
__host__ __device__ __forceinline__ void load8x(const bf16* p, float x[8]) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const u32 u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        x[2 * i] = f32_from_bits(u[i] << 16);
        x[2 * i + 1] = f32_from_bits(u[i] & 0xffff0000u);
    }
}
