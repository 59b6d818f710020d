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
// Two kernels, the same arithmetic per row (bitwise the same outputs; docs/cuda.md "Prefill attention"):
// attention_prefill_gqa below, and attention_prefill (one query head per block, attention_prefill_head.cuh).
#include "attention_prefill_frag.cuh"
#include "attention_prefill_head.cuh"
#include "attention_prefill_gqa.cuh"

// ---- attention_prefill_gqa: the block of attention_prefill_gqa.cuh, its tiles on mma.sync with ldmatrix fragments ----
// One KV tile for one warp (slots wm..wm+15): ap_tile's arithmetic with ldmatrix fragments.
template <bool SPLIT, int D>
__device__ __forceinline__ void ag_tile(const u16* Qh, const u16* Ql, const u16* Ks, const u16* Vs, int wm, int k0,
                                        float scale, ApRows<D>& st) {
    constexpr int BN = ApCfg<D>::BN, LD = ApCfg<D>::LD, NF = BN / 8;
    const int lane = threadIdx.x & 31;
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
    ap_online<NF, D>(s, k0, scale, st);
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

// The mma.sync engine: rows padded to D + 8 words (the 8 row addresses of an ldmatrix in distinct bank groups)
template <int D> struct AgSync {
    static constexpr int BN = ApCfg<D>::BN, LD = ApCfg<D>::LD, Q_WORDS = AG_SLOTS * LD, KV_WORDS = BN * LD;
    static constexpr bool Q_LO = true;
    static __device__ __forceinline__ u16* base(uint4* smem) { return reinterpret_cast<u16*>(smem); }
    static __device__ __forceinline__ int q_off(int m, int d) { return m * LD + d; }
    static __device__ __forceinline__ int kv_off(int i, int d) { return i * LD + d; }
    static __device__ __forceinline__ void after_copy() {}
    static __device__ __forceinline__ int group_lim(int wlim, const int*, int, int, int, int) { return wlim; }
    template <bool SPLIT>
    static __device__ __forceinline__ void tile(const u16* Qh, const u16* Ql, const u16* Ks, const u16* Vs, int wm,
                                                int k0, float scale, ApRows<D>& st) {
        ag_tile<SPLIT, D>(Qh, Ql, Ks, Vs, wm, k0, scale, st);
    }
};

// grid (ceil(R / BR), HKV, splits), 256 threads; dynamic shared memory 2 (D + 8) (128 (1 + split) + 4 BN) + 1024
// bytes: ag_body (attention_prefill_gqa.cuh) with the mma.sync engine.
template <typename T, int D>
__global__ void __launch_bounds__(AG_THREADS, 1)
    attention_prefill_gqa(const T* __restrict__ q, const bf16* __restrict__ k_cache,
                          const bf16* __restrict__ v_cache, const int* __restrict__ page_table,
                          const int* __restrict__ row_seq, const int* __restrict__ row_pos, T* __restrict__ o, int R,
                          int HQ, int HKV, int page_size, long long ldpt, float scale, int split_keys,
                          float* __restrict__ part) {
    ag_body<AgSync<D>, T, D>(q, k_cache, v_cache, page_table, row_seq, row_pos, o, R, HQ, HKV, page_size, ldpt,
                             scale, split_keys, part);
}

// The key splits' merge: one thread per output element (r, h, d) of rows 0 .. R - 1. Row r has splits 0 .. n - 1,
// n = row_pos[r] / split_keys + 1, each with keys (row_pos >= z·split_keys). M = max m_z, w_z = e^{m_z − M},
// o = (Σ_z w_z acc_z) · (1 / Σ_z w_z l_z), the sums in split order from the first term (n = 1: w_0 = 1, so acc_0
// and l_0 unchanged, and o = acc_0 · (1 / l_0) as the unsplit kernel stores it).
template <typename T, int D>
__global__ void __launch_bounds__(256)
    attention_prefill_combine(const float* __restrict__ part, const int* __restrict__ row_pos, T* __restrict__ o,
                              int R, int HQ, int split_keys) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)R * HQ * D) return;
    const long long oh = e / D, zs = (long long)R * HQ * (D + 2);
    const int d = (int)(e % D), n = row_pos[oh / HQ] / split_keys + 1;
    const float* p = part + oh * (D + 2);
    float mx = p[D];
    for (int z = 1; z < n; ++z) mx = fmaxf(mx, p[z * zs + D]);
    const float w0 = expf(p[D] - mx);
    float acc = p[d] * w0, l = p[D + 1] * w0;
    for (int z = 1; z < n; ++z) {
        const float w = expf(p[z * zs + D] - mx);
        acc += p[z * zs + d] * w;
        l += p[z * zs + D + 1] * w;
    }
    const float il = l > 0.f ? 1.f / l : 0.f;
    o[oh * D + d] = from_f<T>(acc * il);
}
