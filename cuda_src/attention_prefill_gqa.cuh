// The GQA prefill-attention block (attention_prefill_gqa on mma.sync, attention_prefill.cu; attention_prefill_wg
// on wgmma, attention_wg.cu): its slots, staging, segments, key splits and outputs, shared by both engines. An
// engine E gives the tile size BN, the shared-memory layout of Q (Q_WORDS per half, q_off) and of a K or V buffer
// (KV_WORDS, kv_off), base() (the dynamic shared memory's aligned start), after_copy() (what a thread does after
// its copies land, before the block barrier), group_lim() (the last key any row of its unit of issue attends: a
// tile past it is skipped) and tile<SPLIT>() (one KV tile's two products for one warp's 16 slots around
// ap_online). Which engine computes a tile changes no step of the per-row arithmetic described here. Q_LO: whether
// the engine reads float q's lo half (else neither staged nor given shared memory).
#pragma once
#include "attention_prefill_frag.cuh"

// ---- attention_prefill_gqa: the GQA group packed, K/V tiles double-buffered by cp.async, ldmatrix fragments ----
// Block = one KV head hk x BR = 128 / G consecutive rows of the launch (G = HQ / HKV query heads per KV head), 8
// warps. Its 128 slots are (row, head) pairs, slot m = G r + h (row r0 + r, query head hk G + h; slots past BR G
// or past R are zero and never written), warp w owns slots 16w..16w+15 as its mma rows, so every K/V tile staged
// in shared memory serves all G heads of the group (the one-head kernel loads it G times). Per slot the
// arithmetic is the one-head kernel's, operation for operation: S accumulators over dims in 16-steps, hi then lo;
// the same masks, online softmax and exp; P·V in the same order, with the same BN. Fragments now come by ldmatrix
// (Q: one x4 per 16x16 A fragment; K: one x4 per two 8-key B fragments), which moves no value, so the output is
// bitwise the one-head kernel's. Row independence follows as there (tiles past a row leave it unchanged).
// Tiles: tile i + 1 is copied (cp.async, zero-filled past the segment's last key) while tile i is computed; one
// block barrier per tile. Row tiles are scheduled last-first (the late, long rows start in the first wave).
#define AG_SLOTS 128
#define AG_THREADS 256

template <class E, typename T, int D>
__device__ __forceinline__ void ag_stage_q(const T* q, int nrows, int HQ, int G, int hk, int r0, u16* Qh, u16* Ql) {
    constexpr bool LO = ApSplit<T>::value && E::Q_LO;
    for (int c = threadIdx.x; c < AG_SLOTS * D / 8; c += blockDim.x) {
        const int m = c / (D / 8), d = (c % (D / 8)) * 8, r = m / G;
        ap_stage_q8<T, LO>(r < nrows ? q + ((long long)(r0 + r) * HQ + hk * G + m % G) * D + d : nullptr, Qh, Ql,
                           E::q_off(m, d));
    }
}

// log2(page_size) for a power of two, else -1 (ag_stage_kv then divides)
__device__ __forceinline__ int ag_page_shift(int page_size) {
    int sh = 0;
    while ((1 << sh) < page_size) ++sh;
    return (1 << sh) == page_size ? sh : -1;
}

