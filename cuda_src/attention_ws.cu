// Causal prefill attention, warp-specialized (sm_90a): the rounded-q wgmma kernel (attention_wg.cu at precision
// "bf16": 64-key tiles, P rounded to bf16, the fast softmax) with its K / V staging moved to a producer warpgroup and
// the block barrier per tile replaced by mbarriers, so that the two consumer warpgroups no longer run in step.
//
// Block: 384 threads. Warpgroup 0 produces: its 128 threads cp.async each tile's K and V rows into a 2-stage ring
// (setmaxnreg.dec: it needs few registers), each thread's copies completing on the stage's full barrier
// (cp.async.mbarrier.arrive.noinc: 128 arrivals). Warpgroups 1 and 2 consume (setmaxnreg.inc): warpgroup c owns
// slots 64c..64c+63 exactly as warps 4c..4c+3 of the wg kernel do (consumer warp w holds slots 16w..16w+15), so
// every slot's arithmetic is that kernel's: the same wgmmas in the same order on the same operands, ap_online, the
// same outputs. K and V have their own full and empty barriers (a stage's K is released once S is computed, its V
// once P V has landed); every consumer warp arrives on the empty barriers of every tile of the segment, also of the
// tiles its warpgroup skips (after that tile's full barrier has completed, so an early arrival can never count
// toward the stage's previous phase).
//
// Two options (template flags), each changing only when a product is issued, never what it adds:
//   OV (intra-warpgroup overlap): tile j's S = Q K^T and tile j-1's O += P V are issued together; the softmax of S_j
//      runs while P V is in flight, and its O rescale (ap_online's, deferred: ap_rescale) follows once P V has
//      landed. O sees the same sequence as in the wg kernel: ... += P_{j-1} V_{j-1}, *= corr_j, += P_j V_j.
//   PP (ping-pong): the two consumer warpgroups take turns issuing their products (named barriers 1 and 2), so that
//      one's softmax overlaps the other's products instead of both waiting on the tensor cores at once. Both take
//      a turn for every issue step of every segment, also for steps with nothing to issue, so the turns stay paired.
// Measured (H100, docs/cuda.md "Warp-specialized prefill attention"): PP alone is the fastest (8K prompt, 27B heads:
// 53.1% of the bf16 GEMM rate against the wg kernel's 46.0%), OV slower; attention_prefill.WS_OPTIONS = (OV off, PP
// on). Registers: setmaxnreg 32 / 232 with the producer's chunk loop unrolled AS_STAGE_UNROLL = 4 ways (no spills;
// OV's S, two P arrays and O need the 232, below which ptxas serializes every wgmma).
// Shared memory as the wg kernel's: Q [2 warpgroups][4 x 64-dim blocks][64 slots][64] bf16 (64 KB), K and V
// [2 stages][4][64 keys][64] (128 KB), the rows' sequence and position (1 KB), 8 mbarriers, 1024 of alignment.
#include "attention_wg.cuh"
#include "mbarrier.cuh"

#define AS_THREADS 384
#define AS_CONSUMER_WARPS 8
#ifndef AS_STAGE_UNROLL
#define AS_STAGE_UNROLL 4
#endif

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void as_named_sync(int id) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void as_named_arrive(int id) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

// The barriers: full K, full V, empty K, empty V, 2 stages each (8-byte words from bars)
struct AsBars {
    u32 bars;
    __device__ __forceinline__ u32 full(int kv, int s) const { return bars + 8 * (2 * kv + s); }
    __device__ __forceinline__ u32 empty(int kv, int s) const { return bars + 8 * (4 + 2 * kv + s); }
};

// A consumer warp's release of tile n's K or V stage (lane 0 arrives for the warp)
__device__ __forceinline__ void as_release(const AsBars& b, int kv, int n) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(b.empty(kv, n & 1));
}
// wait until tile n's K or V has landed, then make it visible to this thread's wgmma operand reads
__device__ __forceinline__ void as_acquire(const AsBars& b, int kv, int n) {
    mbar_wait(b.full(kv, n & 1), (n >> 1) & 1);
    fence_proxy_async();
}

