// Gated DeltaNet: causal depthwise conv with carried state, and the chunked delta rule for prefill
// (docs/model-math.md §4). Sequences are packed: tokens starts[b] .. starts[b+1]-1 of the activation rows belong to
// sequence b, whose state lives in pool slot slots[b]. The exact token-by-token recurrence (decode, exact prefill)
// and the fused decode step are in gdn_step.cu.
#include "gdn_common.cuh"

// y[t, c] = silu(sum_{j<KW} w[c, j] * x_{t-KW+1+j}[c]); history before the first token comes from
// state[slot, c, 0..KW-2] (oldest first, raw pre-conv inputs) and is updated to the last KW-1 raw inputs.
// Thread = (channel, tile of CONV_TILE packed rows): every token's window is its own raw inputs, so tiles run in
// parallel and each output is the same expression on the same values as a token-by-token pass (bitwise). State
// ownership, which makes the in-place update race-free: the tokens s .. s+KW-2 of a sequence starting at s (the only
// ones whose window reaches into the carried state) belong to the tile holding s, even where they spill past its
// end; that thread alone reads the old state and writes the new one (after all its reads). A sequence shorter than
// KW-1 mixes old state and its tokens into the new state, as the sequential form does; an empty one is untouched.
// Measured (H200, 35B-A3B, one 8192-token prompt): one thread per channel walking all tokens took 3.6 ms a layer
// (64 blocks, one dependent load per token); see docs/cuda.md.
constexpr int CONV_TILE = 64;

template <typename T, int KW>
__global__ void causal_conv(const T* __restrict__ x, const float* __restrict__ w, float* __restrict__ state,
                            T* __restrict__ y, const int* __restrict__ starts, const int* __restrict__ slots, int C,
                            long long ldx, long long ldy, int nseq) {
    pdl_trigger();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int t0 = blockIdx.y * CONV_TILE, t1 = min(t0 + CONV_TILE, starts[nseq]);
    if (c >= C || t0 >= t1) return;
    // the sequence holding t0: the last b with starts[b] <= t0 (never an empty one: its successor starts there too)
    int lo = 0, hi = nseq - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (starts[mid] <= t0)
            lo = mid;
        else
            hi = mid - 1;
    }
    int b = lo;
    float wc[KW];
#pragma unroll
    for (int j = 0; j < KW; ++j) wc[j] = w[c * KW + j];
    for (; b < nseq && starts[b] < t1; ++b) {
        const int s = starts[b], e = starts[b + 1];
        if (e == s) continue;
        const bool owner = s >= t0;  // this tile holds the sequence's first token: it owns the state
        const int ta = owner ? s : max(t0, s + KW - 1);
        const int tb = owner ? max(min(e, t1), min(e, s + KW - 1)) : min(e, t1);
        float* st = state + ((long long)slots[b] * C + c) * (KW - 1);
        float win[KW - 1], ns[KW - 1];
#pragma unroll
        for (int j = 0; j < KW - 1; ++j) win[j] = conv_raw<T, KW>(x, ldx, c, st, s, ta - (KW - 1) + j);
        if (owner) {
#pragma unroll
            for (int j = 0; j < KW - 1; ++j) ns[j] = conv_raw<T, KW>(x, ldx, c, st, s, e - (KW - 1) + j);
        }
        int t = ta;
        for (; t + 8 <= tb; t += 8) {  // 8 independent loads in flight, then the dependent taps
            float xv[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) xv[i] = to_f(x[(long long)(t + i) * ldx + c]);
#pragma unroll
            for (int i = 0; i < 8; ++i) y[(long long)(t + i) * ldy + c] = from_f<T>(conv_token<KW>(win, wc, xv[i]));
        }
        for (; t < tb; ++t)
            y[(long long)t * ldy + c] = from_f<T>(conv_token<KW>(win, wc, to_f(x[(long long)t * ldx + c])));
        if (owner) {
#pragma unroll
            for (int j = 0; j < KW - 1; ++j) st[j] = ns[j];
        }
    }
}

