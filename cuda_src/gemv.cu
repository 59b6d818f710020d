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
// of NB and of the number of rows in the launch. The host picks `splits` from (format, N, K) only (linear.py, gemv_plan).
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

#define GV_WARPS 4
#define GV_STAGES 4  // per-warp weight pipeline depth: 3 K-tiles in flight while one is computed
#define GV_CHUNK 2    // K-tiles of activations staged per block barrier (double-buffered), 5-8 lanes
#define GV_CHUNK4 4   // the same for 2-4 lanes (the 4-lane instance: half the 8-lane staging, same shared memory)
#define GV_CHUNK1 16  // the same for one lane: 4x fewer barriers (a split of <= 16 tiles stages once)
#define GV_MIN_BLOCKS 4  // resident blocks per SM the registers are budgeted for (launch bounds)

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

template <typename T> struct GvIsFloat { static constexpr bool v = false; };
template <> struct GvIsFloat<float> { static constexpr bool v = true; };

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

// The activation prologue (xf, uniform per launch) the GEMV applies while staging, so the elementwise kernel before it disappears:
//   GV_PLAIN    x as given;
//   GV_SWIGLU   silu(x[k]) * x2[k]: x = the gate half, x2 = the up half of a fused [gate | up] row (activation.cu's
//               swiglu, same expression);
//   GV_GATE     x[k] * sigmoid(x2[(k / gd) * 2 gd + k % gd]): the attention output times its gate read in place
//               from the q|gate projection (activation.cu's sigmoid_gate, same expression).
//   GV_NORM     r[k] * inv * (1 + w[k]) (GV_NORMW: * w[k]), the residual add + RMS norm folded into the GEMV
//               (docs/cuda.md, "Norm folding"): x is the float32 residual r (row stride ldx, in floats), x2 the
//               float32 norm weight w, and inv = 1 / sqrt(ss / K + eps) with ss the sum over p = 0 .. npart - 1,
//               in that order, of the producer's partial sums of squares part[p * ldp + row] (see gv_fold_ss);
//               the expression of norm.cu's rms_out, every block of the launch computing the same inv.
// bf16 activations round the transformed value to bf16 as the standalone kernels store it, so a fused product is
// bitwise the product of the standalone kernel's output (the norm modes: up to the order of the sum of squares).
#define GV_PLAIN 0
#define GV_SWIGLU 1
#define GV_GATE 2
#define GV_NORM 3
#define GV_NORMW 4

// The folded norm's staged value of residual word r with norm weight word g (norm.cu's rms_out expression, rounded
// to T as a stored activation).
template <typename T> __device__ __forceinline__ float gv_normed(float r, float g, float inv, int xf) {
    return to_f(from_f<T>(r * inv * (xf == GV_NORM ? 1.f + g : g)));
}

// 8 activations of one lane as floats (zero past K; K % 8 == 0 so a word is all in or all out); k is the column.
template <typename T>
__device__ __forceinline__ void gv_load8(const T* p, const T* p2, int xf, int k, int gd, float inv, bool in,
                                         float v[8]) {
    if (!in) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = 0.f;
        return;
    }
    if (xf >= GV_NORM) {  // p: the lane's float32 residual row, p2: the norm weight
        float g[8];
        load8x(reinterpret_cast<const float*>(p) + k, v);
        load8x(reinterpret_cast<const float*>(p2) + k, g);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = gv_normed<T>(v[j], g[j], inv, xf);
        return;
    }
    load8x(p + k, v);
    if (xf != GV_PLAIN) {  // uniform per launch: staging only, off the weights' hot loop
        float u[8];
        load8x(xf == GV_SWIGLU ? p2 + k : p2 + (long long)(k / gd) * 2 * gd + k % gd, u);  // gd % 8 == 0
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float r = xf == GV_SWIGLU ? siluf_(v[j]) * u[j] : v[j] * sigmoidf_(u[j]);
            v[j] = to_f(from_f<T>(r));  // float: exact; bf16: the standalone kernel's rounding
        }
    }
}

