// The MoE gate | up product with the SwiGLU in its epilogue (gemm_sm90.cu gemm90_experts_f16g_swiglu; docs/cuda.md
// "SwiGLU in the expert gate | up epilogue"): the weight tile's rows and the epilogue. The dense MLP's twin is
// gemm_sm90_ws.cu gemm90_f16_ws_swiglu (the same tile split on the ws kernel; its epilogue is gate_up_store too).
//
// Expert e's weight rows are [gate | up] (half = I gate rows, then the same features' I up rows; fuse.py, HF's
// gate_up_proj), and column tile nt of the plain kernel holds BN consecutive rows. Here it holds gate rows
// e 2I + (BN/2) nt .. + BN/2 - 1 as stage rows 0 .. BN/2 - 1 and the same features' up rows e 2I + I + (BN/2) nt ..
// as stage rows BN/2 .. BN - 1, so the accumulator of column c < BN/2 (a gate feature) and that of column c + BN/2
// (its up value) sit in one thread (frag_rc: register i + BN/4 holds column c + BN/2 of register i's row). Every
// row is valid: I % (BN/2) == 0 (the host's condition, gemm_swiglu.experts_swiglu_ok).
//
// Bitwise contract with the plain kernel gemm90_experts_f16g<D> followed by split_f16row_in<false, true>: the stage
// rows are byte for byte D's stage of the rows they hold (the same pieces per thread, destinations and sizes as
// D::Loader, only the source rows change: tests/test_gemm_pair_host.py), so every output column is the same MMA
// (m64n256k16, f16) over the same operands in the same K order, and the epilogue computes g and u with the plain
// epilogue's expression and h with split_f16row_in's (siluf_(g) * u).
#pragma once
#include "common.cuh"
#include "wdq.cuh"

// The weight loader of the gate | up tile for format D (a stored format with an in-loop conversion: DqFP8, DqNVFP4).
// Constructed as D::Loader is, with g0 = the tile's first gate row (absolute) in place of its first row and
// half = I (the up rows' offset) in place of the valid row count (every row is valid).
template <typename D> struct GateUpLoader;

// DqFP8's Stream<BN / 32> (row tid / 8 + 32 i, 8 bytes at k 8 (tid % 8)) as two streams of BN / 64 pieces: pieces
// i < BN / 64 (stage rows below BN / 2) from the gate rows, the rest from the up rows; the same destinations.
template <bool ROW> struct GateUpLoader<DqFP8<ROW>> {
    static constexpr int BN = DqFP8<ROW>::BN, NI = BN / 64;
    Stream<NI, 8, 64, 2048> g, u;
    int kc;
    HD GateUpLoader(const u8* p0, const u8*, const u8*, int K, long long g0, int half, int tid) {
        const int r0 = tid >> 3, c = tid & 7;
        kc = 8 * c;
        g.init(p0, g0 + r0, K, 32, 8 * c, r0 * 64 + 8 * c, BN / 2 - r0);
        u.init(p0, g0 + half + r0, K, 32, 8 * c, (BN / 2 + r0) * 64 + 8 * c, BN / 2 - r0);
    }
    HD void copy(u8* st, int kt, int K, const u8* fb) const {
        const bool kin = kt * GS_BK + kc < K;
        g.copy(st, kt, kin, fb);
        u.copy(st, kt, kin, fb);
    }
};

