// The state pass with its warps specialized (gdn_chunked(variant="wsp" / "wspq")): gdn_chunk_state_mma's walk
// (gdn_state_mma.cuh) with the work that the next chunk waits for and the work it does not split between two warp
// groups of one block. Included by gdn_chunk.cu after gdn_state_mma.cuh.
//
// A chunk's state S_c feeds V'_c = U − W S_c and S_{c+1} = e^{γ_n} S_c + (diag(tail) K)ᵀ V'_c: that chain is the
// only sequential part. The output e^γ Q S_c + A V'_c needs S_c and V'_c but nothing needs it. In the 4-warp pass
// one warp does both for its 16 chunk rows, so every chunk waits for its output products too (Q S is half of the
// k = dk products, A V' a fifth of the rest). Here warps 0-3 (the walk) run the 4-warp pass's W S, V', state
// update and state tiles, warps 4-7 (the output) its Q S, A V' and stores for the same rows, each with the
// 4-warp pass's mma sequence per accumulator: the outputs and states are bitwise the "tc" variant's (host test).
//
// The groups meet at named barriers (common.cuh), per chunk c:
//   walk:   sync WALK (S_c, the chunk's gates and W rows written) -> arrive S_READY -> U loads, W S_c -> V'_c into
//           buffer c & 1 -> arrive V_READY -> sync WALK (V'_c complete; W_c read: stage W_{c+1}) -> update
//           -> sync S_FREE -> S_{c+1}
//   output: sync S_READY -> gates of c + 1 -> Q S_c -> sync V_READY -> arrive S_FREE -> A V'_c -> store
// A group arrives for a barrier's next phase only after the other group passed its current one (V_READY of c + 1
// needs S_{c+1}, written after S_FREE of c, which the output arrives at after its V_READY wait of c; S_READY of c + 1
// likewise), V'_c's buffer was last read by the output's A V'_{c−2}, finished before it arrived at S_FREE of c − 1,
// which S_c waited for, and the gates of c + 1 go into the buffer of c − 1, whose last reader (the walk's update and
// S_c) arrived at S_READY of c before. What left the walk's path besides the output's products: the gate loads
// (e^γ of the output's rows it computes from the scratch itself; the walk reads the tails and e^{γ_n}), and the U
// entries load before W S instead of after it. With QSTG ("wspq", one block per SM at dk = 128: + dk·64 floats)
// the output stages its chunk's Q rows in shared memory as the walk stages W, and the walk loads the update's K rows
// into registers before V' is complete (KPRE: 64 more registers); without it both come from the scratch in place.
#pragma once
#include "mbarrier.cuh"

enum { WSP_WALK_REGS = 152, WSP_OUT_REGS = 104 };  // per thread of the two warp groups where paired (setmaxnreg)
// two blocks per SM (at most 128 registers a thread): the served heads (dk = 128) without QSTG; the smaller test
// heads take one (dk = 64 spills under any split of 2 x 128)
__host__ __device__ constexpr bool wsp_pair(int dk, bool qstg) { return dk == 128 && !qstg; }
enum { WSP_WALK = 1, WSP_S_READY = 2, WSP_V_READY = 3, WSP_S_FREE = 4, WSP_OUT = 5 };

template <int DK, int DVS, bool QSTG> struct GdnStateWspSmem {
    using L = GdnStateMmaSmem<DK, DVS>;
    // S fragments, V' fragments of two chunks, e^γ and tails of two chunks, W rows (QSTG: + Q rows)
    static constexpr int FLOATS = L::SF + 2 * L::VF + 4 * GC_CHUNK + (QSTG ? 2 : 1) * GC_CHUNK * DK;
};

// rows t0 .. t0 + n − 1 of a scratch section (row r at src + (t0 + r)·ld, DK values) into dst by cp.async, 16-byte
// piece q of row r at sc_stage_off(q, r) (gdn_scratch.cuh; float rows: gsm_stage's layout)
template <int DK, typename SC>
__device__ __forceinline__ void wsp_stage(SC* dst, const SC* src, long long ld, long long t0, int n, int tid,
                                          int nthreads) {
    constexpr int QPR = DK * (int)sizeof(SC) / 16, PER = 16 / (int)sizeof(SC);  // pieces per row, values per piece
    for (int e = tid; e < n * QPR; e += nthreads) {
        const int r = e / QPR, q = e % QPR;
        cp_async_f4(reinterpret_cast<float*>(dst + r * DK + sc_stage_off<SC, DK>(q, r)),
                    reinterpret_cast<const float*>(src + (t0 + r) * ld + PER * q));
    }
}

