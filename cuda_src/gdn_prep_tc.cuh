// gdn_chunk_prep with the solve on tensor cores (gdn_chunked(variant="tc")): the same pass, arguments and scratch
// as gdn_chunk_prep (gdn_chunk.cu; results within fp32 noise of it), one block of 8 warps per (chunk of any
// sequence, key head). Included by gdn_chunk.cu (GC_CHUNK, GdnPrepSmem, gc_products_acc).
//
// gdn_chunk_prep solves (I + L) [U | W] = R, R = [diag(β) V | diag(β) K e^γ], with one thread per column of R: a
// 64-step chain per column and 64 registers per thread, so one block of 8 warps per SM, latency-bound (Nsight
// Compute, 27B heads, 4096 rows: 0.21 instructions issued per cycle and scheduler, 12.5% occupancy). Here:
//   1. T = (I + L)⁻¹ by 16 x 16 blocks (fp32 FMAs): the four diagonal blocks by forward substitution (a thread
//      per column, 15 steps), then the blocks below by their distance d = 1, 2, 3 to the diagonal,
//      T_ij = −T_ii Σ_{k=j}^{i−1} L_ik T_kj (a thread per element, sums in order of k, then of the 16 inner
//      indices);
//   2. [U | W] = T R as 3xTF32 mma.sync (tf32_frag.cuh): warp w takes the 8-column tiles w, w + 8, ... of R (U's
//      columns, then W's), all four 16-row tiles of T and only T's blocks on or below the diagonal; R's entries
//      go from global memory (V) or shared memory (K) straight into B fragments.
// The products K Kᵀ, Q Kᵀ stay in registers (gc_products_acc) and L, A come from them per value head, so shared
// memory holds K, Q (whose space L and the block products reuse once the products are done) and T: 2 blocks per
// SM (__launch_bounds__(256, 2)). γ, β, A and the normed q, k are bitwise gdn_chunk_prep's (the same expressions
// in the same order); U and W differ from its forward substitution by fp32 rounding.
#pragma once
#include "tf32_frag.cuh"

template <int DK> struct GdnPrepTcSmem {
    static constexpr int KST = GdnPrepSmem<DK>::KST;  // q, k rows
    static constexpr int MST = GdnPrepSmem<DK>::MST;  // L and T rows (float4-aligned for the A fragments)
    static constexpr int LM = GC_CHUNK * MST + 3 * 256;  // L, then the block products M (up to three 16 x 16)
    static constexpr int QR = GC_CHUNK * KST > LM ? GC_CHUNK * KST : LM;  // Q's region, reused for L and M
    static constexpr int FLOATS = GC_CHUNK * KST + QR + GC_CHUNK * MST + 3 * GC_CHUNK;  // + γ, β, e^γ
};

// T = (I + L)⁻¹ into Tm from the strictly lower L in Lm (rows past the chunk are zero, so T is the identity
// there); Mb: 3 x 256 floats of scratch. Only the blocks on and below T's block diagonal are written (the diagonal
// blocks whole, zeros above their diagonal). Ends with a block barrier.
template <int DK>
__device__ __forceinline__ void gpt_inverse(const float* Lm, float* Tm, float* Mb, int tid) {
    constexpr int MST = GdnPrepTcSmem<DK>::MST;
    if (tid < 64) {  // diagonal block b, column c: x_c = 1, x_r = −Σ_{q=c}^{r−1} L_rq x_q (q in order)
        const int b = tid >> 4, c = tid & 15;
        const float* lb = Lm + 16 * b * MST + 16 * b;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float s = 0.f;
#pragma unroll
            for (int q = 0; q < r; ++q)
                if (q >= c) s = fmaf(lb[r * MST + q], x[q], s);
            x[r] = r < c ? 0.f : r == c ? 1.f : -s;
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) Tm[(16 * b + r) * MST + 16 * b + c] = x[r];
    }
    __syncthreads();
#pragma unroll 1
    for (int d = 1; d < 4; ++d) {
        const int nb = 4 - d;  // blocks (j + d, j), j < nb
        for (int e = tid; e < nb * 256; e += 256) {  // M = Σ_{k=j}^{i−1} L_ik T_kj
            const int j = e >> 8, i = j + d, r = (e >> 4) & 15, c = e & 15;
            float s = 0.f;
            for (int k = j; k < i; ++k) {
                const float* lr = Lm + (16 * i + r) * MST + 16 * k;
                const float* tc = Tm + 16 * k * MST + 16 * j + c;
#pragma unroll
                for (int q = 0; q < 16; ++q) s = fmaf(lr[q], tc[q * MST], s);
            }
            Mb[e] = s;
        }
        __syncthreads();
        for (int e = tid; e < nb * 256; e += 256) {  // T_ij = −T_ii M
            const int j = e >> 8, i = j + d, r = (e >> 4) & 15, c = e & 15;
            const float* tr = Tm + (16 * i + r) * MST + 16 * i;
            const float* m = Mb + (e & ~255) + c;
            float s = 0.f;
#pragma unroll
            for (int q = 0; q < 16; ++q) s = fmaf(tr[q], m[16 * q], s);
            Tm[(16 * i + r) * MST + 16 * j + c] = -s;
        }
        __syncthreads();
    }
}

