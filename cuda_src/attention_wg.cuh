// The wgmma engine of the prefill attention (sm_90a; attention_wg.cu's kernel, attention_ws.cu's warp-specialized
// one): the GQA block of attention_prefill_gqa.cuh (slots,
// segments, masks, online softmax, key splits, outputs: one text with attention_prefill_gqa) whose two products per
// KV tile run as warpgroup MMAs instead of per-warp mma.sync. docs/cuda.md "Prefill attention" gives the arithmetic.
//
// Warpgroup k (warps 4k..4k+3) owns slots 64k..64k+63; warp w still owns slots 16w..16w+15 as the rows of its part
// of every accumulator (wgmma's m64 fragment is four mma.sync m16 fragments, one per warp), so ap_online and the
// outputs are unchanged. Per KV tile of BN = 32 keys:
//   S = Q K^T: m64n32k16 with A = the warpgroup's Q tile and B = the K tile, both in shared memory as 128-byte
//       swizzled K-major tiles (wgmma.cuh), per 16 dims hi then lo (float q), as the mma.sync kernel;
//   O += P V: m64n256k16 with A = P from registers (the S accumulators after ap_online, split into bf16 hi / lo
//       exactly as ap_split2 does for the mma.sync kernel) and B = the V tile in shared memory read N-major
//       (imm-trans-b): V's rows are keys, each 64-dim block of a row 128 bytes, the same swizzled tile format as K;
//       per 16 keys hi then lo.
// The per-accumulator sequence of products (16-dim steps in order, hi before lo; 16-key steps in order) is the
// mma.sync kernel's. A warpgroup skips a tile only if all 64 of its slots are past it (wgmma needs the whole
// warpgroup), which changes no bit: a tile wholly past a row leaves it unchanged (attention_prefill_gqa.cuh).
//
// Shared memory (dynamic, from a 1024-byte aligned base): Qh, Ql [2 warpgroups][D/64 blocks][64 slots][64] bf16,
// K and V [2 buffers][D/64 blocks][BN keys][64] bf16, then the rows' sequence and position: 194 KB for float q
// (130 KB where Q's lo half is not read, 194 KB again with 64-key tiles).
#pragma once
#include "attention_prefill_frag.cuh"
#include "attention_prefill_gqa.cuh"
#include "wgmma.cuh"

#define AW_BN 32  // keys per KV tile: the mma.sync kernel's (same tile boundaries); S is 16 registers per thread

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// S += Q K^T for one tile: per 16 dims hi then lo (issued, not waited for)
// Descriptors advance by adding (offset >> 4) to the start-address field: desc_sw128(a + o) == desc_sw128(a) +
// (o >> 4) for 16-byte multiples o while a + o stays below 256 KB (the field never carries), one integer add per
// wgmma instead of the mask, shift and or (the kernel is issue-bound; see ag_stage_kv).
// BN = 32 (m64n32k16) or 64 (m64n64k16, the rounded-q kernel's tiles).
template <bool SPLIT, int BN, int D>
__device__ __forceinline__ void aw_issue_s(float (&sv)[BN / 2], u32 qh, u32 ql, u32 ks) {
    const u64 dh = desc_sw128(qh), dl = desc_sw128(ql), dk = desc_sw128(ks);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const u32 qo = (kk >> 2) * (64 * 128) + (kk & 3) * 32, ko = (kk >> 2) * (BN * 128) + (kk & 3) * 32;
        if constexpr (BN == 64) {
            wgmma_ss_n64(sv, dh + (qo >> 4), dk + (ko >> 4));
            if (SPLIT) wgmma_ss_n64(sv, dl + (qo >> 4), dk + (ko >> 4));
        } else {
            wgmma_ss_n32(sv, dh + (qo >> 4), dk + (ko >> 4));
            if (SPLIT) wgmma_ss_n32(sv, dl + (qo >> 4), dk + (ko >> 4));
        }
    }
}

// O += P V for one tile: per 16 keys hi then lo (PLO; else hi = P rounded to bf16 only; issued, not waited for)
template <bool PLO, int BN, int D>
__device__ __forceinline__ void aw_issue_pv(float (&acc)[D / 2], u32 (&ah)[BN / 16][4], u32 (&al)[BN / 16][4],
                                            u32 vs) {
    const u64 dv0 = desc_sw128_mn(vs, BN * 128);
#pragma unroll
    for (int k = 0; k < BN / 16; ++k) {
        const u64 dv = dv0 + (k * 16 * 128 >> 4);
        wgmma_rs_n256_tb(acc, ah[k], dv);
        if (PLO) wgmma_rs_n256_tb(acc, al[k], dv);
    }
}
#endif

