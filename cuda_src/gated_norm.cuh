// The GDN output norm of one row (one token's value head), shared by norm.cu's gated_rmsnorm and gdn_step.cu's
// fused decode epilogue so both give the same bits:
//   y = (o * rsqrt(mean(o^2) + eps)) * w * silu(z)
// One warp per row: lane l sums o_i^2 over i = l, l+32, ... in order, then warp_sum (fixed order). Rows of up to
// 32 * GN_REG elements are read once into registers (o, z and w loads all issued before the reduction); longer
// rows take a second pass over memory in the same order (same result). y may alias o: a lane writes only the
// elements it has read. gdn_step.cu's cluster epilogue (gdn_step_cl) computes the same lane sums from values it
// exchanges through distributed shared memory and finishes them with the two functions below: the same bits.
#pragma once
#include "common.cuh"

constexpr int GN_REG = 8;

// 1 / rms of a row from lane l's sum of o_i^2 over i = l, l+32, ... (in that order): warp_sum, then the mean
__device__ __forceinline__ float gated_norm_inv(float ss, int D, float eps) {
    return 1.f / sqrtf(warp_sum(ss) / (float)D + eps);
}
// one output element: (o * inv) * w * silu(z), left to right
__device__ __forceinline__ float gated_norm_y(float o, float inv, float w, float z) { return o * inv * w * siluf_(z); }

// A row of D <= 32 * GN_REG: lane l's outputs y[r] for elements l + 32 r (r with l + 32 r >= D: unset), as float
// (rounded to T by the caller's store)
template <typename T>
__device__ __forceinline__ void gated_norm_vals(const T* orow, const T* zrow, const float* w, int D, float eps,
                                                int lane, float (&y)[GN_REG]) {
    float ov[GN_REG], zv[GN_REG], wv[GN_REG], ss = 0.f;
#pragma unroll
    for (int r = 0; r < GN_REG; ++r) {
        const int i = lane + 32 * r;
        ov[r] = i < D ? to_f(orow[i]) : 0.f;
        zv[r] = i < D ? to_f(zrow[i]) : 0.f;
        wv[r] = i < D ? w[i] : 0.f;
    }
#pragma unroll
    for (int r = 0; r < GN_REG; ++r) ss = fmaf(ov[r], ov[r], ss);  // zeros past D leave ss unchanged
    const float inv = gated_norm_inv(ss, D, eps);
#pragma unroll
    for (int r = 0; r < GN_REG; ++r) y[r] = gated_norm_y(ov[r], inv, wv[r], zv[r]);
}

template <typename T>
__device__ __forceinline__ void gated_norm_row(const T* orow, const T* zrow, const float* w, T* yrow, int D,
                                               float eps, int lane) {
    if (D <= 32 * GN_REG) {
        float y[GN_REG];
        gated_norm_vals(orow, zrow, w, D, eps, lane, y);
#pragma unroll
        for (int r = 0; r < GN_REG; ++r) {
            const int i = lane + 32 * r;
            if (i < D) yrow[i] = from_f<T>(y[r]);
        }
        return;
    }
    float ss = 0.f;
    for (int i = lane; i < D; i += 32) {
        const float v = to_f(orow[i]);
        ss = fmaf(v, v, ss);
    }
    const float inv = gated_norm_inv(ss, D, eps);
    for (int i = lane; i < D; i += 32) yrow[i] = from_f<T>(gated_norm_y(to_f(orow[i]), inv, w[i], to_f(zrow[i])));
}
