// The decode GEMV's tail (gemv.cu): the block's results to y, with the K splits added in split order by the last
// block to arrive (gv_store) or by a cluster's rank 0 from distributed shared memory (gv_store_cl; the same float
// operations, gv_split_sum), and norm folding's producer side (GvFold: the residual update and the row block's
// partial sums of squares). Part of gemv.cu: uses its GV_* geometry defines, which it sets before including this.
#pragma once
#include "common.cuh"
#include "gemv_stage.cuh"

// Output row of lane b: the slot table's (expert lanes, lt != nullptr; yb = y) or row b of the lane block at yb.
template <typename T>
__device__ __forceinline__ T* gv_yrow(T* yb, const int* lt, int nb_max, int b, long long ldy) {
    return yb + (long long)(lt ? lt[nb_max + b] : b) * ldy;
}

// Norm folding, producer side (fold != 0, dense launches): the output y is the float32 residual, and each output
// x (rounded to T, as a stored activation) is added to it in place: r = x + y[b, n], what norm.cu's rmsnorm<RESID>
// stores. The block keeps its r in shared memory (sr, [ROWS][8]) for gv_fold_ss.
struct GvFold {
    int on;             // 0: plain store
    float* part;        // partial sums of squares [row blocks][ldp]
    long long ldp;      // its row stride: the activation rows of the launch
    long long prow;     // this lane block's first activation row
};

// The SwiGLU epilogue (GU, gemv.cu gemv_mma_gu; a fused [gate | up] weight of N = 2 I rows, N % ROWS == 0, checked
// by the host). Block bx's rows 0 .. ROWS/2 - 1 are the gate rows of features bx * ROWS/2 .., rows ROWS/2 .. the
// same features' up rows I + bx * ROWS/2 .. (gv_wrow), so one block ends with both halves of its features (the
// prefill GEMM's gate_up.cuh pairs them the same way). A warp's rows never straddle the halves (ROWS/2 is a multiple
// of its MT * 16 rows). Every code path below takes GU as a template argument, so the plain instances are compiled
// from the same text as before (their registers and spills unchanged).
template <int ROWS> __device__ __forceinline__ int gv_wrow(int bx, int rl, int N) {
    constexpr int H = ROWS / 2;
    return rl < H ? bx * H + rl : (N >> 1) + bx * H + rl - H;
}

// The epilogue's store: once every output of the block is in sr ([ROWS][8], each rounded to T as the stored product
// would be), y[b, f] = silu(g) * u rounded to T for the block's ROWS/2 features f = bx * ROWS/2 + rl, with
// gemv_stage.cuh's gv_swiglu (the GV_SWIGLU staging's expression): a plain product of y stages the bits a GV_SWIGLU
// product of the [gate | up] rows does (tests/test_gemv_lanes_host.py -k swiglu_out).
template <typename T, int NB, int ROWS>
__device__ __forceinline__ void gv_gu_store(const float* sr, int bx, int nb, T* yb, const int* lt, long long ldy) {
    constexpr int H = ROWS / 2;
    __syncthreads();  // every output of the block is in sr
    for (int i = threadIdx.x; i < H * NB; i += blockDim.x) {  // consecutive threads: consecutive features
        const int b = i / H, rl = i % H;
        if (b < nb) gv_yrow(yb, lt, NB, b, ldy)[bx * H + rl] = from_f<T>(gv_swiglu(sr[rl * 8 + b], sr[(rl + H) * 8 + b]));
    }
}

// r = x + r0 into *q, r0 the residual word *q (loaded by the caller, so that its round trip can overlap others)
template <typename T> __device__ __forceinline__ float gv_fold_add(float x, float r0, float* q) {
    const float r = __fadd_rn(to_f(from_f<T>(x)), r0);  // x rounded first, never contracted into an fma
    *q = r;
    return r;
}
template <typename T> __device__ __forceinline__ float gv_fold_r(float x, float* q) { return gv_fold_add<T>(x, *q, q); }

