// Gated DeltaNet chunked prefill in two passes (docs/model-math.md §4.6; reference ops_gdn.gdn_chunked / _chunk).
// Same arguments, gates, l2norm, q scale and state layout as gdn_recurrent (gdn_step.cu). Sequences are packed
// (tokens starts[b] .. starts[b+1]-1, state slot slots[b]); each runs in chunks of GC_CHUNK tokens counted from
// its first token in the call (the last chunk may be shorter). Per chunk of n tokens, with γ = cumsum(g),
// D_ij = e^{γ_i−γ_j} (j ≤ i), all fp32:
//   L = strict_lower(diag(β) K Kᵀ ⊙ D);  A = lower(Q Kᵀ ⊙ D)
//   [U | W] = (I + L)⁻¹ [diag(β) V | diag(β) K ⊙ e^γ]          (one forward substitution per column)
//   V' = U − W S;  O = diag(e^γ) Q S + A V';  S ← e^{γ_n} S + (diag(e^{γ_n−γ}) K)ᵀ V'
// Pass 1 (gdn_chunk_prep): one block per (chunk of any sequence, key head) computes everything that does not
// depend on S (normed Q, K and their products once per key head; then per value head of its group: L, A, W, U, γ)
// into a float32 scratch indexed by token row. Pass 2
// (gdn_chunk_state): one block per (sequence, value head, GdnStateSmem::DVS value columns) walks the sequence's
// chunks in order with its state slice on chip. Every sum runs in a fixed order over the sequence's own tokens:
// results of a row never depend on the other sequences of the call or on the launch shape. Each pass comes in two
// forms, the products on fp32 FMAs (gdn_chunk_prep<., ., false>, gdn_chunk_state: gdn_chunked(variant="fp32")) or
// as 3xTF32 mma.sync (tf32_frag.cuh: gdn_chunk_prep<., ., true>, gdn_chunk_state_mma in gdn_state_mma.cuh:
// variant="mma"); the prep's solve is the same in both. gdn_chunk_prep_tc (gdn_prep_tc.cuh, variant="tc", the
// default) is the mma prep with the solve as a blocked inverse and a 3xTF32 product.
#include "gdn_common.cuh"
#include "tf32_frag.cuh"

constexpr int GC_CHUNK = 64;

// Scratch rows (float32, indexed by the token's row t in the call; row-major within a row):
//   qk [t][HK][2·DK]  normed q (scaled by 1/√DK) then normed k
//   w  [t][HV][DK]    W;   a [t][HV][GC_CHUNK]  row of A (zero above the diagonal and past the chunk)
//   u  [t][HV][DV]    U;   g [t][HV]            γ (cumsum of the gate logs within the chunk)

// Pass 1 shared memory, in floats (the wrapper's prep_smem_bytes mirrors it; the kernel traps on a mismatch).
template <int DK> struct GdnPrepSmem {
    static constexpr int KST = DK + 4;        // q, k rows (float4-aligned: the products read 4 key dims at once)
    static constexpr int MST = GC_CHUNK + 4;  // L and product rows (float4-aligned for the solve's broadcast reads)
    static constexpr int FLOATS = 2 * GC_CHUNK * KST + 3 * GC_CHUNK * MST + 3 * GC_CHUNK;
};