// acc += X S for the rows x0, x1 (chunk rows r0, r0 + 1; zero where v0 / v1 is false) over the DVS columns, the
// 16-blocks of the key dim alternating between acc (even) and a second accumulator (odd), summed at the end: two
// chains half as deep (3·DK/16 mmas) per tile instead of gsm_ws_qs's one (CH = 2, variant "wsp2": its own rounding,
// not the tc variant's bits). SWZ: staged rows (gsm_stage's layout, sw = sc_swz<float> of r0).
template <int DK, int DVS, bool SWZ>
__device__ __forceinline__ void wsp_rows_s2(const float* x0, const float* x1, bool v0, bool v1, const float* Sf,
                                            float (&acc)[DVS / 8][4], int lane, int sw) {
    constexpr int NTN = DVS / 8;
    const int t = lane & 3;
    float odd[NTN][4] = {};
#pragma unroll
    for (int kb = 0; kb < DK / 16; ++kb) {
        const int d = SWZ ? sc_swz_off<float>(kb, t, sw) : 16 * kb + 4 * t;
        const float4 a0 = sc_ld4(x0 + d, v0), a1 = sc_ld4(x1 + d, v1);
        const Tf32A a[2] = {tf32_a(a0.x, a1.x, a0.y, a1.y), tf32_a(a0.z, a1.z, a0.w, a1.w)};
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int nt = 0; nt < NTN; ++nt) {
                const float4 b = *reinterpret_cast<const float4*>(Sf + (((kb * 2 + s) * NTN + nt) * 32 + lane) * 4);
                tf32_mma3(kb & 1 ? odd[nt] : acc[nt], a[s], b.x, b.y, b.z, b.w);
            }
    }
#pragma unroll
    for (int nt = 0; nt < NTN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] += odd[nt][e];
}

// The walk's K rows for the state update of the chunk at kr (n tokens): entry [kb][mi][u] is (k(i, d), k(i, d + 1))
// for token i = 16kb + 4t + u and key dims d = 16(mt0 + mi) + 2g (zero past the chunk), loaded before V' is
// complete so that their latency hides behind it (gsm_update loads them inside its loop)
template <int DK, int DVS, typename L = GdnStateMmaSmem<DK, DVS>>
__device__ __forceinline__ void wsp_load_k(const float* kr, long long ldk, float2 (&kk)[GC_CHUNK / 16][L::MW][4],
                                           int mt0, int n, int g, int t) {
#pragma unroll
    for (int kb = 0; kb < GC_CHUNK / 16; ++kb)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = 16 * kb + 4 * t + u;
#pragma unroll
            for (int mi = 0; mi < L::MW; ++mi)
                kk[kb][mi][u] = i < n ? *reinterpret_cast<const float2*>(kr + i * ldk + 16 * (mt0 + mi) + 2 * g)
                                      : make_float2(0.f, 0.f);
        }
}

// gsm_update on preloaded K rows: the same products, splits and mma order
template <int DK, int DVS, typename L = GdnStateMmaSmem<DK, DVS>>
__device__ __forceinline__ void wsp_update(const float2 (&kk)[GC_CHUNK / 16][L::MW][4], const float* tail,
                                           const float* Vf, float (&acc)[L::MW][L::NW][4], int nt0, int n, int lane) {
    const int t = lane & 3;
#pragma unroll
    for (int kb = 0; kb < GC_CHUNK / 16; ++kb) {
        if (16 * kb >= n) break;
        float2 k2[L::MW][4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = 16 * kb + 4 * t + u;
            const float tl = i < n ? tail[i] : 0.f;
#pragma unroll
            for (int mi = 0; mi < L::MW; ++mi) k2[mi][u] = make_float2(kk[kb][mi][u].x * tl, kk[kb][mi][u].y * tl);
        }
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int mi = 0; mi < L::MW; ++mi) {
                const Tf32A a = tf32_a(k2[mi][2 * s].x, k2[mi][2 * s].y, k2[mi][2 * s + 1].x, k2[mi][2 * s + 1].y);
#pragma unroll
                for (int ni = 0; ni < L::NW; ++ni) {
                    const float4 b =
                        *reinterpret_cast<const float4*>(Vf + (((kb * 2 + s) * L::NTN + nt0 + ni) * 32 + lane) * 4);
                    tf32_mma3(acc[mi][ni], a, b.x, b.y, b.z, b.w);
                }
            }
    }
}