// The block's sums of squares of r, per lane and per group of FR = ROWS * 4 / GV_WARPS rows (a 4-warp block's rows:
// with more warps a block writes the partials 4-warp blocks would, so the consumers' norms keep their bits): warp w
// takes (lane, group) items w, w + GV_WARPS, ...; thread l of the warp adds the group's rows l, l + 32, l + 64, ...
// (fmaf from 0, rows past N left out), then a butterfly over the 32 threads (a + b == b + a: every thread ends with
// the same bits). A fixed order whatever the launch: a lane's partial depends only on its own r. Group h of block bx
// is written to part[(bx * G + h) * ldp + prow + b].
template <int NB, int ROWS>
__device__ __forceinline__ void gv_fold_ss(const float* sr, int bx, int N, int nb, const GvFold& fo) {
    constexpr int FR = ROWS * 4 / GV_WARPS, G = ROWS / FR;
    __syncthreads();  // every r of the block is in sr
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int item = warp; item < NB * G; item += GV_WARPS) {  // uniform per warp
        const int b = G == 1 ? item : item % NB, h = G == 1 ? 0 : item / NB, p = bx * G + h;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < FR / 32; ++i) {
            const int rl = h * FR + i * 32 + lane;
            if (b < nb && bx * ROWS + rl < N) s = fmaf(sr[rl * 8 + b], sr[rl * 8 + b], s);
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if constexpr (G == 1) {
            if (lane == 0 && b < nb) fo.part[p * fo.ldp + fo.prow + b] = s;
        } else {  // a group wholly past N has no partial (a 4-warp grid has no block there)
            if (lane == 0 && b < nb && bx * ROWS + h * FR < N) fo.part[p * fo.ldp + fo.prow + b] = s;
        }
    }
}

// Thread-block clusters (sm_90): the K-split reduction through distributed shared memory (gv_store_cl). The host
// emulation (tests/host/attn_emu.cpp, GV_HOST_EMU) runs a cluster's blocks concurrently, each with its own shared
// memory, and defines the emu_* functions used here.
// the blocks in this block's cluster (1: launched without clusters)
__device__ __forceinline__ unsigned gv_cl_size() {
#ifdef __CUDA_ARCH__
    unsigned n;
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
#elif defined(GV_HOST_EMU)
    return emu_cluster_size();
#else
    return 1;
#endif
}
// every thread of every block of the cluster: this thread's earlier memory operations (shared::cluster reads and
// writes included) are performed before any thread passes the barrier (release), and its later ones see every
// operation the others released (acquire)
__device__ __forceinline__ void gv_cl_sync() {
#ifdef __CUDA_ARCH__
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#elif defined(GV_HOST_EMU)
    emu_cluster_sync();
#endif
}
// V floats at p's offset in the shared memory of cluster block `rank` (p: an address in this block's dynamic shared
// memory, 16-byte aligned for V = 4)
template <int V> __device__ __forceinline__ void gv_cl_load(const float* p, unsigned rank, float (&v)[V]) {
#ifdef __CUDA_ARCH__
    unsigned a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(rank));
    if constexpr (V == 4)
        asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v[0]) : "r"(a) : "memory");
#elif defined(GV_HOST_EMU)
    const float* q = emu_peer(p, rank);
    for (int j = 0; j < V; ++j) v[j] = q[j];
#endif
}

// The splits' sum of the block's tile, shared by both reductions so that they are one arithmetic: per output
// (row rl, lane b) s = 0.f, then s += partial of split 0, 1, .., splits - 1 in that order (ld(sp, off, v): the V
// floats of split sp at offset off = rl * 8 + b0 of its [ROWS][8] partial tile), times row_scale, rounded to T into
// y (or, folding, added into the residual and kept in sr for gv_fold_ss). 2-8 lanes: V = 4 lanes per load. The
// splits' loads go in batches of U, each batch's loads predicated and issued before its adds, so that a sum of up
// to U splits is one L2 round trip (a `#pragma unroll U` loop left a split count below U to its remainder loop,
// one load after another). Measured (H200, perf/gemv_variants.py nored): with one float per global load the 4- and
// 8-lane reductions cost 4-11 us per GEMV (L2 round trips one after another in the last block).
template <typename F, typename T, int NB, int U, bool GU, typename Ld>
__device__ __forceinline__ void gv_split_sum(Ld ld, float* sr, int bx, int splits, T* yb, const int* lt,
                                             long long ldy, const u8* p1, const u8* p2, long long wbase, int N,
                                             int nb, const GvFold& fo) {
    constexpr int ROWS = GV_WARPS * F::MT * 16, V = NB >= 4 ? 4 : 1;
    float* rb = reinterpret_cast<float*>(yb);
    for (int i = threadIdx.x; i < ROWS * NB / V; i += blockDim.x) {
        const int rl = i / (NB / V), b0 = i % (NB / V) * V, n = GU ? gv_wrow<ROWS>(bx, rl, N) : bx * ROWS + rl;
        // the row scale and (folding) the residual words are loaded before the partials, so that their L2 round
        // trips overlap the partials' instead of following them (same values, same operations)
        const bool in = n < N;
        const float rs = in ? F::row_scale(p1, p2, wbase + n) : 0.f;
        float r0[V] = {};
        if (fo.on && in) {
#pragma unroll
            for (int j = 0; j < V; ++j)
                if (b0 + j < nb) r0[j] = rb[(b0 + j) * ldy + n];
        }
        float s[V] = {};
        for (int s0 = 0; s0 < splits; s0 += U) {  // U splits' loads issued, then their adds in split order
            float v[U][V];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (s0 + u < splits) ld(s0 + u, rl * 8 + b0, v[u]);
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (s0 + u < splits) {
#pragma unroll
                    for (int j = 0; j < V; ++j) s[j] += v[u][j];
                }
        }
        if (!in) continue;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            if (b0 + j >= nb) continue;
            if constexpr (GU)
                sr[rl * 8 + b0 + j] = to_f(from_f<T>(s[j] * rs));  // the stored product's bits
            else if (fo.on)
                sr[rl * 8 + b0 + j] = gv_fold_add<T>(s[j] * rs, r0[j], rb + (b0 + j) * ldy + n);
            else
                gv_yrow(yb, lt, NB, b0 + j, ldy)[n] = from_f<T>(s[j] * rs);
        }
    }
}

