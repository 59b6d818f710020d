// The GDN output norm of one row (one token's value head), shared by norm.cu's gated_rmsnorm and gdn_step.cu's
// fused decode epilogue so both give the same bits:
//   y = (o * rsqrt(mean(o^2) + eps)) * w * silu(z)
// One warp per row: lane l sums o_i^2 over i = l, l+32, ... in order, then warp_sum (fixed order). Rows of up to
// 32 * GN_REG elements are read once into registers (o, z and w loads all issued before the reduction), R = 4 of
// them for rows of up to 128 (the served heads: no work on the 4 registers past D, whose fmaf(0, 0, ss) terms
// left ss unchanged anyway, so the same bits); longer rows take a second pass over memory in the same order (same
// result). y may alias o: a lane writes only the
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

// The R values of lane l for elements l + 32 r of a row (zero at r with l + 32 r >= D)
template <typename T, int R>
__device__ __forceinline__ void gated_norm_load(const T* row, int D, int lane, float (&v)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = lane + 32 * r < D ? to_f(row[lane + 32 * r]) : 0.f;
}

// A row of D <= 32 R from its loaded values (o, z and w as gated_norm_load gives them): y[r] for elements l + 32 r
// (r with l + 32 r >= D: unset), as float (rounded to T by the caller's store); y may be ov
template <int R>
__device__ __forceinline__ void gated_norm_of(const float (&ov)[R], const float (&zv)[R], const float (&wv)[R],
                                              int D, float eps, float (&y)[R]) {
    float ss = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) ss = fmaf(ov[r], ov[r], ss);  // zeros past D leave ss unchanged
    const float inv = gated_norm_inv(ss, D, eps);
#pragma unroll
    for (int r = 0; r < R; ++r) y[r] = gated_norm_y(ov[r], inv, wv[r], zv[r]);
}

template <typename T, int R = GN_REG>
__device__ __forceinline__ void gated_norm_vals(const T* orow, const T* zrow, const float* w, int D, float eps,
                                                int lane, float (&y)[R]) {
    float ov[R], zv[R], wv[R];
    gated_norm_load<T, R>(orow, D, lane, ov);
    gated_norm_load<T, R>(zrow, D, lane, zv);
    gated_norm_load<float, R>(w, D, lane, wv);
    gated_norm_of<R>(ov, zv, wv, D, eps, y);
}

template <typename T, int R>
__device__ __forceinline__ void gated_norm_put(const T* orow, const T* zrow, const float* w, T* yrow, int D,
                                               float eps, int lane) {
    float y[R];
    gated_norm_vals<T, R>(orow, zrow, w, D, eps, lane, y);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = lane + 32 * r;
        if (i < D) yrow[i] = from_f<T>(y[r]);
    }
}

template <typename T>
__device__ __forceinline__ void gated_norm_row(const T* orow, const T* zrow, const float* w, T* yrow, int D,
                                               float eps, int lane) {
    if (D <= 128) {
        gated_norm_put<T, 4>(orow, zrow, w, yrow, D, eps, lane);
        return;
    }
    if (D <= 32 * GN_REG) {
        gated_norm_put<T, GN_REG>(orow, zrow, w, yrow, D, eps, lane);
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
