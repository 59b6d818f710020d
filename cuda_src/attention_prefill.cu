// Causal prefill attention on tensor cores (flash-attention-2 style), bf16 paged KV cache (docs/model-math.md §3).
//
// Same semantics as attention.cu `attention`: q [R, HQ, D] (float or bf16), k_cache/v_cache [pages, page_size,
// HKV, D] bf16; row r (sequence row_seq[r]) attends positions 0..row_pos[r]; q head h reads KV head h / (HQ/HKV);
// o = softmax(q k^T * scale) v in q's type, fp32 online softmax.
//
// Operands are exact (as gemm.cu): K and V are bf16; float q is split q = hi + lo (two bf16 halves, two mma per
// fragment; bf16 q is exact in hi alone); the fp32 probabilities P are split the same way for P·V. mma.sync
// m16n8k16 bf16 x bf16 -> fp32 (fragment layout: see gemm.cu).
//
// Block = 64 consecutive rows of the launch x one query head, 4 warps, warp w owns rows 16w..16w+15 and the full
// head dimension (O accumulators D/2 floats per thread). Rows of the block are processed in segments: maximal runs
// of one sequence (a chunk may pack several sequences). Per segment the KV tiles of BN keys are visited in
// ascending order from key 0 up to the segment's largest position; keys past a row's position are masked to
// -inf, and a tile entirely past a row leaves that row bit-for-bit unchanged (corr = exp(0) = 1, p = 0, and V rows
// past the segment's last position are zero-filled so 0 * V stays 0). So each output's reduction order depends
// only on its own row: never on the batch, the block, or the other rows. Warps whose rows all lie before a tile
// skip its mma (same result, by the argument above).
//
// Shared memory (dynamic): Qh [64][D+8], Ql [64][D+8] (float q only), Ks [BN][D+8], Vs [BN][D+8] (bf16 words;
// rows padded by 8 so the fragment loads and ldmatrix rows of a warp fall in distinct banks).
#include "common.cuh"

#define AP_BM 64
#ifndef AP_STATIC_SHARED
#define AP_STATIC_SHARED __shared__  // the host emulation (one block at a time) makes these function statics
#endif
#define AP_THREADS 128

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

// Q rows r0..r0+63 of head hq into Qh (and Ql for float q); rows past R read as 0.
template <typename T, int D>
__device__ __forceinline__ void ap_stage_q(const T* q, int R, int HQ, int hq, int r0, u16* Qh, u16* Ql) {
    constexpr int LD = ApCfg<D>::LD;
    for (int c = threadIdx.x; c < AP_BM * D / 8; c += blockDim.x) {
        const int r = c / (D / 8), d = (c % (D / 8)) * 8;
        float v[8];
        if (r0 + r < R) {
            ap_load8(q + ((long long)(r0 + r) * HQ + hq) * D + d, v);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = 0.f;
        }
        u32 h[4], l[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) ap_split2(v[2 * j], v[2 * j + 1], h[j], l[j]);
        *reinterpret_cast<uint4*>(Qh + r * LD + d) = make_uint4(h[0], h[1], h[2], h[3]);
        if (ApSplit<T>::value) *reinterpret_cast<uint4*>(Ql + r * LD + d) = make_uint4(l[0], l[1], l[2], l[3]);
    }
}

// K and V of keys k0..k0+BN-1 (KV head hk, page row pt) into Ks, Vs; keys past kend are zero-filled (never read
// from the cache: their pages may not exist).
template <int D>
__device__ __forceinline__ void ap_stage_kv(const bf16* kc, const bf16* vc, const int* pt, int page_size, int HKV,
                                            int hk, int k0, int kend, u16* Ks, u16* Vs) {
    constexpr int BN = ApCfg<D>::BN, LD = ApCfg<D>::LD;
    for (int c = threadIdx.x; c < BN * D / 8; c += blockDim.x) {
        const int i = c / (D / 8), d = (c % (D / 8)) * 8, p = k0 + i;
        uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
        if (p <= kend) {
            const long long base = (((long long)pt[p / page_size] * page_size + p % page_size) * HKV + hk) * D + d;
            kv = *reinterpret_cast<const uint4*>(kc + base);
            vv = *reinterpret_cast<const uint4*>(vc + base);
        }
        *reinterpret_cast<uint4*>(Ks + i * LD + d) = kv;
        *reinterpret_cast<uint4*>(Vs + i * LD + d) = vv;
    }
}

