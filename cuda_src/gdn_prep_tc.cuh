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
// gdn_chunk_prep_tc_conv (gdn_chunked(conv=...)) is the same pass over the raw in-projection rows with gdn.cu's
// causal conv fused (gpt_prep below): the conv output array is never written, the scratch and the conv states are
// bitwise causal_conv's followed by gdn_chunk_prep_tc's.
#pragma once
#include "tf32_frag.cuh"

template <int DK> struct GdnPrepTcSmem {
    static constexpr int KST = GdnPrepSmem<DK>::KST;  // q, k rows
    static constexpr int MST = GdnPrepSmem<DK>::MST;  // L and T rows (float4-aligned for the A fragments)
    static constexpr int LM = GC_CHUNK * MST + 3 * 256;  // L, then the block products M (up to three 16 x 16)
    static constexpr int QR = GC_CHUNK * KST > LM ? GC_CHUNK * KST : LM;  // Q's region, reused for L and M
    static constexpr int FLOATS = GC_CHUNK * KST + QR + GC_CHUNK * MST + 3 * GC_CHUNK;  // + γ, β, e^γ
    // gdn_chunk_prep_tc_conv: the Q region (free again after T's inverse) also holds a value head's conv outputs,
    // GC_CHUNK rows of gpt_vst(DV) floats; it grows where they need more (dv > dk + 2 at dk = 128; never for the
    // served heads, dk = dv = 128: 85.5 KB, as without the conv)
    static __host__ __device__ constexpr int qr_conv(int vst) { return GC_CHUNK * vst > QR ? GC_CHUNK * vst : QR; }
    static __host__ __device__ constexpr int floats_conv(int vst) { return FLOATS - QR + qr_conv(vst); }
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

// The fused conv (gdn_chunk_prep_tc_conv) of nch channels over the chunk's GC_CHUNK rows into shared memory. Work
// item e = (channel ch = e % nch, segment e / nch of rs = GC_CHUNK / segs rows), threads tid, tid + 256, ...,
// B raw rows loaded at a time (the q, k rows 16, the value rows 4: with the products' 32 registers live there,
// 8 or 16 made ptxas spill at dk = 128; nvcc 13.0);
// map(ch, c, dst): the channel's index c in the conv's C channels and its shared-memory column dst (row stride
// ld). Each output is to_f(from_f<T>(conv_token(window, taps, raw))) over its own raw window (conv_raw: x0's rows
// relative to the chunk's first row, those before the sequence's first row s <= 0 from the carried state st of
// the sequence's slot, channel c at st + c (GDN_KW - 1)): causal_conv's expression on the same values, so the
// bits it stores, for any segmentation. Rows past the chunk (n <= row < GC_CHUNK) are zero.
template <typename T, int B, typename Map>
__device__ __forceinline__ void gpt_conv_rows(const T* x0, long long ldx, const float* cw, const float* st, int s,
                                              int n, int nch, int segs, int ld, Map map, int tid) {
    const int rs = GC_CHUNK / segs;
    for (int e = tid; e < nch * segs; e += 256) {
        const int ch = e % nch, i0 = e / nch * rs, lim = min(n, i0 + rs);
        int c;
        float* dst;
        map(ch, c, dst);
        if (i0 < lim) {
            float wc[GDN_KW], win[GDN_KW - 1];
#pragma unroll
            for (int j = 0; j < GDN_KW; ++j) wc[j] = cw[(long long)c * GDN_KW + j];
#pragma unroll
            for (int j = 0; j < GDN_KW - 1; ++j)
                win[j] = conv_raw<T, GDN_KW>(x0, ldx, c, st + (long long)c * (GDN_KW - 1), s, i0 - (GDN_KW - 1) + j);
            for (int r = i0; r < lim; r += B) {
                float xv[B];
#pragma unroll
                for (int u = 0; u < B; ++u) xv[u] = r + u < lim ? to_f(x0[(long long)(r + u) * ldx + c]) : 0.f;
#pragma unroll
                for (int u = 0; u < B; ++u)
                    if (r + u < lim) dst[(r + u) * ld] = to_f(from_f<T>(conv_token<GDN_KW>(win, wc, xv[u])));
            }
        }
        for (int r = max(i0, n); r < i0 + rs; ++r) dst[r * ld] = 0.f;
    }
}

// Segments per channel for nch channels on 256 threads: the largest power of two <= 256 / nch, at most 8.
__host__ __device__ __forceinline__ int gpt_conv_segs(int nch) {
    int segs = 1;
    while (segs < 8 && 2 * segs * nch <= 256) segs *= 2;
    return segs;
}

// Row stride of the conv's value rows in shared memory: DV rounded up to 8, + 2 (gpt_apply's lanes (g, t) read
// rows 4t + u, columns g: banks 8t + g, distinct).
__host__ __device__ __forceinline__ int gpt_vst(int DV) { return (DV + 7) / 8 * 8 + 2; }

// [U | W] = T R for value head j (columns col < DV: U, from β v; the others W, from β k e^γ), written to the
// scratch rows of the chunk's n tokens. Warp-uniform loops (every lane takes part in every mma).
// CONV (gdn_chunk_prep_tc_conv): β v from the value head's conv outputs in shared memory (vs, row stride vst)
// instead of qkv's rows; the same values, so the same B fragments.
template <typename T, int DK, bool CONV = false, typename SC = float>
__device__ __forceinline__ void gpt_apply(const float* Tm, const float* Ks, const float* beta, const float* eg,
                                          const T* qkv, long long ldqkv, long long voff, float* u_out, SC* w_out,
                                          long long ldu, long long ldw, int DV, int n, int warp, int lane,
                                          const float* vs = nullptr, int vst = 0) {
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
                if constexpr (CONV) {
                    if (i < n && col < DV + DK)
                        v = col < DV ? vs[i * vst + col] * beta[i] : Ks[i * S::KST + col - DV] * beta[i] * eg[i];
                } else {
                    if (i < n && col < DV + DK)
                        v = col < DV ? to_f(qkv[i * ldqkv + voff + col]) * beta[i]
                                     : Ks[i * S::KST + col - DV] * beta[i] * eg[i];
                }
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
                    else sc_put(w_out + i * ldw + c - DV, acc[mt][e]);
                }
            }
    }
}