// The walk (threads 0-127): V' and the state over the chunks of [t_beg, t_end); the state tiles as the 4-warp pass.
// The gates of the chunks after the first come from the output warps.
template <typename S, int DK, int DVS, bool KPRE, int CH, typename SC>
__device__ __forceinline__ void wsp_walk(const SC* qk_s, const SC* w_s, const SC* a_s, const float* u_s,
                                         const float* g_s, S* st, float* Sf, float* Vf0, float* gate, SC* Ws,
                                         int t_beg, int t_end, int j, int hk, int HK, int HV, int DV, int c0,
                                         int tid) {
    constexpr int C = GC_CHUNK;
    using L = GdnStateMmaSmem<DK, DVS>;
    constexpr int NTN = L::NTN, NTW = L::NTW, MW = L::MW, NW = L::NW;
    const int lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
    const int mt0 = (w / L::WPM) * MW, nt0 = (w % L::WPM) * NW;
    const bool owns = nt0 < NTN;
    float sreg[MW][NW][4];
    gsm_state_load<DK, DVS>(st, sreg, owns, mt0, nt0, c0, DV, g, t);
    if (owns) gsm_state_put<DK, DVS, 4, true>(Sf, sreg, mt0, nt0, g, t);
    if (t_beg < t_end) {
        gsm_gates(g_s, HV, j, t_beg, min(C, t_end - t_beg), gate, gate + C, tid);
        wsp_stage<DK, SC>(Ws, w_s + (long long)j * DK, (long long)HV * DK, t_beg, min(C, t_end - t_beg), tid, 128);
    }
    const long long ldq = 2LL * HK * DK;
    int par = 0;
    for (int t0 = t_beg; t0 < t_end; t0 += C, par ^= 1) {
        const int n = min(C, t_end - t0), r0 = 16 * w + 2 * g;
        const bool v0 = r0 < n, v1 = r0 + 1 < n;
        const float *eg = gate + 2 * C * par, *tail = eg + C;
        float* Vf = Vf0 + par * L::VF;
        cp_async_f4_wait();
        named_bar_sync(WSP_WALK, 128);      // S_c fragments, the chunk's gates and W rows written
        named_bar_arrive(WSP_S_READY, 256);  // the output may read S_c
        gc_hint_next_chunk<DK, SC>(qk_s, w_s, a_s, u_s, t0, t_end, hk, j, HK, HV, DV, c0, tid, 128);
        const long long q0 = (long long)(t0 + (v0 ? r0 : 0)), q1 = (long long)(t0 + (v1 ? r0 + 1 : 0));
        float u[NTW][4];  // U, loaded before W S so that its latency hides behind the products
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 8 * nt + 2 * t + (e & 1);
                const bool ok = (e >> 1 ? v1 : v0) && c0 + c < DV;
                u[nt][e] = ok ? u_s[((e >> 1 ? q1 : q0) * HV + j) * DV + c0 + c] : 0.f;
            }
        float ws[NTW][4] = {}, none[NTW][4];
        const int s0 = v0 ? r0 : 0, s1 = v1 ? r0 + 1 : 0;
        if constexpr (CH == 2)
            wsp_rows_s2<DK, DVS, true>(Ws + s0 * DK, Ws + s1 * DK, v0, v1, Sf, ws, lane, sc_swz<float, DK>(r0));
        else
            gsm_ws_qs<DK, DVS, true, false, NTW, L::U_WQ, true, SC>(Ws + s0 * DK, Ws + s1 * DK, nullptr, nullptr, v0,
                                                                    v1, Sf, ws, none, lane, 0, sc_swz<SC, DK>(r0));
        float2 kk[C / 16][MW][4];  // KPRE: the update's K rows, loaded while V' is completed (else unused)
        if constexpr (KPRE)
            if (owns) wsp_load_k<DK, DVS>(qk_s + ((long long)t0 * HK + hk) * 2 * DK + DK, ldq, kk, mt0, n, g, t);
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt) {
            float vp[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool ok = (e >> 1 ? v1 : v0) && c0 + 8 * nt + 2 * t + (e & 1) < DV;
                vp[e] = ok ? u[nt][e] - ws[nt][e] : 0.f;
            }
            gsm_put_block<NTN, true>(Vf, r0, 8 * nt + 2 * t, vp[0], vp[1], vp[2], vp[3]);
        }
        named_bar_arrive(WSP_V_READY, 256);  // the output may read V'_c
        named_bar_sync(WSP_WALK, 128);       // V'_c complete; the chunk's W rows read by the walk
        if (t0 + C < t_end)
            wsp_stage<DK, SC>(Ws, w_s + (long long)j * DK, (long long)HV * DK, t0 + C, min(C, t_end - t0 - C), tid,
                              128);
        float acc[MW][NW][4] = {};
        if constexpr (KPRE) {
            if (owns) wsp_update<DK, DVS>(kk, tail, Vf, acc, nt0, n, lane);
        } else if (owns) {
            const SC* kr = qk_s + ((long long)t0 * HK + hk) * 2 * DK + DK;  // the chunk's first k row
            gsm_update<DK, DVS, 4, L, SC>(kr, ldq, tail, Vf, acc, mt0, nt0, n, lane);
        }
        named_bar_sync(WSP_S_FREE, 256);  // the output is done with S_c and wrote the next chunk's gates
        if (owns) {
            const float elast = eg[n - 1];
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int ni = 0; ni < NW; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sreg[mi][ni][e] = fmaf(sreg[mi][ni][e], elast, acc[mi][ni][e]);
            gsm_state_put<DK, DVS, 4, true>(Sf, sreg, mt0, nt0, g, t);
        }
    }
    if (owns) gsm_state_store<DK, DVS>(st, sreg, mt0, nt0, c0, DV, g, t);
}

