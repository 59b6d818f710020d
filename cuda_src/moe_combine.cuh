// The routed experts' part of the MoE combine for one thread's 8 consecutive elements, shared by norm.cu's
// moe_combine_rmsnorm (combine8) and gemv.cu's combine tail (gemv_moe.cuh gv_combine_row) so that both add the same
// float operations in the same order: acc[e] = fmaf(w_j, row_j[e], acc[e]) from 0, experts j = 0 .. k - 1 in rank
// order. The rows are requested in batches of MOE_COMBINE_BATCH experts before the batch's first fmaf: a token's
// combine is two L2 round trips (its ids, then its rows), not two per expert (a loop of one row load then its fmafs
// ran the 35B-A3B's 8 experts' loads one after another: 6.9 us of Nsight Compute time per layer at f43b0e6).
#pragma once
// a guard besides #pragma once: the host emulations concatenate gemv.cu and norm.cu, which both bring this header
#ifndef NINFER_MOE_COMBINE_CUH
#define NINFER_MOE_COMBINE_CUH
#include "common.cuh"

constexpr int MOE_COMBINE_BATCH = 8;

// ld(j, d): expert j's 8 values into d; returns its weight.
template <typename Ld> __device__ __forceinline__ void moe_combine_experts(Ld ld, int k, float (&acc)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.f;
    for (int j0 = 0; j0 < k; j0 += MOE_COMBINE_BATCH) {
        float d[MOE_COMBINE_BATCH][8], w[MOE_COMBINE_BATCH];
#pragma unroll
        for (int b = 0; b < MOE_COMBINE_BATCH; ++b)
            if (j0 + b < k) w[b] = ld(j0 + b, d[b]);
#pragma unroll
        for (int b = 0; b < MOE_COMBINE_BATCH; ++b)
            if (j0 + b < k) {
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] = fmaf(w[b], d[b][e], acc[e]);
            }
    }
}
#endif  // NINFER_MOE_COMBINE_CUH
