// gdn_chunk_state on tensor cores (gdn_chunked(variant="mma")): the same pass, arguments, scratch and results
// within fp32 noise, its four products W S, Q S, A V' and (diag(tail) K)ᵀ V' as 3xTF32 mma.sync (tf32_frag.cuh).
// Included by gdn_chunk.cu (GC_CHUNK, the scratch layout).
//
// One block of NWARP = 4 or 8 warps per (sequence, value head, DVS value columns); warp w owns chunk rows 16rt ..
// 16rt+15 (rt = w % 4) of V', the output and the A V' product in the 8-column tiles of its column half ch = w / 4
// (all of them with 4 warps), and a fixed set of state tiles (GdnStateMmaSmem) whose fp32 values live in its
// registers for the whole sequence. With 8 warps each warp has half the work of a 4-warp warp and the SM twice the
// warps to hide the scratch loads and the mma chains behind; only which warp computes an element changes, not its
// mma sequence, so both give the same bits (host test). C-fragment rows g / g+8 of a 16-row tile stand for rows
// 2g / 2g+1 of it (chunk rows for V' and the output, key dims for the state), so a thread's pairs of A-operand
// values and of B-fragment entries are adjacent in memory. Every k-sum runs over 16-blocks in order, each as two
// 8-steps (step s takes k = 16kb + 4t + 2s in slot t and the next k in slot t + 4), each step as lo·hi, hi·lo,
// hi·hi: an output element's arithmetic depends on nothing but its row, its column and the chunk's length (DVS,
// NWARP and the other sequences of the call change no bit). A V' skips the 16-blocks above the warp's rows and past
// the chunk (A and V' are zero there).
//
// Shared memory holds S and V' only, as ready B fragments [16-block][step][8-column tile][lane][b0 hi, b1 hi,
// b0 lo, b1 lo] (one conflict-free 16-byte load per fragment), and e^γ, e^{γ_n−γ} of the current and the next
// chunk. W, Q, A, U and K are read from the scratch straight into registers (the next chunk's rows are hinted into
// the L2 while one computes); with STG (variant "tcs") the chunk's W and Q rows come from shared memory instead,
// copied there by cp.async while the previous chunk's A V' and state update run (gsm_stage). Only where an operand
// is read from changes, not its value: STG gives the same bits.
#pragma once
#include "gdn_scratch.cuh"

template <int DK, int DVS, int NWARP = 4> struct GdnStateMmaSmem {
    static_assert(DVS == 16 || DVS == 32, "value slice");
    static_assert(NWARP == 4 || NWARP == 8, "warps per block");
    static constexpr int NTN = DVS / 8;                      // 8-column tiles
    static constexpr int NTW = NTN / (NWARP / 4);            // a warp's column tiles of V' and the output
    static constexpr int SF = 2 * DK * DVS;                   // state fragments (hi and lo)
    static constexpr int VF = 2 * GC_CHUNK * DVS;             // V' fragments
    static constexpr int FLOATS = SF + VF + 4 * GC_CHUNK;     // + e^γ and tails of two chunks
    static constexpr int STAGED = FLOATS + 2 * GC_CHUNK * DK;  // STG: + the chunk's W and Q rows
    // state tiles per warp: MW 16-row tiles from mt0 = (w / WPM)·MW by NW 8-column tiles from nt0 = (w % WPM)·NW
    // (WPM warps per row tile; a warp with nt0 >= NTN owns none: DK = 16, DK = 32 with 16 columns and 8 warps)
    static constexpr int MT = DK / 16, WPM = MT >= NWARP ? 1 : NWARP / MT, MW = MT >= NWARP ? MT / NWARP : 1;
    static constexpr int NW = NTN / WPM > 0 ? NTN / WPM : 1;
    // unrolling of the 16-block loops of W S and Q S, A V' and the update: in full with 4 warps; with 8 (at most
    // 128 registers) 1, 1 and 2, else ptxas spills (a loop's order of mmas is the same either way)
    static constexpr int U_WQ = NWARP == 8 ? 1 : MT, U_AV = NWARP == 8 ? 1 : GC_CHUNK / 16;
    static constexpr int U_UP = NWARP == 8 ? 2 : GC_CHUNK / 16;
};

