// The decode GEMV's activation staging (gemv.cu): the input transform applied while staging (xf: plain, SwiGLU,
// output gate, folded RMS norm), the per-chunk loads a chunk ahead (gv_fetch) and their store as bf16 mma B
// fragments in shared memory (gv_put), and the folded norm's consumer side (gv_norm_inv). Part of gemv.cu: uses its
// GV_* geometry defines (GV_WARPS, GV_CHUNK*), which it sets before including this.
#pragma once
#include "common.cuh"

template <typename T> struct GvIsFloat { static constexpr bool v = false; };
template <> struct GvIsFloat<float> { static constexpr bool v = true; };

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

// The SwiGLU of a gate value g and its up value u (activation.cu's swiglu expression): the SwiGLU epilogue's
// (gemv_store.cuh gv_gu_store), and the GV_SWIGLU staging's below (written out there: the wrapper shifted the
// front end's register numbering of the bf16 instances), so both give the same bits.
__device__ __forceinline__ float gv_swiglu(float g, float u) { return siluf_(g) * u; }

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
            const float r = xf == GV_SWIGLU ? siluf_(v[j]) * u[j] : v[j] * sigmoidf_(u[j]);  // gv_swiglu
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