// cp.async of keys k0..k0+BN-1 into Ks, Vs (keys past kend zero-filled, their pages never touched). ps_shift:
// ag_page_shift(page_size). Measured (H200, Nsight Compute, 27B heads at 8K): the wgmma kernel's issue slots were
// 42% busy with the ALU its busiest pipe, so a key's page and offset come by shift and mask, not by a runtime
// integer division, wherever the page size is a power of two, and each thread stages CPT chunks of one key (its
// page looked up and its row address formed once per tile, not per chunk; the block's AG_THREADS threads, TPK per
// key, consecutive threads on adjacent 16-byte chunks). The same bytes land in the same places.
// NT threads stage (tid: this one's index among them; attention_ws.cu's producer warpgroup: 128); KV: which of
// K (1), V (2) or both (3); U: the chunk loop's unroll (0: all; the producer's few registers take fewer).
template <class E, int D, int NT = AG_THREADS, int KV = 3, int U = 0>
__device__ __forceinline__ void ag_stage_kv(const bf16* kc, const bf16* vc, const int* pt, int page_size, int ps_shift,
                                            int HKV, int hk, int k0, int kend, u16* Ks, u16* Vs,
                                            int tid = threadIdx.x) {
    constexpr int BN = E::BN, CPK = D / 8, CPT = BN * CPK / NT, TPK = CPK / CPT;
    static_assert(CPT >= 1 && CPK % CPT == 0 && BN * CPK == CPT * NT, "whole chunks of one key per thread");
    const int i = tid / TPK, c0 = tid % TPK, p = k0 + i;
    const bool ok = p <= kend;
    long long row = 0;
    if (ok) {
        const int pg = ps_shift >= 0 ? p >> ps_shift : p / page_size, po = p - pg * page_size;
        row = (((long long)pt[pg] * page_size + po) * HKV + hk) * D;
    }
    constexpr int UN = U ? U : CPT;
#pragma unroll UN
    for (int j = 0; j < CPT; ++j) {
        const int d = (c0 + TPK * j) * 8, off = E::kv_off(i, d);
        if (KV & 1) ap_cp16(Ks + off, kc + row + d, ok);
        if (KV & 2) ap_cp16(Vs + off, vc + row + d, ok);
    }
}

// A segment's start for warp wm's 16 slots (rows row[0], row[1] of this thread; a row outside [s0, s1) attends
// nothing): their last keys, running max and sum, O zeroed. Returns the engine's skip bound (E::group_lim of the
// warp's largest last key: the last key any row of its unit of issue attends).
template <class E, int D>
__device__ __forceinline__ int ag_segment_begin(ApRows<D>& st, const int (&row)[2], const int* s_pos, int s0, int s1,
                                                int wm, int G) {
    int wlim = -1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        st.lim[h] = row[h] >= s0 && row[h] < s1 ? s_pos[row[h]] : -1;
        st.m[h] = NEG_INF, st.l[h] = 0.f;
        wlim = max(wlim, st.lim[h]);
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) wlim = max(wlim, __shfl_xor_sync(0xffffffffu, wlim, x));
    wlim = E::group_lim(wlim, s_pos, s0, s1, wm, G);  // the engine's skip unit (a warp, or a warpgroup)
#pragma unroll
    for (int f = 0; f < D / 8; ++f) st.acc[f][0] = st.acc[f][1] = st.acc[f][2] = st.acc[f][3] = 0.f;
    return wlim;
}

// A segment's outputs for this thread's two slots: O / l, or with key splits the split's partial state (the
// unnormalised O, running max and quad-summed l), merged by attention_prefill_combine. Rows with no key in this
// split (or not in the segment) write nothing.
template <typename T, int D>
__device__ __forceinline__ void ag_store(const ApRows<D>& st, const int (&row)[2], int wm, int r0, int R, int HQ,
                                         int hk, int G, int kz0, int split_keys, T* __restrict__ o,
                                         float* __restrict__ part) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = st.l[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (st.lim[h] < kz0) continue;  // no row here, or none of its keys in this split
        const int m = wm + g + 8 * h;
        const long long oh = (long long)(r0 + row[h]) * HQ + hk * G + m % G;
        if (split_keys) {  // the split's partial state, merged by attention_prefill_combine
            float* prow = part + ((long long)blockIdx.z * R * HQ + oh) * (D + 2);
#pragma unroll
            for (int f = 0; f < D / 8; ++f)
#pragma unroll
                for (int c = 0; c < 2; ++c) prow[8 * f + 2 * t + c] = st.acc[f][2 * h + c];
            if (t == 0) prow[D] = st.m[h], prow[D + 1] = l;
            continue;
        }
        const float il = l > 0.f ? 1.f / l : 0.f;
        T* orow = o + oh * D;
#pragma unroll
        for (int f = 0; f < D / 8; ++f)
#pragma unroll
            for (int c = 0; c < 2; ++c) orow[8 * f + 2 * t + c] = from_f<T>(st.acc[f][2 * h + c] * il);
    }
}