// DqNVFP4's codes Stream<2> (row tid / 2 + 128 i) as two one-piece streams (piece 0: the gate row, piece 1: the up
// row of the same feature, each addressed in the 16-row groups of the device layout), and its scales (row tid) from
// the gate row below BN / 2, else the up row; the same destinations (codes at row * 32, scales at BN * 32 + 4 row).
template <bool ROWG> struct GateUpLoader<DqNVFP4<ROWG>> {
    static constexpr int BN = DqNVFP4<ROWG>::BN;
    static_assert(BN == 256, "one codes piece per half tile");
    Stream<1, 16, 1024, 0, 1, 32> cg, cu;
    Stream<1, 4, 128, 0, 1, 4> scales;
    HD GateUpLoader(const u8* p0, const u8* p1, const u8*, int K, long long g0, int half, int tid) {
        const long long kp = kpad128(K), rg = g0 + (tid >> 1), ru = rg + half;
        const long long rs = tid < BN / 2 ? g0 + tid : g0 + half + (tid - BN / 2);
        const int h = tid & 1;
        cg.init(p0, rg & ~15LL, kp / 2, 1, (int)(rg & 15) * 64 + 16 * h, (tid >> 1) * 32 + 16 * h, 1);
        cu.init(p0, ru & ~15LL, kp / 2, 1, (int)(ru & 15) * 64 + 16 * h, (BN / 2 + (tid >> 1)) * 32 + 16 * h, 1);
        scales.init(p1, rs & ~15LL, kp / 16, 1, (int)(rs & 15) * 8, BN * 32 + tid * 4, 1);
    }
    HD void copy(u8* st, int kt, int, const u8* fb) const {
        cg.copy(st, kt, true, fb);
        cu.copy(st, kt, true, fb);
        scales.copy(st, kt, true, fb);
    }
};

// The gs_tile weight loader of a plain (SW false) or gate | up (SW true) tile.
template <typename D, bool SW> struct GsWeightLoader {
    typedef typename D::Loader T;
};
template <typename D> struct GsWeightLoader<D, true> {
    typedef GateUpLoader<D> T;
};

// The gate | up tile's epilogue (the accumulators of a 128 x BN tile as gs_tile holds them, thread tid of 256):
// row r < mvalid, feature c < BN / 2: g = acc(c) * row_scale(gbase + c) * rowf[r] and u = acc(c + BN / 2) *
// row_scale(ubase + c) * rowf[r] (gs_tile's plain epilogue, operation for operation: the values it would have stored
// in [gate | up]), h[r][c] = siluf_(g) * u (split_in8<true>'s expression: the values split_f16row_in<false, true>
// computes from those stored rows) as float2 (c even; h 8-byte aligned, ldh even). Per row: its largest |h| over
// the tile (fmaxf from 0 over the quad that shares the row, NaN ignored: the split's row pass over these columns,
// max is order-free) into tmax[r * tn + nt]. Rows count from row m0 of rowf, h and tmax, features from f0 (h's
// column f0 + c, row scales gbase + f0 + c and ubase + f0 + c): the expert launch passes pointers and bases offset
// to its tile (m0 = f0 = 0); gemm_sm90_ws.cu's store_swiglu (the dense MLP's gate | up, the same epilogue) its
// tile's m0 and f0 with gbase = 0, ubase = half (B, the row scale index type: int there, as its PTX was before).
template <typename D, typename B>
__device__ __forceinline__ void gate_up_store(const float (&acc)[D::BN / 2], int tid, int mvalid,
                                              const u8* __restrict__ p1, const u8* __restrict__ p2, B gbase, B ubase,
                                              const float* __restrict__ rowf, float* __restrict__ h, long long ldh,
                                              float* __restrict__ tmax, int tn, int nt, int m0 = 0, int f0 = 0) {
    constexpr int Q = D::BN / 4;  // registers holding gate columns; register i + Q: the up column of the feature
    float mx[2] = {0.f, 0.f};
    int rows[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < Q; i += 2) {
        int r, c;
        frag_rc(tid, i, r, c);
        rows[(i >> 1) & 1] = r;
        if (r < mvalid) {
            const float f = rowf[m0 + r];
            float hv[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const float g = acc[i + j] * D::row_scale(p1, p2, gbase + f0 + c + j) * f;
                const float up = acc[i + Q + j] * D::row_scale(p1, p2, ubase + f0 + c + j) * f;
                hv[j] = siluf_(g) * up;
                mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], fabsf(hv[j]));
            }
            *reinterpret_cast<float2*>(h + (long long)(m0 + r) * ldh + f0 + c) = make_float2(hv[0], hv[1]);
        }
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        mx[q] = fmaxf(mx[q], __shfl_xor_sync(0xffffffffu, mx[q], 1));
        mx[q] = fmaxf(mx[q], __shfl_xor_sync(0xffffffffu, mx[q], 2));
        if ((tid & 3) == 0 && rows[q] < mvalid) tmax[(long long)(m0 + rows[q]) * tn + nt] = mx[q];
    }
}
