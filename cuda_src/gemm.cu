// Prefill matrix products on tensor cores: y[m, n] = sum_k x[m, k] * W[n, k], x in float or bf16, W in any
// stored format (wformat.cuh). Both tiles are rounded to bf16 in shared memory (the weights dequantized on the
// way in) and multiplied with mma.sync m16n8k16 bf16 -> fp32. K tiles are visited in order, so each output has a
// fixed reduction order that depends only on K (not on M or on the tile a row falls in).
//
// Tile 64x64x32, 4 warps in a 2x2 grid, each warp 32x32 = 2 (m16) x 4 (n8) fragments. Rows padded by 8 bf16
// (16 bytes) so the 32-bit fragment loads of a warp fall in distinct banks. Single-buffered: correctness first;
// the performance issue replaces this with wgmma/TMA pipelines.
#include "common.cuh"
#include "wformat.cuh"

#define GM_BM 64
#define GM_BN 64
#define GM_BK 32
#define GM_LD (GM_BK + 8)

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

// Stage one 64x32 tile of x and of W (dequantized) into shared memory as bf16; out-of-range rows read as 0.
template <typename F, typename T>
__device__ __forceinline__ void gemm_stage(const u8* p0, const u8* p1, const u8* p2, const T* x, long long ldx,
                                           int M, int N, int K, int m0, int n0, int k0, u16 (*As)[GM_LD],
                                           u16 (*Bs)[GM_LD]) {
    for (int c = threadIdx.x; c < GM_BM * GM_BK / 8; c += blockDim.x) {
        const int r = c / (GM_BK / 8), kk = (c % (GM_BK / 8)) * 8;
        float v[8];
        if (m0 + r < M && k0 + kk < K) {
            load8x(x + (long long)(m0 + r) * ldx + k0 + kk, v);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = 0.f;
        }
        u32* dst = reinterpret_cast<u32*>(&As[r][kk]);
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[j] = pack_bf16x2(v[2 * j], v[2 * j + 1]);
        if (n0 + r < N && k0 + kk < K) {
            F::load8(p0, p1, p2, K, n0 + r, k0 + kk, v);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = 0.f;
        }
        dst = reinterpret_cast<u32*>(&Bs[r][kk]);
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[j] = pack_bf16x2(v[2 * j], v[2 * j + 1]);
    }
}

// x: [M, K] (row stride ldx), y: [M, N] (row stride ldy). K % 8 == 0 (checked by the wrapper).
template <typename F, typename T>
__global__ void __launch_bounds__(128)
    gemm(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2, const T* __restrict__ x,
         T* __restrict__ y, int M, int N, int K, long long ldx, long long ldy) {
    __shared__ __align__(16) u16 As[GM_BM][GM_LD];
    __shared__ __align__(16) u16 Bs[GM_BN][GM_LD];
    const int m0 = blockIdx.y * GM_BM, n0 = blockIdx.x * GM_BN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

    for (int k0 = 0; k0 < K; k0 += GM_BK) {
        gemm_stage<F, T>(p0, p1, p2, x, ldx, M, N, K, m0, n0, k0, As, Bs);
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < GM_BK; ks += 16) {
            u32 a[2][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = wm + i * 16 + g;
                a[i][0] = *reinterpret_cast<const u32*>(&As[r][ks + 2 * t]);
                a[i][1] = *reinterpret_cast<const u32*>(&As[r + 8][ks + 2 * t]);
                a[i][2] = *reinterpret_cast<const u32*>(&As[r][ks + 2 * t + 8]);
                a[i][3] = *reinterpret_cast<const u32*>(&As[r + 8][ks + 2 * t + 8]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int c = wn + j * 8 + g;
                b[j][0] = *reinterpret_cast<const u32*>(&Bs[c][ks + 2 * t]);
                b[j][1] = *reinterpret_cast<const u32*>(&Bs[c][ks + 2 * t + 8]);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_bf16_16816(acc[i][j], a[i], b[j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = m0 + wm + i * 16 + g + 8 * h;
                const int n = n0 + wn + j * 8 + 2 * t;
                if (m < M) {
                    if (n < N) y[(long long)m * ldy + n] = from_f<T>(acc[i][j][2 * h]);
                    if (n + 1 < N) y[(long long)m * ldy + n + 1] = from_f<T>(acc[i][j][2 * h + 1]);
                }
            }
}