// Float offset of B-operand entry (k, n) in a fragment array with NTN column tiles (the hi word; lo at +2). Rows
// k and k + 1 (k even) share one 16-byte slot: hi(k), hi(k+1), lo(k), lo(k+1).
template <int NTN> __device__ __forceinline__ int gsm_frag(int k, int n) {
    const int kb = k >> 4, r = k & 15;
    return ((((kb * 2 + ((r >> 1) & 1)) * NTN + (n >> 3)) * 32 + 4 * (n & 7) + (r >> 2)) << 2) + (r & 1);
}

// Entries (k, n) = x and (k + 1, n) = y, k even, split and stored as one fragment slot
template <int NTN> __device__ __forceinline__ void gsm_put(float* frag, int k, int n, float x, float y) {
    float xh, xl, yh, yl;
    tf32_split(x, xh, xl);
    tf32_split(y, yh, yl);
    *reinterpret_cast<float4*>(frag + gsm_frag<NTN>(k, n)) = make_float4(xh, yh, xl, yl);
}

// The 2 x 2 block (k, n) = v0, (k, n + 1) = v1, (k + 1, n) = v2, (k + 1, n + 1) = v3 (k, n even) as two gsm_put,
// column n first; with LANE_ORDER the lanes with (k >> 1) odd store column n + 1 first. A warp's lanes hold
// k = 16m + 2g, n = 8j + 2t, and column n + e lands in 16-byte bank group 4e + (g >> 1) of its 128 bytes: with every
// lane on the same e a store reaches 4 of the 8 groups (8 wavefronts for its 512 bytes, a 2-way conflict), with
// e = g & 1 first all 8 (4 wavefronts). The same words at the same places; only the order of the two stores differs.
// The wsp pass stores in LANE_ORDER (measured, H100, perf/results/bench_gdn_put_f94fc38_h100.txt, 8192 rows, 32
// columns: its state launch 1.182 -> 1.102 ms on the 35B-A3B's heads, 1.908 -> 1.758 on the 27B's); the 4-warp
// passes do not (the selects cost the staged tcs instances at dk 32 / 64 spills).
template <int NTN, bool LANE_ORDER = false>
__device__ __forceinline__ void gsm_put_block(float* frag, int k, int n, float v0, float v1, float v2, float v3) {
    if constexpr (LANE_ORDER) {
        const bool sw = (k >> 1) & 1;
        gsm_put<NTN>(frag, k, n + sw, sw ? v1 : v0, sw ? v3 : v2);
        gsm_put<NTN>(frag, k, n + !sw, sw ? v0 : v1, sw ? v2 : v3);
    } else {
        gsm_put<NTN>(frag, k, n, v0, v2);
        gsm_put<NTN>(frag, k, n + 1, v1, v3);
    }
}

// STG: the W rows (head j) and Q rows (key head hk) of the chunk at t0 (n tokens) into Ws, Qs ([GC_CHUNK][DK] each,
// chunk q of row r at sc_stage_off(q, r), gdn_scratch.cuh's float layout); rows past n are left as they are (never read: gsm_ws_qs reads a row only
// where it is inside the chunk)
template <int DK>
__device__ __forceinline__ void gsm_stage(float* Ws, float* Qs, const float* w_s, const float* qk_s, long long t0,
                                          int n, int j, int hk, int HV, int HK, int tid, int nthreads) {
    constexpr int QPR = DK / 4;  // 16-byte chunks per row
    for (int e = tid; e < n * QPR; e += nthreads) {
        const int r = e / QPR, q = e % QPR, d = sc_stage_off<float, DK>(q, r);
        cp_async_f4(Ws + r * DK + d, w_s + ((t0 + r) * HV + j) * DK + 4 * q);
        cp_async_f4(Qs + r * DK + d, qk_s + ((t0 + r) * HK + hk) * 2 * DK + 4 * q);
    }
}