// The K-split reduction of a cluster launch (linear.py: cluster dims (1, splits, 1), so a row block's splits are
// one cluster on one GPC and cluster rank == split): each block puts its fp32 partial tile [ROWS][8] (gv_store's
// `part` layout) at the start of its weight ring (free: the main loop's last barrier follows every read of it and
// every copy into it has landed), a cluster barrier publishes the tiles, rank 0 adds all ranks' tiles through
// distributed shared memory in split order (gv_split_sum: the counter path's float operations in the same order,
// so the same bits), and a second cluster barrier keeps every block, and so its shared memory, alive until rank 0
// has read it. No global workspace, counter or atomic.
template <typename F, typename T, int NB, bool GU>
__device__ __forceinline__ bool gv_store_cl(u32* sm, const float (&acc)[F::MT][4], int bx, int split, int splits,
                                            T* yb, const int* lt, long long ldy, const u8* p1, const u8* p2,
                                            long long wbase, int N, int nb, const GvFold& fo) {
    constexpr int MT = F::MT, ROWS = GV_WARPS * MT * 16;
    constexpr int ACT = GvChunk<NB>::V * 8 * NB * 4 * (GvIsFloat<T>::v ? 4 : 2);
    static_assert(ROWS * 8 * 4 <= GV_WARPS * GV_STAGES * F::VECS * 512, "a partial tile fits the weight ring");
    if (gv_cl_size() != (unsigned)splits) __trap();  // the host launches clusters of exactly the splits
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float* part = reinterpret_cast<float*>(sm + 2 * ACT);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)  // acc (h * 2, h * 2 + 1): row g + 8h, lanes 2t and 2t + 1
            *reinterpret_cast<float2*>(part + (warp * MT * 16 + mt * 16 + g + h * 8) * 8 + 2 * t) =
                make_float2(acc[mt][2 * h], acc[mt][2 * h + 1]);
    gv_cl_sync();  // every rank's tile written and visible to the cluster
    float* sr = reinterpret_cast<float*>(sm) + 32;  // folding: as gv_store (the activation buffers)
    if (split == 0) {
        const auto ld = [part](int sp, int off, auto& v) { gv_cl_load(part + off, (unsigned)sp, v); };
        gv_split_sum<F, T, NB, 16, GU>(ld, sr, bx, splits, yb, lt, ldy, p1, p2, wbase, N, nb, fo);
    }
    gv_cl_sync();  // rank 0's reads of the other ranks' shared memory are done: they may exit
    if constexpr (GU) {
        if (split == 0) gv_gu_store<T, NB, ROWS>(sr, bx, nb, yb, lt, ldy);
    } else if (split == 0 && fo.on) {
        gv_fold_ss<NB, ROWS>(sr, bx, N, nb, fo);
    }
    return split == 0;
}