// The key head's products k_i·k_j and q_i·k_j (key dims in order) into KKr, QKr. Thread (ti, tj) of a 16x16 grid
// owns rows ti + 16r and columns tj + 16c (r, c < 4) here and in gc_lower_attn: only it reads its entries back.
template <int DK>
__device__ __forceinline__ void gc_products(const float* Ks, const float* Qs, float* KKr, float* QKr, int ti,
                                            int tj) {
    using L = GdnPrepSmem<DK>;
    float kk[4][4] = {}, qk[4][4] = {};
    for (int d = 0; d < DK; d += 4) {
        float4 ki[4], qi[4], kj[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            ki[r] = *reinterpret_cast<const float4*>(Ks + (ti + 16 * r) * L::KST + d);
            qi[r] = *reinterpret_cast<const float4*>(Qs + (ti + 16 * r) * L::KST + d);
            kj[r] = *reinterpret_cast<const float4*>(Ks + (tj + 16 * r) * L::KST + d);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                kk[r][c] = fmaf(ki[r].w, kj[c].w,
                                fmaf(ki[r].z, kj[c].z, fmaf(ki[r].y, kj[c].y, fmaf(ki[r].x, kj[c].x, kk[r][c]))));
                qk[r][c] = fmaf(qi[r].w, kj[c].w,
                                fmaf(qi[r].z, kj[c].z, fmaf(qi[r].y, kj[c].y, fmaf(qi[r].x, kj[c].x, qk[r][c]))));
            }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            KKr[(ti + 16 * r) * L::MST + tj + 16 * c] = kk[r][c];
            QKr[(ti + 16 * r) * L::MST + tj + 16 * c] = qk[r][c];
        }
}

// The same products as 3xTF32 mma.sync (tf32_frag.cuh; gdn_chunk_prep<., ., true> and gdn_chunk_prep_tc): warp w
// computes rows 16(w/2) + g, + 8 by columns 32(w%2) + 8nt + 2t, + 1 (nt < 4; C-fragment order) of both, k over the
// key dims in 16-blocks in order (step s takes dim 16kb + 4t + 2s in slot t, the next in slot t + 4: one float4 per
// row and block), into registers. 8 warps.
template <int DK>
__device__ __forceinline__ void gc_products_acc(const float* Ks, const float* Qs, float (&kk)[4][4],
                                                float (&qk)[4][4], int warp, int lane) {
    using L = GdnPrepSmem<DK>;
    const int g = lane >> 2, t = lane & 3, r0 = 16 * (warp >> 1) + g, n0 = 32 * (warp & 1);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) kk[nt][e] = qk[nt][e] = 0.f;
#pragma unroll 2
    for (int kb = 0; kb < DK / 16; ++kb) {
        const int d = 16 * kb + 4 * t;
        const float4 k0 = *reinterpret_cast<const float4*>(Ks + r0 * L::KST + d);
        const float4 k1 = *reinterpret_cast<const float4*>(Ks + (r0 + 8) * L::KST + d);
        const float4 q0 = *reinterpret_cast<const float4*>(Qs + r0 * L::KST + d);
        const float4 q1 = *reinterpret_cast<const float4*>(Qs + (r0 + 8) * L::KST + d);
        const Tf32A ak[2] = {tf32_a(k0.x, k1.x, k0.y, k1.y), tf32_a(k0.z, k1.z, k0.w, k1.w)};
        const Tf32A aq[2] = {tf32_a(q0.x, q1.x, q0.y, q1.y), tf32_a(q0.z, q1.z, q0.w, q1.w)};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {  // B = Kᵀ: column g of tile nt is k row n0 + 8nt + g
            const float4 kb4 = *reinterpret_cast<const float4*>(Ks + (n0 + 8 * nt + g) * L::KST + d);
            const float b[4] = {kb4.x, kb4.y, kb4.z, kb4.w};
            float bh[4], bl[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) tf32_split(b[e], bh[e], bl[e]);
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                tf32_mma3(kk[nt], ak[s], bh[2 * s], bh[2 * s + 1], bl[2 * s], bl[2 * s + 1]);
                tf32_mma3(qk[nt], aq[s], bh[2 * s], bh[2 * s + 1], bl[2 * s], bl[2 * s + 1]);
            }
        }
    }
}