// The prep's body: gdn_chunk_prep_tc (CONV false: qkv the conv output) and gdn_chunk_prep_tc_conv (CONV true: qkv
// the raw in-projection rows, the conv computed here by gpt_conv_rows: q and k rows into Qs, Ks before the
// l2norm; each value head's rows into the Q region after T's inverse, read by gpt_apply). With CONV every q, k and
// v value the prep uses is the one causal_conv stores, so the scratch is bitwise conv-then-prep's. Conv state: no
// chunk's window reaches before its sequence's first row except the first chunk's, and the key heads' blocks of
// that chunk read disjoint channels (q, k of key head hk and v of its value heads): each such block, after a
// barrier past its last read of the old state, stores the new one for its channels (the last GDN_KW - 1 raw
// inputs, causal_conv's expression: the old state mixed in for sequences shorter than that). Empty sequences have
// no block and keep their state, as in causal_conv.
template <typename T, int DK, bool CONV, typename SC>
__device__ __forceinline__ void gpt_prep(const T* __restrict__ qkv, const T* __restrict__ a, const T* __restrict__ bb,
                                         const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                                         SC* __restrict__ qk_s, SC* __restrict__ w_s, SC* __restrict__ a_s,
                                         float* __restrict__ u_s, float* __restrict__ g_s,
                                         const int* __restrict__ starts, int nseq, int HK, int HV, int DV,
                                         long long ldqkv, long long lda, long long ldb,
                                         const float* __restrict__ conv_w, float* __restrict__ conv_state,
                                         const int* __restrict__ slots) {
    pdl_trigger();
    constexpr int C = GC_CHUNK, NT = 256, R32 = (DK + 31) / 32, PER = C * DK / NT;
    using S = GdnPrepTcSmem<DK>;
    constexpr int KST = S::KST, MST = S::MST;
    static_assert(DK % 16 == 0 && (C * DK) % NT == 0, "tile shapes");
    extern __shared__ float smem[];  // dynamic: starts 16-byte aligned (no static shared memory)
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if constexpr (CONV) {
            if (dyn < S::floats_conv(gpt_vst(DV)) * sizeof(float)) __trap();
        } else {
            if (dyn < S::FLOATS * sizeof(float)) __trap();
        }
    }
    int x = blockIdx.x, t0 = -1, n = 0, sb = 0;  // as gdn_chunk_prep: the chunks of sequence 0, then 1, ...
    for (int b = 0; b < nseq; ++b) {
        const int s0 = starts[b], len = starts[b + 1] - s0, nc = (len + C - 1) / C;
        if (x < nc) {
            t0 = s0 + x * C;
            n = min(C, len - x * C);
            sb = b;
            break;
        }
        x -= nc;
    }
    if (t0 < 0) return;
    // CONV: x is the chunk's index in sequence sb, whose first row is at −x·C from the chunk's; cst the carried
    // conv state of its slot (conv_raw reads it only for rows before that, i.e. in the first chunk)
    const float* cst = nullptr;
    int vst = 0;
    if constexpr (CONV) {
        cst = conv_state + (long long)slots[sb] * (2 * HK * DK + HV * DV) * (GDN_KW - 1);
        vst = gpt_vst(DV);
    }
    float *Ks = smem, *Qs = Ks + C * KST, *Lm = Qs, *Mb = Lm + C * MST, *Tm = Qs + (CONV ? S::qr_conv(vst) : S::QR);
    float *gam = Tm + C * MST, *beta = gam + C, *eg = beta + C;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hk = blockIdx.y, ratio = HV / HK;
    const float qscale = 1.f / sqrtf((float)DK);
    const long long qoff = (long long)hk * DK, koff = (long long)HK * DK + hk * DK;
    if constexpr (CONV) {  // channels q (DK) | k (DK) of key head hk; rows past the chunk are zero
        gpt_conv_rows<T, 16>(qkv + (long long)t0 * ldqkv, ldqkv, conv_w, cst, -x * C, n, 2 * DK, gpt_conv_segs(2 * DK),
                         KST,
                         [&](int ch, int& c, float*& dst) {
                             c = (int)(ch < DK ? qoff + ch : koff + ch - DK);
                             dst = ch < DK ? Qs + ch : Ks + ch - DK;
                         },
                         tid);
    } else {
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
            SC* row = qk_s + ((long long)(t0 + i) * HK + hk) * 2 * DK;
            sc_put(row + d, Qs[i * KST + d]);
            sc_put(row + DK + d, Ks[i * KST + d]);
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
        SC* a_out = a_s + ((long long)t0 * HV + j) * C;
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
                if (i < n) sc_put2(a_out + (long long)i * HV * C + jj, at[0], at[1]);
            }
        __syncthreads();
        gpt_inverse<DK>(Lm, Tm, Mb, tid);
        if constexpr (CONV) {  // value head j's conv rows over L and M (done with by the inverse's last barrier)
            const long long voff = 2LL * HK * DK + (long long)j * DV;
            gpt_conv_rows<T, 4>(qkv + (long long)t0 * ldqkv, ldqkv, conv_w, cst, -x * C, n, DV, gpt_conv_segs(DV), vst,
                             [&](int ch, int& c, float*& dst) {
                                 c = (int)(voff + ch);
                                 dst = Qs + ch;
                             },
                             tid);
            __syncthreads();
        }
        gpt_apply<T, DK, CONV, SC>(Tm, Ks, beta, eg, qkv + (long long)t0 * ldqkv, ldqkv,
                                   2LL * HK * DK + (long long)j * DV, u_s + (long long)t0 * HV * DV + (long long)j * DV,
                                   w_s + (long long)t0 * HV * DK + (long long)j * DK, (long long)HV * DV,
                                   (long long)HV * DK, DV, n, warp, lane, Qs, vst);
    }
    if constexpr (CONV) {
        if (x == 0) {         // the sequence's first chunk: the new carried state of this block's channels
            __syncthreads();  // every read of the old state (the q, k windows, each value head's) is done
            const T* x0 = qkv + (long long)t0 * ldqkv;
            const int len = starts[sb + 1] - t0, nch = 2 * DK + ratio * DV;
            for (int e = tid; e < nch; e += NT) {
                const int c = (int)(e < DK       ? qoff + e
                                    : e < 2 * DK ? koff + e - DK
                                                 : 2LL * HK * DK + (long long)hk * ratio * DV + e - 2 * DK);
                float* st = conv_state + ((long long)slots[sb] * (2 * HK * DK + HV * DV) + c) * (GDN_KW - 1);
                float ns[GDN_KW - 1];  // causal_conv's: raw rows len − 3 .. len − 1 (those before the sequence: old)
#pragma unroll
                for (int i = 0; i < GDN_KW - 1; ++i)
                    ns[i] = conv_raw<T, GDN_KW>(x0, ldqkv, c, st, 0, len - (GDN_KW - 1) + i);
#pragma unroll
                for (int i = 0; i < GDN_KW - 1; ++i) st[i] = ns[i];
            }
        }
    }
}