// ---- chunked prefill form (§4.6; reference ops_gdn.gdn_chunked / _chunk), one pass --------------------------------
// The model runs the two-pass form in gdn_chunk.cu (chunk-parallel intra-chunk work, then a short state pass); this
// one-pass kernel is kept as its benchmark variant (gdn_chunk.py: gdn_chunked(variant="serial"), compiled on first use).
// Same arguments, gates, l2norm, q scale and state layout as gdn_recurrent (gdn_step.cu). Each sequence runs in
// chunks of GDN_CHUNK tokens counted from its first token (the last chunk may be shorter). Per chunk of n tokens, with
// γ = cumsum(g), D_ij = e^{γ_i−γ_j} (j ≤ i), all fp32 in shared memory:
//   L = strict_lower(diag(β) K Kᵀ ⊙ D);  A = lower(Q Kᵀ ⊙ D)
//   V' = (I + L)⁻¹ (diag(β) V − diag(β e^γ) K S)      [= U − W S of _chunk: W S is folded into the right-hand
//                                                      side, so the forward substitution is DVS wide, not DK]
//   O  = diag(e^γ) Q S + A V';   S ← e^{γ_n} S + (diag(e^{γ_n−γ}) K)ᵀ V'
// One block (256 threads) per (sequence, value head, slice of DVS value columns); the key-side work (L, A) is
// recomputed per slice. Every sum runs in a fixed order; results of a row never depend on the other sequences.
constexpr int GDN_CHUNK = 64;

// Shared-memory layout, in floats (the wrapper's _chunk_smem mirrors it; the kernel traps on a mismatch).
// Row strides are padded so the tile loops below hit distinct banks.
template <int DK, int DVS> struct GdnChunkSmem {
    static constexpr int KST = DK + 1;          // q, k rows
    static constexpr int SST = DVS + 16;        // state rows (two consecutive rows 16 banks apart)
    static constexpr int VST = DVS + DVS / 8;   // V / V' rows (solve lanes of one column on distinct banks)
    static constexpr int MST = GDN_CHUNK + 1;   // L, A rows
    static constexpr int FLOATS = 2 * GDN_CHUNK * KST + DK * SST + GDN_CHUNK * VST + 2 * GDN_CHUNK * MST + 4 * GDN_CHUNK;
};

// L_ij = β_i (k_i·k_j) D_ij for j < i, A_ij = (q_i·k_j) D_ij for j ≤ i, zero elsewhere and on rows/cols >= n.
// Thread (ti, tj) of a 16x16 grid owns rows ti + 16r and columns tj + 16c (r, c < 4).
template <int DK>
__device__ __forceinline__ void gdn_chunk_lower_attn(const float* Ks, const float* Qs, float* Lm, float* Am,
                                                     const float* gam, const float* beta, int n, int ti, int tj) {
    using L = GdnChunkSmem<DK, 32>;
    float kk[4][4] = {}, qk[4][4] = {};
    for (int d = 0; d < DK; ++d) {
        float ki[4], qi[4], kj[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            ki[r] = Ks[(ti + 16 * r) * L::KST + d];
            qi[r] = Qs[(ti + 16 * r) * L::KST + d];
            kj[r] = Ks[(tj + 16 * r) * L::KST + d];
        }
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                kk[r][c] = fmaf(ki[r], kj[c], kk[r][c]);
                qk[r][c] = fmaf(qi[r], kj[c], qk[r][c]);
            }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = ti + 16 * r;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int jj = tj + 16 * c;
            float l = 0.f, at = 0.f;
            if (i < n && jj <= i) {  // masked before exp: the exponent is never positive
                const float dec = expf(gam[i] - gam[jj]);
                at = qk[r][c] * dec;
                if (jj < i) l = beta[i] * kk[r][c] * dec;
            }
            Lm[i * L::MST + jj] = l;
            Am[i * L::MST + jj] = at;
        }
    }
}

// Right-hand side of the solve, in place over V: R_i = β_i v_i − β_i e^{γ_i} (k_i S); and out_i = e^{γ_i} q_i S
// (the inter-chunk part of the output, kept in registers). Tiles: rows ti + 16r, columns tj + 16c.
template <int DK, int DVS>
__device__ __forceinline__ void gdn_chunk_rhs(const float* Ks, const float* Qs, const float* Ss, float* Vs,
                                              const float* beta, const float* eg, float (&out)[4][DVS / 16], int n,
                                              int ti, int tj) {
    using L = GdnChunkSmem<DK, DVS>;
    constexpr int RC = DVS / 16;
    float ks[4][RC] = {};
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < RC; ++c) out[r][c] = 0.f;
    for (int d = 0; d < DK; ++d) {
        float ki[4], qi[4], s[RC];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            ki[r] = Ks[(ti + 16 * r) * L::KST + d];
            qi[r] = Qs[(ti + 16 * r) * L::KST + d];
        }