// gc_products_acc's tiles stored into KKr, QKr for gc_lower_attn (the caller's barrier sits between)
template <int DK>
__device__ __forceinline__ void gc_products_mma(const float* Ks, const float* Qs, float* KKr, float* QKr, int warp,
                                                int lane) {
    using L = GdnPrepSmem<DK>;
    const int g = lane >> 2, t = lane & 3, r0 = 16 * (warp >> 1) + g, n0 = 32 * (warp & 1);
    float kk[4][4], qk[4][4];
    gc_products_acc<DK>(Ks, Qs, kk, qk, warp, lane);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
        const int c = n0 + 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(KKr + r0 * L::MST + c) = make_float2(kk[nt][0], kk[nt][1]);
        *reinterpret_cast<float2*>(KKr + (r0 + 8) * L::MST + c) = make_float2(kk[nt][2], kk[nt][3]);
        *reinterpret_cast<float2*>(QKr + r0 * L::MST + c) = make_float2(qk[nt][0], qk[nt][1]);
        *reinterpret_cast<float2*>(QKr + (r0 + 8) * L::MST + c) = make_float2(qk[nt][2], qk[nt][3]);
    }
}

// One value head's L (into shared memory) and A (straight to its scratch rows) from the products:
// L_ij = β_i (k_i·k_j) D_ij for j < i, A_ij = (q_i·k_j) D_ij for j ≤ i, zero elsewhere; masked before exp, so the
// exponent is never positive. Same thread tiles as gc_products.
template <int DK>
__device__ __forceinline__ void gc_lower_attn(const float* KKr, const float* QKr, float* Lm, float* a_out,
                                              long long a_ld, const float* gam, const float* beta, int n, int ti,
                                              int tj) {
    using L = GdnPrepSmem<DK>;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = ti + 16 * r;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int jj = tj + 16 * c;
            float l = 0.f, at = 0.f;
            if (i < n && jj <= i) {
                const float dec = expf(gam[i] - gam[jj]);
                at = QKr[i * L::MST + jj] * dec;
                if (jj < i) l = beta[i] * KKr[i * L::MST + jj] * dec;
            }
            Lm[i * L::MST + jj] = l;
            if (i < n) a_out[i * a_ld + jj] = at;
        }
    }
}

// (I + L) X = R for one column held in registers, rows in order: row i subtracts Σ_{j<i} L_ij x_j, summed as four
// partial sums over j mod 4 (each in order of j), added as (p0 + p1) + (p2 + p3): a fixed order, four chains.
template <int DK>
__device__ __forceinline__ void gc_solve(const float* Lm, float (&x)[GC_CHUNK], int n) {
    using L = GdnPrepSmem<DK>;
#pragma unroll
    for (int i = 1; i < GC_CHUNK; ++i) {
        if (i >= n) break;
        float p0 = 0.f, p1 = 0.f, p2 = 0.f, p3 = 0.f;
#pragma unroll
        for (int j4 = 0; j4 < i; j4 += 4) {
            const float4 l = *reinterpret_cast<const float4*>(Lm + i * L::MST + j4);
            p0 = fmaf(l.x, x[j4], p0);
            if (j4 + 1 < i) p1 = fmaf(l.y, x[j4 + 1], p1);
            if (j4 + 2 < i) p2 = fmaf(l.z, x[j4 + 2], p2);
            if (j4 + 3 < i) p3 = fmaf(l.w, x[j4 + 3], p3);
        }
        x[i] -= (p0 + p1) + (p2 + p3);
    }
}