// One KV tile for warp w's 16 slots, issued with the other warps of its warpgroup: S, the softmax step (ap_online),
// P V. Tried and not kept: a ping-pong variant (warpgroup 1 deferring its P V to the next tile, three K/V buffers,
// so that one warpgroup's softmax overlaps the other's products), for which ptxas (13.0) announced serialized
// wgmmas (C7520: wgmmas after a branch it cannot prove warp-uniform, even on a lane-0 broadcast); not timed.
// PLO: P as bf16 hi + lo (two wgmmas per 16 keys, the exact products); else P rounded to bf16 (one), the softmax
// sum still from the fp32 P (ap_online), as flash-attention does.
template <bool SPLIT, bool PLO, int BN, int D>
__device__ __forceinline__ void aw_tile(const u16* Qh, const u16* Ql, const u16* Ks, const u16* Vs, int wm, int k0,
                                        float scale, ApRows<D>& st) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int NF = BN / 8, KS = BN / 16;
    const int qw = (wm >> 6) * 64 * D;  // the warpgroup's Q tiles
    const u32 qh = smem_u32(Qh + qw), ql = smem_u32(Ql + qw), ks = smem_u32(Ks), vs = smem_u32(Vs);
    float s[NF][4];
#pragma unroll
    for (int j = 0; j < NF; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    float(&sv)[4 * NF] = *reinterpret_cast<float(*)[4 * NF]>(&s[0][0]);
    fence_regs(sv);
    wgmma_fence();
    aw_issue_s<SPLIT, BN, D>(sv, qh, ql, ks);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(sv);
    ap_online<NF, D, false, !SPLIT && !PLO && BN == 64>(s, k0, scale, st);  // the bf16 kernel's fast softmax
    u32 ah[KS][4], al[KS][4];
#pragma unroll
    for (int k = 0; k < KS; ++k) {
        if (PLO) {
            ap_split2(s[2 * k][0], s[2 * k][1], ah[k][0], al[k][0]);
            ap_split2(s[2 * k][2], s[2 * k][3], ah[k][1], al[k][1]);
            ap_split2(s[2 * k + 1][0], s[2 * k + 1][1], ah[k][2], al[k][2]);
            ap_split2(s[2 * k + 1][2], s[2 * k + 1][3], ah[k][3], al[k][3]);
        } else {
            ah[k][0] = ap_round2(s[2 * k][0], s[2 * k][1]);
            ah[k][1] = ap_round2(s[2 * k][2], s[2 * k][3]);
            ah[k][2] = ap_round2(s[2 * k + 1][0], s[2 * k + 1][1]);
            ah[k][3] = ap_round2(s[2 * k + 1][2], s[2 * k + 1][3]);
            al[k][0] = al[k][1] = al[k][2] = al[k][3] = 0u;
        }
    }
    float(&acc)[D / 2] = *reinterpret_cast<float(*)[D / 2]>(&st.acc[0][0]);
    fence_regs(acc);
    fence_regs(ah);
    fence_regs(al);
    wgmma_fence();
    aw_issue_pv<PLO, BN, D>(acc, ah, al, vs);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(acc);
    fence_regs(ah);
    fence_regs(al);
#else
    __trap();  // compiled for sm_90a only (the wrapper picks this kernel only there)
#endif
}

// The wgmma engine: swizzled tiles of 64-element rows. QLO / PLO: the lo halves of float q / of P enter the
// products (exact operands); without them q / P are rounded to bf16, one wgmma per product step (the precision
// docs/cuda.md "Prefill attention precision" measures); without QLO, Q's lo half is neither staged nor given shared
// memory, which leaves room for BN = 64-key K / V tiles (double-buffered: 64 KB of Q + 128 KB).
template <int D, bool QLO = true, bool PLO = true, int BN_ = AW_BN> struct AgWg {
    static_assert(D == 256, "the P V product is m64n256: D = 256 (the served models' head size)");
    static_assert(BN_ == 32 || (BN_ == 64 && !QLO), "64-key tiles fit in shared memory only without Q's lo half");
    static constexpr int BN = BN_, Q_WORDS = AG_SLOTS * D, KV_WORDS = BN * D;
    static constexpr bool Q_LO = QLO;
    static __device__ __forceinline__ u16* base(uint4* smem) {
        const u32 a = (u32)__cvta_generic_to_shared(smem);
        return reinterpret_cast<u16*>(reinterpret_cast<char*>(smem) + ((1024u - (a & 1023u)) & 1023u));
    }
    static __device__ __forceinline__ int q_off(int m, int d) {
        return (m >> 6) * 64 * D + (d >> 6) * 4096 + sw128(m & 63, (d & 63) >> 3) / 2;
    }
    static __device__ __forceinline__ int kv_off(int i, int d) {
        return (d >> 6) * (BN * 64) + sw128(i, (d & 63) >> 3) / 2;
    }
    static __device__ __forceinline__ void after_copy() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        fence_proxy_async();  // this thread's st.shared / cp.async writes -> visible to the wgmma operand reads
#endif
    }
    // the last key any slot of warp wm's warpgroup attends in segment [s0, s1): a warpgroup-uniform skip bound
    static __device__ __forceinline__ int group_lim(int wlim, const int* s_pos, int s0, int s1, int wm, int G) {
        const int m0 = wm & ~63;
        int lim = -1;
        for (int r = max(m0 / G, s0); r <= (m0 + 63) / G && r < s1; ++r) lim = max(lim, s_pos[r]);
        return lim;
    }
    template <bool SPLIT>
    static __device__ __forceinline__ void tile(const u16* Qh, const u16* Ql, const u16* Ks, const u16* Vs, int wm,
                                                int k0, float scale, ApRows<D>& st) {
        aw_tile<SPLIT && QLO, PLO, BN, D>(Qh, Ql, Ks, Vs, wm, k0, scale, st);
    }
};