// [U | W] = T R for value head j (columns col < DV: U, from β v; the others W, from β k e^γ), written to the
// scratch rows of the chunk's n tokens. Warp-uniform loops (every lane takes part in every mma).
template <typename T, int DK>
__device__ __forceinline__ void gpt_apply(const float* Tm, const float* Ks, const float* beta, const float* eg,
                                          const T* qkv, long long ldqkv, long long voff, float* u_out, float* w_out,
                                          long long ldu, long long ldw, int DV, int n, int warp, int lane) {
    using S = GdnPrepTcSmem<DK>;
    const int g = lane >> 2, t = lane & 3, ntiles = (DV + DK + 7) / 8;
    for (int nt = warp; nt < ntiles; nt += 8) {
        const int col = 8 * nt + g;  // this lane's B column
        float acc[4][4] = {};
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {  // k-block kb of every row tile at or below it (each tile's sum in order)
            float bh[4], bl[4];           // rows 16kb + 4t + u of R, split
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int i = 16 * kb + 4 * t + u;
                float v = 0.f;
                if (i < n && col < DV + DK)
                    v = col < DV ? to_f(qkv[i * ldqkv + voff + col]) * beta[i]
                                 : Ks[i * S::KST + col - DV] * beta[i] * eg[i];
                tf32_split(v, bh[u], bl[u]);
            }
#pragma unroll
            for (int mt = kb; mt < 4; ++mt) {
                const float4 a0 = *reinterpret_cast<const float4*>(Tm + (16 * mt + g) * S::MST + 16 * kb + 4 * t);
                const float4 a1 = *reinterpret_cast<const float4*>(Tm + (16 * mt + g + 8) * S::MST + 16 * kb + 4 * t);
                const Tf32A as[2] = {tf32_a(a0.x, a1.x, a0.y, a1.y), tf32_a(a0.z, a1.z, a0.w, a1.w)};
#pragma unroll
                for (int s = 0; s < 2; ++s) tf32_mma3(acc[mt], as[s], bh[2 * s], bh[2 * s + 1], bl[2 * s], bl[2 * s + 1]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = 16 * mt + g + 8 * (e >> 1), c = 8 * nt + 2 * t + (e & 1);
                if (i < n && c < DV + DK) {
                    if (c < DV) u_out[i * ldu + c] = acc[mt][e];
                    else w_out[i * ldw + c - DV] = acc[mt][e];
                }
            }
    }
}

template <typename T, int DK>
__global__ void __launch_bounds__(256, 2)
    gdn_chunk_prep_tc(const T* __restrict__ qkv, const T* __restrict__ a, const T* __restrict__ bb,
                      const float* __restrict__ A_log, const float* __restrict__ dt_bias, float* __restrict__ qk_s,
                      float* __restrict__ w_s, float* __restrict__ a_s, float* __restrict__ u_s,
                      float* __restrict__ g_s, const int* __restrict__ starts, int nseq, int HK, int HV, int DV,
                      long long ldqkv, long long lda, long long ldb) {
    pdl_trigger();
    constexpr int C = GC_CHUNK, NT = 256, R32 = (DK + 31) / 32, PER = C * DK / NT;
    using S = GdnPrepTcSmem<DK>;
    constexpr int KST = S::KST, MST = S::MST;
    static_assert(DK % 16 == 0 && (C * DK) % NT == 0, "tile shapes");
    extern __shared__ float smem[];  // dynamic: starts 16-byte aligned (no static shared memory)
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < S::FLOATS * sizeof(float)) __trap();
    }
    int x = blockIdx.x, t0 = -1, n = 0;  // as gdn_chunk_prep: the chunks of sequence 0, then 1, ...
    for (int b = 0; b < nseq; ++b) {
        const int s0 = starts[b], len = starts[b + 1] - s0, nc = (len + C - 1) / C;
        if (x < nc) {
            t0 = s0 + x * C;
            n = min(C, len - x * C);
            break;
        }
        x -= nc;
    }
    if (t0 < 0) return;
    float *Ks = smem, *Qs = Ks + C * KST, *Lm = Qs, *Mb = Lm + C * MST, *Tm = Qs + S::QR;
    float *gam = Tm + C * MST, *beta = gam + C, *eg = beta + C;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hk = blockIdx.y, ratio = HV / HK;
    const float qscale = 1.f / sqrtf((float)DK);
    const long long qoff = (long long)hk * DK, koff = (long long)HK * DK + hk * DK;