// SC: the element type of the q|k, W and A scratch sections (gdn_scratch.cuh: float, or bf16 for variant "wspb")
template <typename T, int DK, typename SC = float>
__global__ void __launch_bounds__(256, 2)
    gdn_chunk_prep_tc(const T* __restrict__ qkv, const T* __restrict__ a, const T* __restrict__ bb,
                      const float* __restrict__ A_log, const float* __restrict__ dt_bias, SC* __restrict__ qk_s,
                      SC* __restrict__ w_s, SC* __restrict__ a_s, float* __restrict__ u_s,
                      float* __restrict__ g_s, const int* __restrict__ starts, int nseq, int HK, int HV, int DV,
                      long long ldqkv, long long lda, long long ldb) {
    gpt_prep<T, DK, false, SC>(qkv, a, bb, A_log, dt_bias, qk_s, w_s, a_s, u_s, g_s, starts, nseq, HK, HV, DV,
                               ldqkv, lda, ldb, nullptr, nullptr, nullptr);
}

// gdn_chunk_prep_tc over the raw in-projection rows x (q | k | v channels, row stride ldx) with gdn.cu's
// causal_conv<T, GDN_KW> fused: taps conv_w[C][GDN_KW], carried raw inputs conv_state[slot][C][GDN_KW − 1]
// (updated in place), slots[nseq]; C = 2·HK·DK + HV·DV. The scratch and the new conv states are bitwise those of
// causal_conv then gdn_chunk_prep_tc, and the conv output is never stored. Dynamic shared memory:
// GdnPrepTcSmem<DK>::floats_conv(gpt_vst(DV)) floats (the wrapper's prep_tc_smem_bytes(dk, dv); traps on less).
template <typename T, int DK, typename SC = float>
__global__ void __launch_bounds__(256, 2)
    gdn_chunk_prep_tc_conv(const T* __restrict__ x, const T* __restrict__ a, const T* __restrict__ bb,
                           const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                           SC* __restrict__ qk_s, SC* __restrict__ w_s, SC* __restrict__ a_s,
                           float* __restrict__ u_s, float* __restrict__ g_s, const int* __restrict__ starts, int nseq,
                           int HK, int HV, int DV, long long ldx, long long lda, long long ldb,
                           const float* __restrict__ conv_w, float* __restrict__ conv_state,
                           const int* __restrict__ slots) {
    gpt_prep<T, DK, true, SC>(x, a, bb, A_log, dt_bias, qk_s, w_s, a_s, u_s, g_s, starts, nseq, HK, HV, DV, ldx, lda,
                              ldb, conv_w, conv_state, slots);
}