// The products of one issue turn, each its own commit group, issued and not waited for: S = Q K^T of a tile into s
// if S, then O += P V of a tile (P rounded to bf16) if PV. Every register operand is defined before
// the first wgmma (ptxas serializes the wgmmas when an instruction defines one between them, C7513).
template <int D, bool S, bool PV>
__device__ __forceinline__ void as_issue(float (&s)[8][4], ApRows<D>& st, u32 (&p)[4][4], u32 qh, u32 ks, u32 vs) {
    float(&sv)[32] = *reinterpret_cast<float(*)[32]>(&s[0][0]);
    float(&acc)[D / 2] = *reinterpret_cast<float(*)[D / 2]>(&st.acc[0][0]);
    u32 none[4][4];
    if (PV) {
        fence_regs(acc);
        fence_regs(p);
    }
    wgmma_fence();
    if (S) {  // aw_issue_s's products, the first one not reading s (as from zeroed accumulators)
        const u64 dq = desc_sw128(qh), dk = desc_sw128(ks);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const u32 qo = (kk >> 2) * (64 * 128) + (kk & 3) * 32, ko = (kk >> 2) * (64 * 128) + (kk & 3) * 32;
            wgmma_ss_n64(sv, dq + (qo >> 4), dk + (ko >> 4), kk > 0);
        }
        wgmma_commit();
    }
    if (PV) {
        aw_issue_pv<false, 64, D>(acc, p, none, vs);
        wgmma_commit();
    }
}
// P = bf16(s) as the A fragments of the P V product (ap_round2, as aw_tile)
__device__ __forceinline__ void as_round_p(const float (&s)[8][4], u32 (&p)[4][4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        p[k][0] = ap_round2(s[2 * k][0], s[2 * k][1]);
        p[k][1] = ap_round2(s[2 * k][2], s[2 * k][3]);
        p[k][2] = ap_round2(s[2 * k + 1][0], s[2 * k + 1][1]);
        p[k][3] = ap_round2(s[2 * k + 1][2], s[2 * k + 1][3]);
    }
}

// The producer warpgroup: every tile of every segment of the block (those of split z only, with key splits) into
// the ring, K then V, each after both consumer warpgroups have released the stage's previous tile.
template <class E, int D>
__device__ __forceinline__ void as_produce(const AsBars& b, const bf16* kc, const bf16* vc, const int* page_table,
                                           long long ldpt, const int* s_seq, const int* s_pos, int nrows,
                                           int page_size, int HKV, int hk, int split_keys, int kz0, u16* Kb,
                                           u16* Vb) {
    constexpr int BN = E::BN, KW = E::KV_WORDS;
    const int ps_shift = ag_page_shift(page_size), tid = threadIdx.x;
    int n = 0;
    for (int s0 = 0, s1; s0 < nrows; s0 = s1) {
        int kend;
        s1 = ap_segment(s_seq, s_pos, s0, nrows, kend);
        const int* pt = page_table + (long long)s_seq[s0] * ldpt;
        const int i0 = split_keys ? kz0 / BN : 0;
        const int i1 = split_keys ? min(kend / BN, (kz0 + split_keys) / BN - 1) : kend / BN;
        for (int i = i0; i <= i1; ++i, ++n) {
            const int st = n & 1, ph = ((n >> 1) & 1) ^ 1;  // a fresh stage counts as released
            mbar_wait(b.empty(0, st), ph);
            ag_stage_kv<E, D, 128, 1, AS_STAGE_UNROLL>(kc, vc, pt, page_size, ps_shift, HKV, hk, i * BN, kend, Kb + st * KW,
                                      Vb + st * KW, tid);
            mbar_arrive_cp(b.full(0, st));
            mbar_wait(b.empty(1, st), ph);
            ag_stage_kv<E, D, 128, 2, AS_STAGE_UNROLL>(kc, vc, pt, page_size, ps_shift, HKV, hk, i * BN, kend, Kb + st * KW,
                                      Vb + st * KW, tid);
            mbar_arrive_cp(b.full(1, st));
        }
    }
}

// One consumer warpgroup's turn to issue its products (PP): barrier 1 + wg is warpgroup wg's, the other's arrival
// opens it. The turns of both warpgroups strictly alternate.
template <bool PP> __device__ __forceinline__ void as_turn_begin(int wg) {
    if (PP) as_named_sync(1 + wg);
}
template <bool PP> __device__ __forceinline__ void as_turn_end(int wg) {
    if (PP) as_named_arrive(2 - wg);
}

// OV's step for tile i (tile counter n): S of tile i and P V of tile i - 1 (P in pin) in one turn; the softmax of S
// while P V is in flight, P of tile i into pout, O's rescale once P V has landed.
template <int D, bool PP>
__device__ __forceinline__ void as_step(const AsBars& b, ApRows<D>& st, float (&s)[8][4], u32 (&pin)[4][4],
                                        u32 (&pout)[4][4], u32 qh, u32 k0s, u32 v0s, int i, int n, float scale,
                                        int wg, float (&corr)[2]) {
    constexpr int KB = 2 * 64 * D;
    float(&sv)[32] = *reinterpret_cast<float(*)[32]>(&s[0][0]);
    float(&acc)[D / 2] = *reinterpret_cast<float(*)[D / 2]>(&st.acc[0][0]);
    as_acquire(b, 0, n);
    as_acquire(b, 1, n - 1);
    as_turn_begin<PP>(wg);
    as_issue<D, true, true>(s, st, pin, qh, k0s + (n & 1) * KB, v0s + ((n - 1) & 1) * KB);
    as_turn_end<PP>(wg);
    wgmma_wait<1>();
    fence_regs(sv);
    as_release(b, 0, n);
    ap_online<8, D, false, true, false>(s, i * 64, scale, st, corr);  // O untouched: P V in flight
    as_round_p(s, pout);
    wgmma_wait<0>();
    fence_regs(acc);
    fence_regs(pin);
    as_release(b, 1, n - 1);
    ap_rescale(st, corr);
}

