// MoE router (docs/model-math.md §5): p = softmax_fp32(logits) over all E experts, top-k by probability with ties
// to the lower expert id (a stable sort), weights renormalised over the selected k: w = p_sel / sum(p_sel).
// One warp per token; lane l holds experts l, l + 32, ... (E <= 32 * MAXE). Selection order is best first.
// NaN logits (a NaN probability) rank below every number and are still selectable, so every id written is a real
// expert in [0, E) and the k ids are distinct (K <= E): the expert kernels never index outside the weight. A row
// that had to select a NaN expert gets NaN weights, so the failure shows in the output instead of hiding.
// shared >= 0: the slot list continues after the rows * K routed ids with one id `shared` per row (the MoE shared
// expert stored as expert E of the same weight, ninfer/cuda/fuse.py), so one expert launch runs both.
#include "common.cuh"

template <typename T, int MAXE>
__global__ void moe_route(const T* __restrict__ logits, int* __restrict__ ids, float* __restrict__ weights,
                          int rows, int E, int K, long long ld, int shared) {
    pdl_trigger();
    pdl_wait();  // launched with PDL inside decode graphs (ninfer/cuda/router.py): nothing read before
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float p[MAXE];
    float m = NEG_INF;
#pragma unroll
    for (int e = 0; e < MAXE; ++e) {
        const int x = lane + 32 * e;
        p[e] = x < E ? to_f(logits[row * ld + x]) : NEG_INF;
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
    if (shared >= 0 && lane == 0) ids[(long long)rows * K + row] = shared;
    if (lane < K) {
        ids[row * K + lane] = sel_id;
        weights[row * K + lane] = bad ? __int_as_float(0x7fc00000) : sel_p / sel_sum;
    }
}
