// RMS norms, fp32 math, rounded once on store (docs/model-math.md §2).
//
// rmsnorm: optionally fused with the residual add (resid <- resid + x, in place, fp32), then
//   y = r * rsqrt(mean(r^2) + eps) * (OFFSET ? 1 + w : w)
// One block per row; the sum of squares is a fixed-order block reduction (common.cuh).
//
// gated_rmsnorm (GDN output norm, plain weight): per head of width D,
//   y = (o * rsqrt(mean(o^2) + eps)) * w * silu(z); one warp per (token, head) row.
#include "common.cuh"

template <typename T, bool OFFSET, bool RESID>
__global__ void __launch_bounds__(256)
    rmsnorm(const T* __restrict__ x, float* __restrict__ resid, const float* __restrict__ w, T* __restrict__ y,
            int H, float eps, long long ldx, long long ldr, long long ldy) {
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const T* xr = x + row * ldx;
    float* rr = resid + row * ldr;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v = to_f(xr[i]);
        if (RESID) {
            v += rr[i];
            rr[i] = v;
        }
        ss = fmaf(v, v, ss);
    }
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)H + eps);
    T* yr = y + row * ldy;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float v = RESID ? rr[i] : to_f(xr[i]);
        const float g = OFFSET ? 1.f + w[i] : w[i];
        yr[i] = from_f<T>(v * inv * g);
    }
}

// o, z, y: [rows, D] with row strides ldo, ldz, ldy (rows = tokens * heads, heads contiguous in a token).
template <typename T>
__global__ void __launch_bounds__(256)
    gated_rmsnorm(const T* __restrict__ o, const T* __restrict__ z, const float* __restrict__ w,
                  T* __restrict__ y, int rows, int D, float eps, long long ldo, long long ldz, long long ldy) {
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T* orow = o + row * ldo;
    float ss = 0.f;
    for (int i = lane; i < D; i += 32) {
        const float v = to_f(orow[i]);
        ss = fmaf(v, v, ss);
    }
    const float inv = 1.f / sqrtf(warp_sum(ss) / (float)D + eps);
    const T* zrow = z + row * ldz;
    T* yrow = y + row * ldy;
    for (int i = lane; i < D; i += 32) yrow[i] = from_f<T>(to_f(orow[i]) * inv * w[i] * siluf_(to_f(zrow[i])));
}
