// Decode GEMV on tensor cores (mma.sync m16n8k16, bf16 operands, fp32 accumulation).
//
// y[b, n] = sum_k x[b, k] W[n, k] for up to 8 activation rows ("lanes"), the lanes as the mma's N = 8 columns and
// 16 weight rows as its M. Each warp streams its rows' weights through a private ring of GV_STAGES shared-memory
// stages filled by cp.async (3 K-tiles in flight, no registers held by the loads), then dequantizes them in registers
// into exact bf16 operands (wfrag.cuh); activations are staged once per block in shared memory as bf16 B fragments
// (float x as hi + lo halves: two mma per step).
//
// Block: GV_WARPS warps, each MT m-tiles of 16 rows (F::MT), so GV_WARPS * MT * 16 rows per block; grid
// (row blocks, splits, lane blocks | expert slots). Split s of S covers K-tiles [s * T / S, (s + 1) * T / S) of the
// T 128-wide tiles (balanced); with several splits each block writes its fp32 partials to `ws` and the last block
// of a row block to arrive (a counter in `cnt`, reset by that block) adds them in split order, or, launched as
// thread-block clusters of the splits (linear.GV_CLUSTER), rank 0 adds them from the other blocks' shared memory
// (gv_store_cl: the same float operations in the same order, so the same bits). Per output element
// the arithmetic is a fixed sequence (tiles in order, 8 steps per tile, hi then lo, splits in order), and an mma
// column depends only on its own lane's activations, so a lane's result is bitwise independent of the other lanes,
// of NB and of the number of rows in the launch. The host picks `splits` from (format, N, K) only
// (ninfer/cuda/gemv_geometry.py, gemv_plan).
//
// Expert modes (`experts`): 1, MoE decode: slot z = one activation row xrow[z] against expert ids[z]'s weights (one
// lane, output row z); 2, expert lanes (MoE prefill of short chunks): slot z = up to NB rows routed to expert ids[z]
// (-1: an empty slot, the block exits), lane g reading activation row xrow[z*2NB + g] and writing output row
// xrow[z*2NB + NB + g] (-1 past the slot's rows; a slot's lanes are filled from 0). A lane's arithmetic is the same
// fixed sequence, so every row of mode 2 is bitwise its mode-1 result (same expert, same splits): the invariant above
// covers the lanes of a slot too. The table comes from gemv_lanes_table (moe_lanes.cu) without a host sync.

#include "common.cuh"
#include "gemv_moe.cuh"
#include "wfrag.cuh"

// A family file may set GV_WARPS and GV_MIN_BLOCKS before including this one (gemv_w8.cu: 8 warps, 256-row blocks)
#ifndef GV_WARPS
#define GV_WARPS 4
#endif
#define GV_STAGES 4  // per-warp weight pipeline depth: 3 K-tiles in flight while one is computed
#define GV_CHUNK 2    // K-tiles of activations staged per block barrier (double-buffered), 5-8 lanes
#define GV_CHUNK4 4   // the same for 2-4 lanes (the 4-lane instance: half the 8-lane staging, same shared memory)
#define GV_CHUNK1 16  // the same for one lane: 4x fewer barriers (a split of <= 16 tiles stages once)
#ifndef GV_MIN_BLOCKS
#define GV_MIN_BLOCKS 4  // resident blocks per SM the registers are budgeted for (launch bounds)
#endif

// the kernel's pieces, after the geometry they use: activation staging and the folded norm's 1 / rms; the
// cp.async / mma primitives, weight ring and main loop; the split sums, cluster reduction and norm folding's
// producer side; the L2 prefetch of the next product
#include "gemv_stage.cuh"
#include "gemv_products.cuh"
#include "gemv_store.cuh"
#include "gemv_prefetch.cuh"

// The rows of the block's lane block or slot z (gv_kernel's experts modes): weight rows from wbase, activation rows
// from xr0 (expert lanes: lt), output rows from yb, nb lanes; lt: expert lanes' row table of the slot (lane inputs,
// then lane outputs), else null.
template <typename T> struct GvSlot {
    long long wbase, xr0;
    T* yb;
    int nb;
    const int* lt;
};

