// Decode matrix-vector / small-batch products: y[b, n] = sum_k x[b, k] * W[n, k] for up to 8 rows b,
// weights in any stored format (wformat.cuh wide chunks), dequantized in registers, fp32 accumulation.
//
// Layout (chosen for memory-level parallelism; reasoned, see docs in linear.py): a block of GEMV_THREADS threads
// is split into row groups of `tpr` threads (a multiple of 32 dividing GEMV_THREADS, picked on the host from the
// format and K only); each group computes GEMV_R consecutive output rows over the whole of K. Thread lt of a group
// owns the chunks k0 = KV * (lt + i * tpr), i = 0, 1, ... (KV = F::KV weights behind one 16-byte load per row),
// GEMV_U chunks x GEMV_R rows of loads in flight before any arithmetic; each x chunk is read once per thread and
// reused for the GEMV_R rows. Per thread the order is fixed (chunks in i order, 8-wide sub-chunks, j = 0..7),
// then an xor butterfly per warp, then the group's warps in index order through shared memory, then the
// format's row scale. Every activation row b runs the same instruction sequence under a predicate (b < nrows),
// so a row's result is bitwise independent of how many rows share the launch (GEMV_MAXB is fixed), and the
// experts kernel gives bitwise the plain gemv's rows (same tpr for the same format and K).
// x is read through the L1 (no shared-memory staging: 8 rows x 17408 fp32 would not fit, and a K-tiled copy
// would cost barriers); sub-chunks at k >= K (K % 8 == 0) are skipped, so x is never read past its row.
#include "common.cuh"
#include "wformat.cuh"

#define GEMV_MAXB 8
#define GEMV_THREADS 256
#define GEMV_R 4  // output rows per row group (measured: 2 rows per group at 4-8 activation rows was slower,
                  // 27B decode x8 55 against 72 tok/s: each x chunk then serves fewer weight rows)
#define GEMV_U 2  // chunks per thread in flight