// The output (threads 128-255, ot = tid − 128): e^γ Q S_c + A V'_c for the chunk rows of warp ot / 32
template <typename T, int DK, int DVS, bool QSTG, int CH, typename SC>
__device__ __forceinline__ void wsp_out(const SC* qk_s, const SC* a_s, const float* g_s, T* o,
                                        const float* Sf, const float* Vf0, float* gate, SC* Qs, int t_beg,
                                        int t_end, int j, int hk, int HK, int HV, int DV, int c0, long long ldo,
                                        int ot) {
    constexpr int C = GC_CHUNK;
    using L = GdnStateMmaSmem<DK, DVS>;
    constexpr int NTW = L::NTW;
    const int lane = ot & 31, rt = ot >> 5, g = lane >> 2, t = lane & 3;
    const long long ldq = 2LL * HK * DK;
    const SC* q_rows = qk_s + (long long)hk * 2 * DK;  // QSTG: row t of the key head's q at q_rows + t·ldq
    if (QSTG && t_beg < t_end) wsp_stage<DK, SC>(Qs, q_rows, ldq, t_beg, min(C, t_end - t_beg), ot, 128);
    int par = 0;
    for (int t0 = t_beg; t0 < t_end; t0 += C, par ^= 1) {
        const int n = min(C, t_end - t0), r0 = 16 * rt + 2 * g;
        const bool v0 = r0 < n, v1 = r0 + 1 < n;
        const long long q0 = (long long)(t0 + (v0 ? r0 : 0)), q1 = (long long)(t0 + (v1 ? r0 + 1 : 0));
        const float e0 = v0 ? expf(g_s[q0 * HV + j]) : 0.f, e1 = v1 ? expf(g_s[q1 * HV + j]) : 0.f;  // e^γ
        float out[NTW][4] = {}, none[NTW][4];
        if constexpr (QSTG) {
            cp_async_f4_wait();
            named_bar_sync(WSP_OUT, 128);  // the chunk's Q rows landed
        }
        named_bar_sync(WSP_S_READY, 256);  // S_c written; the walk is done with the gates of chunk c − 1
        if (t0 + C < t_end) {  // the next chunk's gates into chunk c − 1's buffer (the walk reads them after S_FREE)
            float* next = gate + 2 * C * (par ^ 1);
            gsm_gates(g_s, HV, j, t0 + C, min(C, t_end - t0 - C), next, next + C, ot);
        }
        if constexpr (QSTG) {
            const int s0 = v0 ? r0 : 0, s1 = v1 ? r0 + 1 : 0;
            gsm_ws_qs<DK, DVS, false, true, NTW, L::U_WQ, true>(nullptr, nullptr, Qs + s0 * DK, Qs + s1 * DK, v0, v1,
                                                                Sf, none, out, lane, 0, sc_swz<float, DK>(r0));
        } else if constexpr (CH == 2) {
            wsp_rows_s2<DK, DVS, false>(qk_s + (q0 * HK + hk) * 2 * DK, qk_s + (q1 * HK + hk) * 2 * DK, v0, v1, Sf,
                                        out, lane, 0);
        } else {
            gsm_ws_qs<DK, DVS, false, true, NTW, L::U_WQ, false, SC>(nullptr, nullptr, qk_s + (q0 * HK + hk) * 2 * DK,
                                                                     qk_s + (q1 * HK + hk) * 2 * DK, v0, v1, Sf, none,
                                                                     out, lane);
        }
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) out[nt][e] *= e >> 1 ? e1 : e0;
        named_bar_sync(WSP_V_READY, 256);   // V'_c written
        named_bar_arrive(WSP_S_FREE, 256);  // done with S_c
        if constexpr (QSTG) {
            named_bar_sync(WSP_OUT, 128);  // every output warp is done with the chunk's Q rows
            if (t0 + C < t_end)
                wsp_stage<DK, SC>(Qs, q_rows, ldq, t0 + C, min(C, t_end - t0 - C), ot, 128);
        }
        gsm_attn<DVS, NTW, C / 16, SC>(a_s + (q0 * HV + j) * C, a_s + (q1 * HV + j) * C, v0, v1, Vf0 + par * L::VF,
                                       out, rt, n, lane);
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = c0 + 8 * nt + 2 * t + (e & 1);
                if ((e >> 1 ? v1 : v0) && c < DV)
                    o[(e >> 1 ? q1 : q0) * ldo + (long long)j * DV + c] = from_f<T>(out[nt][e]);
            }
    }
}