#pragma unroll
        for (int c = 0; c < RC; ++c) s[c] = Ss[d * L::SST + tj + 16 * c];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int c = 0; c < RC; ++c) {
                ks[r][c] = fmaf(ki[r], s[c], ks[r][c]);
                out[r][c] = fmaf(qi[r], s[c], out[r][c]);
            }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = ti + 16 * r;
        if (i >= n) continue;
        const float be = beta[i], e = eg[i];
#pragma unroll
        for (int c = 0; c < RC; ++c) {
            float* v = Vs + i * L::VST + tj + 16 * c;
            *v = be * *v - be * e * ks[r][c];
            out[r][c] *= e;
        }
    }
}

// Forward substitution (I + L) X = R over rows 0..n-1, in place in Vs. LPC lanes (aligned in the warp) share
// column `col`: lane `sub` sums the terms j ≡ sub (mod LPC), an xor butterfly adds the LPC partial sums, and the
// lane with sub == i mod LPC writes X_i, so every lane reads only rows it wrote itself (no barrier needed).
template <int DVS, int LPC>
__device__ __forceinline__ void gdn_chunk_solve(const float* Lm, float* Vs, int n, int col, int sub) {
    using L = GdnChunkSmem<16, DVS>;
    for (int i = 1; i < n; ++i) {
        float p = 0.f;
        for (int jj = sub; jj < i; jj += LPC) p = fmaf(Lm[i * L::MST + jj], Vs[jj * L::VST + col], p);
#pragma unroll
        for (int off = LPC / 2; off > 0; off >>= 1) p += __shfl_xor_sync(0xffffffffu, p, off);
        if (sub == i % LPC) Vs[i * L::VST + col] -= p;
    }
}

// S ← e^{γ_n} S + Σ_{i<n} (k_i e^{γ_n−γ_i}) ⊗ V'_i. Thread owns state rows ti + 16r (r < DK/16), columns tj + 16c.
template <int DK, int DVS>
__device__ __forceinline__ void gdn_chunk_state(const float* Ks, float* Ss, const float* Vs, const float* tail,
                                                float elast, int n, int ti, int tj) {
    using L = GdnChunkSmem<DK, DVS>;
    constexpr int RC = DVS / 16, RD = DK / 16;
    float acc[RD][RC] = {};
    for (int i = 0; i < n; ++i) {
        const float ti_ = tail[i];
        float kt[RD], vv[RC];
#pragma unroll
        for (int r = 0; r < RD; ++r) kt[r] = Ks[i * L::KST + ti + 16 * r] * ti_;
#pragma unroll
        for (int c = 0; c < RC; ++c) vv[c] = Vs[i * L::VST + tj + 16 * c];
#pragma unroll
        for (int r = 0; r < RD; ++r)
#pragma unroll
            for (int c = 0; c < RC; ++c) acc[r][c] = fmaf(kt[r], vv[c], acc[r][c]);
    }
#pragma unroll
    for (int r = 0; r < RD; ++r)
#pragma unroll
        for (int c = 0; c < RC; ++c) {
            float* s = Ss + (ti + 16 * r) * L::SST + tj + 16 * c;
            *s = fmaf(*s, elast, acc[r][c]);
        }
}