// ws += W S and qs += Q S for the warp's chunk rows r0, r0 + 1 (C rows g, g+8; rows past the chunk read as zero)
// and its NTW column tiles nb .. nb + NTW − 1 (ws[i]: tile nb + i; KU: the 16-block loop's unrolling); WS / QS
// false: that product is skipped (gdn_state_split.cuh: W S in the state pass, Q S in the output pass). Each
// accumulator sees the same mmas in the same order whichever products, tiles, unrolling and warp count.
// SWZ: the rows are staged ones (gsm_stage), chunk q of the row at q ^ sw.
// SC: the scratch element type (gdn_scratch.cuh; given, never deduced: the rows a product skips are nullptr).
template <int DK, int DVS, bool WS = true, bool QS = true, int NTW = DVS / 8, int KU = DK / 16, bool SWZ = false,
          typename SC = float>
__device__ __forceinline__ void gsm_ws_qs(const sc_t<SC>* wr0, const sc_t<SC>* wr1, const sc_t<SC>* qr0,
                                          const sc_t<SC>* qr1, bool v0, bool v1, const float* Sf, float (&ws)[NTW][4],
                                          float (&qs)[NTW][4], int lane, int nb = 0, int sw = 0) {
    constexpr int NTN = DVS / 8;
    const int t = lane & 3;
#pragma unroll 1
    for (int k0 = 0; k0 < DK / 16; k0 += KU)
#pragma unroll
        for (int kb = k0; kb < k0 + KU; ++kb) {
            const int d = SWZ ? sc_swz_off<SC>(kb, t, sw) : 16 * kb + 4 * t;
            Tf32A aw[2], aq[2];
            if constexpr (WS) {
                const float4 w0 = sc_ld4(wr0 + d, v0), w1 = sc_ld4(wr1 + d, v1);
                aw[0] = sc_a<SC>(w0.x, w1.x, w0.y, w1.y);
                aw[1] = sc_a<SC>(w0.z, w1.z, w0.w, w1.w);
            }
            if constexpr (QS) {
                const float4 q0 = sc_ld4(qr0 + d, v0), q1 = sc_ld4(qr1 + d, v1);
                aq[0] = sc_a<SC>(q0.x, q1.x, q0.y, q1.y);
                aq[1] = sc_a<SC>(q0.z, q1.z, q0.w, q1.w);
            }
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int nt = 0; nt < NTW; ++nt) {
                    const float4 b =
                        *reinterpret_cast<const float4*>(Sf + (((kb * 2 + s) * NTN + nb + nt) * 32 + lane) * 4);
                    if constexpr (WS) sc_mma3<SC>(ws[nt], aw[s], b.x, b.y, b.z, b.w);
                    if constexpr (QS) sc_mma3<SC>(qs[nt], aq[s], b.x, b.y, b.z, b.w);
                }
        }
}

// out += A V' over the 16-blocks kb <= rt (the warp's row tile) that start inside the chunk (A rows ar0, ar1 =
// chunk rows r0, r0 + 1), for the column tiles nb .. nb + NTW − 1 as gsm_ws_qs
template <int DVS, int NTW = DVS / 8, int AU = GC_CHUNK / 16, typename SC = float>
__device__ __forceinline__ void gsm_attn(const sc_t<SC>* ar0, const sc_t<SC>* ar1, bool v0, bool v1, const float* Vf,
                                         float (&out)[NTW][4], int rt, int n, int lane, int nb = 0) {
    constexpr int NTN = DVS / 8;
    const int t = lane & 3;
#pragma unroll 1
    for (int k0 = 0; k0 < GC_CHUNK / 16; k0 += AU)
#pragma unroll
        for (int kb = k0; kb < k0 + AU; ++kb) {
            if (kb > rt || 16 * kb >= n) break;
            const float4 x0 = sc_ld4(ar0 + 16 * kb + 4 * t, v0), x1 = sc_ld4(ar1 + 16 * kb + 4 * t, v1);
            const Tf32A a[2] = {sc_a<SC>(x0.x, x1.x, x0.y, x1.y), sc_a<SC>(x0.z, x1.z, x0.w, x1.w)};
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int nt = 0; nt < NTW; ++nt) {
                    const float4 b =
                        *reinterpret_cast<const float4*>(Vf + (((kb * 2 + s) * NTN + nb + nt) * 32 + lane) * 4);
                    sc_mma3<SC>(out[nt], a[s], b.x, b.y, b.z, b.w);
                }
        }
}

