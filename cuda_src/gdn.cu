// Gated DeltaNet: causal depthwise conv with carried state, and the delta-rule recurrence over one or many
// tokens (model-qwen3.6.md §4). Sequences are packed: tokens starts[b] .. starts[b+1]-1 of the activation
// rows belong to sequence b, whose state lives in pool slot slots[b].
#include "common.cuh"

// y[t, c] = silu(sum_{j<KW} w[c, j] * x_{t-KW+1+j}[c]); history before the first token comes from
// state[slot, c, 0..KW-2] (oldest first, raw pre-conv inputs) and is updated to the last KW-1 raw inputs.
// One thread per channel; tokens of a sequence in order.
template <typename T, int KW>
__global__ void causal_conv(const T* __restrict__ x, const float* __restrict__ w, float* __restrict__ state,
                            T* __restrict__ y, const int* __restrict__ starts, const int* __restrict__ slots, int C,
                            long long ldx, long long ldy) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (c >= C) return;
    float* st = state + ((long long)slots[b] * C + c) * (KW - 1);
    float win[KW - 1], wc[KW];
#pragma unroll
    for (int j = 0; j < KW - 1; ++j) win[j] = st[j];
#pragma unroll
    for (int j = 0; j < KW; ++j) wc[j] = w[c * KW + j];
    for (int t = starts[b]; t < starts[b + 1]; ++t) {
        const float xt = to_f(x[t * ldx + c]);
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < KW - 1; ++j) acc = fmaf(wc[j], win[j], acc);
        acc = fmaf(wc[KW - 1], xt, acc);
#pragma unroll
        for (int j = 0; j < KW - 2; ++j) win[j] = win[j + 1];
        win[KW - 2] = xt;
        y[t * ldy + c] = from_f<T>(siluf_(acc));
    }
#pragma unroll
    for (int j = 0; j < KW - 1; ++j) st[j] = win[j];
}

__device__ __forceinline__ float softplus_(float x) { return x > 20.f ? x : log1pf(expf(x)); }

template <typename S> __device__ __forceinline__ float st_load(const S* p) { return to_f(*p); }
template <typename S> __device__ __forceinline__ void st_store(S* p, float v) { *p = from_f<S>(v); }

// Delta rule per value head j (QK head j / ratio), state S[DK, DV] fp32 in registers (stored as S-type):
//   q, k <- l2norm (eps 1e-6), q /= sqrt(DK); beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)
//   S <- e^g S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
// One warp per state column (value dim), lane l holds rows l, l+32, ... ; all reductions are fixed-order
// warp butterflies. The multi-token loop is the exact recurrence (chunked WY form: performance issue).
// qkv: conv output rows [q (HK*DK) | k (HK*DK) | v (HV*DV)]; a, b: [T, HV]; o: [T, HV*DV].
template <typename T, typename S, int DK>
__global__ void __launch_bounds__(128)
    gdn_recurrent(const T* __restrict__ qkv, const T* __restrict__ a, const T* __restrict__ bb,
                  const float* __restrict__ A_log, const float* __restrict__ dt_bias, S* __restrict__ state,
                  T* __restrict__ o, const int* __restrict__ starts, const int* __restrict__ slots, int HK, int HV,
                  int DV, long long ldqkv, long long lda, long long ldb, long long ldo) {
    constexpr int R = (DK + 31) / 32;
    const int lane = threadIdx.x & 31;
    const int col = blockIdx.z * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int j = blockIdx.y, b = blockIdx.x, hk = j / (HV / HK);
    if (col >= DV) return;
    S* st = state + (((long long)slots[b] * HV + j) * DK) * DV + col;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = lane + 32 * r;
        s[r] = (i < DK) ? st_load(st + (long long)i * DV) : 0.f;
    }
    const float negA = -expf(A_log[j]), dtb = dt_bias[j], qscale = 1.f / sqrtf((float)DK);
    const long long qoff = (long long)hk * DK, koff = (long long)HK * DK + hk * DK;
    const long long voff = 2LL * HK * DK + (long long)j * DV + col;
    for (int t = starts[b]; t < starts[b + 1]; ++t) {
        const T* row = qkv + t * ldqkv;
        float q[R], k[R], qq = 0.f, kk = 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int i = lane + 32 * r;
            q[r] = (i < DK) ? to_f(row[qoff + i]) : 0.f;
            k[r] = (i < DK) ? to_f(row[koff + i]) : 0.f;
            qq = fmaf(q[r], q[r], qq);
            kk = fmaf(k[r], k[r], kk);
        }
        const float qn = qscale / sqrtf(warp_sum(qq) + 1e-6f), kn = 1.f / sqrtf(warp_sum(kk) + 1e-6f);
        const float beta = sigmoidf_(to_f(bb[t * ldb + j]));
        const float decay = expf(negA * softplus_(to_f(a[t * lda + j]) + dtb));
        float kv = 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            k[r] *= kn;
            q[r] *= qn;
            s[r] *= decay;
            kv = fmaf(s[r], k[r], kv);
        }
        const float delta = beta * (to_f(row[voff]) - warp_sum(kv));
        float out = 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            s[r] = fmaf(k[r], delta, s[r]);
            out = fmaf(s[r], q[r], out);
        }
        out = warp_sum(out);
        if (lane == 0) o[t * ldo + (long long)j * DV + col] = from_f<T>(out);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = lane + 32 * r;
        if (i < DK) st_store(st + (long long)i * DV, s[r]);
    }
}
