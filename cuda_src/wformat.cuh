// Weight-format readers shared by the GEMV, GEMM and embedding families.
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
//   NVFP4G16_E4M3S  p0 = packed e2m1 [N, Kp/2] (even column low nibble), p1 = e4m3 block scales [N, Kp/16],
//                   p2 = f32 global g; Kp = align_up(K, 128); w = e2m1 * f32(s_b * g) as ninfer.formats decodes
//   Q{4,5,6}G64     p0 = base nibbles [N, gpr*32], p1 = high-bit plane [N, gpr*H], p2 = f16 scales [N, gpr];
//                   gpr = Kp/64, H = 0/8/16; code = sign-extended (nibble | high << 4)
//   W8G32           p0 = int8 [N, gpr*32], p2 = f16 scales [N, gpr]; gpr = Kp/32
//
// Wide chunks (the GEMV's loaders, gemv.cu): `KV` weights per lane, all behind one 16-byte load of the main plane
// (plus the format's small side planes), so a warp streams 512 bytes per row per load. Every chunk starts at
// k0 % KV == 0 with k0 < K and never straddles a scale group; chunks of the K-padded formats (NVFP4, group-int)
// stay inside the padded row, BF16's K % 8 == 0 ends every chunk at K, and FP8 guards its second 8-byte half.
//   load_wide(p0, p1, p2, K, n, k0, c)  issue the global loads only (the kernel puts several chunks in flight)
//   prep_wide(c)                        per-chunk scales from the loaded bits (once per chunk, not per weight)
//   deq_wide(c, s, w[8])                weights k0+8s .. k0+8s+7 as w[j] * XS * row_scale(..) (exact products)
//   row_scale(p1, p2, n)                the factor constant along a row (NVFP4 global g, FP8 scale), else 1
// XS is a power of two the kernel multiplies x by: NVFP4 and FP8 decode through the bit patterns of subnormal
// floats (e2m1 / e4m3 code bits placed at the bottom of the f32 exponent read as value * 2^-126 / 2^-120), scaled
// back into the normal range by exact power-of-two products, which leaves weights 2^-56 times too small; x * 2^56
// (exact for |x| < 2^71) compensates. CuPy compiles with -ftz=true, so the products that read a subnormal go
// through mul_keep_denorm (PTX mul.rn.f32 without .ftz) and stay exact. The functions are __host__ __device__ so a
// host program can check them.
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

// e2m1 nibble (bits 28..31 of `t`) -> value * 2^-126: magnitude bits to 24..22 (exponent e, mantissa m), the sign
// to bit 31; e = 0 (0 or 0.5) is the f32 subnormal m * 2^-127 = 0.5 m * 2^-126.
__host__ __device__ __forceinline__ float e2m1_hi_scaled(u32 t) {
    return f32_from_bits((u32)((int)t >> 6) & 0x81c00000u);
}

#define WF_P56 72057594037927936.0f  // 2^56
#define WF_P63 9223372036854775808.0f  // 2^63
#define WF_P64 18446744073709551616.0f  // 2^64
#define WF_P127 1.7014118346046923e38f  // 2^127

__host__ __device__ __forceinline__ long long kpad128(int K) { return ((long long)K + 127) / 128 * 128; }