// The per-thread part (rows b < nrows <= NB): acc[r][b] = this thread's partial sum for weight row wr[r] and activation row b,
// in units of XS (host-callable so a host program can mirror the kernel).
template <typename F, typename T, int NB, int R>
__host__ __device__ __forceinline__ void gemv_lane(const u8* p0, const u8* p1, const u8* p2,
                                                   const long long wr[R], int K, const T* x, long long ldx,
                                                   int nrows, int lt, int tpr, float acc[R][NB]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int b = 0; b < NB; ++b) acc[r][b] = 0.f;
    const int step = F::KV * tpr;
    for (int k = F::KV * lt; k < K; k += GEMV_U * step) {
        typename F::Wide c[GEMV_U][R];
#pragma unroll
        for (int u = 0; u < GEMV_U; ++u)
            if (k + u * step < K)
#pragma unroll
                for (int r = 0; r < R; ++r) F::load_wide(p0, p1, p2, K, wr[r], k + u * step, c[u][r]);
#pragma unroll
        for (int u = 0; u < GEMV_U; ++u) {
            const int ku = k + u * step;
            if (ku < K) {
#pragma unroll
                for (int r = 0; r < R; ++r) F::prep_wide(c[u][r]);
#pragma unroll
                for (int s = 0; s < F::KV / 8; ++s) {
                    const int ks = ku + 8 * s;
                    if (ks < K) {
                        float w[R][8];
#pragma unroll
                        for (int r = 0; r < R; ++r) F::deq_wide(c[u][r], s, w[r]);
#pragma unroll
                        for (int b = 0; b < NB; ++b) {
                            if (b < nrows) {
                                float xv[8];
                                load8x(x + b * ldx + ks, xv);
                                if constexpr (F::XS != 1.f) {
#pragma unroll
                                    for (int j = 0; j < 8; ++j) xv[j] *= F::XS;
                                }
#pragma unroll
                                for (int r = 0; r < R; ++r) {
                                    float a = acc[r][b];
#pragma unroll
                                    for (int j = 0; j < 8; ++j) a = fmaf(w[r][j], xv[j], a);
                                    acc[r][b] = a;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

// One block: output rows n = (blockIdx.x * groups + g) * R + r of weight rows wrow0 + n; rows past N
// recompute row N - 1 (uniform control flow) and are never stored.
template <typename F, typename T, int NB, int R>
__device__ __forceinline__ void gemv_block(const u8* p0, const u8* p1, const u8* p2, const T* x, long long ldx,
                                           int nrows, int N, int K, int tpr, long long wrow0, T* y,
                                           long long ldy) {
    __shared__ float red[GEMV_THREADS / 32][R][NB];
    const int groups = GEMV_THREADS / tpr, g = threadIdx.x / tpr, lt = threadIdx.x % tpr;
    const int n0 = (blockIdx.x * groups + g) * R;
    long long wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = wrow0 + min(n0 + r, N - 1);
    float acc[R][NB];
    gemv_lane<F, T, NB, R>(p0, p1, p2, wr, K, x, ldx, nrows, lt, tpr, acc);
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int b = 0; b < NB; ++b)
            if (b < nrows) {
                const float v = warp_sum(acc[r][b]);
                if ((threadIdx.x & 31) == 0) red[warp][r][b] = v;
            }
    __syncthreads();
    const int wpg = tpr / 32;
    for (int i = threadIdx.x; i < groups * R * NB; i += GEMV_THREADS) {
        const int gi = i / (R * NB), r = (i / NB) % R, b = i % NB;
        const int n = (blockIdx.x * groups + gi) * R + r;
        if (b < nrows && n < N) {
            float t = 0.f;
            for (int w = gi * wpg; w < (gi + 1) * wpg; ++w) t += red[w][r][b];
            y[b * ldy + n] = from_f<T>(t * F::row_scale(p1, p2, wrow0 + n));
        }
    }
}

// x: [nrows, K] (row stride ldx), y: [nrows, N] (row stride ldy); weight rows row0 .. row0 + N - 1.
// NB = 1, 2, 4 or GEMV_MAXB (the smallest that holds the launch's rows): smaller instances need fewer registers
// (more warps in flight) and run, for each row, exactly the arithmetic of the NB = 8 instance, so a row alone is
// bitwise the row among 8.
// Grid: ceil(N / (GEMV_THREADS / tpr * GEMV_R)) x ceil(nrows / NB) blocks of GEMV_THREADS; blockIdx.y takes
// activation rows NB * blockIdx.y .. + NB with the same code, so more than 8 rows in one launch give every row
// bitwise its decode result (the exact prefill mode and the fp32 router use this).
template <typename F, typename T, int NB>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2, const T* __restrict__ x,
         T* __restrict__ y, int N, int K, int nrows, long long ldx, long long ldy, long long row0, int tpr) {
    const long long rb = (long long)blockIdx.y * NB;
    gemv_block<F, T, NB, GEMV_R>(p0, p1, p2, x + rb * ldx, ldx, min(NB, nrows - (int)rb), N, K, tpr, row0, y + rb * ldy,
                         ldy);
}

// MoE decode dispatch: slot s = blockIdx.y multiplies activation row xrow[s] by expert ids[s] (rows ids[s]*N ..
// +N of the fused [E*N, K] weight) into y[s, :]. Same per-row order as gemv, so an expert's output for a token
// does not depend on the other slots.
template <typename F, typename T>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_experts(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
                 const T* __restrict__ x, T* __restrict__ y, const int* __restrict__ ids,
                 const int* __restrict__ xrow, int N, int K, long long ldx, long long ldy, int tpr) {
    const int s = blockIdx.y;
    gemv_block<F, T, 1, GEMV_R>(p0, p1, p2, x + (long long)xrow[s] * ldx, ldx, 1, N, K, tpr, (long long)ids[s] * N,
                     y + (long long)s * ldy, ldy);
}