// acc += (diag(tail) K)ᵀ V' for the warp's state tiles: A = Kᵀ (rows: key dims 16mt + 2g, +1; k: the chunk's
// tokens, zero past n), k rows read from the scratch qk section (kr: the chunk's first row's k, row stride ldk)
template <int DK, int DVS, int NWARP = 4, typename L = GdnStateMmaSmem<DK, DVS, NWARP>, typename SC = float>
__device__ __forceinline__ void gsm_update(const sc_t<SC>* kr, long long ldk, const float* tail, const float* Vf,
                                           float (&acc)[L::MW][L::NW][4], int mt0, int nt0, int n, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll 1
    for (int k0 = 0; k0 < GC_CHUNK / 16; k0 += L::U_UP)
#pragma unroll
        for (int kb = k0; kb < k0 + L::U_UP; ++kb) {
            if (16 * kb >= n) break;
            float2 k2[L::MW][4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int i = 16 * kb + 4 * t + u;
                const float tl = i < n ? tail[i] : 0.f;
#pragma unroll
                for (int mi = 0; mi < L::MW; ++mi) {
                    float2 k = make_float2(0.f, 0.f);
                    if (i < n) k = sc_ld2(kr + i * ldk + 16 * (mt0 + mi) + 2 * g);
                    k2[mi][u] = make_float2(k.x * tl, k.y * tl);
                }
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

// e^γ and the tails e^{γ_n−γ} of the chunk at t0 (n tokens) into eg, tail (threads tid < n)
__device__ __forceinline__ void gsm_gates(const float* g_s, int HV, int j, int t0, int n, float* eg, float* tail,
                                          int tid) {
    if (tid < n) {
        const float gi = g_s[(long long)(t0 + tid) * HV + j], gl = g_s[(long long)(t0 + n - 1) * HV + j];
        eg[tid] = expf(gi);
        tail[tid] = expf(gl - gi);
    }
}

// The warp's state tiles (rows 16mt + 2g (c0, c1) and + 1 (c2, c3), columns 8nt + 2t, + 1) from / to the state
// rows st (DV floats apart; columns past DV read as zero and are not stored), and as split B fragments into Sf
template <int DK, int DVS, int NWARP = 4, typename L = GdnStateMmaSmem<DK, DVS, NWARP>, typename S>
__device__ __forceinline__ void gsm_state_load(const S* st, float (&sreg)[L::MW][L::NW][4], bool owns, int mt0,
                                               int nt0, int c0, int DV, int g, int t) {
#pragma unroll
    for (int mi = 0; mi < L::MW; ++mi)
#pragma unroll
        for (int ni = 0; ni < L::NW; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int d = 16 * (mt0 + mi) + 2 * g + (e >> 1), c = 8 * (nt0 + ni) + 2 * t + (e & 1);
                sreg[mi][ni][e] = owns && c0 + c < DV ? st_load(st + (long long)d * DV + c) : 0.f;
            }
}
template <int DK, int DVS, int NWARP = 4, bool LANE_ORDER = false, typename L = GdnStateMmaSmem<DK, DVS, NWARP>>
__device__ __forceinline__ void gsm_state_put(float* Sf, const float (&sreg)[L::MW][L::NW][4], int mt0, int nt0,
                                              int g, int t) {
#pragma unroll
    for (int mi = 0; mi < L::MW; ++mi)
#pragma unroll
        for (int ni = 0; ni < L::NW; ++ni)
            gsm_put_block<L::NTN, LANE_ORDER>(Sf, 16 * (mt0 + mi) + 2 * g, 8 * (nt0 + ni) + 2 * t, sreg[mi][ni][0],
                                              sreg[mi][ni][1], sreg[mi][ni][2], sreg[mi][ni][3]);
}
template <int DK, int DVS, int NWARP = 4, typename L = GdnStateMmaSmem<DK, DVS, NWARP>, typename S>
__device__ __forceinline__ void gsm_state_store(S* st, const float (&sreg)[L::MW][L::NW][4], int mt0, int nt0,
                                                int c0, int DV, int g, int t) {
#pragma unroll
    for (int mi = 0; mi < L::MW; ++mi)
#pragma unroll
        for (int ni = 0; ni < L::NW; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int d = 16 * (mt0 + mi) + 2 * g + (e >> 1), c = 8 * (nt0 + ni) + 2 * t + (e & 1);
                if (c0 + c < DV) st_store(st + (long long)d * DV + c, sreg[mi][ni][e]);
            }
}

// ptxas (nvcc 13.0, sm_90a), 4 warps: 140 registers at DK = 128 with 16 columns, 174 with 32; 79-164 for the smaller
// heads; no spills. A minimum of 3 blocks per SM only at DK = 16 (the tiny test model's heads: without it 8 bytes
// spill); elsewhere none (0): with 3 the larger heads spill, with 1 they take 255 registers and spill too. 8 warps:
// a minimum of 2 blocks (at most 128 registers: two blocks of 256 threads per SM) at DK = 128 (122 registers with
// 16 columns, 124 with 32) and 16 (96, 124-126); 1 at DK = 32 and 64 (104-134; with 2 they spill 8-16 bytes).
template <typename T, typename S, int DK, int DVS, int NWARP = 4, bool STG = false>
__global__ void __launch_bounds__(32 * NWARP, NWARP == 8 ? (DK == 32 || DK == 64 ? 1 : 2) : DK == 16 ? 3 : 0)
    gdn_chunk_state_mma(const float* __restrict__ qk_s, const float* __restrict__ w_s, const float* __restrict__ a_s,
                        const float* __restrict__ u_s, const float* __restrict__ g_s, S* __restrict__ state,
                        T* __restrict__ o, const int* __restrict__ starts, const int* __restrict__ slots, int HK,
                        int HV, int DV, long long ldo) {
    pdl_trigger();
    constexpr int C = GC_CHUNK;
    using L = GdnStateMmaSmem<DK, DVS, NWARP>;
    constexpr int NTN = L::NTN, NTW = L::NTW, MW = L::MW, NW = L::NW;
    extern __shared__ float smem[];  // dynamic: starts 16-byte aligned (no static shared memory)
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (STG ? L::STAGED : L::FLOATS) * sizeof(float)) __trap();
    }
    float *Sf = smem, *Vf = Sf + L::SF, *gate = Vf + L::VF;  // gate: [chunk parity][e^γ (C), tail (C)]
    float *Ws = gate + 4 * C, *Qs = Ws + C * DK;              // STG: the chunk's W and Q rows
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
    const int rt = NWARP == 4 ? w : w & 3, nb = NWARP == 4 ? 0 : (w >> 2) * NTW;  // row tile, first column tile
    const int j = blockIdx.y, b = blockIdx.x, hk = j / (HV / HK), c0 = blockIdx.z * DVS;
    const int mt0 = (w / L::WPM) * MW, nt0 = (w % L::WPM) * NW;
    const bool owns = nt0 < NTN;  // DK = 16 (and DK = 32 at 16 columns with 8 warps): some warps own no state tile
    S* st = state + (((long long)slots[b] * HV + j) * DK) * DV + c0;
    float sreg[MW][NW][4];  // the warp's state tiles
    gsm_state_load<DK, DVS, NWARP>(st, sreg, owns, mt0, nt0, c0, DV, g, t);
    const int t_beg = starts[b], t_end = starts[b + 1];
    const long long ldq = 2LL * HK * DK;  // qk scratch row stride
    if (owns) gsm_state_put<DK, DVS, NWARP>(Sf, sreg, mt0, nt0, g, t);
    if (t_beg < t_end) gsm_gates(g_s, HV, j, t_beg, min(C, t_end - t_beg), gate, gate + C, tid);
    if (STG && t_beg < t_end)
        gsm_stage<DK>(Ws, Qs, w_s, qk_s, t_beg, min(C, t_end - t_beg), j, hk, HV, HK, tid, 32 * NWARP);
    int par = 0;
    for (int t0 = t_beg; t0 < t_end; t0 += C, par ^= 1) {
        const int n = min(C, t_end - t0), r0 = 16 * rt + 2 * g;  // the thread's chunk rows r0, r0 + 1
        const bool v0 = r0 < n, v1 = r0 + 1 < n;
        const float *eg = gate + 2 * C * par, *tail = eg + C;
        if (STG) cp_async_f4_wait();  // this thread's copies of the chunk's W and Q rows landed
        __syncthreads();  // S fragments, this chunk's gates (STG: W and Q rows) written; last chunk's V' read
        gc_hint_next_chunk<DK>(qk_s, w_s, a_s, u_s, t0, t_end, hk, j, HK, HV, DV, c0, tid, 32 * NWARP);
        // rows past the chunk are neither read nor used: their pointers stay at row 0 of the chunk
        const long long q0 = (long long)(t0 + (v0 ? r0 : 0)), q1 = (long long)(t0 + (v1 ? r0 + 1 : 0));
        float ws[NTW][4] = {}, out[NTW][4] = {};
        if constexpr (STG) {
            const int s0 = v0 ? r0 : 0, s1 = v1 ? r0 + 1 : 0;
            gsm_ws_qs<DK, DVS, true, true, NTW, L::U_WQ, true>(Ws + s0 * DK, Ws + s1 * DK, Qs + s0 * DK,
                                                               Qs + s1 * DK, v0, v1, Sf, ws, out, lane, nb,
                                                               sc_swz<float, DK>(r0));
        } else {
            gsm_ws_qs<DK, DVS, true, true, NTW, L::U_WQ>(w_s + (q0 * HV + j) * DK, w_s + (q1 * HV + j) * DK,
                                                         qk_s + (q0 * HK + hk) * 2 * DK,
                                                         qk_s + (q1 * HK + hk) * 2 * DK, v0, v1, Sf, ws, out, lane,
                                                         nb);
        }
        // V' = U − W S (zero past the chunk and past DV) into its fragments; out = e^γ Q S
        const float e0 = v0 ? eg[r0] : 0.f, e1 = v1 ? eg[r0 + 1] : 0.f;
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt) {
            float vp[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 8 * (nb + nt) + 2 * t + (e & 1);
                const bool ok = (e >> 1 ? v1 : v0) && c0 + c < DV;
                vp[e] = ok ? u_s[((e >> 1 ? q1 : q0) * HV + j) * DV + c0 + c] - ws[nt][e] : 0.f;
                out[nt][e] *= e >> 1 ? e1 : e0;
            }
            gsm_put_block<NTN>(Vf, r0, 8 * (nb + nt) + 2 * t, vp[0], vp[1], vp[2], vp[3]);
        }
        __syncthreads();  // V' complete; S fragments (STG: W and Q rows) read by all
        // STG: the next chunk's W and Q rows, landing while this chunk's A V' and update run
        if (STG && t0 + C < t_end)
            gsm_stage<DK>(Ws, Qs, w_s, qk_s, t0 + C, min(C, t_end - t0 - C), j, hk, HV, HK, tid, 32 * NWARP);
        gsm_attn<DVS, NTW, L::U_AV>(a_s + (q0 * HV + j) * C, a_s + (q1 * HV + j) * C, v0, v1, Vf, out, rt, n, lane,
                                    nb);
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = c0 + 8 * (nb + nt) + 2 * t + (e & 1);
                if ((e >> 1 ? v1 : v0) && c < DV)
                    o[(e >> 1 ? q1 : q0) * ldo + (long long)j * DV + c] = from_f<T>(out[nt][e]);
            }
        // S ← e^{γ_n} S + (diag(tail) K)ᵀ V', back into the fragments for the next chunk
        if (owns) {
            float acc[MW][NW][4] = {};
            gsm_update<DK, DVS, NWARP>(qk_s + ((long long)t0 * HK + hk) * 2 * DK + DK, ldq, tail, Vf, acc, mt0, nt0,
                                       n, lane);
            const float elast = eg[n - 1];
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int ni = 0; ni < NW; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sreg[mi][ni][e] = fmaf(sreg[mi][ni][e], elast, acc[mi][ni][e]);
            gsm_state_put<DK, DVS, NWARP>(Sf, sreg, mt0, nt0, g, t);
        }
        if (t0 + C < t_end) gsm_gates(g_s, HV, j, t0 + C, min(C, t_end - t0 - C), gate + 2 * C * (par ^ 1),
                                      gate + 2 * C * (par ^ 1) + C, tid);
    }
    if (owns) gsm_state_store<DK, DVS, NWARP>(st, sreg, mt0, nt0, c0, DV, g, t);
}