struct FmtBF16 {
    static constexpr int SGROUP = 0;
    // wide chunk: 8 weights (16 bytes), K % 8 == 0
    static constexpr int KV = 8;
    static constexpr float XS = 1.f;
    struct Wide {
        uint4 v;
    };
    static __host__ __device__ __forceinline__ void load_wide(const u8* p0, const u8*, const u8*, int K, long long n, int k0, Wide& c) {
        c.v = *reinterpret_cast<const uint4*>(p0 + (n * K + k0) * 2);
    }
    static __host__ __device__ __forceinline__ void prep_wide(Wide&) {}
    static __host__ __device__ __forceinline__ void deq_wide(const Wide& c, int, float w[8]) {
        const u32 u[4] = {c.v.x, c.v.y, c.v.z, c.v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[2 * i] = f32_from_bits(u[i] << 16);
            w[2 * i + 1] = f32_from_bits(u[i] & 0xffff0000u);
        }
    }
    static __host__ __device__ __forceinline__ float row_scale(const u8*, const u8*, long long) { return 1.f; }
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

// FP8 wide chunk: 16 codes as two 8-byte loads (rows are only 8-byte aligned when K % 16 != 0); the second half
// is loaded only inside the row (k0 + 8 < K), else zero. w = e4m3 * 2^-56, exact.
struct FP8Wide {
    static constexpr int KV = 16;
    static constexpr float XS = WF_P56;
    struct Wide {
        uint2 a, b;
    };
    static __host__ __device__ __forceinline__ void load_wide(const u8* p0, const u8*, const u8*, int K, long long n, int k0, Wide& c) {
        const u8* p = p0 + n * K + k0;
        c.a = *reinterpret_cast<const uint2*>(p);
        c.b = k0 + 8 < K ? *reinterpret_cast<const uint2*>(p + 8) : make_uint2(0u, 0u);
    }
    static __host__ __device__ __forceinline__ void prep_wide(Wide&) {}
    static __host__ __device__ __forceinline__ void deq_wide(const Wide& c, int s, float w[8]) {
        const uint2 v = s == 0 ? c.a : c.b;
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = mul_keep_denorm(e4m3_hi_scaled((j < 4 ? v.x : v.y) << (24 - 8 * (j & 3))), WF_P64);
    }
};

struct FmtFP8Row : FP8Wide {
    static __host__ __device__ __forceinline__ float row_scale(const u8* p1, const u8*, long long n) {
        return reinterpret_cast<const float*>(p1)[n];
    }
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

struct FmtFP8Tensor : FP8Wide {
    static __host__ __device__ __forceinline__ float row_scale(const u8* p1, const u8*, long long) { return *reinterpret_cast<const float*>(p1); }
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
    // wide chunk: 32 weights = 16 code bytes + the 2 block scales; d = e4m3 * 2^70 and e2m1 * 2^-126 give
    // w = e2m1 * e4m3 * 2^-56 (exact: at most 6 significant bits); the global g is the row scale.
    static constexpr int KV = 32;
    static constexpr float XS = WF_P56;
    struct Wide {
        uint4 c;
        u32 sc;
        float d0, d1;
    };
    static __host__ __device__ __forceinline__ void load_wide(const u8* p0, const u8* p1, const u8*, int K, long long n, int k0, Wide& c) {
        const long long kp = kpad128(K);
        c.c = *reinterpret_cast<const uint4*>(p0 + n * (kp / 2) + k0 / 2);
        c.sc = *reinterpret_cast<const u16*>(p1 + n * (kp / 16) + k0 / 16);
    }
    static __host__ __device__ __forceinline__ void prep_wide(Wide& c) {
        c.d0 = mul_keep_denorm(e4m3_hi_scaled(c.sc << 24), WF_P127) * WF_P63;
        c.d1 = mul_keep_denorm(e4m3_hi_scaled(c.sc << 16), WF_P127) * WF_P63;
    }
    static __host__ __device__ __forceinline__ void deq_wide(const Wide& c, int s, float w[8]) {
        const u32 v = s == 0 ? c.c.x : s == 1 ? c.c.y : s == 2 ? c.c.z : c.c.w;
        const float d = s < 2 ? c.d0 : c.d1;
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = mul_keep_denorm(e2m1_hi_scaled(v << (28 - 4 * i)), d);
    }
    static __host__ __device__ __forceinline__ float row_scale(const u8*, const u8* p2, long long) { return *reinterpret_cast<const float*>(p2); }
    // e2m1 x e4m3 block scale (exact in bf16); the f32 global scale g is the row scale.
    static __device__ __forceinline__ void load8v(const u8* p0, const u8* p1, const u8*, int K, long long n,
                                                  int k0, float w[8]) {
        const long long kp = kpad128(K);
        const u32 c = *reinterpret_cast<const u32*>(p0 + n * (kp / 2) + k0 / 2);
        const float d = e4m3_to_f(p1[n * (kp / 16) + k0 / 16]);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = e2m1_to_f((c >> (4 * i)) & 0xfu) * d;
    }
    static __device__ __forceinline__ float scale(const u8*, const u8*, const u8* p2, int, long long, int) {
        return *reinterpret_cast<const float*>(p2);
    }
    static __device__ __forceinline__ void load8(const u8* p0, const u8* p1, const u8* p2, int K, long long n,
                                                 int k0, float w[8]) {
        const long long kp = kpad128(K);
        const u32 c = *reinterpret_cast<const u32*>(p0 + n * (kp / 2) + k0 / 2);
        const float d = e4m3_to_f(p1[n * (kp / 16) + k0 / 16]) * *reinterpret_cast<const float*>(p2);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = e2m1_to_f((c >> (4 * i)) & 0xfu) * d;
    }
};

template <int BITS>
struct FmtQG64 {
    static constexpr int H = BITS == 4 ? 0 : (BITS == 5 ? 8 : 16);
    static constexpr int SGROUP = 64;
    // wide chunk: 32 weights = half a group: 16 base bytes, 4 (Q5) or 8 (Q6) high bytes, the group's scale.
    // Codes become floats through 2^23 + offset-binary code (exact), w = q * f32(scale) as the decoder.
    static constexpr int KV = 32;
    static constexpr float XS = 1.f;
    struct Wide {
        uint4 base;
        uint2 high;
        u32 sc;
        float d;
    };
    static __host__ __device__ __forceinline__ void load_wide(const u8* p0, const u8* p1, const u8* p2, int K, long long n, int k0, Wide& c) {
        const long long grp = n * (kpad128(K) / 64) + k0 / 64;
        const int j0 = k0 & 63;  // 0 or 32
        c.base = *reinterpret_cast<const uint4*>(p0 + grp * 32 + j0 / 2);
        c.high = make_uint2(0u, 0u);
        if (BITS == 5) c.high.x = *reinterpret_cast<const u32*>(p1 + grp * 8 + j0 / 8);
        if (BITS == 6) c.high = *reinterpret_cast<const uint2*>(p1 + grp * 16 + j0 / 4);
        c.sc = reinterpret_cast<const u16*>(p2)[grp];
    }
    static __host__ __device__ __forceinline__ void prep_wide(Wide& c) { c.d = hd_f16_to_f((u16)c.sc); }
    static __host__ __device__ __forceinline__ void deq_wide(const Wide& c, int s, float w[8]) {
        const u32 v = s == 0 ? c.base.x : s == 1 ? c.base.y : s == 2 ? c.base.z : c.base.w;
        u32 high = 0;
        if (BITS == 5) high = (c.high.x >> (8 * s)) & 0xffu;
        if (BITS == 6) high = ((s < 2 ? c.high.x : c.high.y) >> (16 * (s & 1))) & 0xffffu;
        constexpr float OFF = 8388608.f + (float)(1 << (BITS - 1));
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            u32 u = (v >> (4 * i)) & 0xfu;
            if (BITS == 5) u |= ((high >> i) & 1u) << 4;
            if (BITS == 6) u |= ((high >> (2 * i)) & 3u) << 4;
            w[i] = (f32_from_bits(0x4b000000u | (u ^ (1u << (BITS - 1)))) - OFF) * c.d;
        }
    }
    static __host__ __device__ __forceinline__ float row_scale(const u8*, const u8*, long long) { return 1.f; }
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
        return f16_bits_to_f(reinterpret_cast<const u16*>(p2)[n * (kpad128(K) / 64) + k0 / 64]);
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
    // wide chunk: 16 weights = half a group (16 int8 bytes) and the group's scale; int8 -> float through
    // 2^23 + (code ^ 0x80) (exact), w = q * f32(scale) as the decoder.
    static constexpr int KV = 16;
    static constexpr float XS = 1.f;
    struct Wide {
        uint4 v;
        u32 sc;
        float d;
    };
    static __host__ __device__ __forceinline__ void load_wide(const u8* p0, const u8*, const u8* p2, int K, long long n, int k0, Wide& c) {
        const long long grp = n * (kpad128(K) / 32) + k0 / 32;
        c.v = *reinterpret_cast<const uint4*>(p0 + grp * 32 + (k0 & 31));
        c.sc = reinterpret_cast<const u16*>(p2)[grp];
    }
    static __host__ __device__ __forceinline__ void prep_wide(Wide& c) { c.d = hd_f16_to_f((u16)c.sc); }
    static __host__ __device__ __forceinline__ void deq_wide(const Wide& c, int s, float w[8]) {
        const u32 lo = (s == 0 ? c.v.x : c.v.z) ^ 0x80808080u, hi = (s == 0 ? c.v.y : c.v.w) ^ 0x80808080u;
#pragma unroll
        for (int j = 0; j < 8; ++j)
            w[j] = (f32_from_bits(0x4b000000u | (((j < 4 ? lo : hi) >> (8 * (j & 3))) & 0xffu)) - 8388736.f) * c.d;
    }
    static __host__ __device__ __forceinline__ float row_scale(const u8*, const u8*, long long) { return 1.f; }
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