// The tiles i0..iw of one segment (tile counter n0 at i0; iw < i0: none) for this consumer warpgroup, in iw - i0 + 1
// turns (+ 1 with OV).
template <int D, bool OV, bool PP>
__device__ __forceinline__ void as_segment(const AsBars& b, ApRows<D>& st, u32 qh, u32 k0s, u32 v0s, int i0, int i1,
                                          int iw, int n0, float scale, int wg) {
    constexpr int BN = 64, KB = 2 * BN * D;  // bytes of one stage's K (or V) tile
    float s[8][4];
    float(&sv)[32] = *reinterpret_cast<float(*)[32]>(&s[0][0]);
    float(&acc)[D / 2] = *reinterpret_cast<float(*)[D / 2]>(&st.acc[0][0]);
    u32 p[4][4];
    if (!OV) {
        for (int i = i0; i <= iw; ++i) {
            const int n = n0 + i - i0, off = (n & 1) * KB;
            as_acquire(b, 0, n);
            as_turn_begin<PP>(wg);
            as_issue<D, true, false>(s, st, p, qh, k0s + off, 0);
            as_turn_end<PP>(wg);
            wgmma_wait<0>();
            fence_regs(sv);
            as_release(b, 0, n);
            ap_online<8, D, false, true>(s, i * BN, scale, st);
            as_round_p(s, p);
            as_acquire(b, 1, n);
            as_issue<D, false, true>(s, st, p, qh, 0, v0s + off);
            wgmma_wait<0>();
            fence_regs(acc);
            fence_regs(p);
            as_release(b, 1, n);
        }
        return;
    }
    if (iw < i0) return;
    float corr[2];
    as_acquire(b, 0, n0);  // tile i0: S alone
    as_turn_begin<PP>(wg);
    as_issue<D, true, false>(s, st, p, qh, k0s + (n0 & 1) * KB, 0);
    as_turn_end<PP>(wg);
    wgmma_wait<0>();
    fence_regs(sv);
    as_release(b, 0, n0);
    ap_online<8, D, false, true, false>(s, i0 * BN, scale, st, corr);
    ap_rescale(st, corr);
    as_round_p(s, p);
    u32 q[4][4];  // P alternates between p and q (a copy between them made ptxas serialize every wgmma, C7513)
    for (int i = i0 + 1; i <= iw; i += 2) {  // S of tile i with P V of tile i - 1
        as_step<D, PP>(b, st, s, p, q, qh, k0s, v0s, i, n0 + i - i0, scale, wg, corr);
        if (i + 1 <= iw) as_step<D, PP>(b, st, s, q, p, qh, k0s, v0s, i + 1, n0 + i + 1 - i0, scale, wg, corr);
    }
    const int nw = n0 + iw - i0;  // P V of tile iw alone
    as_acquire(b, 1, nw);
    as_turn_begin<PP>(wg);
    if ((iw - i0) & 1) {
        as_issue<D, false, true>(s, st, q, qh, 0, v0s + (nw & 1) * KB);
    } else {
        as_issue<D, false, true>(s, st, p, qh, 0, v0s + (nw & 1) * KB);
    }
    as_turn_end<PP>(wg);
    wgmma_wait<0>();
    fence_regs(acc);
    fence_regs(p);
    fence_regs(q);
    as_release(b, 1, nw);
}

