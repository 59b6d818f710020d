// One MoE router row (docs/model-math.md §5), shared by router.cu's moe_route and gemv.cu's routed expert launch so
// that both select the same experts with the same weights bit for bit: p = softmax_fp32(logits) over all E experts,
// top-K by probability with ties to the lower expert id (a stable sort). One warp per row; lane l holds experts l,
// l + 32, ... (E <= 32 * MAXE). Selection order is best first: lane j < K ends holding choice j (id, probability);
// sum (of the K selected probabilities) and bad are warp-uniform. NaN logits (a NaN probability) rank below every
// number and are still selectable, so every id is a real expert in [0, E) and the K ids are distinct (K <= E); a row
// that had to select a NaN expert gets NaN weights (route_weight), so the failure shows in the output.
#pragma once
#include "common.cuh"

struct RouteSel {
    int id;      // lane j < K: expert of choice j
    float p;     // lane j < K: its probability
    float sum;   // the K selected probabilities' sum (NaN ones count 0)
    bool bad;    // a NaN expert was selected
};

// The renormalised weight of this lane's choice: p / sum, NaN if the row selected a NaN expert.
__device__ __forceinline__ float route_weight(const RouteSel& r) {
    return r.bad ? __int_as_float(0x7fc00000) : r.p / r.sum;
}

template <typename T, int MAXE>
__device__ __forceinline__ RouteSel route_row(const T* __restrict__ lg, int E, int K, int lane) {
    float p[MAXE];
    float m = NEG_INF;
#pragma unroll
    for (int e = 0; e < MAXE; ++e) {
        const int x = lane + 32 * e;
        p[e] = x < E ? to_f(lg[x]) : NEG_INF;
        m = fmaxf(m, p[e]);
    }
    m = warp_max(m);
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < MAXE; ++e) {
        p[e] = lane + 32 * e < E ? expf(p[e] - m) : -4.f;  // -4 marks "not an expert" (never selected)
        s += fmaxf(p[e], 0.f);  // fmaxf drops NaN
    }
    const float inv = 1.f / warp_sum(s);
#pragma unroll
    for (int e = 0; e < MAXE; ++e) {
        if (p[e] >= 0.f) p[e] *= inv;
        else if (p[e] != p[e]) p[e] = -1.f;  // NaN: below any probability, above "taken" and "not an expert"
    }
    float sel_sum = 0.f, sel_p = 0.f;
    int sel_id = 0;
    bool bad = false;
    for (int j = 0; j < K; ++j) {
        float bv = -2.f;  // candidates are > -2: probabilities and untaken NaN experts (one always exists: K <= E)
        int bi = 0x7fffffff;
#pragma unroll
        for (int e = 0; e < MAXE; ++e)
            if (p[e] > bv) bv = p[e], bi = lane + 32 * e;  // ascending ids: strict > keeps the lower id
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
#pragma unroll
        for (int e = 0; e < MAXE; ++e)
            if (lane + 32 * e == bi) p[e] = -3.f;  // taken
        bad |= bv < 0.f;  // warp-uniform: bv is the butterfly's common result
        sel_sum += fmaxf(bv, 0.f);
        if (lane == j) sel_p = bv, sel_id = bi;
    }
    return RouteSel{sel_id, sel_p, sel_sum, bad};
}