// Online-softmax state of one thread: its two rows (g and g + 8 of the warp's 16) and their O fragments.
template <int D> struct ApRows {
    float acc[D / 8][4];  // O fragment f: rows g (elements 0, 1) and g + 8 (2, 3), columns 8f + 2t + (e & 1)
    float m[2], l[2];     // running max (scaled scores) and this thread's partial sum of p
    int lim[2];           // last key the row attends (-1: row not in the current segment)
};

// One KV tile for one warp: S = Qh·K^T (+ Ql·K^T), scale and mask, online-softmax update, O += P·V.
template <bool SPLIT, int D>
__device__ __forceinline__ void ap_tile(const u16* Qh, const u16* Ql, const u16* Ks, const u16* Vs, int wm, int k0,
                                        float scale, ApRows<D>& st) {
    constexpr int BN = ApCfg<D>::BN, LD = ApCfg<D>::LD, NF = BN / 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float s[NF][4];
#pragma unroll
    for (int j = 0; j < NF; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 4
    for (int kk = 0; kk < D; kk += 16) {
#pragma unroll
        for (int h = 0; h < (SPLIT ? 2 : 1); ++h) {
            const u16* A = h == 0 ? Qh : Ql;
            u32 a[4];
            a[0] = *reinterpret_cast<const u32*>(A + (wm + g) * LD + kk + 2 * t);
            a[1] = *reinterpret_cast<const u32*>(A + (wm + g + 8) * LD + kk + 2 * t);
            a[2] = *reinterpret_cast<const u32*>(A + (wm + g) * LD + kk + 2 * t + 8);
            a[3] = *reinterpret_cast<const u32*>(A + (wm + g + 8) * LD + kk + 2 * t + 8);
#pragma unroll
            for (int j = 0; j < NF; ++j) {
                const u16* kr = Ks + (8 * j + g) * LD + kk + 2 * t;
                ap_mma(s[j], a, *reinterpret_cast<const u32*>(kr), *reinterpret_cast<const u32*>(kr + 8));
            }
        }
    }
    float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = k0 + 8 * j + 2 * t + (e & 1);
            s[j][e] = key <= st.lim[e >> 1] ? s[j][e] * scale : NEG_INF;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
        }
    float base[2], corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mn = fmaxf(st.m[h], mx[h]);
        base[h] = mn == NEG_INF ? 0.f : mn;  // row with nothing attended yet: keep exp finite (p = corr = 0)
        corr[h] = expf(st.m[h] - base[h]);  // exactly 1 when the max did not move
        st.m[h] = mn;
        st.l[h] *= corr[h];
    }
#pragma unroll
    for (int f = 0; f < D / 8; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) st.acc[f][e] *= corr[e >> 1];
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[j][e] = expf(s[j][e] - base[e >> 1]);
            st.l[e >> 1] += s[j][e];
        }
    // O += P·V, P split into hi + lo; V B-fragments by transposed ldmatrix from Vs[key][dim].
    const int vr = ((lane >> 3) & 1) * 8 + (lane & 7), vc = (lane >> 4) * 8;
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) {
        u32 ah[4], al[4];
        ap_split2(s[2 * ks][0], s[2 * ks][1], ah[0], al[0]);
        ap_split2(s[2 * ks][2], s[2 * ks][3], ah[1], al[1]);
        ap_split2(s[2 * ks + 1][0], s[2 * ks + 1][1], ah[2], al[2]);
        ap_split2(s[2 * ks + 1][2], s[2 * ks + 1][3], ah[3], al[3]);
#pragma unroll
        for (int n = 0; n < D; n += 16) {
            u32 b[4];
            ap_ldsm_x4_trans(b, Vs + (16 * ks + vr) * LD + n + vc);
            ap_mma(st.acc[n / 8], ah, b[0], b[1]);
            ap_mma(st.acc[n / 8], al, b[0], b[1]);
            ap_mma(st.acc[n / 8 + 1], ah, b[2], b[3]);
            ap_mma(st.acc[n / 8 + 1], al, b[2], b[3]);
        }
    }
}