// A consumer warpgroup: ag_body's segment walk and outputs, its tiles through as_segment.
template <class E, typename T, int D, bool OV, bool PP>
__device__ __forceinline__ void as_consume(const AsBars& b, const u16* Qh, const u16* Kb, const u16* Vb,
                                           const int* s_seq, const int* s_pos, int nrows, int r0, int R, int HQ,
                                           int G, int hk, float scale, int split_keys, int kz0, T* __restrict__ o,
                                           float* __restrict__ part) {
    constexpr int BN = E::BN;
    const int ct = threadIdx.x - 128, warp = ct >> 5, g = (ct & 31) >> 2, wm = warp * 16;
    const int wg = warp >> 2;
    const u32 qh = smem_u32(Qh + (wm >> 6) * 64 * D), k0s = smem_u32(Kb), v0s = smem_u32(Vb);
    const int row[2] = {(wm + g) / G, (wm + g + 8) / G};
    if (PP && wg == 1) as_named_arrive(1);  // warpgroup 0 takes the first turn
    ApRows<D> st;
    int n = 0;
    for (int s0 = 0, s1; s0 < nrows; s0 = s1) {
        int kend;
        s1 = ap_segment(s_seq, s_pos, s0, nrows, kend);
        const int wlim = ag_segment_begin<E, D>(st, row, s_pos, s0, s1, wm, G);
        const int i0 = split_keys ? kz0 / BN : 0;
        const int i1 = split_keys ? min(kend / BN, (kz0 + split_keys) / BN - 1) : kend / BN;
        if (i0 > i1) continue;  // no key of this split is visible to the segment (the producer skips it too)
        const int iw = wlim < 0 ? i0 - 1 : min(i1, wlim / BN);  // tiles i * BN <= wlim, as ag_body's skip
        as_segment<D, OV, PP>(b, st, qh, k0s, v0s, i0, i1, iw, n, scale, wg);
        // The tiles past this warpgroup's slots: released in order, each after its turn, so that the warpgroups
        // take i1 - i0 + 1 turns per segment (+ 1 with OV: its last P V) and every turn's tiles are already
        // loaded or next in line (a turn taken only after the releases would wait for tiles that need them).
        if (PP && OV && iw < i0) {
            as_turn_begin<PP>(wg);
            as_turn_end<PP>(wg);
        }
        for (int i = max(iw + 1, i0); i <= i1; ++i) {
            const int m = n + i - i0;
            as_turn_begin<PP>(wg);
            as_turn_end<PP>(wg);
            mbar_wait(b.full(0, m & 1), (m >> 1) & 1);
            as_release(b, 0, m);
            mbar_wait(b.full(1, m & 1), (m >> 1) & 1);
            as_release(b, 1, m);
        }
        n += i1 - i0 + 1;
        ag_store<T, D>(st, row, wm, r0, R, HQ, hk, G, kz0, split_keys, o, part);
    }
    if (PP && wg == 0) as_named_sync(1);  // pairs warpgroup 1's first arrival
}

#endif

// grid (ceil(R / BR), HKV, splits), 384 threads; dynamic shared memory 2 D (128 + 4 * 64) + 1024 + 1024 + 64 bytes
// (ws_smem_bytes in attention_prefill.py). The arguments are attention_prefill_wg's.
template <typename T, int D, bool OV, bool PP>
__global__ void __launch_bounds__(AS_THREADS, 1)
    attention_prefill_ws(const T* __restrict__ q, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                         const int* __restrict__ page_table, const int* __restrict__ row_seq,
                         const int* __restrict__ row_pos, T* __restrict__ o, int R, int HQ, int HKV, int page_size,
                         long long ldpt, float scale, int split_keys, float* __restrict__ part) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using E = AgWg<D, false, false, 64>;
    constexpr int KW = E::KV_WORDS;
    extern __shared__ uint4 att_smem[];
    u16* Qh = E::base(att_smem);
    u16* Kb = Qh + E::Q_WORDS;
    u16* Vb = Kb + 2 * KW;
    int* s_seq = reinterpret_cast<int*>(Vb + 2 * KW);
    int* s_pos = s_seq + AG_SLOTS;
    const AsBars b{smem_u32(s_pos + AG_SLOTS)};
    const int G = HQ / HKV, BR = AG_SLOTS / G, hk = blockIdx.y;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * BR, nrows = min(BR, R - r0), kz0 = blockIdx.z * split_keys;
    ap_load_rows(row_seq, row_pos, r0, nrows, AG_SLOTS, s_seq, s_pos);
    ag_stage_q<E, T, D>(q, nrows, HQ, G, hk, r0, Qh, Qh);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            mbar_init(b.bars + 8 * i, 128);                     // full: one cp.async arrival per producer thread
            mbar_init(b.bars + 8 * (4 + i), AS_CONSUMER_WARPS);  // empty: one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    E::after_copy();
    __syncthreads();
    if (threadIdx.x < 128) {
        setmaxnreg_dec<32>();
        as_produce<E, D>(b, k_cache, v_cache, page_table, ldpt, s_seq, s_pos, nrows, page_size, HKV, hk, split_keys,
                         kz0, Kb, Vb);
    } else {
        setmaxnreg_inc<232>();
        as_consume<E, T, D, OV, PP>(b, Qh, Kb, Vb, s_seq, s_pos, nrows, r0, R, HQ, G, hk, scale, split_keys, kz0, o,
                                    part);
    }
#else
    __trap();  // compiled for sm_90a only (the wrapper picks this kernel only there)
#endif
}