// Fills s for z; false for an expert-lanes slot past the table's filled ones (the launch is sized by an upper
// bound: the block exits). An expert slot (experts == 1) picks its expert here when routed (gv_route_slot) and
// issues the L2 hint of its down projection (gv_prefetch_expert).
template <typename F, typename T, int NB>
__device__ __forceinline__ bool gv_slot(GvSlot<T>& s, const int* __restrict__ ids, const int* __restrict__ xrow,
                                        T* __restrict__ y, int N, int nrows, long long ldy, long long row0,
                                        int experts, int fold, int z, const u8* __restrict__ q0,
                                        const u8* __restrict__ q1, int qn, int qk, const GvRoute& rt) {
    s.lt = nullptr;
    if (experts == 2) {
        const int e = ids[z];
        if (e < 0) return false;
        s.lt = xrow + (long long)z * 2 * NB;
        s.nb = 0;
#pragma unroll
        for (int g = 0; g < NB; ++g) s.nb += s.lt[g] >= 0;
        s.wbase = (long long)e * N, s.xr0 = 0, s.yb = y;
    } else if (experts) {
        const int e = rt.lg != nullptr ? gv_route_slot(rt, z, xrow[z], blockIdx.x == 0 && blockIdx.y == 0) : ids[z];
        s.wbase = (long long)e * N, s.xr0 = xrow[z], s.yb = y + (long long)z * ldy, s.nb = 1;
        if (GvPf<F>::ON && GV_PF_START && q0 != nullptr) gv_prefetch_expert(q0, q1, qn, qk, e);
    } else {
        s.wbase = row0, s.xr0 = (long long)z * NB;
        s.yb = fold ? reinterpret_cast<T*>(reinterpret_cast<float*>(y) + s.xr0 * ldy) : y + s.xr0 * ldy;
        s.nb = min(NB, nrows - z * NB);
    }
    return true;
}