#pragma unroll 8
    for (int it = 0; it < PER; ++it) {  // 16 loads in flight per thread; rows past the chunk are zero
        const int e = tid + it * NT, i = e / DK, d = e % DK;
        float qv = 0.f, kv = 0.f;
        if (i < n) {
            const T* row = qkv + (long long)(t0 + i) * ldqkv;
            qv = to_f(row[qoff + d]);
            kv = to_f(row[koff + d]);
        }
        Qs[i * KST + d] = qv;
        Ks[i * KST + d] = kv;
    }
    __syncthreads();
    for (int i = warp; i < n; i += NT / 32) {  // l2norm: gdn_chunk_prep's lane order and scales
        float qq = 0.f, kk = 0.f;
#pragma unroll
        for (int r = 0; r < R32; ++r) {
            const int d = lane + 32 * r;
            const float qv = d < DK ? Qs[i * KST + d] : 0.f, kv = d < DK ? Ks[i * KST + d] : 0.f;
            qq = fmaf(qv, qv, qq);
            kk = fmaf(kv, kv, kk);
        }
        const float qn = qscale / sqrtf(warp_sum(qq) + 1e-6f), kn = 1.f / sqrtf(warp_sum(kk) + 1e-6f);
#pragma unroll
        for (int r = 0; r < R32; ++r) {
            const int d = lane + 32 * r;
            if (d < DK) {
                Qs[i * KST + d] *= qn;
                Ks[i * KST + d] *= kn;
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < PER; ++it) {  // the key head's normed rows for the state pass
        const int e = tid + it * NT, i = e / DK, d = e % DK;
        if (i < n) {
            float* row = qk_s + ((long long)(t0 + i) * HK + hk) * 2 * DK;
            row[d] = Qs[i * KST + d];
            row[DK + d] = Ks[i * KST + d];
        }
    }
    float kk[4][4], qk[4][4];  // this warp's tiles of K Kᵀ and Q Kᵀ, for every value head of the group
    gc_products_acc<DK>(Ks, Qs, kk, qk, warp, lane);
    const int g = lane >> 2, tq = lane & 3, r0 = 16 * (warp >> 1) + g, n0 = 32 * (warp & 1);
    for (int j = hk * ratio; j < (hk + 1) * ratio; ++j) {
        __syncthreads();  // Q read by the products (first head); the previous head done with L, T, β, γ
        if (tid < n) {
            const long long t = t0 + tid;
            beta[tid] = sigmoidf_(to_f(bb[t * ldb + j]));
            gam[tid] = -expf(A_log[j]) * softplus_(to_f(a[t * lda + j]) + dt_bias[j]);  // gdn_recurrent's log-decay
        }
        __syncthreads();
        if (tid == NT - 1) {  // γ = cumsum(g) in token order
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < C; ++i)
                if (i < n) gam[i] = acc += gam[i];
        }
        __syncthreads();
        if (tid < n) {
            eg[tid] = expf(gam[tid]);
            g_s[(long long)(t0 + tid) * HV + j] = gam[tid];
        }
        // L and A from the registers (gc_lower_attn's expressions): L_ij = β_i (k_i·k_j) D_ij (j < i),
        // A_ij = (q_i·k_j) D_ij (j ≤ i), zero elsewhere; L's rows past the chunk zero too
        float* a_out = a_s + ((long long)t0 * HV + j) * C;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = r0 + 8 * h, jj = n0 + 8 * nt + 2 * tq;
                float l[2], at[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    l[e] = at[e] = 0.f;
                    if (i < n && jj + e <= i) {
                        const float dec = expf(gam[i] - gam[jj + e]);
                        at[e] = qk[nt][2 * h + e] * dec;
                        if (jj + e < i) l[e] = beta[i] * kk[nt][2 * h + e] * dec;
                    }
                }
                *reinterpret_cast<float2*>(Lm + i * MST + jj) = make_float2(l[0], l[1]);
                if (i < n) *reinterpret_cast<float2*>(a_out + (long long)i * HV * C + jj) = make_float2(at[0], at[1]);
            }
        __syncthreads();
        gpt_inverse<DK>(Lm, Tm, Mb, tid);
        gpt_apply<T, DK>(Tm, Ks, beta, eg, qkv + (long long)t0 * ldqkv, ldqkv, 2LL * HK * DK + (long long)j * DV,
                         u_s + (long long)t0 * HV * DV + (long long)j * DV,
                         w_s + (long long)t0 * HV * DK + (long long)j * DK, (long long)HV * DV, (long long)HV * DK, DV,
                         n, warp, lane);
    }
}
