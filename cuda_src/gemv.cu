// Decode matrix-vector / small-batch products: y[b, n] = sum_k x[b, k] * W[n, k] for up to 8 rows b,
// weights in any stored format (wformat.cuh), dequantized in registers, fp32 accumulation.
//
// One warp per output row n; lane l owns the 8-wide chunks k0 = 8l, 8l + 256, ... in order, then an xor
// butterfly sums the lanes. Every activation row b runs the same instruction sequence under a predicate
// (b < nrows), so a row's result is bitwise independent of how many rows share the launch (MAXB is fixed).
#include "common.cuh"
#include "wformat.cuh"

#define GEMV_MAXB 8
#define GEMV_WARPS 8

template <typename F, typename T>
__device__ __forceinline__ void gemv_row(const u8* p0, const u8* p1, const u8* p2, long long wrow, int K,
                                         const T* x, long long ldx, int nrows, float acc[GEMV_MAXB]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int b = 0; b < GEMV_MAXB; ++b) acc[b] = 0.f;
    for (int k0 = lane * 8; k0 < K; k0 += 256) {
        float w[8];
        F::load8(p0, p1, p2, K, wrow, k0, w);
#pragma unroll
        for (int b = 0; b < GEMV_MAXB; ++b) {
            if (b < nrows) {
                float xv[8];
                load8x(x + b * ldx + k0, xv);
                float a = acc[b];
#pragma unroll
                for (int j = 0; j < 8; ++j) a = fmaf(w[j], xv[j], a);
                acc[b] = a;
            }
        }
    }
#pragma unroll
    for (int b = 0; b < GEMV_MAXB; ++b) acc[b] = warp_sum(acc[b]);
}

// x: [nrows, K] (row stride ldx), y: [nrows, N] (row stride ldy); weight rows row0 .. row0 + N - 1.
template <typename F, typename T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2, const T* __restrict__ x,
         T* __restrict__ y, int N, int K, int nrows, long long ldx, long long ldy, long long row0) {
    const int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    float acc[GEMV_MAXB];
    gemv_row<F, T>(p0, p1, p2, row0 + n, K, x, ldx, nrows, acc);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int b = 0; b < GEMV_MAXB; ++b)
            if (b < nrows) y[b * ldy + n] = from_f<T>(acc[b]);
    }
}

// MoE decode dispatch: slot s multiplies activation row xrow[s] by expert ids[s] (rows ids[s]*N .. +N of the
// fused [E*N, K] weight) into y[s, :]. Same per-row order as gemv, so an expert's output for a token does
// not depend on the other slots.
template <typename F, typename T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_experts(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
                 const T* __restrict__ x, T* __restrict__ y, const int* __restrict__ ids,
                 const int* __restrict__ xrow, int N, int K, long long ldx, long long ldy) {
    const int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), s = blockIdx.y;
    if (n >= N) return;
    float acc[GEMV_MAXB];
    gemv_row<F, T>(p0, p1, p2, (long long)ids[s] * N + n, K, x + (long long)xrow[s] * ldx, ldx, 1, acc);
    if ((threadIdx.x & 31) == 0) y[s * ldy + n] = from_f<T>(acc[0]);
}