// experts == 0: lane block z takes activation rows z*NB .. (nrows of them in the launch), weight rows row0 ..;
// Norm folding (docs/cuda.md): xf GV_NORM | GV_NORMW stages the RMS-normed residual (x: float32 residual, x2: norm
// weight, part/ldp/npart/eps: the producer's partial sums of squares; any experts mode: a lane's partials are
// those of its activation row); fold = 1 (experts == 0 only) makes y the float32 residual, updated in place, and
// writes this launch's partials to part [row blocks][ldp = nrows]. GU (gemv_mma_gu, dense, fold = 0): the SwiGLU
// epilogue (gemv_store.cuh gv_wrow, gv_gu_store): W is a fused [gate | up] weight of N = 2 I rows (N % ROWS == 0)
// and y[b, f] = silu(g) * u for f < I, what a GV_SWIGLU product of the plain [gate | up] output stages.
// experts == 1: expert slot z: activation row xrow[z], weight rows ids[z] * N .., one lane;
// experts == 2: expert lanes: slot z's rows from its table xrow[z*2NB ..] (header), weight rows ids[z] * N ...
// Dynamic shared memory: two activation chunk buffers (2 * GV_CHUNK * 8 * NB * 4 * FW * 4 bytes), then per warp
// GV_STAGES stages of F::VECS * 512 bytes of weights (GemvPlan.smem_bytes in gemv_geometry.py computes the same
// sizes).
// q0 .. qsplits: the next product's L2 prefetch (gemv_prefetch.cuh gv_prefetch_next; gemv_mma_pf), null in gemv_mma.
template <typename F, typename T, int NB, bool GU = false, bool RR = false>
__device__ __forceinline__ void gv_kernel(
    const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2, const T* __restrict__ x,
    const T* __restrict__ x2, T* __restrict__ y, const int* __restrict__ ids, const int* __restrict__ xrow,
    float* __restrict__ ws, int* __restrict__ cnt, int N, int K, int nrows, long long ldx, long long ldx2,
    long long ldy, long long row0, int experts, int xf, int gd, int zin, float* __restrict__ part, long long ldp,
    int npart, float eps, int fold, const u8* __restrict__ q0, const u8* __restrict__ q1, int qn, int qk, int qbx,
    int qsplits, const GvRoute& rt, const GvCombine& cb, const GvRouteTail& rr = GvRouteTail{}) {
    pdl_trigger();
#ifdef GV_HOST_EMU
    u32* const gv_sm = gv_emu_smem();  // the emulation's shared memory of this block (its own in a cluster launch)
#else
    extern __shared__ __align__(16) u32 gv_sm[];
#endif
    constexpr int MT = F::MT, ROWS = GV_WARPS * MT * 16, STAGE = F::VECS * 512;
    constexpr int FW = GvIsFloat<T>::v ? 4 : 2;
    // zin > 0 (dense launches of several lane blocks): the grid is (blocks_x * zin, splits, 1) with block x =
    // bx * zin + z, so the zin lane blocks of one weight tile run side by side and all but one read it from L2 (one
    // pass over the weights instead of zin). The same blocks, the same arithmetic: every row's bits are unchanged.
    const int z = zin ? blockIdx.x % zin : blockIdx.z, split = blockIdx.y, splits = gridDim.y;
    const int bx = zin ? blockIdx.x / zin : blockIdx.x;
    // launched with PDL (ninfer/cuda/launch.py): nothing an earlier kernel writes is read before pdl_wait. Expert
    // launches need the router's ids for their rows; the others issue their first weight tiles, then wait.
    if (experts) pdl_wait();
    GvSlot<T> sl;
    if (!gv_slot<F, T, NB>(sl, ids, xrow, y, N, nrows, ldy, row0, experts, fold, z, q0, q1, qn, qk, rt)) return;
    const long long wbase = sl.wbase, xr0 = sl.xr0;
    T* const yb = sl.yb;
    const int nb = sl.nb;
    const int* const lt = sl.lt;
    // the row this thread stages (its lane gl; only read while gl < nb)
    const int gl = threadIdx.x % NB;
    const long long xr = lt ? (gl < nb ? lt[gl] : 0) : xr0 + gl;
    const bool norm = xf >= GV_NORM;  // x: the float32 residual (row stride in floats); x2: the weight, one row
    const T* xl = norm ? reinterpret_cast<const T*>(reinterpret_cast<const float*>(x) + xr * ldx) : x + xr * ldx;
    const T* x2l = norm ? x2 : x2 + xr * ldx2;
    const int ntiles = (K + 127) / 128, kt0 = split * ntiles / splits, nt = (split + 1) * ntiles / splits - kt0;
    const long long tile = (long long)z * ((N + ROWS - 1) / ROWS) + bx;  // (lane block | slot, row block)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    // weights: a per-warp ring of GV_STAGES tiles, GV_STAGES - 1 of them in flight ahead of the math
    constexpr int ACT = GvChunk<NB>::V * 8 * NB * 4 * FW;  // u32 words of one activation chunk buffer
    u8* wsm = reinterpret_cast<u8*>(gv_sm + 2 * ACT) + warp * GV_STAGES * STAGE;
    // GU: the block's rows are its features' gate rows, then their up rows (gv_wrow)
    const int r0 = GU ? gv_wrow<ROWS>(bx, warp * MT * 16, N) : bx * ROWS + warp * MT * 16;
    typename F::Src src = gv_rows_src<F>(p0, p1, p2, N, K, wbase, r0, kt0, t);
    if constexpr (GvBulk<F>::ON) gv_bulk_init<F>(wsm, lane);
    gv_prologue<F>(wsm, lane, src, t, nt);
    if (GvPf<F>::ON && GV_PF_START && q0 != nullptr && !experts) gv_prefetch_next<ROWS>(q0, q1, qn, qk, qbx, qsplits);
    if (!experts) pdl_wait();
    float inv = 0.f, xv[GvItems<NB>::N][8];  // xv: the first activation chunk (gv_products stages it)
    if (norm) {  // the chunk's words loaded before the partials' round trip, normed after it
        float wv[GvItems<NB>::N][8];
        gv_fetch_norm_raw<T, NB>(xv, wv, xl, x2l, nb, K, kt0, nt);
        inv = gv_norm_inv<T, NB>(gv_sm, part, ldp, npart, xr, gl, nb, K, eps);
        gv_norm_apply<T, NB>(xv, wv, xf, inv);
    } else {
        gv_fetch<F, T, NB>(xv, xl, x2l, xf, gd, inv, nb, K, kt0, nt, 0);
    }
    float acc[MT][4];
    gv_products<F, T, NB>(gv_sm, wsm, lane, src, t, xl, x2l, xf, gd, inv, nb, K, kt0, nt, xv, acc);
    if constexpr (GvBulk<F>::ON) gv_bulk_inval<F>(wsm, lane);
    if (GvPf<F>::ON && !GV_PF_START && q0 != nullptr && !experts) gv_prefetch_next<ROWS>(q0, q1, qn, qk, qbx, qsplits);
    const GvFold fo{fold, part, ldp, xr0};
    const bool fin =
        gv_store<F, T, NB, GU>(gv_sm, acc, bx, tile, split, splits, yb, lt, ldy, ws, cnt, p1, p2, wbase, N, nb, fo);
    if (cb.cnt != nullptr) gv_combine_tail(cb, z, reinterpret_cast<const float*>(y), N, gv_sm);
    if constexpr (RR) {
        const int nbx = zin ? gridDim.x / zin : gridDim.x;
        gv_route_tail<NB>(rr, fin, z, nbx, xr0, nb, reinterpret_cast<const float*>(y), ldy, gv_sm);
    }
}

#define GV_PARAMS                                                                                                   \
    const u8 *__restrict__ p0, const u8 *__restrict__ p1, const u8 *__restrict__ p2, const T *__restrict__ x,     \
        const T *__restrict__ x2, T *__restrict__ y, const int *__restrict__ ids, const int *__restrict__ xrow,   \
        float *__restrict__ ws, int *__restrict__ cnt, int N, int K, int nrows, long long ldx, long long ldx2,    \
        long long ldy, long long row0, int experts, int xf, int gd, int zin, float *__restrict__ part,            \
        long long ldp, int npart, float eps, int fold