// The kernel body. grid (ceil(R / BR), HKV, splits), BR = 128 / G (G <= 128), 256 threads; dynamic shared memory
// (from E::base): Qh, Ql (float q) of E::Q_WORDS each, K and V [2 buffers] of E::KV_WORDS bf16 words, then the
// rows' sequence and position [128] ints each.
// Key splits (split_keys > 0, a multiple of BN; the wrapper's choice for launches of few blocks, docs/cuda.md):
// block z visits only keys [z·split_keys, (z+1)·split_keys) and, for each row with a key there, stores its
// unnormalised accumulators, running max and (quad-summed) sum to part[z][r][h][D + 2] instead of the output;
// attention_prefill_combine merges a row's splits 0 .. row_pos / split_keys in order. A row with one split is
// bitwise the unsplit result: its only split walks the same tiles from key 0, and the merge multiplies by e^0 = 1.
template <class E, typename T, int D>
__device__ __forceinline__ void ag_body(const T* __restrict__ q, const bf16* __restrict__ k_cache,
                                        const bf16* __restrict__ v_cache, const int* __restrict__ page_table,
                                        const int* __restrict__ row_seq, const int* __restrict__ row_pos,
                                        T* __restrict__ o, int R, int HQ, int HKV, int page_size, long long ldpt,
                                        float scale, int split_keys, float* __restrict__ part) {
    constexpr int BN = E::BN, QW = E::Q_WORDS, KW = E::KV_WORDS;
    constexpr bool SPLIT = ApSplit<T>::value && E::Q_LO;
    extern __shared__ uint4 att_smem[];
    u16* Qh = E::base(att_smem);
    u16* Ql = Qh + QW;
    u16* Kb = Ql + (SPLIT ? QW : 0);
    u16* Vb = Kb + 2 * KW;
    int* s_seq = reinterpret_cast<int*>(Vb + 2 * KW);
    int* s_pos = s_seq + AG_SLOTS;
    const int G = HQ / HKV, BR = AG_SLOTS / G, hk = blockIdx.y;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * BR, nrows = min(BR, R - r0), kz0 = blockIdx.z * split_keys;
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, wm = warp * 16;
    const int ps_shift = ag_page_shift(page_size);
    ap_load_rows(row_seq, row_pos, r0, nrows, AG_SLOTS, s_seq, s_pos);
    ag_stage_q<E, T, D>(q, nrows, HQ, G, hk, r0, Qh, Ql);
    E::after_copy();
    __syncthreads();
    const int row[2] = {(wm + g) / G, (wm + g + 8) / G};  // the thread's two slots' rows (>= nrows: none)
    ApRows<D> st;
    for (int s0 = 0, s1; s0 < nrows; s0 = s1) {  // segments: maximal runs of one sequence
        const int b = s_seq[s0];
        int kend;
        s1 = ap_segment(s_seq, s_pos, s0, nrows, kend);
        const int wlim = ag_segment_begin<E, D>(st, row, s_pos, s0, s1, wm, G);
        const int* pt = page_table + (long long)b * ldpt;
        // this block's tiles: all of the segment's, or those of split z (block-uniform bounds)
        const int i0 = split_keys ? kz0 / BN : 0;
        const int i1 = split_keys ? min(kend / BN, (kz0 + split_keys) / BN - 1) : kend / BN;
        if (i0 > i1) continue;  // no key of this split is visible to the segment
        ag_stage_kv<E, D>(k_cache, v_cache, pt, page_size, ps_shift, HKV, hk, i0 * BN, kend, Kb, Vb);
        ap_cp_commit();
        for (int i = i0; i <= i1; ++i) {
            ap_cp_wait_all();
            E::after_copy();
            __syncthreads();  // tile i is in place for all; every warp is done with tile i - 1's buffer
            const int nb = (i - i0 + 1) & 1;
            if (i < i1)
                ag_stage_kv<E, D>(k_cache, v_cache, pt, page_size, ps_shift, HKV, hk, (i + 1) * BN, kend,
                                  Kb + nb * KW, Vb + nb * KW);
            ap_cp_commit();
            const int cb = (i - i0) & 1;
            if (i * BN <= wlim) E::template tile<SPLIT>(Qh, Ql, Kb + cb * KW, Vb + cb * KW, wm, i * BN, scale, st);
        }
        __syncthreads();  // the next segment's first copies reuse the buffers
        ag_store<T, D>(st, row, wm, r0, R, HQ, hk, G, kz0, split_keys, o, part);
    }
}

