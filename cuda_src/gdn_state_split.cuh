// The state pass split in two (gdn_chunked(variant="split")): gdn_chunk_state_h walks each sequence's chunks with
// only what the recurrence needs (V' = U − W S and S ← e^{γ_n} S + (diag(tail) K)ᵀ V'), storing V' over U in the
// scratch and each chunk's starting state S into a per-chunk array h; gdn_chunk_out then computes every chunk's
// output O = e^γ Q S + A V' at once, one block per (chunk, value head, DVS value columns). Both reuse
// gdn_chunk_state_mma's device functions (gdn_state_mma.cuh: the same fragments, k order, mma sequence per
// accumulator and S / V' splits), so states and outputs are bitwise gdn_chunk_state_mma's; the sequential walk
// loses the Q S and A V' products (40% of its mma, the q and A rows: 40% of its scratch reads). Included by
// gdn_chunk.cu.
//
// h: float32 [chunk][HV][DK][DV], chunks numbered as gdn_chunk_prep's blocks (the chunks of sequence 0, then 1, ...).
#pragma once
#include "gdn_state_mma.cuh"

// The first chunk number of sequence b (gdn_chunk_prep's numbering)
__device__ __forceinline__ int gss_chunk_base(const int* starts, int b) {
    int cb = 0;
    for (int i = 0; i < b; ++i) cb += (starts[i + 1] - starts[i] + GC_CHUNK - 1) / GC_CHUNK;
    return cb;
}

template <typename T, typename S, int DK, int DVS>
__global__ void __launch_bounds__(128, DK == 16 ? 3 : 0)
    gdn_chunk_state_h(const float* __restrict__ qk_s, const float* __restrict__ w_s, const float* __restrict__ a_s,
                      float* __restrict__ u_s, const float* __restrict__ g_s, float* __restrict__ h_s,
                      S* __restrict__ state, const int* __restrict__ starts, const int* __restrict__ slots, int HK,
                      int HV, int DV) {
    pdl_trigger();
    constexpr int C = GC_CHUNK;
    using L = GdnStateMmaSmem<DK, DVS>;
    constexpr int NTN = L::NTN, MW = L::MW, NW = L::NW;
    extern __shared__ float smem[];  // dynamic: starts 16-byte aligned (no static shared memory)
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < L::FLOATS * sizeof(float)) __trap();
    }
    float *Sf = smem, *Vf = Sf + L::SF, *gate = Vf + L::VF;  // as gdn_chunk_state_mma
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
    const int j = blockIdx.y, b = blockIdx.x, hk = j / (HV / HK), c0 = blockIdx.z * DVS;
    const int mt0 = (w / L::WPM) * MW, nt0 = (w % L::WPM) * NW;
    const bool owns = nt0 < NTN;
    S* st = state + (((long long)slots[b] * HV + j) * DK) * DV + c0;
    float sreg[MW][NW][4];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int ni = 0; ni < NW; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int d = 16 * (mt0 + mi) + 2 * g + (e >> 1), c = 8 * (nt0 + ni) + 2 * t + (e & 1);
                sreg[mi][ni][e] = owns && c0 + c < DV ? st_load(st + (long long)d * DV + c) : 0.f;
            }
    const int t_beg = starts[b], t_end = starts[b + 1];
    const long long ldq = 2LL * HK * DK;
    if (owns)
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int ni = 0; ni < NW; ++ni) {
                const int d = 16 * (mt0 + mi) + 2 * g, c = 8 * (nt0 + ni) + 2 * t;
                gsm_put_block<NTN>(Sf, d, c, sreg[mi][ni][0], sreg[mi][ni][1], sreg[mi][ni][2], sreg[mi][ni][3]);
            }
    if (t_beg < t_end) gsm_gates(g_s, HV, j, t_beg, min(C, t_end - t_beg), gate, gate + C, tid);
    int par = 0, ci = gss_chunk_base(starts, b);
    for (int t0 = t_beg; t0 < t_end; t0 += C, par ^= 1, ++ci) {
        const int n = min(C, t_end - t0), r0 = 16 * w + 2 * g;
        const bool v0 = r0 < n, v1 = r0 + 1 < n;
        const float *eg = gate + 2 * C * par, *tail = eg + C;
        if (owns) {  // the chunk's starting state, for gdn_chunk_out
            float* h = h_s + ((long long)ci * HV + j) * DK * DV + c0;
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int ni = 0; ni < NW; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int d = 16 * (mt0 + mi) + 2 * g + (e >> 1), c = 8 * (nt0 + ni) + 2 * t + (e & 1);
                        if (c0 + c < DV) h[(long long)d * DV + c] = sreg[mi][ni][e];
                    }
        }
        __syncthreads();  // S fragments and this chunk's gates written; last chunk's readers of V' done
        gc_hint_next_chunk<DK>(qk_s, w_s, a_s, u_s, t0, t_end, hk, j, HK, HV, DV, c0, tid, 128);
        const long long q0 = (long long)(t0 + (v0 ? r0 : 0)), q1 = (long long)(t0 + (v1 ? r0 + 1 : 0));
        float ws[NTN][4] = {}, unused[NTN][4];
        gsm_ws_qs<DK, DVS, true, false>(w_s + (q0 * HV + j) * DK, w_s + (q1 * HV + j) * DK, nullptr, nullptr, v0,
                                        v1, Sf, ws, unused, lane);
        // V' = U − W S (zero past the chunk and past DV) into its fragments and over U in the scratch
