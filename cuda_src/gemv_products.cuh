// The decode GEMV's main loop (gemv.cu): cp.async and mma.sync primitives, one K-tile's products on tensor cores
// (gv_tile), the warp's weight ring (gv_rows_src, gv_prologue) and the block's loop over the split's tiles
// (gv_products: activations staged per chunk, weights through the ring). The formats' readers are wfrag.cuh's. Part
// of gemv.cu: uses its GV_* geometry defines, which it sets before including this.
#pragma once
#include "common.cuh"
#include "gemv_stage.cuh"
#include "wfrag.cuh"

// (host emulation, tests/test_gemv_lanes_host.py: the copies are synchronous and the mma is emu_mma)
__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// the weight ring by bulk copies (GV_BULK; off by default)
#include "gemv_bulk.cuh"

__device__ __forceinline__ void mma_bf16_16816(float d[4], const u32 a[4], u32 b0, u32 b1) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(GV_HOST_EMU)
    emu_mma(*reinterpret_cast<float(*)[4]>(d), a[0], a[1], a[2], a[3], b0, b1);
#endif
}

// GV_GROUP_DEFER 1 (an A/B candidate, session 42; off: measured no faster): the group formats (GROUP > 0) scale a
// tile's group partials into the accumulators after the next tile's first products instead of at the tile's end.
// Each tile's groups start fresh partial sums, and ptxas places their scaling (a HADD2.F32 per scale, an FFMA per
// partial) after the tile's last mma: the loop's back edge, the next stage's wait and its shared loads queue behind
// those mma's results (SASS of the one-row Q4G64 instance; NVFP4 carries its accumulators across tiles, no tail).
// The same FMAs in the same order per accumulator (tile by tile, group by group): the same bits. A preprocessor
// switch, so that the default's PTX is the one before it. Measured (H100, e2ac007, perf/gemv_variants defer
// against base, perf/results/gemv_qg_e2ac007_h100.txt): a 27B layer's GEMVs at one row 0.99x / 0.97x / 1.02x the
// time for Q4G64 / Q5G64 / Q6G64 and 1.28x for W8G32 (four groups per tile: more live registers); at eight rows
// 1.01-1.52x. Kept off as the record of that measurement.
#ifndef GV_GROUP_DEFER
#define GV_GROUP_DEFER 0
#endif
#if GV_GROUP_DEFER
template <typename F> struct GvDefer {  // the previous tile's group partials and their scales
    static constexpr int NG = F::GROUP ? 8 / F::GROUP : 1;
    float part[F::MT][NG][4], sc[F::MT][NG][2];
};
#define GV_DEFER_PARAM , GvDefer<F>& dfr
#define GV_DEFER_ARG , dfr
#else
#define GV_DEFER_PARAM
#define GV_DEFER_ARG
#endif

#if GV_GROUP_DEFER
// m-tile mt's deferred groups into its accumulators, group by group (as the tile would have at its end)
template <typename F>
__device__ __forceinline__ void gv_defer_apply(const GvDefer<F>& dfr, float (&acc)[F::MT][4], int mt) {
#pragma unroll
    for (int h = 0; h < GvDefer<F>::NG; ++h) {
        acc[mt][0] = fmaf(dfr.part[mt][h][0], dfr.sc[mt][h][0], acc[mt][0]);
        acc[mt][1] = fmaf(dfr.part[mt][h][1], dfr.sc[mt][h][0], acc[mt][1]);
        acc[mt][2] = fmaf(dfr.part[mt][h][2], dfr.sc[mt][h][1], acc[mt][2]);
        acc[mt][3] = fmaf(dfr.part[mt][h][3], dfr.sc[mt][h][1], acc[mt][3]);
    }
}
#endif

