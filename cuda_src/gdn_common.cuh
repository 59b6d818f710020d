// Per-token pieces of the Gated DeltaNet mixer shared by every kernel that computes them (gdn.cu's causal_conv
// and gdn_chunked, gdn_step.cu's exact recurrence): one definition, so the fused decode kernel and the separate
// kernels do the same arithmetic in the same order and agree bitwise.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float softplus_(float x) { return x > 20.f ? x : log1pf(expf(x)); }

template <typename S> __device__ __forceinline__ float st_load(const S* p) { return to_f(*p); }
template <typename S> __device__ __forceinline__ void st_store(S* p, float v) { *p = from_f<S>(v); }

constexpr int GDN_KW = 4;  // conv taps of the models' GDN conv1d (the wrappers check w[C, 4])

// One token of the depthwise causal conv of one channel: silu(sum_j wc[j] * [win..., xt]_j), taps in order (tap
// KW-1 is the current token), then the window slides to hold the last KW-1 raw inputs (oldest first).
template <int KW>
__device__ __forceinline__ float conv_token(float (&win)[KW - 1], const float (&wc)[KW], float xt) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < KW - 1; ++j) acc = fmaf(wc[j], win[j], acc);
    acc = fmaf(wc[KW - 1], xt, acc);
#pragma unroll
    for (int j = 0; j < KW - 2; ++j) win[j] = win[j + 1];
    win[KW - 2] = xt;
    return siluf_(acc);
}

// Raw conv input u of the sequence starting at row s (channel c of rows x, row stride ldx): x's row for u >= s,
// else the carried state st[0 .. KW-2] of the channel (oldest first). Rows may be relative (u, s < 0 with x
// pointing past the sequence's first row): only rows >= s are read from x. gdn.cu's causal_conv and
// gdn_prep_tc.cuh's fused conv read their windows and new states through it.
template <typename T, int KW>
__device__ __forceinline__ float conv_raw(const T* x, long long ldx, int c, const float* st, int s, int u) {
    return u >= s ? to_f(x[(long long)u * ldx + c]) : st[KW - 1 + u - s];
}

// Gates of one (token, value head): beta = sigmoid(b); decay = e^g with g = -exp(A_log) softplus(a + dt_bias)
// (negA = -exp(A_log) computed once per head).
__device__ __forceinline__ void gdn_gate(float a, float b, float negA, float dtb, float& beta, float& decay) {
    beta = sigmoidf_(b);
    decay = expf(negA * softplus_(a + dtb));
}