// One block of 256 threads per (sequence, value head, DVS value columns), gdn_chunk_state_mma's arguments.
// Registers (ptxas, nvcc 13.0, sm_90a, dk = 128 and 32 columns): unbounded the walk takes ~220 and the output
// ~100, so where two blocks share an SM (wsp_pair: 128 a thread) the walk raises its budget to WSP_WALK_REGS and
// the output lowers its to WSP_OUT_REGS (setmaxnreg, per warp group; 2 x 128 x (152 + 104) = 64K registers per
// SM): no spills, where a flat 128 spilled up to 64 bytes a thread and 160 / 96 spilled the output's 36. One block
// per SM (QSTG, dk < 128) needs no shift: 248 registers at dk = 128, no spills
// (tests/test_cuda_compile.py).
template <typename T, typename S, int DK, int DVS, bool QSTG = false, int CH = 1, typename SC = float>
__global__ void __launch_bounds__(256, wsp_pair(DK, QSTG) ? 2 : 1)
    gdn_chunk_state_wsp(const SC* __restrict__ qk_s, const SC* __restrict__ w_s, const SC* __restrict__ a_s,
                        const float* __restrict__ u_s, const float* __restrict__ g_s, S* __restrict__ state,
                        T* __restrict__ o, const int* __restrict__ starts, const int* __restrict__ slots, int HK,
                        int HV, int DV, long long ldo) {
    static_assert(CH == 1 || (CH == 2 && !QSTG), "two chains per product: without staged Q rows only");
    static_assert(sizeof(SC) == 4 || (CH == 1 && !QSTG), "a bf16 scratch: one chain, Q rows in place");
    pdl_trigger();
    using L = GdnStateMmaSmem<DK, DVS>;
    extern __shared__ float smem[];  // dynamic: starts 16-byte aligned (no static shared memory)
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < GdnStateWspSmem<DK, DVS, QSTG>::FLOATS * sizeof(float)) __trap();
    }
    float *Sf = smem, *Vf = Sf + L::SF, *gate = Vf + 2 * L::VF;
    SC *Ws = reinterpret_cast<SC*>(gate + 4 * GC_CHUNK), *Qs = Ws + GC_CHUNK * DK;  // bf16: in the floats' first half
    const int tid = threadIdx.x, j = blockIdx.y, b = blockIdx.x, hk = j / (HV / HK), c0 = blockIdx.z * DVS;
    const int t_beg = starts[b], t_end = starts[b + 1];
    if (tid < 128) {
        S* st = state + (((long long)slots[b] * HV + j) * DK) * DV + c0;
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (wsp_pair(DK, QSTG)) setmaxnreg_inc<WSP_WALK_REGS>();
#endif
        wsp_walk<S, DK, DVS, QSTG, CH, SC>(qk_s, w_s, a_s, u_s, g_s, st, Sf, Vf, gate, Ws, t_beg, t_end, j, hk, HK,
                                           HV, DV, c0, tid);
    } else {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (wsp_pair(DK, QSTG)) setmaxnreg_dec<WSP_OUT_REGS>();
#endif
        wsp_out<T, DK, DVS, QSTG, CH, SC>(qk_s, a_s, g_s, o, Sf, Vf, gate, Qs, t_beg, t_end, j, hk, HK, HV, DV, c0,
                                          ldo, tid - 128);
    }
}