#pragma unroll
        for (int nt = 0; nt < NTN; ++nt) {
            float vp[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 8 * nt + 2 * t + (e & 1);
                const bool ok = (e >> 1 ? v1 : v0) && c0 + c < DV;
                float* u = u_s + ((e >> 1 ? q1 : q0) * HV + j) * DV + c0 + c;
                vp[e] = ok ? *u - ws[nt][e] : 0.f;
                if (ok) *u = vp[e];
            }
            gsm_put_block<NTN>(Vf, r0, 8 * nt + 2 * t, vp[0], vp[1], vp[2], vp[3]);
        }
        __syncthreads();  // V' complete; S fragments read by all
        if (owns) {
            float acc[MW][NW][4] = {};
            gsm_update<DK, DVS>(qk_s + ((long long)t0 * HK + hk) * 2 * DK + DK, ldq, tail, Vf, acc, mt0, nt0, n,
                                lane);
            const float elast = eg[n - 1];
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int ni = 0; ni < NW; ++ni) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) sreg[mi][ni][e] = fmaf(sreg[mi][ni][e], elast, acc[mi][ni][e]);
                    const int d = 16 * (mt0 + mi) + 2 * g, c = 8 * (nt0 + ni) + 2 * t;
                    gsm_put_block<NTN>(Sf, d, c, sreg[mi][ni][0], sreg[mi][ni][1], sreg[mi][ni][2], sreg[mi][ni][3]);
                }
        }
        if (t0 + C < t_end) gsm_gates(g_s, HV, j, t0 + C, min(C, t_end - t0 - C), gate + 2 * C * (par ^ 1),
                                      gate + 2 * C * (par ^ 1) + C, tid);
    }
    if (owns)
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int ni = 0; ni < NW; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int d = 16 * (mt0 + mi) + 2 * g + (e >> 1), c = 8 * (nt0 + ni) + 2 * t + (e & 1);
                    if (c0 + c < DV) st_store(st + (long long)d * DV + c, sreg[mi][ni][e]);
                }
}

// O = e^γ Q S + A V' of one chunk (its number blockIdx.x, as gdn_chunk_prep's), value head blockIdx.y, columns
// blockIdx.z·DVS ..: S from h, V' from the scratch (gdn_chunk_state_h), both split into the fragments
// gdn_chunk_state_mma would hold; then its output code. Shared memory: gdn_chunk_state_mma's layout.
template <typename T, int DK, int DVS>
__global__ void __launch_bounds__(128)
    gdn_chunk_out(const float* __restrict__ qk_s, const float* __restrict__ a_s, const float* __restrict__ u_s,
                  const float* __restrict__ g_s, const float* __restrict__ h_s, T* __restrict__ o,
                  const int* __restrict__ starts, int nseq, int HK, int HV, int DV, long long ldo) {
    pdl_trigger();
    constexpr int C = GC_CHUNK;
    using L = GdnStateMmaSmem<DK, DVS>;
    constexpr int NTN = L::NTN;
    extern __shared__ float smem[];
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < L::FLOATS * sizeof(float)) __trap();
    }
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
    float *Sf = smem, *Vf = Sf + L::SF, *eg = Vf + L::VF;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
    const int j = blockIdx.y, hk = j / (HV / HK), c0 = blockIdx.z * DVS;
    const float* h = h_s + ((long long)blockIdx.x * HV + j) * DK * DV + c0;
    for (int e = tid; e < (DK / 2) * DVS; e += 128) {  // S: key dims 2kp, 2kp + 1 of column c
        const int d = 2 * (e / DVS), c = e % DVS;
        const bool ok = c0 + c < DV;
        gsm_put<NTN>(Sf, d, c, ok ? h[(long long)d * DV + c] : 0.f, ok ? h[(long long)(d + 1) * DV + c] : 0.f);
    }
    for (int e = tid; e < (C / 2) * DVS; e += 128) {  // V': chunk rows 2rp, 2rp + 1 (zero past n and DV)
        const int r = 2 * (e / DVS), c = e % DVS;
        const bool ok = c0 + c < DV;
        const float* u = u_s + ((long long)(t0 + r) * HV + j) * DV + c0 + c;
        gsm_put<NTN>(Vf, r, c, ok && r < n ? u[0] : 0.f, ok && r + 1 < n ? u[(long long)HV * DV] : 0.f);
    }
    if (tid < n) eg[tid] = expf(g_s[(long long)(t0 + tid) * HV + j]);  // gsm_gates' e^γ
    __syncthreads();
    const int r0 = 16 * w + 2 * g;
    const bool v0 = r0 < n, v1 = r0 + 1 < n;
    const long long q0 = (long long)(t0 + (v0 ? r0 : 0)), q1 = (long long)(t0 + (v1 ? r0 + 1 : 0));
    float unused[NTN][4], out[NTN][4] = {};
    gsm_ws_qs<DK, DVS, false, true>(nullptr, nullptr, qk_s + (q0 * HK + hk) * 2 * DK, qk_s + (q1 * HK + hk) * 2 * DK,
                                    v0, v1, Sf, unused, out, lane);
    const float e0 = v0 ? eg[r0] : 0.f, e1 = v1 ? eg[r0 + 1] : 0.f;
#pragma unroll
    for (int nt = 0; nt < NTN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) out[nt][e] *= e >> 1 ? e1 : e0;
    gsm_attn<DVS>(a_s + (q0 * HV + j) * C, a_s + (q1 * HV + j) * C, v0, v1, Vf, out, w, n, lane);
#pragma unroll
    for (int nt = 0; nt < NTN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int c = c0 + 8 * nt + 2 * t + (e & 1);
            if ((e >> 1 ? v1 : v0) && c < DV) o[(e >> 1 ? q1 : q0) * ldo + (long long)j * DV + c] = from_f<T>(out[nt][e]);
        }
}
