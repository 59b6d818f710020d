// Prefill matrix products on tensor cores: y[m, n] = sum_k x[m, k] * W[n, k], x in float or bf16, W in any
// stored format (wformat.cuh), mma.sync m16n8k16 bf16 x bf16 -> fp32.
//
// Operands are exact, not rounded (measured: rounding both operands to bf16 moved the tiny parity checkpoint's
// logits by 0.37-0.54 relative and cost the mid-size MoE 8% top-1 agreement):
//  * W: each format's load8v values are exact in bf16 (codes, e2m1 x e4m3, bf16); the format's scale multiplies
//    the fp32 sums: per 32-wide K tile for group formats (F::SGROUP = 32/64), once per row after the K loop else.
//  * x: bf16 activations are exact; float activations are split x = hi + lo (hi = bf16(x), lo = bf16(x - hi),
//    |x - hi - lo| <= 2^-17 |x|) and both halves are multiplied (two mma per fragment).
// K tiles are visited in order, so each output has a fixed reduction order that depends only on K (not on M or on
// the tile a row falls in).
//
// Tile 128x128x32, 8 warps in a 2 (M) x 4 (N) grid, each warp 64x32 = 4 (m16) x 4 (n8) fragments. Rows padded by 8
// bf16 (16 bytes) so the 32-bit fragment loads of a warp fall in distinct banks. The next K tile's global loads are
// issued into registers before the current tile's MMAs (register prefetch), so their latency overlaps the math.
// The per-output order (K tiles ascending; per 16-wide step hi then lo) is the 64x64 kernel's: same bits.
#include "common.cuh"
#include "wformat.cuh"

#define GM_BM 128
#define GM_BN 128
#define GM_BK 32
#define GM_LD (GM_BK + 8)
#define GM_THREADS 256
#define GM_MI 4                                       // m16 fragments per warp (64 rows)
#define GM_NJ 4                                       // n8 fragments per warp (32 columns)
#define GM_CHUNKS ((GM_BM * GM_BK / 8) / GM_THREADS)  // 8-wide chunks per thread per operand and K tile

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    return (u32)f_to_bf16_bits(lo) | ((u32)f_to_bf16_bits(hi) << 16);
}