// grid (ceil(R / 64), HQ), 128 threads, dynamic shared memory per the layout above (the wrapper sizes it).
template <typename T, int D>
__global__ void __launch_bounds__(AP_THREADS)
    attention_prefill(const T* __restrict__ q, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                      const int* __restrict__ page_table, const int* __restrict__ row_seq,
                      const int* __restrict__ row_pos, T* __restrict__ o, int R, int HQ, int HKV, int page_size,
                      long long ldpt, float scale) {
    constexpr int BN = ApCfg<D>::BN, LD = ApCfg<D>::LD;
    constexpr bool SPLIT = ApSplit<T>::value;
    extern __shared__ uint4 att_smem[];  // (named as the host emulation's shared memory)
    AP_STATIC_SHARED int s_seq[AP_BM], s_pos[AP_BM];
    u16* Qh = reinterpret_cast<u16*>(att_smem);
    u16* Ql = Qh + AP_BM * LD;
    u16* Ks = Ql + (SPLIT ? AP_BM * LD : 0);
    u16* Vs = Ks + BN * LD;
    const int r0 = blockIdx.x * AP_BM, hq = blockIdx.y, hk = hq / (HQ / HKV), nrows = min(AP_BM, R - r0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wm = warp * 16;
    for (int i = threadIdx.x; i < AP_BM; i += blockDim.x) {
        s_seq[i] = i < nrows ? row_seq[r0 + i] : -1;
        s_pos[i] = i < nrows ? row_pos[r0 + i] : -1;
    }
    ap_stage_q<T, D>(q, R, HQ, hq, r0, Qh, Ql);
    __syncthreads();
    ApRows<D> st;
    for (int s0 = 0, s1; s0 < nrows; s0 = s1) {  // segments: maximal runs of one sequence
        const int b = s_seq[s0];
        int kend = s_pos[s0];
        for (s1 = s0 + 1; s1 < nrows && s_seq[s1] == b; ++s1) kend = max(kend, s_pos[s1]);
        int wlim = -1;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wm + g + 8 * h;
            st.lim[h] = r >= s0 && r < s1 ? s_pos[r] : -1;
            st.m[h] = NEG_INF, st.l[h] = 0.f;
            wlim = max(wlim, st.lim[h]);
        }
#pragma unroll
        for (int x = 16; x > 0; x >>= 1) wlim = max(wlim, __shfl_xor_sync(0xffffffffu, wlim, x));
#pragma unroll
        for (int f = 0; f < D / 8; ++f) st.acc[f][0] = st.acc[f][1] = st.acc[f][2] = st.acc[f][3] = 0.f;
        const int* pt = page_table + (long long)b * ldpt;
        for (int k0 = 0; k0 <= kend; k0 += BN) {
            ap_stage_kv<D>(k_cache, v_cache, pt, page_size, HKV, hk, k0, kend, Ks, Vs);
            __syncthreads();
            if (k0 <= wlim) ap_tile<SPLIT, D>(Qh, Ql, Ks, Vs, wm, k0, scale, st);  // warp-uniform
            __syncthreads();
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = st.l[h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int r = wm + g + 8 * h;
            if (st.lim[h] < 0) continue;
            const float il = l > 0.f ? 1.f / l : 0.f;
            T* orow = o + ((long long)(r0 + r) * HQ + hq) * D;
#pragma unroll
            for (int f = 0; f < D / 8; ++f)
#pragma unroll
                for (int c = 0; c < 2; ++c) orow[8 * f + 2 * t + c] = from_f<T>(st.acc[f][2 * h + c] * il);
        }
    }
}

// ---- attention_prefill_gqa: the GQA group packed, K/V tiles double-buffered by cp.async, ldmatrix fragments ----
// Block = one KV head hk x BR = 128 / G consecutive rows of the launch (G = HQ / HKV query heads per KV head), 8
// warps. Its 128 slots are (row, head) pairs, slot m = G r + h (row r0 + r, query head hk G + h; slots past BR G
// or past R are zero and never written), warp w owns slots 16w..16w+15 as its mma rows, so every K/V tile staged
// in shared memory serves all G heads of the group (the one-head kernel above loads it G times). Per slot the
// arithmetic is the kernel above's, operation for operation: S accumulators over dims in 16-steps, hi then lo;
// the same masks, online softmax and exp; P·V in the same order, with the same BN. Fragments now come by ldmatrix
// (Q: one x4 per 16x16 A fragment; K: one x4 per two 8-key B fragments), which moves no value, so the output is
// bitwise the one-head kernel's. Row independence follows as there (tiles past a row leave it unchanged).
// Tiles: tile i + 1 is copied (cp.async, zero-filled past the segment's last key) while tile i is computed; one
// block barrier per tile. Row tiles are scheduled last-first (the late, long rows start in the first wave).
#define AG_SLOTS 128
#define AG_THREADS 256

template <typename T, int D>
__device__ __forceinline__ void ag_stage_q(const T* q, int nrows, int HQ, int G, int hk, int r0, u16* Qh, u16* Ql) {
    constexpr int LD = ApCfg<D>::LD;
    for (int c = threadIdx.x; c < AG_SLOTS * D / 8; c += blockDim.x) {
        const int m = c / (D / 8), d = (c % (D / 8)) * 8, r = m / G;
        float v[8];
        if (r < nrows) {
            ap_load8(q + ((long long)(r0 + r) * HQ + hk * G + m % G) * D + d, v);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = 0.f;
        }
        u32 h[4], l[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) ap_split2(v[2 * j], v[2 * j + 1], h[j], l[j]);
        *reinterpret_cast<uint4*>(Qh + m * LD + d) = make_uint4(h[0], h[1], h[2], h[3]);
        if (ApSplit<T>::value) *reinterpret_cast<uint4*>(Ql + m * LD + d) = make_uint4(l[0], l[1], l[2], l[3]);
    }
}

// cp.async of keys k0..k0+BN-1 into Ks, Vs (keys past kend zero-filled, their pages never touched).
template <int D>
__device__ __forceinline__ void ag_stage_kv(const bf16* kc, const bf16* vc, const int* pt, int page_size, int HKV,
                                            int hk, int k0, int kend, u16* Ks, u16* Vs) {
    constexpr int BN = ApCfg<D>::BN, LD = ApCfg<D>::LD;
    for (int c = threadIdx.x; c < BN * D / 8; c += blockDim.x) {
        const int i = c / (D / 8), d = (c % (D / 8)) * 8, p = k0 + i;
        const bool ok = p <= kend;
        long long base = 0;
        if (ok) base = (((long long)pt[p / page_size] * page_size + p % page_size) * HKV + hk) * D + d;
        ap_cp16(Ks + i * LD + d, kc + base, ok);
        ap_cp16(Vs + i * LD + d, vc + base, ok);
    }
}

// One KV tile for one warp (slots wm..wm+15): ap_tile's arithmetic with ldmatrix fragments.
template <bool SPLIT, int D>
__device__ __forceinline__ void ag_tile(const u16* Qh, const u16* Ql, const u16* Ks, const u16* Vs, int wm, int k0,
                                        float scale, ApRows<D>& st) {
    constexpr int BN = ApCfg<D>::BN, LD = ApCfg<D>::LD, NF = BN / 8;
    const int lane = threadIdx.x & 31, t = lane & 3;
    const int qoff = (wm + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;  // A: matrix i = lane / 8
    const int koff = ((lane & 7) + (lane >> 4) * 8) * LD + ((lane >> 3) & 1) * 8;     // B: keys x k-halves
    float s[NF][4];
#pragma unroll
    for (int j = 0; j < NF; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 2
    for (int kk = 0; kk < D; kk += 16) {
        u32 a[2][4];
        ap_ldsm_x4(a[0], Qh + qoff + kk);
        if (SPLIT) ap_ldsm_x4(a[1], Ql + qoff + kk);
#pragma unroll
        for (int j = 0; j < NF; j += 2) {
            u32 b[4];
            ap_ldsm_x4(b, Ks + koff + 8 * j * LD + kk);
#pragma unroll
            for (int h = 0; h < (SPLIT ? 2 : 1); ++h) {  // per accumulator: hi then lo, as ap_tile
                ap_mma(s[j], a[h], b[0], b[1]);
                ap_mma(s[j + 1], a[h], b[2], b[3]);
            }
        }
    }
    float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = k0 + 8 * j + 2 * t + (e & 1);
            s[j][e] = key <= st.lim[e >> 1] ? s[j][e] * scale : NEG_INF;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
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
    if (corr[0] != 1.f || corr[1] != 1.f) {  // x * 1 = x: skipping is bitwise the same
#pragma unroll
        for (int f = 0; f < D / 8; ++f)
#pragma unroll
            for (int e = 0; e < 4; ++e) st.acc[f][e] *= corr[e >> 1];
    }
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[j][e] = expf(s[j][e] - base[e >> 1]);
            st.l[e >> 1] += s[j][e];
        }
    const int voff = (((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8;
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) {
        u32 ah[4], al[4];
        ap_split2(s[2 * ks][0], s[2 * ks][1], ah[0], al[0]);
        ap_split2(s[2 * ks][2], s[2 * ks][3], ah[1], al[1]);
        ap_split2(s[2 * ks + 1][0], s[2 * ks + 1][1], ah[2], al[2]);
        ap_split2(s[2 * ks + 1][2], s[2 * ks + 1][3], ah[3], al[3]);
#pragma unroll
        for (int n = 0; n < D; n += 16) {
            u32 b[4];
            ap_ldsm_x4_trans(b, Vs + voff + 16 * ks * LD + n);
            ap_mma(st.acc[n / 8], ah, b[0], b[1]);
            ap_mma(st.acc[n / 8], al, b[0], b[1]);
            ap_mma(st.acc[n / 8 + 1], ah, b[2], b[3]);
            ap_mma(st.acc[n / 8 + 1], al, b[2], b[3]);
        }
    }
}

// grid (ceil(R / BR), HKV), BR = 128 / G (G <= 128), 256 threads; dynamic shared memory: Qh, Ql (float q)
// [128][D+8], K and V [2 buffers][BN][D+8] bf16 words, then the rows' sequence and position [128] ints each.
template <typename T, int D>
__global__ void __launch_bounds__(AG_THREADS, 1)
    attention_prefill_gqa(const T* __restrict__ q, const bf16* __restrict__ k_cache,
                          const bf16* __restrict__ v_cache, const int* __restrict__ page_table,
                          const int* __restrict__ row_seq, const int* __restrict__ row_pos, T* __restrict__ o, int R,
                          int HQ, int HKV, int page_size, long long ldpt, float scale) {
    constexpr int BN = ApCfg<D>::BN, LD = ApCfg<D>::LD;
    constexpr bool SPLIT = ApSplit<T>::value;
    extern __shared__ uint4 att_smem[];
    u16* Qh = reinterpret_cast<u16*>(att_smem);
    u16* Ql = Qh + AG_SLOTS * LD;
    u16* Kb = Ql + (SPLIT ? AG_SLOTS * LD : 0);
    u16* Vb = Kb + 2 * BN * LD;
    int* s_seq = reinterpret_cast<int*>(Vb + 2 * BN * LD);
    int* s_pos = s_seq + AG_SLOTS;
    const int G = HQ / HKV, BR = AG_SLOTS / G, hk = blockIdx.y;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * BR, nrows = min(BR, R - r0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wm = warp * 16;
    for (int i = threadIdx.x; i < AG_SLOTS; i += blockDim.x) {
        s_seq[i] = i < nrows ? row_seq[r0 + i] : -1;
        s_pos[i] = i < nrows ? row_pos[r0 + i] : -1;
    }
    ag_stage_q<T, D>(q, nrows, HQ, G, hk, r0, Qh, Ql);
    __syncthreads();
    const int row[2] = {(wm + g) / G, (wm + g + 8) / G};  // the thread's two slots' rows (>= nrows: none)
    ApRows<D> st;
    for (int s0 = 0, s1; s0 < nrows; s0 = s1) {  // segments: maximal runs of one sequence
        const int b = s_seq[s0];
        int kend = s_pos[s0];
        for (s1 = s0 + 1; s1 < nrows && s_seq[s1] == b; ++s1) kend = max(kend, s_pos[s1]);
        int wlim = -1;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            st.lim[h] = row[h] >= s0 && row[h] < s1 ? s_pos[row[h]] : -1;
            st.m[h] = NEG_INF, st.l[h] = 0.f;
            wlim = max(wlim, st.lim[h]);
        }
#pragma unroll
        for (int x = 16; x > 0; x >>= 1) wlim = max(wlim, __shfl_xor_sync(0xffffffffu, wlim, x));
#pragma unroll
        for (int f = 0; f < D / 8; ++f) st.acc[f][0] = st.acc[f][1] = st.acc[f][2] = st.acc[f][3] = 0.f;
        const int* pt = page_table + (long long)b * ldpt;
        const int ntiles = kend / BN + 1;
        ag_stage_kv<D>(k_cache, v_cache, pt, page_size, HKV, hk, 0, kend, Kb, Vb);
        ap_cp_commit();
        for (int i = 0; i < ntiles; ++i) {
            ap_cp_wait_all();
            __syncthreads();  // tile i is in place for all; every warp is done with tile i - 1's buffer
            const int nb = (i + 1) & 1;
            if (i + 1 < ntiles)
                ag_stage_kv<D>(k_cache, v_cache, pt, page_size, HKV, hk, (i + 1) * BN, kend, Kb + nb * BN * LD,
                               Vb + nb * BN * LD);
            ap_cp_commit();
            const int cb = i & 1;
            if (i * BN <= wlim) ag_tile<SPLIT, D>(Qh, Ql, Kb + cb * BN * LD, Vb + cb * BN * LD, wm, i * BN, scale, st);
        }
        __syncthreads();  // the next segment's first copies reuse the buffers
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = st.l[h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (st.lim[h] < 0) continue;
            const float il = l > 0.f ? 1.f / l : 0.f;
            const int m = wm + g + 8 * h;
            T* orow = o + ((long long)(r0 + row[h]) * HQ + hk * G + m % G) * D;
#pragma unroll
            for (int f = 0; f < D / 8; ++f)
#pragma unroll
                for (int c = 0; c < 2; ++c) orow[8 * f + 2 * t + c] = from_f<T>(st.acc[f][2 * h + c] * il);
        }
    }
}