#define GV_ARGS \
    p0, p1, p2, x, x2, y, ids, xrow, ws, cnt, N, K, nrows, ldx, ldx2, ldy, row0, experts, xf, gd, zin, part, ldp, npart, eps, fold

template <typename F, typename T, int NB>
__global__ void __launch_bounds__(GV_WARPS * 32, GV_MIN_BLOCKS) gemv_mma(GV_PARAMS) {
    gv_kernel<F, T, NB>(GV_ARGS, nullptr, nullptr, 0, 0, 0, 0, GvRoute{}, GvCombine{});  // no prefetch: compiled away
}

// The same product, then the next product's L2 prefetch (gv_prefetch_next; linear.gemv's ``prefetch``): a separate
// instance so that the default kernel stays exactly what it was. NVFP4 formats only.
template <typename F, typename T, int NB>
__global__ void __launch_bounds__(GV_WARPS * 32, GV_MIN_BLOCKS)
    gemv_mma_pf(GV_PARAMS, const u8* __restrict__ q0, const u8* __restrict__ q1, int qn, int qk, int qbx,
                int qsplits) {
    static_assert(GvPf<F>::ON, "the prefetch reads the NVFP4 device layout");
    gv_kernel<F, T, NB>(GV_ARGS, q0, q1, qn, qk, qbx, qsplits, GvRoute{}, GvCombine{});
}

// The dense gate | up product with the SwiGLU epilogue (GU above; linear.gemv(swiglu_out=True)): a separate instance,
// so that gemv_mma stays what it was (its registers and spills: the epilogue's code in every instance shifted
// ptxas's allocation, and the 4- and 8-row NVFP4 instances spilled).
template <typename F, typename T, int NB>
__global__ void __launch_bounds__(GV_WARPS * 32, GV_MIN_BLOCKS) gemv_mma_gu(GV_PARAMS) {
    gv_kernel<F, T, NB, true>(GV_ARGS, nullptr, nullptr, 0, 0, 0, 0, GvRoute{}, GvCombine{});
}

// The router product with the routing in its tail (GvRouteTail, gemv_moe.cuh; linear.gemv(route=...)): dense,
// float32 rows; the experts' ids and weights as moe_route writes them, one launch instead of two.
template <typename F, typename T, int NB>
__global__ void __launch_bounds__(GV_WARPS * 32, GV_MIN_BLOCKS)
    gemv_mma_rr(GV_PARAMS, int* __restrict__ rcnt, int ne, int topk, int rows, int shared, int* __restrict__ rids,
                float* __restrict__ rw) {
    static_assert(GvIsFloat<T>::v, "float32 rows");
    gv_kernel<F, T, NB, false, true>(GV_ARGS, nullptr, nullptr, 0, 0, 0, 0, GvRoute{}, GvCombine{},
                                     GvRouteTail{rcnt, ne, topk, rows, shared, rids, rw});
}

// The routed expert launch (GvRoute above; gemv_experts.gemv_experts_routed): experts == 1, one lane per slot, the L2
// hint of the down projection (q0, q1, qn, qk; null for none, ignored by formats other than NVFP4).
template <typename F, typename T, int NB>
__global__ void __launch_bounds__(GV_WARPS * 32, GV_MIN_BLOCKS)
    gemv_mma_rt(GV_PARAMS, const u8* __restrict__ q0, const u8* __restrict__ q1, int qn, int qk,
                const float* __restrict__ lg, long long ldl, int ne, int topk, int nrouted, int shared,
                int* __restrict__ rids, float* __restrict__ rw) {
    gv_kernel<F, T, NB>(GV_ARGS, q0, q1, qn, qk, 0, 0,
                        GvRoute{lg, ldl, ne, topk, nrouted, shared, rids, rw}, GvCombine{});
}

// The down projection with the MoE combine and the next norm in its tail (GvCombine above;
// gemv_experts.gemv_experts_down_combine): experts == 1, one K split, float32 rows.
template <typename F, typename T, int NB>
__global__ void __launch_bounds__(GV_WARPS * 32, GV_MIN_BLOCKS)
    gemv_mma_cb(GV_PARAMS, int* __restrict__ tcnt, int arrivals, int topk, int nrouted, const int* __restrict__ where,
                const float* __restrict__ ew, const float* sh, long long ldsh, const float* __restrict__ sg,
                long long ldsg, float* resid, long long ldr, const float* __restrict__ nw, float* __restrict__ out,
                long long ldo, float neps, int offset) {
    static_assert(GvIsFloat<T>::v && NB == 1, "float32 rows, one lane per slot");
    gv_kernel<F, T, NB>(GV_ARGS, nullptr, nullptr, 0, 0, 0, 0, GvRoute{},
                        GvCombine{tcnt, arrivals, topk, nrouted, where, ew, sh, ldsh, sg, ldsg, resid, ldr, nw, out,
                                  ldo, neps, offset});
}