// One K-tile of one warp: MT m-tiles x 8 steps. acc[mt][0..3] = (row g, lane 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
template <typename F, typename T, int NB>
__device__ __forceinline__ void gv_tile(const u32* sm, int tl, const typename F::Raw (&raw)[F::MT][2],
                                        float (&acc)[F::MT][4] GV_DEFER_PARAM) {
    constexpr bool SPLIT = GvIsFloat<T>::v;
    constexpr int FW = SPLIT ? 4 : 2, MT = F::MT;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    typename F::Prep p[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        F::prep(raw[mt][0], p[mt][0]);
        F::prep(raw[mt][1], p[mt][1]);
    }
    float tmp[MT][4];
    // mma columns g >= NB (never stored) read lane NB - 1's fragments: no predicate, no zeroing per step
    const int gb = g < NB ? g : NB - 1;
    // the thread's fragment of step 0; step s is s * NB * 4 * FW words on (an immediate offset per step)
    const u32* f0 = sm + ((size_t)(tl * 8 * NB + gb) * 4 + t) * FW;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
        u32 b[4];
        const u32* f = f0 + s * NB * 4 * FW;
        if (SPLIT) {
            const uint4 v = *reinterpret_cast<const uint4*>(f);
            b[0] = v.x, b[1] = v.y, b[2] = v.z, b[3] = v.w;
        } else {
            const uint2 v = *reinterpret_cast<const uint2*>(f);
            b[0] = v.x, b[1] = v.y, b[2] = b[3] = 0u;
        }
        const int w = s >> 1, i = 2 * (s & 1);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const u32 a[4] = {F::pair(p[mt][0], w, i), F::pair(p[mt][1], w, i), F::pair(p[mt][0], w, i + 1),
                              F::pair(p[mt][1], w, i + 1)};
            if constexpr (F::GROUP == 0) {
                mma_bf16_16816(acc[mt], a, b[0], b[1]);
                if (SPLIT) mma_bf16_16816(acc[mt], a, b[2], b[3]);
            } else {
                if (s % F::GROUP == 0) tmp[mt][0] = tmp[mt][1] = tmp[mt][2] = tmp[mt][3] = 0.f;
                mma_bf16_16816(tmp[mt], a, b[0], b[1]);
                if (SPLIT) mma_bf16_16816(tmp[mt], a, b[2], b[3]);
#if GV_GROUP_DEFER
                if (s == 0) gv_defer_apply<F>(dfr, acc, mt);  // the previous tile's groups (before any is stored)
                if (s % F::GROUP == F::GROUP - 1) {
                    const int h = s / F::GROUP;
                    dfr.part[mt][h][0] = tmp[mt][0], dfr.part[mt][h][1] = tmp[mt][1];
                    dfr.part[mt][h][2] = tmp[mt][2], dfr.part[mt][h][3] = tmp[mt][3];
                    dfr.sc[mt][h][0] = F::gscale(p[mt][0], h), dfr.sc[mt][h][1] = F::gscale(p[mt][1], h);
                }
#else
                if (s % F::GROUP == F::GROUP - 1) {
                    const float s0 = F::gscale(p[mt][0], s / F::GROUP), s1 = F::gscale(p[mt][1], s / F::GROUP);
                    acc[mt][0] = fmaf(tmp[mt][0], s0, acc[mt][0]);
                    acc[mt][1] = fmaf(tmp[mt][1], s0, acc[mt][1]);
                    acc[mt][2] = fmaf(tmp[mt][2], s1, acc[mt][2]);
                    acc[mt][3] = fmaf(tmp[mt][3], s1, acc[mt][3]);
                }
#endif
            }
        }
    }
}

// This warp's rows of the block starting at row r0 of the launch: its cp.async sources at K-tile kt0.
template <typename F>
__device__ __forceinline__ typename F::Src gv_rows_src(const u8* p0, const u8* p1, const u8* p2, int N, int K,
                                                       long long wbase, int r0, int kt0, int t) {
    const int g = (threadIdx.x & 31) >> 2;
    if constexpr (GvBulk<F>::ON) {  // each m-tile's 16-row group (a row past N: the last row's group, as below)
        long long grp[F::MT];
#pragma unroll
        for (int mt = 0; mt < F::MT; ++mt) grp[mt] = wbase + min(r0 + mt * 16, N - 1), grp[mt] -= grp[mt] % 16;
        return F::src_bulk(p0, p1, K, grp, kt0 * 128);
    } else {
        long long wr[F::MT][2];
#pragma unroll
        for (int mt = 0; mt < F::MT; ++mt) {
            wr[mt][0] = wbase + min(r0 + mt * 16 + g, N - 1);
            wr[mt][1] = wbase + min(r0 + mt * 16 + g + 8, N - 1);
        }
        return F::src(p0, p1, p2, K, wr, kt0 * 128, t);
    }
}