// Activations are staged per chunk of GV_CHUNK tiles into one of two shared-memory buffers: fragment (tile tl of
// the chunk, step s, lane g, quad thread t) at u32 offset ((tl * 8 + s) * NB + g) * 4 + t, times FW words (hi b0,
// hi b1[, lo b0, lo b1]). A thread owns items (8 consecutive activations of one lane) threadIdx.x + j * 128;
// their global loads are issued a chunk ahead (gv_fetch, into registers) and converted and stored after the
// current chunk's math (gv_put), so their latency hides behind the weights' stream.
template <int NB> struct GvChunk {
    static constexpr int V = NB == 1 ? GV_CHUNK1 : (NB <= 4 ? GV_CHUNK4 : GV_CHUNK);
};
template <int NB> struct GvItems {
    static constexpr int N = (NB * GvChunk<NB>::V * 16 + GV_WARPS * 32 - 1) / (GV_WARPS * 32);
};

// Item j of this thread in chunk c: its column k, and whether it is staged (inside the chunk, its lane in the
// launch, its tile in the split, k < K); else it stages zeros.
template <int NB>
__device__ __forceinline__ bool gv_item(int j, int c, int nb, int K, int kt0, int nt, int& k) {
    const int item = threadIdx.x + j * GV_WARPS * 32, g = item % NB, tl = item / NB >> 4, cc = item / NB & 15;
    const int tile = c * GvChunk<NB>::V + tl;
    k = (kt0 + tile) * 128 + 8 * cc;
    return item < NB * GvChunk<NB>::V * 16 && g < nb && tile < nt && k < K;
}

// Row addressing: every item of a thread belongs to lane threadIdx.x % NB (GV_WARPS * 32 % NB == 0), so the kernel
// resolves that lane's row once (xl, x2l: its activation row and x2 row; read only where the lane is in).
template <typename F, typename T, int NB>
__device__ __forceinline__ void gv_fetch(float (&v)[GvItems<NB>::N][8], const T* xl, const T* x2l, int xf, int gd,
                                         float inv, int nb, int K, int kt0, int nt, int c) {
    static_assert(GV_WARPS * 32 % NB == 0, "a thread stages one lane");
#pragma unroll
    for (int j = 0; j < GvItems<NB>::N; ++j) {
        int k;
        const bool in = gv_item<NB>(j, c, nb, K, kt0, nt, k);
        gv_load8<T>(xl, x2l, xf, in ? k : 0, gd, inv, in, v[j]);
    }
}

// A folded norm's first chunk in two phases (gv_kernel), so that its loads are in flight while the block gathers
// the norm's partials: the residual and weight words only (zero past K or past the lanes, as gv_load8), then, once
// inv is known, gv_load8's expression on them (a zero item stays zero: 0 * inv * (1 + 0) and 0 * inv * 0 are +0).
template <typename T, int NB>
__device__ __forceinline__ void gv_fetch_norm_raw(float (&v)[GvItems<NB>::N][8], float (&w)[GvItems<NB>::N][8],
                                                  const T* xl, const T* x2l, int nb, int K, int kt0, int nt) {
#pragma unroll
    for (int j = 0; j < GvItems<NB>::N; ++j) {
        int k;
        if (gv_item<NB>(j, 0, nb, K, kt0, nt, k)) {
            load8x(reinterpret_cast<const float*>(xl) + k, v[j]);
            load8x(reinterpret_cast<const float*>(x2l) + k, w[j]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[j][e] = w[j][e] = 0.f;
        }
    }
}
template <typename T, int NB>
__device__ __forceinline__ void gv_norm_apply(float (&v)[GvItems<NB>::N][8], const float (&w)[GvItems<NB>::N][8],
                                              int xf, float inv) {
#pragma unroll
    for (int j = 0; j < GvItems<NB>::N; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e)
            v[j][e] = gv_normed<T>(v[j][e], w[j][e], inv, xf);
}

template <typename F, typename T, int NB>
__device__ __forceinline__ void gv_put(const float (&v)[GvItems<NB>::N][8], u32* sm) {
    constexpr bool SPLIT = GvIsFloat<T>::v;
    constexpr int FW = SPLIT ? 4 : 2;
#pragma unroll
    for (int j = 0; j < GvItems<NB>::N; ++j) {
        const int item = threadIdx.x + j * GV_WARPS * 32, g = item % NB, tl = item / NB >> 4, cc = item / NB & 15;
        if (item >= NB * GvChunk<NB>::V * 16) break;
        int t, w;
        F::chunk(cc, t, w);
        u32 hi[4], lo[4];
        stage_pairs(v[j], hi, lo);
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // steps 2w and 2w + 1
            u32* d = sm + ((size_t)((tl * 8 + 2 * w + h) * NB + g) * 4 + t) * FW;
            if (SPLIT) {
                *reinterpret_cast<uint4*>(d) = make_uint4(hi[2 * h], hi[2 * h + 1], lo[2 * h], lo[2 * h + 1]);
            } else {
                *reinterpret_cast<uint2*>(d) = make_uint2(hi[2 * h], hi[2 * h + 1]);
            }
        }
    }
}

