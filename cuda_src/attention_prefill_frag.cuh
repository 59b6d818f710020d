// Shared pieces of the prefill-attention kernels (attention_prefill.cu, attention_prefill_head.cuh): tile
// sizes, the exact hi/lo split, mma.sync m16n8k16 and ldmatrix on their PTX fragment layouts, cp.async, and the
// per-thread online-softmax state. Every asm has a host path (tests/host/attn_prefill_emu.cpp emulates the
// warp-collective ones), so tests/test_attention_prefill_host.py compiles the kernels for the CPU.
#pragma once
#include "common.cuh"

template <int D> struct ApCfg {
    static constexpr int BN = D == 256 ? 32 : 64;  // D=256: keeps S + O accumulators within 255 registers
    static constexpr int LD = D + 8;
};
template <typename T> struct ApSplit {
    static constexpr bool value = false;
};
template <> struct ApSplit<float> {
    static constexpr bool value = true;
};

__device__ __forceinline__ u32 ap_pack(float lo, float hi) {
    return (u32)f_to_bf16_bits(lo) | ((u32)f_to_bf16_bits(hi) << 16);
}

// hi = bf16(x) (both halves), lo = bf16(x - hi): x = hi + lo up to 2^-17 |x|.
// On the device one cvt.rn.bf16x2.f32 per pair (round to nearest even, subnormals kept: the same bits as
// f_to_bf16_bits for every non-NaN input; a NaN stays a NaN), the host emulation the bit arithmetic.
__device__ __forceinline__ void ap_split2(float x0, float x1, u32& hi, u32& lo) {
#ifdef __CUDA_ARCH__
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(x1), "f"(x0));
    const float r0 = x0 - __uint_as_float(hi << 16), r1 = x1 - __uint_as_float(hi & 0xffff0000u);
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(r1), "f"(r0));
#else
    const u16 h0 = f_to_bf16_bits(x0), h1 = f_to_bf16_bits(x1);
    hi = (u32)h0 | ((u32)h1 << 16);
    lo = ap_pack(x0 - bf16_bits_to_f(h0), x1 - bf16_bits_to_f(h1));
#endif
}

// bf16(x0) | bf16(x1) << 16: ap_split2's hi alone (round to nearest even)
__device__ __forceinline__ u32 ap_round2(float x0, float x1) {
#ifdef __CUDA_ARCH__
    u32 hi;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(x1), "f"(x0));
    return hi;
#else
    return ap_pack(x0, x1);
#endif
}

__device__ __forceinline__ void ap_mma(float c[4], const u32 a[4], u32 b0, u32 b1) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(ATT_HOST_EMU)
    emu_mma(*reinterpret_cast<float(*)[4]>(c), a[0], a[1], a[2], a[3], b0, b1);
#endif
}

// Four 8x8 bf16 matrices, transposed: thread (g = lane/4, t = lane%4) gets rows 2t, 2t+1 of column g of matrix i
// in r[i]; lanes 8i..8i+7 give matrix i's row addresses (16-byte aligned).
__device__ __forceinline__ void ap_ldsm_x4_trans(u32 r[4], const u16* p) {
#ifdef __CUDA_ARCH__
    const u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#elif defined(ATT_HOST_EMU)
    emu_ldsm(r, p, true);
#endif
}

// Four 8x8 bf16 matrices: thread (g, t) gets columns 2t, 2t+1 of row g of matrix i in r[i] (lanes 8i..8i+7 give
// matrix i's row addresses): an A fragment of 16 rows (matrices: rows 0-7 / 8-15 x k 0-7 / 8-15) or two B
// fragments of K rows (keys as columns of B).
__device__ __forceinline__ void ap_ldsm_x4(u32 r[4], const u16* p) {
#ifdef __CUDA_ARCH__
    const u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#elif defined(ATT_HOST_EMU)
    emu_ldsm(r, p, false);
#endif
}

// 16 bytes global -> shared without registers, zero-filled when !ok (src is then not read; it must still be a
// valid address). Synchronous in the host emulation.
__device__ __forceinline__ void ap_cp16(u16* dst, const void* src, bool ok) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((u32)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(ok ? 16 : 0)
                 : "memory");
#else
    if (ok) {
        __builtin_memcpy(dst, src, 16);
    } else {
        __builtin_memset(dst, 0, 16);
    }
#endif
}
__device__ __forceinline__ void ap_cp_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ap_cp_wait_all() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void ap_load8(const float* p, float v[8]) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void ap_load8(const bf16* p, float v[8]) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) v[2 * j] = bf16_bits_to_f(w[j] & 0xffffu), v[2 * j + 1] = bf16_bits_to_f(w[j] >> 16);
}

// 8 elements of a Q row at src (nullptr: a row past the launch, staged as zeros) into Qh / Ql at off: bf16 hi, and
// for float q the lo halves (x = hi + lo), as 16-byte stores (LO: a kernel that reads no lo half stages none).
// Both prefill kernels stage Q through this.
template <typename T, bool LO = ApSplit<T>::value>
__device__ __forceinline__ void ap_stage_q8(const T* src, u16* Qh, u16* Ql, int off) {
    float v[8];
    if (src) {
        ap_load8(src, v);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = 0.f;
    }
    u32 h[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) ap_split2(v[2 * j], v[2 * j + 1], h[j], l[j]);
    *reinterpret_cast<uint4*>(Qh + off) = make_uint4(h[0], h[1], h[2], h[3]);
    if (LO) *reinterpret_cast<uint4*>(Ql + off) = make_uint4(l[0], l[1], l[2], l[3]);
}

