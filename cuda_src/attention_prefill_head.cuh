// attention_prefill (variant "head"): the one-query-head-per-block prefill attention kernel, kept beside
// attention_prefill_gqa (attention_prefill.cu) for comparison; both compute the same bits per row.
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
#pragma once
#include "attention_prefill_frag.cuh"

#define AP_BM 64
#ifndef AP_STATIC_SHARED
#define AP_STATIC_SHARED __shared__  // the host emulation (one block at a time) makes these function statics
#endif
#define AP_THREADS 128

// Q rows r0..r0+63 of head hq into Qh (and Ql for float q); rows past R read as 0.
template <typename T, int D>
__device__ __forceinline__ void ap_stage_q(const T* q, int R, int HQ, int hq, int r0, u16* Qh, u16* Ql) {
    constexpr int LD = ApCfg<D>::LD;
    for (int c = threadIdx.x; c < AP_BM * D / 8; c += blockDim.x) {
        const int r = c / (D / 8), d = (c % (D / 8)) * 8;
        ap_stage_q8(r0 + r < R ? q + ((long long)(r0 + r) * HQ + hq) * D + d : nullptr, Qh, Ql, r * LD + d);
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
    ap_online<NF, D, true>(s, k0, scale, st);
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
    ap_load_rows(row_seq, row_pos, r0, nrows, AP_BM, s_seq, s_pos);
    ap_stage_q<T, D>(q, R, HQ, hq, r0, Qh, Ql);
    __syncthreads();
    ApRows<D> st;
    for (int s0 = 0, s1; s0 < nrows; s0 = s1) {  // segments: maximal runs of one sequence
        const int b = s_seq[s0];
        int kend;
        s1 = ap_segment(s_seq, s_pos, s0, nrows, kend);
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