// MMA: the products K Kᵀ, Q Kᵀ as 3xTF32 mma.sync (gc_products_mma) instead of fp32 FMAs (gc_products)
template <typename T, int DK, bool MMA>
__global__ void __launch_bounds__(256)
    gdn_chunk_prep(const T* __restrict__ qkv, const T* __restrict__ a, const T* __restrict__ bb,
                   const float* __restrict__ A_log, const float* __restrict__ dt_bias, float* __restrict__ qk_s,
                   float* __restrict__ w_s, float* __restrict__ a_s, float* __restrict__ u_s,
                   float* __restrict__ g_s, const int* __restrict__ starts, int nseq, int HK, int HV, int DV,
                   long long ldqkv, long long lda, long long ldb) {
    pdl_trigger();
    constexpr int C = GC_CHUNK, NT = 256, R32 = (DK + 31) / 32;
    using L = GdnPrepSmem<DK>;
    constexpr int KST = L::KST;
    static_assert(DK % 16 == 0, "tile shapes");
    extern __shared__ float smem[];  // dynamic: starts 16-byte aligned (no static shared memory)
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < L::FLOATS * sizeof(float)) __trap();
    }
    // this block's chunk: blockIdx.x counts the chunks of sequence 0, then 1, ...; blocks past the last exit
    int x = blockIdx.x, t0 = -1, n = 0;
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
    float *Ks = smem, *Qs = Ks + C * KST, *Lm = Qs + C * KST, *KKr = Lm + C * L::MST, *QKr = KKr + C * L::MST;
    float *gam = QKr + C * L::MST, *beta = gam + C, *eg = beta + C;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, ti = tid >> 4, tj = tid & 15;
    const int hk = blockIdx.y, ratio = HV / HK;
    const float qscale = 1.f / sqrtf((float)DK);
    const long long qoff = (long long)hk * DK, koff = (long long)HK * DK + hk * DK;
    for (int e = tid; e < n * DK; e += NT) {
        const int i = e / DK, d = e % DK;
        const T* row = qkv + (long long)(t0 + i) * ldqkv;
        Qs[i * KST + d] = to_f(row[qoff + d]);
        Ks[i * KST + d] = to_f(row[koff + d]);
    }
    __syncthreads();
    // l2norm (the recurrence's lane order and scales), one warp per row
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
    __syncthreads();
    for (int e = tid; e < n * DK; e += NT) {  // the key head's normed rows for the state pass
        const int i = e / DK, d = e % DK;
        float* row = qk_s + ((long long)(t0 + i) * HK + hk) * 2 * DK;
        row[d] = Qs[i * KST + d];
        row[DK + d] = Ks[i * KST + d];
    }
    if constexpr (MMA)  // once for the key head's value heads
        gc_products_mma<DK>(Ks, Qs, KKr, QKr, warp, lane);
    else
        gc_products<DK>(Ks, Qs, KKr, QKr, ti, tj);
    for (int j = hk * ratio; j < (hk + 1) * ratio; ++j) {
        __syncthreads();  // the previous value head's solve is done with L and the gates
        if (tid < n) {
            const long long t = t0 + tid;
            beta[tid] = sigmoidf_(to_f(bb[t * ldb + j]));
            gam[tid] = -expf(A_log[j]) * softplus_(to_f(a[t * lda + j]) + dt_bias[j]);  // gdn_recurrent's log-decay
        }
        __syncthreads();
        if (tid == NT - 1) {  // γ = cumsum(g) in token order
            float acc = 0.f;
            for (int i = 0; i < n; ++i) gam[i] = acc += gam[i];
        }
        __syncthreads();
        if (tid < n) {
            eg[tid] = expf(gam[tid]);
            g_s[(long long)(t0 + tid) * HV + j] = gam[tid];
        }
        gc_lower_attn<DK>(KKr, QKr, Lm, a_s + ((long long)t0 * HV + j) * C, (long long)HV * C, gam, beta, n, ti, tj);
        __syncthreads();
        // [U | W] column by column: column col < DV is U's (right-hand side β v), the others W's ((β k) e^γ)
        const long long voff = 2LL * HK * DK + (long long)j * DV;
        for (int col = tid; col < DV + DK; col += NT) {
            const bool isv = col < DV;
            float xr[C];
#pragma unroll
            for (int i = 0; i < C; ++i) {
                xr[i] = 0.f;
                if (i < n)
                    xr[i] = isv ? to_f(qkv[(long long)(t0 + i) * ldqkv + voff + col]) * beta[i]
                                : Ks[i * KST + col - DV] * beta[i] * eg[i];
            }
            gc_solve<DK>(Lm, xr, n);
            float* dst = isv ? u_s + (long long)t0 * HV * DV + (long long)j * DV + col
                             : w_s + (long long)t0 * HV * DK + (long long)j * DK + col - DV;
            const long long ld = (long long)HV * (isv ? DV : DK);
#pragma unroll
            for (int i = 0; i < C; ++i)
                if (i < n) dst[i * ld] = xr[i];
        }
    }
}