// The block's rows r0 .. r0 + nrows - 1 of the launch: their sequences and positions into s_seq, s_pos [n] (-1 past
// nrows), read by both prefill kernels' segment walk (ap_segment).
__device__ __forceinline__ void ap_load_rows(const int* row_seq, const int* row_pos, int r0, int nrows, int n,
                                             int* s_seq, int* s_pos) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        s_seq[i] = i < nrows ? row_seq[r0 + i] : -1;
        s_pos[i] = i < nrows ? row_pos[r0 + i] : -1;
    }
}

// The segment starting at row s0: a maximal run of one sequence's rows [s0, s1); returns s1, kend = the largest
// position in it (the last key any of its rows attends).
__device__ __forceinline__ int ap_segment(const int* s_seq, const int* s_pos, int s0, int nrows, int& kend) {
    const int b = s_seq[s0];
    int s1 = s0 + 1;
    kend = s_pos[s0];
    for (; s1 < nrows && s_seq[s1] == b; ++s1) kend = max(kend, s_pos[s1]);
    return s1;
}

// 2^x by the SFU (ex2.approx.ftz: relative error ~2^-22, 2^-inf = 0); the host emulation's exp2f
__device__ __forceinline__ float ap_exp2(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

// Online-softmax state of one thread: its two rows (g and g + 8 of the warp's 16) and their O fragments.
template <int D> struct ApRows {
    float acc[D / 8][4];  // O fragment f: rows g (elements 0, 1) and g + 8 (2, 3), columns 8f + 2t + (e & 1)
    float m[2], l[2];     // running max (scaled scores) and this thread's partial sum of p
    int lim[2];           // last key the row attends (-1: row not in the current segment)
};

// The online-softmax step of one KV tile for one warp's 16 slots, between its two products: s (the tile's raw
// scores q·k, NF 8-key groups in the mma C layout) masked past each row's last key and scaled, the running max
// (a row with nothing attended yet keeps exp finite: p = corr = 0), sum and O accumulators rescaled (corr is exactly
// 1 when the max did not move), and s replaced by p = exp(s - max). Every prefill kernel calls it, so their softmax
// arithmetic is one text. ALWAYS: rescale even by 1 (bitwise the same as skipping: x * 1 = x). FAST (the rounded-P
// kernel's, whose p is rounded to bf16 next): p = 2^((s - max) log2 e) by one ex2.approx (relative error ~2^-22,
// against expf's ~10 instructions), and a tile wholly within both rows' keys skips the per-key mask (a no-op there).
// RESCALE = false (the warp-specialized kernel, attention_ws.cu, whose previous tile's P V is still accumulating into
// O here): O is left alone and corr gets the factors, for ap_rescale once that product has landed; the same
// multiplications in the same order per accumulator as the rescale here.
template <int NF, int D, bool ALWAYS = false, bool FAST = false, bool RESCALE = true>
__device__ __forceinline__ void ap_online(float (&s)[NF][4], int k0, float scale, ApRows<D>& st,
                                          float* corr_out = nullptr) {
    const int t = (threadIdx.x & 31) & 3;
    float mx[2] = {NEG_INF, NEG_INF};
    if (FAST && k0 + 8 * NF - 1 <= min(st.lim[0], st.lim[1])) {
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[j][e] *= scale;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
    } else {
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + 8 * j + 2 * t + (e & 1);
                s[j][e] = key <= st.lim[e >> 1] ? s[j][e] * scale : NEG_INF;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
    }
    float base[2], corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mn = fmaxf(st.m[h], mx[h]);
        base[h] = mn == NEG_INF ? 0.f : mn;
        corr[h] = expf(st.m[h] - base[h]);
        st.m[h] = mn;
        st.l[h] *= corr[h];
    }
    if (!RESCALE) {
        corr_out[0] = corr[0], corr_out[1] = corr[1];
    } else if (ALWAYS || corr[0] != 1.f || corr[1] != 1.f) {  // x * 1 = x: skipping is bitwise the same
#pragma unroll
        for (int f = 0; f < D / 8; ++f)
#pragma unroll
            for (int e = 0; e < 4; ++e) st.acc[f][e] *= corr[e >> 1];
    }
    if (FAST) {
        constexpr float LOG2E = 1.4426950408889634f;
        const float bl[2] = {base[0] * LOG2E, base[1] * LOG2E};
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[j][e] = ap_exp2(fmaf(s[j][e], LOG2E, -bl[e >> 1]));
                st.l[e >> 1] += s[j][e];
            }
        return;
    }
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[j][e] = expf(s[j][e] - base[e >> 1]);
            st.l[e >> 1] += s[j][e];
        }
}

// ap_online's O rescale, deferred (RESCALE = false): O *= corr per row, skipped when both factors are 1
template <int D> __device__ __forceinline__ void ap_rescale(ApRows<D>& st, const float (&corr)[2]) {
    if (corr[0] != 1.f || corr[1] != 1.f) {
#pragma unroll
        for (int f = 0; f < D / 8; ++f)
#pragma unroll
            for (int e = 0; e < 4; ++e) st.acc[f][e] *= corr[e >> 1];
    }
}