template <typename T, typename S, int DK, int DVS>
__global__ void __launch_bounds__(256)
    gdn_chunked(const T* __restrict__ qkv, const T* __restrict__ a, const T* __restrict__ bb,
                const float* __restrict__ A_log, const float* __restrict__ dt_bias, S* __restrict__ state,
                T* __restrict__ o, const int* __restrict__ starts, const int* __restrict__ slots, int HK, int HV,
                int DV, long long ldqkv, long long lda, long long ldb, long long ldo) {
    pdl_trigger();
    constexpr int C = GDN_CHUNK, NT = 256;
    using L = GdnChunkSmem<DK, DVS>;
    constexpr int KST = L::KST, SST = L::SST, VST = L::VST, MST = L::MST;
    constexpr int RC = DVS / 16, LPC = NT / DVS, R32 = (DK + 31) / 32;
    static_assert(DK % 16 == 0 && (DVS == 32 || DVS == 64), "tile shapes");
    extern __shared__ float smem[];
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < L::FLOATS * sizeof(float)) __trap();
    }
    float *Ks = smem, *Qs = Ks + C * KST, *Ss = Qs + C * KST, *Vs = Ss + DK * SST, *Lm = Vs + C * VST;
    float *Am = Lm + C * MST, *gam = Am + C * MST, *beta = gam + C, *eg = beta + C, *tail = eg + C;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, ti = tid >> 4, tj = tid & 15;
    const int j = blockIdx.y, b = blockIdx.x, hk = j / (HV / HK), c0 = blockIdx.z * DVS;
    S* st = state + (((long long)slots[b] * HV + j) * DK) * DV + c0;
    for (int e = tid; e < DK * DVS; e += NT) {
        const int d = e / DVS, c = e % DVS;
        Ss[d * SST + c] = (c0 + c < DV) ? st_load(st + (long long)d * DV + c) : 0.f;
    }
    const float negA = -expf(A_log[j]), dtb = dt_bias[j], qscale = 1.f / sqrtf((float)DK);
    const long long qoff = (long long)hk * DK, koff = (long long)HK * DK + hk * DK;
    const long long voff = 2LL * HK * DK + (long long)j * DV + c0;
    const int t_end = starts[b + 1];
    for (int t0 = starts[b]; t0 < t_end; t0 += C) {
        const int n = min(C, t_end - t0);
        __syncthreads();  // the previous chunk's readers are done with every buffer
        // raw q, k, v slice and per-token gates (rows >= n are never read below)
        for (int e = tid; e < n * DK; e += NT) {
            const int i = e / DK, d = e % DK;
            const T* row = qkv + (long long)(t0 + i) * ldqkv;
            Qs[i * KST + d] = to_f(row[qoff + d]);
            Ks[i * KST + d] = to_f(row[koff + d]);
        }
        for (int e = tid; e < n * DVS; e += NT) {
            const int i = e / DVS, c = e % DVS;
            Vs[i * VST + c] = (c0 + c < DV) ? to_f(qkv[(long long)(t0 + i) * ldqkv + voff + c]) : 0.f;
        }
        if (tid < n) {
            const long long t = t0 + tid;
            beta[tid] = sigmoidf_(to_f(bb[t * ldb + j]));
            gam[tid] = negA * softplus_(to_f(a[t * lda + j]) + dtb);  // g_t = log of gdn_recurrent's decay
        }
        __syncthreads();
        // l2norm (the recurrence's lane order and scales), one warp per row; γ = cumsum(g) in token order
        for (int i = warp; i < n; i += NT / 32) {
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
        if (tid == NT - 1) {
            float acc = 0.f;
            for (int i = 0; i < n; ++i) gam[i] = acc += gam[i];
        }
        __syncthreads();
        if (tid < n) {
            eg[tid] = expf(gam[tid]);
            tail[tid] = expf(gam[n - 1] - gam[tid]);
        }
        gdn_chunk_lower_attn<DK>(Ks, Qs, Lm, Am, gam, beta, n, ti, tj);
        __syncthreads();
        float out[4][RC];
        gdn_chunk_rhs<DK, DVS>(Ks, Qs, Ss, Vs, beta, eg, out, n, ti, tj);
        __syncthreads();
        gdn_chunk_solve<DVS, LPC>(Lm, Vs, n, warp * (32 / LPC) + lane / LPC, lane % LPC);
        __syncthreads();
        // O += A V' (A is zero above the diagonal and on rows >= n), written out for the chunk's rows
        for (int jj = 0; jj < n; ++jj) {
            float av[4], vv[RC];
#pragma unroll
            for (int r = 0; r < 4; ++r) av[r] = Am[(ti + 16 * r) * MST + jj];
#pragma unroll
            for (int c = 0; c < RC; ++c) vv[c] = Vs[jj * VST + tj + 16 * c];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < RC; ++c) out[r][c] = fmaf(av[r], vv[c], out[r][c]);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = ti + 16 * r;
#pragma unroll
            for (int c = 0; c < RC; ++c) {
                const int col = c0 + tj + 16 * c;
                if (i < n && col < DV) o[(long long)(t0 + i) * ldo + (long long)j * DV + col] = from_f<T>(out[r][c]);
            }
        }
        gdn_chunk_state<DK, DVS>(Ks, Ss, Vs, tail, eg[n - 1], n, ti, tj);
    }
    __syncthreads();
    for (int e = tid; e < DK * DVS; e += NT) {
        const int d = e / DVS, c = e % DVS;
        if (c0 + c < DV) st_store(st + (long long)d * DV + c, Ss[d * SST + c]);
    }
}