// The K-split reduction through a global workspace: the block's partials to slot (tile, split) of ws, and the last
// of the row block's splits to arrive (cnt[tile]) adds them in split order (gv_split_sum) and resets the counter.
template <typename F, typename T, int NB, bool GU>
__device__ __forceinline__ bool gv_store_counter(u32* sm, const float (&acc)[F::MT][4], int bx, long long tile,
                                                 int split, int splits, T* yb, const int* lt, long long ldy,
                                                 float* ws, int* cnt, const u8* p1, const u8* p2, long long wbase,
                                                 int N, int nb, const GvFold& fo) {
    constexpr int MT = F::MT, ROWS = GV_WARPS * MT * 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float* sr = reinterpret_cast<float*>(sm) + 32;  // folding: as gv_store
    float* part = ws + (tile * splits + split) * (ROWS * 8);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[(warp * MT * 16 + mt * 16 + g + (e >> 1) * 8) * 8 + 2 * t + (e & 1)] = acc[mt][e];
    // one arrival per block, after the barrier: thread 0's acq_rel atomic releases the block's partials
    // (cumulativity through the barrier) and, in the last block, acquires the others' (extended to its threads by
    // the barrier after it): no separate fences (~4% of the 1-row GEMV's warp stalls were per-thread fences)
    __syncthreads();
    // the last-block flag in the first activation word: every read of the activation buffers ended before the main
    // loop's last barrier (a static __shared__ int here made a block 16 bytes too large for 4 per SM)
    volatile int* last = reinterpret_cast<volatile int*>(sm);
    if (threadIdx.x == 0) *last = arrive_acq_rel(cnt + tile, 1) == splits - 1;
    __syncthreads();
    if (!*last) return false;
    const float* base = ws + tile * splits * (ROWS * 8);
    constexpr int V = NB >= 4 ? 4 : 1;
    const auto ld = [base](int sp, int off, float (&v)[V]) {
        const float* q = base + (long long)sp * ROWS * 8 + off;
        if constexpr (V == 4) {
            const float4 u = __ldcg(reinterpret_cast<const float4*>(q));
            v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
        } else {
            v[0] = __ldcg(q);
        }
    };
    gv_split_sum<F, T, NB, 16, GU>(ld, sr, bx, splits, yb, lt, ldy, p1, p2, wbase, N, nb, fo);
    if constexpr (GU)
        gv_gu_store<T, NB, ROWS>(sr, bx, nb, yb, lt, ldy);
    else if (fo.on)
        gv_fold_ss<NB, ROWS>(sr, bx, N, nb, fo);
    if (threadIdx.x == 0) cnt[tile] = 0;
    return true;
}

// The block's results: with one split straight to y; launched as clusters, gv_store_cl; else gv_store_counter.
// Folding (fo.on): y is the float32 residual, row b at rb + b * ldy (see GvFold). GU: the SwiGLU epilogue (above).
// Returns whether this block finished its row block (its outputs are stored; gemv.cu's routing tail counts those).
template <typename F, typename T, int NB, bool GU = false>
__device__ __forceinline__ bool gv_store(u32* sm, const float (&acc)[F::MT][4], int bx, long long tile, int split,
                                         int splits, T* yb, const int* lt, long long ldy, float* ws, int* cnt,
                                         const u8* p1, const u8* p2, long long wbase, int N, int nb,
                                         const GvFold& fo) {
    constexpr int MT = F::MT, ROWS = GV_WARPS * MT * 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = bx * ROWS + warp * MT * 16;
    // folding: the block's r after the activation words (the main loop's reads of them ended at its last barrier;
    // the split path's flag is word 0); 32 + ROWS * 8 <= 2 * ACT words for every instance
    static_assert(32 + ROWS * 8 <= 2 * GvChunk<NB>::V * 8 * NB * 4 * (GvIsFloat<T>::v ? 4 : 2), "sr fits");
    float* sr = reinterpret_cast<float*>(sm) + 32;
    float* rb = reinterpret_cast<float*>(yb);
    if (GU && splits == 1) {  // every output rounded to T into sr, then the features' SwiGLU
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int rl = warp * MT * 16 + mt * 16 + g + (e >> 1) * 8, b = 2 * t + (e & 1);
                if (b < nb) sr[rl * 8 + b] = to_f(from_f<T>(acc[mt][e] * F::row_scale(p1, p2, wbase + gv_wrow<ROWS>(bx, rl, N))));
            }
        gv_gu_store<T, NB, ROWS>(sr, bx, nb, yb, lt, ldy);
        return true;
    }
    if (splits == 1) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int n = r0 + mt * 16 + g + (e >> 1) * 8, b = 2 * t + (e & 1);
                if (n >= N || b >= nb) continue;
                const float v = acc[mt][e] * F::row_scale(p1, p2, wbase + n);
                if (fo.on)
                    sr[(n - bx * ROWS) * 8 + b] = gv_fold_r<T>(v, rb + b * ldy + n);
                else
                    gv_yrow(yb, lt, NB, b, ldy)[n] = from_f<T>(v);
            }
        if (fo.on) gv_fold_ss<NB, ROWS>(sr, bx, N, nb, fo);
        return true;
    }
    if (gv_cl_size() > 1) {  // (perf/gemv_variants.py's nocl rewrites this line)
        return gv_store_cl<F, T, NB, GU>(sm, acc, bx, split, splits, yb, lt, ldy, p1, p2, wbase, N, nb, fo);
    }
    return gv_store_counter<F, T, NB, GU>(sm, acc, bx, tile, split, splits, yb, lt, ldy, ws, cnt, p1, p2, wbase, N,
                                          nb, fo);
}