__device__ __forceinline__ void mma_bf16_16816(float c[4], const u32 a[4], const u32 b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <typename T> struct SplitX {
    static constexpr bool value = false;  // bf16 activations: exact in one bf16 operand
};
template <> struct SplitX<float> {
    static constexpr bool value = true;
};
#define GM_LO_ROWS(T) (SplitX<T>::value ? GM_BM : 1)

// Global -> registers: this thread's chunks of the 128x32 tiles of x and of W (weight rows wbase + n, exact bf16
// values), and for group formats the scale of column threadIdx.x; out-of-range rows and columns read as 0.
template <typename F, typename T>
__device__ __forceinline__ void gemm_fetch(const u8* p0, const u8* p1, const u8* p2, const T* x, long long ldx,
                                           int M, int N, int K, int m0, int n0, int k0, long long wbase,
                                           float xr[GM_CHUNKS][8], float wr[GM_CHUNKS][8], float& sr) {
#pragma unroll
    for (int i = 0; i < GM_CHUNKS; ++i) {
        const int c = threadIdx.x + i * GM_THREADS;
        const int r = c / (GM_BK / 8), kk = (c % (GM_BK / 8)) * 8;
        if (m0 + r < M && k0 + kk < K) {
            load8x(x + (long long)(m0 + r) * ldx + k0 + kk, xr[i]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) xr[i][j] = 0.f;
        }
        if (n0 + r < N && k0 + kk < K) {
            F::load8v(p0, p1, p2, K, wbase + n0 + r, k0 + kk, wr[i]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) wr[i][j] = 0.f;
        }
    }
    if (F::SGROUP && threadIdx.x < GM_BN)
        sr = n0 + (int)threadIdx.x < N ? F::scale(p0, p1, p2, K, wbase + n0 + threadIdx.x, k0) : 0.f;
}

// Registers -> shared memory: x as bf16 hi (and lo = bf16(x - hi) for float x), W as bf16, the column scales.
template <typename T>
__device__ __forceinline__ void gemm_put(const float xr[GM_CHUNKS][8], const float wr[GM_CHUNKS][8], float sr,
                                         bool sgroup, u16 (*As)[GM_LD], u16 (*Al)[GM_LD], u16 (*Bs)[GM_LD],
                                         float* Ss) {
#pragma unroll
    for (int i = 0; i < GM_CHUNKS; ++i) {
        const int c = threadIdx.x + i * GM_THREADS;
        const int r = c / (GM_BK / 8), kk = (c % (GM_BK / 8)) * 8;
        u32* dst = reinterpret_cast<u32*>(&As[r][kk]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u16 h0 = f_to_bf16_bits(xr[i][2 * j]), h1 = f_to_bf16_bits(xr[i][2 * j + 1]);
            dst[j] = (u32)h0 | ((u32)h1 << 16);
            if (SplitX<T>::value) {
                reinterpret_cast<u32*>(&Al[r][kk])[j] =
                    pack_bf16x2(xr[i][2 * j] - bf16_bits_to_f(h0), xr[i][2 * j + 1] - bf16_bits_to_f(h1));
            }
        }
        dst = reinterpret_cast<u32*>(&Bs[r][kk]);
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[j] = pack_bf16x2(wr[i][2 * j], wr[i][2 * j + 1]);
    }
    if (sgroup && threadIdx.x < GM_BN) Ss[threadIdx.x] = sr;
}

// acc[i][j] += A-fragments(i) x B-fragments(j) over the 32-wide K tile in shared memory (hi, then lo for float x).
template <bool SPLIT>
__device__ __forceinline__ void gemm_tile(const u16 (*As)[GM_LD], const u16 (*Al)[GM_LD], const u16 (*Bs)[GM_LD],
                                          int wm, int wn, int g, int t, float acc[GM_MI][GM_NJ][4]) {
#pragma unroll
    for (int ks = 0; ks < GM_BK; ks += 16) {
        u32 a[GM_MI][4], b[GM_NJ][2];
#pragma unroll
        for (int j = 0; j < GM_NJ; ++j) {
            const int c = wn + j * 8 + g;
            b[j][0] = *reinterpret_cast<const u32*>(&Bs[c][ks + 2 * t]);
            b[j][1] = *reinterpret_cast<const u32*>(&Bs[c][ks + 2 * t + 8]);
        }
#pragma unroll
        for (int h = 0; h < (SPLIT ? 2 : 1); ++h) {
            const u16 (*A)[GM_LD] = h == 0 ? As : Al;
#pragma unroll
            for (int i = 0; i < GM_MI; ++i) {
                const int r = wm + i * 16 + g;
                a[i][0] = *reinterpret_cast<const u32*>(&A[r][ks + 2 * t]);
                a[i][1] = *reinterpret_cast<const u32*>(&A[r + 8][ks + 2 * t]);
                a[i][2] = *reinterpret_cast<const u32*>(&A[r][ks + 2 * t + 8]);
                a[i][3] = *reinterpret_cast<const u32*>(&A[r + 8][ks + 2 * t + 8]);
            }
#pragma unroll
            for (int i = 0; i < GM_MI; ++i)
#pragma unroll
                for (int j = 0; j < GM_NJ; ++j) mma_bf16_16816(acc[i][j], a[i], b[j]);
        }
    }
}

__device__ __forceinline__ void zero_frags(float f[GM_MI][GM_NJ][4]) {
#pragma unroll
    for (int i = 0; i < GM_MI; ++i)
#pragma unroll
        for (int j = 0; j < GM_NJ; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) f[i][j][r] = 0.f;
}

// One 128x128 output tile: y[m, n] for m in [m0, m0 + 128) ∩ [0, M), n in [n0, n0 + 128) ∩ [0, N), weight rows
// wbase + n. Fragment element r of acc[i][j] is row wm + 16i + g + 8(r >> 1), column wn + 8j + 2t + (r & 1).
template <typename F, typename T>
__device__ __forceinline__ void gemm_block(const u8* p0, const u8* p1, const u8* p2, const T* x, T* y, int M,
                                           int N, int K, long long ldx, long long ldy, int m0, int n0,
                                           long long wbase) {
    static_assert(F::SGROUP % GM_BK == 0, "a K tile must not straddle a scale group");
    constexpr bool SPLIT = SplitX<T>::value;
    __shared__ __align__(16) u16 As[GM_BM][GM_LD];
    __shared__ __align__(16) u16 Al[GM_LO_ROWS(T)][GM_LD];
    __shared__ __align__(16) u16 Bs[GM_BN][GM_LD];
    __shared__ float Ss[GM_BN];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    float acc[GM_MI][GM_NJ][4];
    zero_frags(acc);
    float xr[GM_CHUNKS][8], wr[GM_CHUNKS][8], sr = 0.f;
    gemm_fetch<F, T>(p0, p1, p2, x, ldx, M, N, K, m0, n0, 0, wbase, xr, wr, sr);

    for (int k0 = 0; k0 < K; k0 += GM_BK) {
        gemm_put<T>(xr, wr, sr, F::SGROUP != 0, As, Al, Bs, Ss);
        __syncthreads();
        if (k0 + GM_BK < K) gemm_fetch<F, T>(p0, p1, p2, x, ldx, M, N, K, m0, n0, k0 + GM_BK, wbase, xr, wr, sr);
        if (F::SGROUP) {  // this tile's sums, then scaled per column into acc (fixed order)
            float part[GM_MI][GM_NJ][4];
            zero_frags(part);
            gemm_tile<SPLIT>(As, Al, Bs, wm, wn, g, t, part);
#pragma unroll
            for (int i = 0; i < GM_MI; ++i)
#pragma unroll
                for (int j = 0; j < GM_NJ; ++j)
#pragma unroll
                    for (int r = 0; r < 4; ++r)
                        acc[i][j][r] = fmaf(Ss[wn + j * 8 + 2 * t + (r & 1)], part[i][j][r], acc[i][j][r]);
        } else {
            gemm_tile<SPLIT>(As, Al, Bs, wm, wn, g, t, acc);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < GM_NJ; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int n = n0 + wn + j * 8 + 2 * t + c;
            if (n >= N) continue;
            const float s = F::SGROUP ? 1.f : F::scale(p0, p1, p2, K, wbase + n, 0);
#pragma unroll
            for (int i = 0; i < GM_MI; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int m = m0 + wm + i * 16 + g + 8 * h;
                    if (m < M) y[(long long)m * ldy + n] = from_f<T>(acc[i][j][2 * h + c] * s);
                }
        }
}

// x: [M, K] (row stride ldx), y: [M, N] (row stride ldy). K % 8 == 0 (checked by the wrapper).
template <typename F, typename T>
__global__ void __launch_bounds__(GM_THREADS, 1)
    gemm(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2, const T* __restrict__ x,
         T* __restrict__ y, int M, int N, int K, long long ldx, long long ldy) {
    gemm_block<F, T>(p0, p1, p2, x, y, M, N, K, ldx, ldy, blockIdx.y * GM_BM, blockIdx.x * GM_BN, 0);
}

// MoE prefill (grouped): x rows are expert slots sorted by expert, expert e owning rows [off[e], off[e + 1]);
// y[s] = x[s] · W_e[ids of s]ᵀ with W the fused [E*N, K] expert weight. Tile i (blockIdx.y) covers rows
// tile_s0[i] .. min(tile_s0[i] + 128, off[tile_e[i] + 1]); tiles at or beyond *ntiles exit (the grid is sized by
// an upper bound, so no host sync is needed). Same per-output reduction order as gemm.
template <typename F, typename T>
__global__ void __launch_bounds__(GM_THREADS, 1)
    gemm_experts(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
                 const T* __restrict__ x, T* __restrict__ y, const int* __restrict__ off,
                 const int* __restrict__ tile_e, const int* __restrict__ tile_s0, const int* __restrict__ ntiles,
                 int N, int K, long long ldx, long long ldy) {
    const int i = blockIdx.y;
    if (i >= *ntiles) return;
    const int e = tile_e[i], s0 = tile_s0[i], rows = min(GM_BM, off[e + 1] - s0);
    gemm_block<F, T>(p0, p1, p2, x + (long long)s0 * ldx, y + (long long)s0 * ldy, rows, N, K, ldx, ldy, 0,
                     blockIdx.x * GM_BN, (long long)e * N);
}