// Pass 2 shared memory, in floats (the wrapper's state_smem_bytes mirrors it; the kernel traps on a mismatch).
// DVS value columns per block (16 or 32; 8·DVS threads). A column's arithmetic does not depend on DVS: the same
// bits for either.
// Both state passes: hint the next chunk's scratch rows (normed q|k of key head hk; W, A and U of value head j, U
// from column c0) into the L2 while this chunk computes; reads no values. Threads tid, tid + nthreads, ...
// SC: the q|k, W and A sections' element type (gdn_scratch.cuh).
template <int DK, typename SC = float>
__device__ __forceinline__ void gc_hint_next_chunk(const SC* qk_s, const SC* w_s, const SC* a_s,
                                                   const float* u_s, int t0, int t_end, int hk, int j, int HK,
                                                   int HV, int DV, int c0, int tid, int nthreads) {
#ifdef __CUDA_ARCH__
    constexpr int C = GC_CHUNK, B = (int)sizeof(SC);  // 128-byte lines per row and section, at least one:
    constexpr int LQ = DK * B >= 64 ? DK * B / 64 : 1, LW = DK * B >= 128 ? DK * B / 128 : 1, LA = C * B / 128;
    constexpr int PER = LQ + LW + LA + 1, PL = 128 / B;  // lines per token row; values per line
    if (t0 + C >= t_end) return;
    const int nn = min(C, t_end - t0 - C);
    for (int e = tid; e < nn * PER; e += nthreads) {
        const int i = e / PER, l = e % PER;
        const long long t = t0 + C + i;
        const void* p = l < LQ            ? (const void*)(qk_s + (t * HK + hk) * 2 * DK + PL * l)
                        : l < LQ + LW     ? (const void*)(w_s + (t * HV + j) * DK + PL * (l - LQ))
                        : l < LQ + LW + LA ? (const void*)(a_s + (t * HV + j) * C + PL * (l - LQ - LW))
                                           : (const void*)(u_s + (t * HV + j) * DV + c0);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
#endif
}

template <int DK, int DVS> struct GdnStateSmem {
    static_assert(DVS == 16 || DVS == 32, "value slice");
    static constexpr int SST = DVS == 16 ? 24 : 48;  // state rows: the rows a warp writes on distinct banks
    static constexpr int KST = DK + 4;               // q, w / k rows: float4-aligned, a warp's rows on distinct banks
    static constexpr int MST = GC_CHUNK + 4;         // A rows (float4-aligned, a warp's rows on distinct banks)
    static constexpr int VST = SST;                  // U / V' rows
    static constexpr int FLOATS = DK * SST + 2 * GC_CHUNK * KST + GC_CHUNK * MST + GC_CHUNK * VST + 2 * GC_CHUNK;
};

// One block of 8·DVS threads per (sequence, value head, DVS value columns). Thread (ti, tj) = (tid / H, tid % H),
// H = DVS / 2, owns chunk rows ti + 16r (r < 4) and columns tj + Hc (c < 2), and state rows ti·RD + r (r < RD =
// DK/16) in the update.
template <typename T, typename S, int DK, int DVS>
__global__ void __launch_bounds__(8 * DVS)
    gdn_chunk_state(const float* __restrict__ qk_s, const float* __restrict__ w_s, const float* __restrict__ a_s,
                    const float* __restrict__ u_s, const float* __restrict__ g_s, S* __restrict__ state,
                    T* __restrict__ o, const int* __restrict__ starts, const int* __restrict__ slots, int HK,
                    int HV, int DV, long long ldo) {
    pdl_trigger();
    constexpr int C = GC_CHUNK, NT = 8 * DVS, H = DVS / 2, D4 = DK / 4, RD = DK / 16;
    using L = GdnStateSmem<DK, DVS>;
    constexpr int SST = L::SST, KST = L::KST, MST = L::MST, VST = L::VST;
    extern __shared__ float smem[];  // dynamic: starts 16-byte aligned (no static shared memory)
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < L::FLOATS * sizeof(float)) __trap();
    }
    float *Ss = smem, *Qb = Ss + DK * SST, *Wb = Qb + C * KST, *Am = Wb + C * KST, *Vs = Am + C * MST;
    float *eg = Vs + C * VST, *tail = eg + C;
    const int tid = threadIdx.x, ti = tid / H, tj = tid % H;
    const int j = blockIdx.y, b = blockIdx.x, hk = j / (HV / HK), c0 = blockIdx.z * DVS;
    S* st = state + (((long long)slots[b] * HV + j) * DK) * DV + c0;
    for (int e = tid; e < DK * DVS; e += NT) {
        const int d = e / DVS, c = e % DVS;
        Ss[d * SST + c] = (c0 + c < DV) ? st_load(st + (long long)d * DV + c) : 0.f;
    }
    const int t_end = starts[b + 1];
    for (int t0 = starts[b]; t0 < t_end; t0 += C) {
        const int n = min(C, t_end - t0);
        __syncthreads();  // the previous chunk's readers are done with every buffer
        for (int e = tid; e < n * D4; e += NT) {
            const int i = e / D4, d = 4 * (e % D4);
            const long long t = t0 + i;
            *reinterpret_cast<float4*>(Qb + i * KST + d) =
                *reinterpret_cast<const float4*>(qk_s + (t * HK + hk) * 2 * DK + d);
            *reinterpret_cast<float4*>(Wb + i * KST + d) =
                *reinterpret_cast<const float4*>(w_s + (t * HV + j) * DK + d);
        }
        for (int e = tid; e < n * (C / 4); e += NT) {
            const int i = e / (C / 4), c = 4 * (e % (C / 4));
            *reinterpret_cast<float4*>(Am + i * MST + c) =
                *reinterpret_cast<const float4*>(a_s + ((long long)(t0 + i) * HV + j) * C + c);
        }
        for (int e = tid; e < n * DVS; e += NT) {
            const int i = e / DVS, c = e % DVS;
            Vs[i * VST + c] = (c0 + c < DV) ? u_s[((long long)(t0 + i) * HV + j) * DV + c0 + c] : 0.f;
        }
        if (tid < n) {
            const float gi = g_s[(long long)(t0 + tid) * HV + j], gl = g_s[(long long)(t0 + n - 1) * HV + j];
            eg[tid] = expf(gi);
            tail[tid] = expf(gl - gi);
        }
        __syncthreads();
        gc_hint_next_chunk<DK>(qk_s, w_s, a_s, u_s, t0, t_end, hk, j, HK, HV, DV, c0, tid, NT);
        // W S and Q S over the key dim in order (rows >= n are computed from stale rows and never used)
        float ws[4][2] = {}, qs[4][2] = {};
        for (int d = 0; d < DK; d += 4) {
            float4 w4[4], q4[4];
            float s[4][2];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                w4[r] = *reinterpret_cast<const float4*>(Wb + (ti + 16 * r) * KST + d);
                q4[r] = *reinterpret_cast<const float4*>(Qb + (ti + 16 * r) * KST + d);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int c = 0; c < 2; ++c) s[u][c] = Ss[(d + u) * SST + tj + H * c];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    ws[r][c] = fmaf(w4[r].w, s[3][c], fmaf(w4[r].z, s[2][c],
                               fmaf(w4[r].y, s[1][c], fmaf(w4[r].x, s[0][c], ws[r][c]))));
                    qs[r][c] = fmaf(q4[r].w, s[3][c], fmaf(q4[r].z, s[2][c],
                               fmaf(q4[r].y, s[1][c], fmaf(q4[r].x, s[0][c], qs[r][c]))));
                }
        }
        // V' = U − W S in place (each thread rewrites only its own entries; rows >= n zero); out = e^γ Q S
        float out[4][2];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = ti + 16 * r;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float* v = Vs + i * VST + tj + H * c;
                out[r][c] = 0.f;
                if (i < n) {
                    *v -= ws[r][c];
                    out[r][c] = qs[r][c] * eg[i];
                } else {
                    *v = 0.f;
                }
            }
        }
        __syncthreads();  // W read by all, V' complete
        for (int e = tid; e < n * D4; e += NT) {  // k rows scaled by the tail decays e^{γ_n−γ_i}, over W
            const int i = e / D4, d = 4 * (e % D4);
            float4 k = *reinterpret_cast<const float4*>(qk_s + ((long long)(t0 + i) * HK + hk) * 2 * DK + DK + d);
            const float tt = tail[i];
            k.x *= tt;
            k.y *= tt;
            k.z *= tt;
            k.w *= tt;
            *reinterpret_cast<float4*>(Wb + i * KST + d) = k;
        }
        __syncthreads();
        // out += A V' over j in order (A is zero above the diagonal; the terms past n, up to a multiple of 4, are
        // 0 · 0), written out for the chunk's rows
        for (int jj = 0; jj < n; jj += 4) {
            float4 av[4];
            float vv[4][2];
#pragma unroll
            for (int r = 0; r < 4; ++r) av[r] = *reinterpret_cast<const float4*>(Am + (ti + 16 * r) * MST + jj);
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int c = 0; c < 2; ++c) vv[u][c] = Vs[(jj + u) * VST + tj + H * c];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    out[r][c] = fmaf(av[r].w, vv[3][c],
                                     fmaf(av[r].z, vv[2][c], fmaf(av[r].y, vv[1][c], fmaf(av[r].x, vv[0][c], out[r][c]))));
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = ti + 16 * r;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = c0 + tj + H * c;
                if (i < n && col < DV) o[(long long)(t0 + i) * ldo + (long long)j * DV + col] = from_f<T>(out[r][c]);
            }
        }
        // S ← e^{γ_n} S + Σ_{i<n} (k_i e^{γ_n−γ_i}) ⊗ V'_i
        float acc[RD][2] = {};
        for (int i = 0; i < n; ++i) {
            float kt[RD], vv[2];
            if constexpr (RD % 4 == 0) {
#pragma unroll
                for (int r = 0; r < RD; r += 4) {
                    const float4 k4 = *reinterpret_cast<const float4*>(Wb + i * KST + ti * RD + r);
                    kt[r] = k4.x;
                    kt[r + 1] = k4.y;
                    kt[r + 2] = k4.z;
                    kt[r + 3] = k4.w;
                }
            } else {
#pragma unroll
                for (int r = 0; r < RD; ++r) kt[r] = Wb[i * KST + ti * RD + r];
            }
#pragma unroll
            for (int c = 0; c < 2; ++c) vv[c] = Vs[i * VST + tj + H * c];
#pragma unroll
            for (int r = 0; r < RD; ++r)
#pragma unroll
                for (int c = 0; c < 2; ++c) acc[r][c] = fmaf(kt[r], vv[c], acc[r][c]);
        }
        const float elast = eg[n - 1];
#pragma unroll
        for (int r = 0; r < RD; ++r)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float* s = Ss + (ti * RD + r) * SST + tj + H * c;
                *s = fmaf(*s, elast, acc[r][c]);
            }
    }
    __syncthreads();
    for (int e = tid; e < DK * DVS; e += NT) {
        const int d = e / DVS, c = e % DVS;
        if (c0 + c < DV) st_store(st + (long long)d * DV + c, Ss[d * SST + c]);
    }
}

// Pass 2 on tensor cores (gdn_chunked(variant="mma")): gdn_chunk_state_mma, the same pass with its products as
// 3xTF32 mma.sync.
#include "gdn_state_mma.cuh"

// Pass 1 with the solve on tensor cores (gdn_chunked(variant="tc")): gdn_chunk_prep_tc, the same scratch.
#include "gdn_prep_tc.cuh"

// The state pass split into the sequential walk and a chunk-parallel output pass (gdn_chunked(variant="split")).
#include "gdn_state_split.cuh"

// The state pass with the walk (V', the state) and the outputs on two warp groups (gdn_chunked(variant="wsp")).
#include "gdn_state_wsp.cuh"
