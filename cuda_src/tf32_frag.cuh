// fp32 products on tensor cores as 3xTF32: mma.sync m16n8k8 with tf32 operands and fp32 accumulation, each fp32
// operand split x = hi + lo (hi = tf32(x), lo = tf32(x − hi), both rounded to nearest, ties away) and the three
// cross products lo·hi + hi·lo + hi·hi issued in that order (the lo·lo term is dropped). hi carries 11 significant
// bits, lo the next 11: x − hi − lo is at most 2^-22 |x| and the dropped term at most 2^-22 |ab|, so one product is
// within ~2^-21 of the fp32 product's value, below the 2^-24 rounding of each fp32 FMA it replaces times the
// length of its sum (NumPy, 64x128 by 128x32 of standard normals: 3xTF32 5e-8 of max |ref|, plain fp32 sums 2.7e-7,
// a bf16 hi/lo split (m16n8k16) 3.3e-6).
//
// PTX fragment layout (g = lane / 4, t = lane % 4):
//   A (16 x 8, row): a0 (row g, k t), a1 (row g+8, k t), a2 (row g, k t+4), a3 (row g+8, k t+4)
//   B (8 x 8, col):  b0 (k t, column g), b1 (k t+4, column g)
//   C (16 x 8):      c0 (row g, column 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
// A k-sum may visit its indices in any fixed order, so callers map the 8 k slots onto their data as they like,
// the same map for A and B. The host emulation (tests/host/gdn_emu.cpp, GDN_HOST_EMU) runs the split bit for bit
// and the mma as an exact sum of the tf32 operands rounded once to fp32.
#pragma once
#include "common.cuh"

// round to nearest, ties away from zero, to tf32 (the low 13 bits zero); a NaN or an infinity passes unchanged
__device__ __forceinline__ float tf32_rna(float x) {
#ifdef __CUDA_ARCH__
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
#else
    const u32 u = f32_bits(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    return f32_from_bits((u + 0x1000u) & 0xffffe000u);
#endif
}

// x = hi + lo (x − hi is exact in fp32)
__device__ __forceinline__ void tf32_split(float x, float& hi, float& lo) {
    hi = tf32_rna(x);
    lo = tf32_rna(x - hi);
}

__device__ __forceinline__ void tf32_mma(float (&d)[4], float a0, float a1, float a2, float a3, float b0,
                                         float b1) {
#ifdef __CUDA_ARCH__
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(__float_as_uint(a2)),
          "r"(__float_as_uint(a3)), "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
#elif defined(GDN_HOST_EMU)
    emu_mma_tf32(d, a0, a1, a2, a3, b0, b1);
#endif
}

// A split fp32 A fragment (hi, lo of a0..a3) and B fragment ({b0, b1} hi and lo): d += a·b as 3xTF32
struct Tf32A {
    float h[4], l[4];
};
__device__ __forceinline__ void tf32_mma3(float (&d)[4], const Tf32A& a, float bh0, float bh1, float bl0,
                                          float bl1) {
    tf32_mma(d, a.l[0], a.l[1], a.l[2], a.l[3], bh0, bh1);
    tf32_mma(d, a.h[0], a.h[1], a.h[2], a.h[3], bl0, bl1);
    tf32_mma(d, a.h[0], a.h[1], a.h[2], a.h[3], bh0, bh1);
}

__device__ __forceinline__ Tf32A tf32_a(float a0, float a1, float a2, float a3) {
    Tf32A r;
    tf32_split(a0, r.h[0], r.l[0]);
    tf32_split(a1, r.h[1], r.l[1]);
    tf32_split(a2, r.h[2], r.l[2]);
    tf32_split(a3, r.h[3], r.l[3]);
    return r;
}