// The first GV_STAGES - 1 of the block's nt tiles into the warp's ring (one commit group each).
template <typename F>
__device__ __forceinline__ void gv_prologue(u8* wsm, int lane, typename F::Src& src, int t, int nt) {
#pragma unroll
    for (int s = 0; s < GV_STAGES - 1; ++s) {
        if (s < nt) gv_copy_stage<F>(wsm + s * F::VECS * 512, lane, src, t);
        cp_async_commit();
    }
}

// The block's products (its prologue issued, chunk 0's activations in xv): activations staged per chunk, weights
// through the ring. Ends with a block barrier after every read of the ring and the activation buffers.
template <typename F, typename T, int NB>
__device__ __forceinline__ void gv_products(u32* sm, u8* wsm, int lane, typename F::Src& src, int t, const T* xl,
                                              const T* x2l, int xf, int gd, float inv, int nb, int K, int kt0,
                                              int nt, float (&xv)[GvItems<NB>::N][8], float (&acc)[F::MT][4]) {
    constexpr int MT = F::MT, STAGE = F::VECS * 512, FW = GvIsFloat<T>::v ? 4 : 2;
    constexpr int ACT = GvChunk<NB>::V * 8 * NB * 4 * FW;
    gv_put<F, T, NB>(xv, sm);  // chunk 0, fetched by the caller
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
#if GV_GROUP_DEFER
    GvDefer<F> dfr;  // zero partials and scales before the first tile: fmaf(0, 0, +0) = +0, the same bits
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < GvDefer<F>::NG; ++h)
            dfr.part[mt][h][0] = dfr.part[mt][h][1] = dfr.part[mt][h][2] = dfr.part[mt][h][3] = 0.f,
            dfr.sc[mt][h][0] = dfr.sc[mt][h][1] = 0.f;
#endif
    const int nchunks = (nt + GvChunk<NB>::V - 1) / GvChunk<NB>::V, nt_refill = nt - (GV_STAGES - 1);
    u8* fill = wsm + (GV_STAGES - 1) * STAGE;  // the stage read one tile ago (tile i - 1 mod GV_STAGES)
    for (int c = 0; c < nchunks; ++c) {
        if (c + 1 < nchunks) gv_fetch<F, T, NB>(xv, xl, x2l, xf, gd, inv, nb, K, kt0, nt, c + 1);
        const u32* act = sm + (c & 1) * ACT;
#pragma unroll 1
        for (int tl = 0, tend = min(GvChunk<NB>::V, nt - c * GvChunk<NB>::V); tl < tend; ++tl) {
            const int i = c * GvChunk<NB>::V + tl;
            gv_wait_stage<F>(wsm, i);  // tile i's copies have landed
            typename F::Raw raw[MT][2];
            u8* const st = wsm + (i % GV_STAGES) * STAGE;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if constexpr (GvBulk<F>::ON) {
                    F::read_bulk(st, lane, mt, 0, t, raw[mt][0]);
                    F::read_bulk(st, lane, mt, 1, t, raw[mt][1]);
                } else {
                    F::read(st, lane, mt, 0, t, raw[mt][0]);
                    F::read(st, lane, mt, 1, t, raw[mt][1]);
                }
            }
            // refill the stage read one iteration ago (its values are consumed: no lane reads it again)
            if (i < nt_refill) gv_copy_stage<F>(fill, lane, src, t);
            fill = st;
            cp_async_commit();
            gv_tile<F, T, NB>(act, tl, raw, acc GV_DEFER_ARG);
        }
        // the other buffer was last read in chunk c - 1, before the previous barrier
        if (c + 1 < nchunks) gv_put<F, T, NB>(xv, sm + ((c + 1) & 1) * ACT);
        __syncthreads();
    }
#if GV_GROUP_DEFER
    if (F::GROUP)  // the last tile's groups
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) gv_defer_apply<F>(dfr, acc, mt);
#endif
}