// One K-tile of one warp: MT m-tiles x 8 steps. acc[mt][0..3] = (row g, lane 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
template <typename F, typename T, int NB>
__device__ __forceinline__ void gv_tile(const u32* sm, int tl, const typename F::Raw (&raw)[F::MT][2],
                                        float (&acc)[F::MT][4]) {
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
                if (s % F::GROUP == F::GROUP - 1) {
                    const float s0 = F::gscale(p[mt][0], s / F::GROUP), s1 = F::gscale(p[mt][1], s / F::GROUP);
                    acc[mt][0] = fmaf(tmp[mt][0], s0, acc[mt][0]);
                    acc[mt][1] = fmaf(tmp[mt][1], s0, acc[mt][1]);
                    acc[mt][2] = fmaf(tmp[mt][2], s1, acc[mt][2]);
                    acc[mt][3] = fmaf(tmp[mt][3], s1, acc[mt][3]);
                }
            }
        }
    }
}

// Output row of lane b: the slot table's (expert lanes, lt != nullptr; yb = y) or row b of the lane block at yb.
template <typename T>
__device__ __forceinline__ T* gv_yrow(T* yb, const int* lt, int nb_max, int b, long long ldy) {
    return yb + (long long)(lt ? lt[nb_max + b] : b) * ldy;
}

// This warp's rows of the block starting at row r0 of the launch: its cp.async sources at K-tile kt0.
template <typename F>
__device__ __forceinline__ typename F::Src gv_rows_src(const u8* p0, const u8* p1, const u8* p2, int N, int K,
                                                       long long wbase, int r0, int kt0, int t) {
    const int g = (threadIdx.x & 31) >> 2;
    long long wr[F::MT][2];
#pragma unroll
    for (int mt = 0; mt < F::MT; ++mt) {
        wr[mt][0] = wbase + min(r0 + mt * 16 + g, N - 1);
        wr[mt][1] = wbase + min(r0 + mt * 16 + g + 8, N - 1);
    }
    return F::src(p0, p1, p2, K, wr, kt0 * 128, t);
}

// The first GV_STAGES - 1 of the block's nt tiles into the warp's ring (one commit group each).
template <typename F>
__device__ __forceinline__ void gv_prologue(u8* wsm, int lane, typename F::Src& src, int t, int nt) {
#pragma unroll
    for (int s = 0; s < GV_STAGES - 1; ++s) {
        if (s < nt) F::copy_next(wsm + s * F::VECS * 512, lane, src, t);
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
    const int nchunks = (nt + GvChunk<NB>::V - 1) / GvChunk<NB>::V, nt_refill = nt - (GV_STAGES - 1);
    u8* fill = wsm + (GV_STAGES - 1) * STAGE;  // the stage read one tile ago (tile i - 1 mod GV_STAGES)
    for (int c = 0; c < nchunks; ++c) {
        if (c + 1 < nchunks) gv_fetch<F, T, NB>(xv, xl, x2l, xf, gd, inv, nb, K, kt0, nt, c + 1);
        const u32* act = sm + (c & 1) * ACT;
#pragma unroll 1
        for (int tl = 0, tend = min(GvChunk<NB>::V, nt - c * GvChunk<NB>::V); tl < tend; ++tl) {
            const int i = c * GvChunk<NB>::V + tl;
            cp_async_wait<GV_STAGES - 2>();  // this lane's copies of tile i have landed
            typename F::Raw raw[MT][2];
            u8* const st = wsm + (i % GV_STAGES) * STAGE;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                F::read(st, lane, mt, 0, t, raw[mt][0]);
                F::read(st, lane, mt, 1, t, raw[mt][1]);
            }
            // refill the stage read one iteration ago (its values are consumed: no lane reads it again)
            if (i < nt_refill) F::copy_next(fill, lane, src, t);
            fill = st;
            cp_async_commit();
            gv_tile<F, T, NB>(act, tl, raw, acc);
        }
        // the other buffer was last read in chunk c - 1, before the previous barrier
        if (c + 1 < nchunks) gv_put<F, T, NB>(xv, sm + ((c + 1) & 1) * ACT);
        __syncthreads();
    }
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

// r = x + r0 into *q, r0 the residual word *q (loaded by the caller, so that its round trip can overlap others)
template <typename T> __device__ __forceinline__ float gv_fold_add(float x, float r0, float* q) {
    const float r = __fadd_rn(to_f(from_f<T>(x)), r0);  // x rounded first, never contracted into an fma
    *q = r;
    return r;
}
template <typename T> __device__ __forceinline__ float gv_fold_r(float x, float* q) { return gv_fold_add<T>(x, *q, q); }

// The block's sum of squares of r over its rows, per lane: warp w takes lanes w, w + GV_WARPS, ...; thread l of the
// warp adds rows l, l + 32, l + 64, ... (fmaf from 0, rows past N left out), then a butterfly over the 32 threads
// (a + b == b + a: every thread ends with the same bits). A fixed order whatever the launch: a lane's partial
// depends only on its own r. Written to part[bx * ldp + prow + b].
template <int NB, int ROWS>
__device__ __forceinline__ void gv_fold_ss(const float* sr, int bx, int N, int nb, const GvFold& fo) {
    __syncthreads();  // every r of the block is in sr
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int b = warp; b < NB; b += GV_WARPS) {  // uniform per warp
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < ROWS / 32; ++i) {
            const int rl = i * 32 + lane;
            if (b < nb && bx * ROWS + rl < N) s = fmaf(sr[rl * 8 + b], sr[rl * 8 + b], s);
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0 && b < nb) fo.part[bx * fo.ldp + fo.prow + b] = s;
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
template <typename F, typename T, int NB, int U, typename Ld>
__device__ __forceinline__ void gv_split_sum(Ld ld, float* sr, int bx, int splits, T* yb, const int* lt,
                                             long long ldy, const u8* p1, const u8* p2, long long wbase, int N,
                                             int nb, const GvFold& fo) {
    constexpr int ROWS = GV_WARPS * F::MT * 16, V = NB >= 4 ? 4 : 1;
    float* rb = reinterpret_cast<float*>(yb);
    for (int i = threadIdx.x; i < ROWS * NB / V; i += blockDim.x) {
        const int rl = i / (NB / V), b0 = i % (NB / V) * V, n = bx * ROWS + rl;
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
            if (fo.on)
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
template <typename F, typename T, int NB>
__device__ __forceinline__ void gv_store_cl(u32* sm, const float (&acc)[F::MT][4], int bx, int split, int splits,
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
        gv_split_sum<F, T, NB, 16>(ld, sr, bx, splits, yb, lt, ldy, p1, p2, wbase, N, nb, fo);
    }
    gv_cl_sync();  // rank 0's reads of the other ranks' shared memory are done: they may exit
    if (split == 0 && fo.on) gv_fold_ss<NB, ROWS>(sr, bx, N, nb, fo);
}

// The block's results: with one split straight to y; launched as clusters, gv_store_cl; else its partials to slot
// (tile, split), and the last of the row block's splits to arrive adds them in split order and resets the tile's
// counter. Folding (fo.on): y is the float32 residual, row b at rb + b * ldy (see GvFold).
template <typename F, typename T, int NB>
__device__ __forceinline__ void gv_store(u32* sm, const float (&acc)[F::MT][4], int bx, long long tile, int split,
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
        return;
    }
    if (gv_cl_size() > 1) {
        gv_store_cl<F, T, NB>(sm, acc, bx, split, splits, yb, lt, ldy, p1, p2, wbase, N, nb, fo);
        return;
    }
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
    if (!*last) return;
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
    gv_split_sum<F, T, NB, 16>(ld, sr, bx, splits, yb, lt, ldy, p1, p2, wbase, N, nb, fo);
    if (fo.on) gv_fold_ss<NB, ROWS>(sr, bx, N, nb, fo);
    if (threadIdx.x == 0) cnt[tile] = 0;
}

// L2 prefetch of the next product's weights (decode chains: linear.gemv's ``prefetch``). A chain of GEMVs runs at
// 50-65% of copy bandwidth on the 27B's mid-size matrices although the lm_head reaches 77% and, without the
// dequantization, 97% (perf/results/device_run_5c07f3d.txt): each launch ramps up and drains, and under PDL the
// next launch can only issue its first GV_STAGES - 1 tiles per warp before it waits for this one. Here the blocks
// of this launch that finish last (the tail, when DRAM has spare bandwidth) each fetch into L2 the first
// GV_PF_TILES K-tiles of one block of the next launch's first wave (next block j = G - 1 - L for this block's
// linear id L, then j + G, ... below min(next grid, GV_PF_WAVE)), so that its main loop starts from L2.
// q0 / q1: the next weight's NVFP4 code and scale planes (wformat.cuh's device layout: a 16-row group's K tiles
// are consecutive 1 KiB code / 128 B scale blocks, so one bulk prefetch per group and plane), qn x qk its shape,
// qbx x qsplits its grid (linear.gemv_plan). Only hints: nothing reads the prefetched bytes but the next launch's
// own loads, so results never change. Formats other than NVFP4 (GvPf<F>::ON false) ignore q0.
// GV_PF_START 1 (the default since 2026-12-04; measured 0 above: a loss): every block issues its hints at its start,
// after its own first tiles and before its PDL wait (block L hints next block L, L + G, ...), so the bytes move
// while this launch streams instead of extending its drain (likely why the end placement lost: a grid completes only
// after its bulk operations have).
// Expert launches (experts == 1, e.g. gate | up) hint the down projection of their own slot's expert instead
// (gv_prefetch_expert): q0 / q1 that weight's planes, qn its rows per expert, qk its K; the slot's blocks share it.
#ifndef GV_PF_START
#define GV_PF_START 1
#endif
#ifndef GV_PF_TILES
#define GV_PF_TILES 4
#endif
#define GV_PF_WAVE 528  // one wave of the GEMV on a 132-SM H200 (linear._GV_WAVE_BLOCKS)
template <typename F> struct GvPf { static constexpr bool ON = false; };
template <> struct GvPf<FragNVFP4> { static constexpr bool ON = true; };
template <> struct GvPf<FragNVFP4RowG> { static constexpr bool ON = true; };

__device__ __forceinline__ void gv_l2_prefetch(const u8* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p, (void)bytes;
#endif
}

template <int ROWS>
__device__ __forceinline__ void gv_prefetch_next(const u8* q0, const u8* q1, int qn, int qk, int qbx, int qsplits) {
    const int tid = threadIdx.x;
    if (tid >= 2 * (ROWS / 16)) return;  // one thread per (16-row group, plane)
    const long long g = gridDim.x * (long long)gridDim.y * gridDim.z;
    const long long l = blockIdx.x + gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
    const long long wave = min((long long)qbx * qsplits, (long long)GV_PF_WAVE);
    const int ntiles = (qk + 127) / 128, grp = tid % (ROWS / 16), codes = tid < ROWS / 16;
    const long long kp = kpad128(qk);
    for (long long j = GV_PF_START ? l : g - 1 - l; j < wave; j += g) {
        const int bx = (int)(j % qbx), split = (int)(j / qbx);
        const int kt0 = split * ntiles / qsplits, nt = (split + 1) * ntiles / qsplits - kt0;
        const long long n = (long long)bx * ROWS + 16 * grp;
        if (n >= qn || nt <= 0) continue;
        const unsigned tiles = (unsigned)min(nt, GV_PF_TILES);
        if (codes)
            gv_l2_prefetch(q0 + nv4_codes(n, kp, kt0 * 128), tiles * 1024u);
        else
            gv_l2_prefetch(q1 + nv4_scales(n, kp, kt0 * 128), tiles * 128u);
    }
}

// An expert launch's hint (GV_PF_START): the down projection rows [e * qn, (e + 1) * qn) of expert e, every K tile:
// in the device layout one contiguous run of code bytes and one of scale bytes (qn a multiple of 16, the host
// checks), cut into equal 16-byte-aligned shares over the slot's blocks (x, y of the grid; z is the slot).
__device__ __forceinline__ void gv_prefetch_expert(const u8* q0, const u8* q1, int qn, int qk, long long e) {
    const int tid = threadIdx.x;
    if (tid >= 2) return;  // thread 0 the codes, thread 1 the scales
    const long long kp = kpad128(qk), n0 = e * qn;
    const long long size = tid == 0 ? qn * kp / 2 : qn * kp / 16;
    const u8* base = tid == 0 ? q0 + nv4_codes(n0, kp, 0) : q1 + nv4_scales(n0, kp, 0);
    const long long parts = (long long)gridDim.x * gridDim.y, l = blockIdx.x + (long long)gridDim.x * blockIdx.y;
    const long long share = (size + parts * 16 - 1) / (parts * 16) * 16, off = l * share;
    if (off < size) gv_l2_prefetch(base + off, (unsigned)min(share, size - off));
}

// Folded norm, consumer side: this thread's lane's 1 / rms from the producer's npart partial sums of squares of
// its row xr, added from 0.f in row-block order (norm.cu's expression, H = K). The partials come through the
// activation buffers (free until gv_products stages): the threads of a lane load its partials side by side, so the
// block pays one L2 round trip where a thread loading them in groups of 8 paid npart / 8 of them (the wait sits
// between the previous launch's end and this one's first product), then each thread adds its lane's in order,
// the same float operations. More partials than the buffers hold (never on the models' shapes): loads in groups.
template <typename T, int NB>
__device__ __forceinline__ float gv_norm_inv(u32* sm, const float* part, long long ldp, int npart, long long xr,
                                             int gl, int nb, int K, float eps) {
    constexpr int CAP = 2 * GvChunk<NB>::V * 8 * NB * 4 * (GvIsFloat<T>::v ? 4 : 2);  // words, 2 * ACT
    constexpr int J = GV_WARPS * 32 / NB;  // threads per lane
    float ss = 0.f;
    if (npart * NB <= CAP) {
        float* sp = reinterpret_cast<float*>(sm);
        if (gl < nb) {
#pragma unroll 4
            for (int p = threadIdx.x / NB; p < npart; p += J) sp[p * NB + gl] = part[p * ldp + xr];
        }
        __syncthreads();
        if (gl < nb)
            for (int p = 0; p < npart; ++p) ss += sp[p * NB + gl];
        __syncthreads();  // every read of the buffers done before gv_products stages into them
    } else if (gl < nb) {
        int p = 0;
        for (; p + 8 <= npart; p += 8) {  // 8 loads in flight, then their adds in order
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = part[(p + j) * ldp + xr];
#pragma unroll
            for (int j = 0; j < 8; ++j) ss += v[j];
        }
        for (; p < npart; ++p) ss += part[p * ldp + xr];
    }
    return gl < nb ? 1.f / sqrtf(ss / (float)K + eps) : 0.f;
}

// experts == 0: lane block z takes activation rows z*NB .. (nrows of them in the launch), weight rows row0 ..;
// Norm folding (docs/cuda.md): xf GV_NORM | GV_NORMW stages the RMS-normed residual (x: float32 residual, x2: norm
// weight, part/ldp/npart/eps: the producer's partial sums of squares; any experts mode: a lane's partials are
// those of its activation row); fold = 1 (experts == 0 only) makes y the float32 residual, updated in place, and
// writes this launch's partials to part [row blocks][ldp = nrows].
// experts == 1: expert slot z: activation row xrow[z], weight rows ids[z] * N .., one lane;
// experts == 2: expert lanes: slot z's rows from its table xrow[z*2NB ..] (header), weight rows ids[z] * N ...
// Dynamic shared memory: two activation chunk buffers (2 * GV_CHUNK * 8 * NB * 4 * FW * 4 bytes), then per warp
// GV_STAGES stages of F::VECS * 512 bytes of weights (gemv_plan in linear.py computes the same sizes).
// q0 .. qsplits: the next product's L2 prefetch (gv_prefetch_next above; gemv_mma_pf), null in gemv_mma.
template <typename F, typename T, int NB>
__device__ __forceinline__ void gv_kernel(
    const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2, const T* __restrict__ x,
    const T* __restrict__ x2, T* __restrict__ y, const int* __restrict__ ids, const int* __restrict__ xrow,
    float* __restrict__ ws, int* __restrict__ cnt, int N, int K, int nrows, long long ldx, long long ldx2,
    long long ldy, long long row0, int experts, int xf, int gd, int zin, float* __restrict__ part, long long ldp,
    int npart, float eps, int fold, const u8* __restrict__ q0, const u8* __restrict__ q1, int qn, int qk, int qbx,
    int qsplits, const GvRoute& rt, const GvCombine& cb) {
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
    long long wbase, xr0;
    T* yb;
    int nb;
    // launched with PDL (ninfer/cuda/launch.py): nothing an earlier kernel writes is read before pdl_wait. Expert
    // launches need the router's ids for their rows; the others issue their first weight tiles, then wait.
    if (experts) pdl_wait();
    const int* lt = nullptr;  // expert lanes: this slot's row table (lane inputs, then lane outputs)
    if (experts == 2) {
        const int e = ids[z];
        if (e < 0) return;  // a slot past the table's filled ones (the launch is sized by an upper bound)
        lt = xrow + (long long)z * 2 * NB;
        nb = 0;
#pragma unroll
        for (int g = 0; g < NB; ++g) nb += lt[g] >= 0;
        wbase = (long long)e * N, xr0 = 0, yb = y;
    } else if (experts) {
        const int e = rt.lg != nullptr ? gv_route_slot(rt, z, xrow[z], blockIdx.x == 0 && blockIdx.y == 0) : ids[z];
        wbase = (long long)e * N, xr0 = xrow[z], yb = y + (long long)z * ldy, nb = 1;
        if (GvPf<F>::ON && GV_PF_START && q0 != nullptr) gv_prefetch_expert(q0, q1, qn, qk, e);
    } else {
        wbase = row0, xr0 = (long long)z * NB;
        yb = fold ? reinterpret_cast<T*>(reinterpret_cast<float*>(y) + xr0 * ldy) : y + xr0 * ldy;
        nb = min(NB, nrows - z * NB);
    }
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
    typename F::Src src = gv_rows_src<F>(p0, p1, p2, N, K, wbase, bx * ROWS + warp * MT * 16, kt0, t);
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
    if (GvPf<F>::ON && !GV_PF_START && q0 != nullptr && !experts) gv_prefetch_next<ROWS>(q0, q1, qn, qk, qbx, qsplits);
    const GvFold fo{fold, part, ldp, xr0};
    gv_store<F, T, NB>(gv_sm, acc, bx, tile, split, splits, yb, lt, ldy, ws, cnt, p1, p2, wbase, N, nb, fo);
    if (cb.cnt != nullptr) gv_combine_tail(cb, z, reinterpret_cast<const float*>(y), N, gv_sm);
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

// The routed expert launch (GvRoute above; linear.gemv_experts_routed): experts == 1, one lane per slot, the L2
// hint of the down projection (q0, q1, qn, qk; null for none, ignored by formats other than NVFP4).
template <typename F, typename T, int NB>
__global__ void __launch_bounds__(GV_WARPS * 32, GV_MIN_BLOCKS)
    gemv_mma_rt(GV_PARAMS, const u8* __restrict__ q0, const u8* __restrict__ q1, int qn, int qk,
                const float* __restrict__ lg, long long ldl, int ne, int topk, int nrouted, int shared,
                int* __restrict__ rids, float* __restrict__ rw) {
    gv_kernel<F, T, NB>(GV_ARGS, q0, q1, qn, qk, 0, 0,
                        GvRoute{lg, ldl, ne, topk, nrouted, shared, rids, rw}, GvCombine{});
}

// The down projection with the MoE combine and the next norm in its tail (GvCombine above; linear.py
// gemv_experts_down_combine): experts == 1, one K split, float32 rows.
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
