// Exact token-by-token Gated DeltaNet recurrence (docs/model-math.md §4.5) with coalesced state access, optionally
// fused with the causal conv of the token, and the fused decode epilogue (gated RMSNorm + q/k conv-state update).
//
// Per value head j (QK head j / ratio), state S[DK, DV] fp32 in registers (stored as S-type between calls):
//   q, k <- l2norm (eps 1e-6), q /= sqrt(DK); beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)
//   S <- e^g S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
//
// Layout (gdn_step): one block per (sequence b, value head j, tile of CT = 32 value columns); lane l owns column
// c0 + l, warp w the RPW = 16 state rows 16w .. 16w+15 (DK / 16 warps). A warp-wide state load is one 128-byte
// (fp32) or 64-byte (bf16) run of a state row, every load of a thread is issued before the first use, and the
// 27B's decode step (HV 48, DV 128) runs 192 blocks per sequence (132 SMs). S^T k and S^T q: each lane sums its
// 16 rows in row order, then every column adds the DK / 16 warp partials in warp order through shared memory. The
// order depends only on DK, never on the launch: a sequence's result is the same alone or with others, and a
// token gives the same bits whether it is one of a multi-token segment (exact prefill) or a decode call of its
// own (fp32 state; a bf16 state is rounded on store, i.e. once per call, as the reference runner rounds it).
//
// SNAPSHOTS (nsnap != 0, speculative verify, docs/speculative.md): before token t of sequence b the block stores the
// state it holds (the state after tokens t0..t-1) into state slot snap[b] + (t - t0), and with CONV the conv window
// of its v channels likewise (gdn_step_post stores the q/k channels'). Stores only: the arithmetic, and so every
// output and the final state, is the same bits with or without them.
//
// POST (CONV and cnt != null: gdn_decode's single launch, variant "counter"): gdn_step_post's epilogue runs in this
// launch. The last of a value head's column tiles to arrive (a counter per (sequence, value head)) applies the gated
// RMSNorm to the head's rows of the sequence, o -> y (gated_norm_row, one warp per row); the last of a QK head's
// readers (a counter per (sequence, QK head)) stores the q/k conv windows it holds, the same values gdn_step_post
// recomputes from the raw inputs; with snapshots, the QK head's first reader (j % ratio == 0, tile 0) stores the q/k
// windows before each token. o has no __restrict__: y may be o (in place, as gdn_decode runs it).
//
// CLUSTER (gdn_step_cl, gdn_decode's default for DV <= 128): the same work, the 4 column tiles of a (sequence,
// value head) one thread-block cluster. Warp 0 of each tile pushes its o row (rounded to T, as stored) into every
// tile's shared memory and arrives on every tile's mbarrier; each tile then sums o^2 over the head in gated_norm_row's
// order and writes its own columns of y: no o store, no counter, no re-read. The per-token arithmetic is gdn_step's
// (the shared gdn_stage_x / gdn_token, gated_norm.cuh's gated_norm_inv / gated_norm_y): outputs and states are the
// bits of the counter epilogue and of the three separate kernels. Critical path of a decode call after pdl_wait
// (the kernel ahead is the in-projection GEMV):
//   counter: slots/starts load -> state, conv state, conv taps, gates, qkv loads -> recurrence (barriers A, B, C) ->
//            o and state stores, __threadfence, two atomics -> __syncthreads, __threadfence -> o, z, norm weight
//            loads by the last tile -> norm -> y store: 4 dependent global round trips, 2 fences;
//   cluster: state (L2-hinted), conv windows (L2-hinted), qkv, a, b, z loads -> recurrence (barriers A, B, C) ->
//            DSMEM push + mbarrier wait -> norm -> y store: 1 global round trip. starts, slots, snap and the weights
//            are read before pdl_wait; the q/k counter's atomic is issued after barrier (A) and only read at the end.
//
// CONV (gdn_decode): qkv holds the raw in_proj_qkv rows; the block convolves the q and k channels of QK head hk and
// the v channels of its tile itself (conv_token, rounded to T as causal_conv stores them, so the result equals
// causal_conv + gdn_recurrent bitwise). The q/k channels are read by the ratio * tiles blocks of a QK head at
// once, so none of them may write those channels' conv state: gdn_step_post does it after this launch; the v
// channels belong to one block, which writes them back. Without CONV, qkv holds the conv output (gdn_recurrent).
#include "cluster.cuh"
#include "gated_norm.cuh"
#include "gdn_common.cuh"

template <int DK> struct GdnStep {
    static constexpr int RPW = 16;                   // state rows per warp
    static constexpr int NW = DK / RPW;              // warps per block
    static constexpr int NT = 32 * NW;               // threads per block
    static constexpr int CT = 32;                    // value columns per block (lane = column)
    static constexpr int NCH = 2 * DK + CT;          // channels per token: q, k of the QK head, v of the tile
    static constexpr int CPT = (NCH + NT - 1) / NT;  // channels per thread
    static constexpr int FLOATS = NCH + 2 * NW * CT; // shared memory: x | S^T k partials | S^T q partials
    static_assert(DK % RPW == 0, "DK must be a multiple of 16");
};

// Channel u of this thread: ch = tid + NT u of [q (DK) | k (DK) | v tile (CT) from column c0] -> its global channel
// (-1: none)
template <int DK, int CPT = GdnStep<DK>::CPT>
__device__ __forceinline__ void gdn_channels(int (&g)[CPT], int tid, int hk, int HK, int j, int DV, int c0) {
    constexpr int NT = GdnStep<DK>::NT, NCH = GdnStep<DK>::NCH;
#pragma unroll
    for (int u = 0; u < CPT; ++u) {
        const int ch = tid + NT * u;
        g[u] = ch < DK ? hk * DK + ch
             : ch < 2 * DK ? HK * DK + hk * DK + (ch - DK)
             : (ch < NCH && c0 + ch - 2 * DK < DV) ? 2 * HK * DK + j * DV + c0 + (ch - 2 * DK)
                                                  : -1;
    }
}

// The conv windows of this thread's channels ch in [lo, hi) (of the block's, gdn_channels) into conv-state slot sl
template <int DK, int CPT = GdnStep<DK>::CPT>
__device__ __forceinline__ void gdn_store_windows(float* conv_state, long long sl, int C, const int (&g)[CPT],
                                                  const float (&win)[CPT][GDN_KW - 1], int tid, int lo, int hi) {
#pragma unroll
    for (int u = 0; u < CPT; ++u) {
        const int ch = tid + GdnStep<DK>::NT * u;
        if (ch >= lo && ch < hi && g[u] >= 0)
#pragma unroll
            for (int e = 0; e < GDN_KW - 1; ++e) conv_state[(sl * C + g[u]) * (GDN_KW - 1) + e] = win[u][e];
    }
}

// This thread's state rows (RPW of them, DV apart from p) stored, where its column is live
template <typename S, int DK>
__device__ __forceinline__ void gdn_store_rows(S* p, int DV, bool live, const float (&s)[GdnStep<DK>::RPW]) {
#pragma unroll
    for (int r = 0; r < GdnStep<DK>::RPW; ++r)
        if (live) st_store(p + (long long)r * DV, s[r]);
}

// x of one token into shared memory: thread tid's channels ch = tid + NT*u of [q | k | v tile] (global channel g[u],
// -1: none, stored as 0), with CONV convolved (conv_token, rounded to T as causal_conv stores it; win slides)
template <typename T, int DK, bool CONV, int CPT = GdnStep<DK>::CPT>
__device__ __forceinline__ void gdn_stage_x(float* xs, const float (&xc)[CPT], float (&win)[CPT][GDN_KW - 1],
                                            const float (&wc)[CPT][GDN_KW], const int (&g)[CPT], int tid) {
    using G = GdnStep<DK>;
#pragma unroll
    for (int u = 0; u < CPT; ++u) {
        const int ch = tid + G::NT * u;
        if (ch >= G::NCH) continue;
        float y = xc[u];
        if (CONV) y = to_f(from_f<T>(conv_token<GDN_KW>(win[u], wc[u], xc[u])));  // causal_conv's rounding
        xs[ch] = g[u] >= 0 ? y : 0.f;
    }
}

// One token of the recurrence on this thread's 16 state rows of its column, after barrier (A) (x in xs): l2 norms,
// decay, S^T k (barrier B), delta, the update, S^T q (barrier C). Returns o of the lane's column where `sum` (the
// DK / 16 warp partials summed in warp order; elsewhere 0). Every read of xs and pkv is done at return.
template <int DK>
__device__ __forceinline__ float gdn_token(float (&s)[GdnStep<DK>::RPW], const float* xs, float* pkv, float* pout,
                                           float beta, float decay, float qscale, int lane, int warp, bool sum) {
    using G = GdnStep<DK>;
    constexpr int RPW = G::RPW, NW = G::NW, CT = G::CT, R32 = (DK + 31) / 32;
    // l2 norms: every warp computes both, in the lane order of the chunked kernel's l2norm
    float qq = 0.f, kk = 0.f;
#pragma unroll
    for (int r = 0; r < R32; ++r) {
        const int d = lane + 32 * r;
        const float qv = d < DK ? xs[d] : 0.f, kv = d < DK ? xs[DK + d] : 0.f;
        qq = fmaf(qv, qv, qq);
        kk = fmaf(kv, kv, kk);
    }
    const float qn = qscale / sqrtf(warp_sum(qq) + 1e-6f), kn = 1.f / sqrtf(warp_sum(kk) + 1e-6f);
    const float *kw = xs + DK + warp * RPW, *qw = xs + warp * RPW;  // this warp's rows (broadcast reads)
    float kv = 0.f;
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
        s[r] *= decay;
        kv = fmaf(s[r], kw[r] * kn, kv);
    }
    pkv[warp * CT + lane] = kv;
    __syncthreads();  // (B) S^T k partials
    float kvs = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) kvs += pkv[w * CT + lane];
    const float delta = beta * (xs[2 * DK + lane] - kvs);
    float out = 0.f;
#pragma unroll
    for (int r = 0; r < RPW; ++r) {  // k, q re-read (not held: 32 registers fewer), the same products
        s[r] = fmaf(kw[r] * kn, delta, s[r]);
        out = fmaf(s[r], qw[r] * qn, out);
    }
    pout[warp * CT + lane] = out;
    __syncthreads();  // (C) S^T q partials; every read of xs and pkv of token t is done
    float os = 0.f;
    if (sum)
#pragma unroll
        for (int w = 0; w < NW; ++w) os += pout[w * CT + lane];
    return os;
}

// Resident blocks per SM asked of the CONV instances (gdn_decode's counter kernel: 5-8 sequences per call, where the
// grid is ~4 waves of 1536 blocks for the 27B): 4 (64 registers, ~44 bytes of spills) instead of the 3 that 80
// registers allow. Measured at 095ac79 (H200, perf/bench_gdn_decode.py, perf/results/device_run_095ac79.txt): 8
// sequences 27.05 -> 25.01 us (fp32 state), 22.76 -> 21.52 (bf16); one sequence 6.18 -> 7.66, which the cluster
// kernel serves instead. The CONV=false instances (exact prefill segments, gdn_recurrent) keep the compiler's
// choice: 4 blocks measured the same there. Registers only: the same arithmetic, the same bits.
constexpr int GDN_STEP_CONV_MIN_BLOCKS = 4;

// qkv: rows [q (HK*DK) | k (HK*DK) | v (HV*DV)] (raw with CONV, convolved without); a, b: [T, HV]; o: [T, HV*DV];
// convw [C, 4], conv_state [slots, C, 3] (only read/written with CONV).
template <typename T, typename S, int DK, bool CONV>
__global__ void __launch_bounds__(GdnStep<DK>::NT, CONV ? GDN_STEP_CONV_MIN_BLOCKS : 1)
    gdn_step(const T* __restrict__ qkv, const float* __restrict__ convw, float* __restrict__ conv_state,
             const T* __restrict__ a, const T* __restrict__ bb, const float* __restrict__ A_log,
             const float* __restrict__ dt_bias, S* __restrict__ state, T* o,
             const int* __restrict__ starts, const int* __restrict__ slots, int HK, int HV, int DV, long long ldqkv,
             long long lda, long long ldb, long long ldo, const int* __restrict__ snap, int nsnap,
             int* __restrict__ cnt, const T* __restrict__ z, const float* __restrict__ nw, T* y, long long ldz,
             long long ldy, float eps) {
    pdl_trigger();
    using G = GdnStep<DK>;
    constexpr int RPW = G::RPW, NW = G::NW, NT = G::NT, CT = G::CT, NCH = G::NCH, CPT = G::CPT;
    extern __shared__ float smem[];
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < G::FLOATS * sizeof(float)) __trap();
    }
    const int b = blockIdx.x, j = blockIdx.y, c0 = blockIdx.z * CT, hk = j / (HV / HK);
    // POST (CONV with cnt): the epilogue runs here (see the end); the first reader of QK head hk snapshots its q/k
    // conv windows (any one block may: nothing in this launch reads the snapshot slots)
    const bool post = CONV && cnt != nullptr, qk_snap = post && j % (HV / HK) == 0 && blockIdx.z == 0;
    // No early exit for an empty segment (t0 == t1: nothing is read past the rows, nothing stored): the slot and
    // state loads then issue together with the starts loads instead of after a branch on them.
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, col = c0 + lane;
    const bool live = col < DV;
    // Launched with PDL inside decode graphs (ninfer/cuda/gdn_step.py): while the kernel ahead (the in-projection GEMV)
    // ends, lane r < 16 of each warp hints its state row r (this block's 32 columns: 128 bytes) into the L2, then
    // every read below waits for it. A hint never changes a value (the L2 is coherent), so the slot read for it
    // needs no ordering; the loads that count come after pdl_wait.
#ifdef __CUDA_ARCH__
    if (lane < RPW) {
        const S* hint = state + (((long long)slots[b] * HV + j) * DK + warp * RPW + lane) * (long long)DV + min(c0, DV - 1);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(hint));
    }
#endif
    pdl_wait();
    const long long slot = slots[b];
    const int t0 = starts[b], t1 = starts[b + 1];
    float *xs = smem, *pkv = xs + NCH, *pout = pkv + NW * CT;
    // State loads first (the longest latency, independent of everything below) and unconditional: a lane past DV
    // reads column DV-1 and never stores; its column's sums are its own, so they reach no live lane.
    S* st = state + ((slot * HV + j) * DK + warp * RPW) * (long long)DV + min(col, DV - 1);
    float s[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) s[r] = st_load(st + (long long)r * DV);

    // channels of this thread: ch = tid + NT*u of [q (DK) | k (DK) | v tile (CT)] -> global channel g[u] (-1: none)
    const int C = 2 * HK * DK + HV * DV;
    int g[CPT];
    gdn_channels<DK>(g, tid, hk, HK, j, DV, c0);
    float win[CPT][GDN_KW - 1], wc[CPT][GDN_KW];
    if (CONV) {
#pragma unroll
        for (int u = 0; u < CPT; ++u)
#pragma unroll
            for (int e = 0; e < GDN_KW; ++e) {
                if (e < GDN_KW - 1) win[u][e] = g[u] >= 0 ? conv_state[(slot * C + g[u]) * (GDN_KW - 1) + e] : 0.f;
                wc[u][e] = g[u] >= 0 ? convw[(long long)g[u] * GDN_KW + e] : 0.f;
            }
    }
    const float negA = -expf(A_log[j]), dtb = dt_bias[j], qscale = 1.f / sqrtf((float)DK);
    // the next token's inputs are loaded one token ahead (exact prefill runs many tokens per block)
    const bool any = t0 < t1;  // block-uniform
    float xn[CPT], an = 0.f, bn = 0.f;
    if (any) {
        an = to_f(a[(long long)t0 * lda + j]);
        bn = to_f(bb[(long long)t0 * ldb + j]);
    }
#pragma unroll
    for (int u = 0; u < CPT; ++u) xn[u] = any && g[u] >= 0 ? to_f(qkv[(long long)t0 * ldqkv + g[u]]) : 0.f;

    for (int t = t0; t < t1; ++t) {
        if (nsnap) {  // snapshot: the state before token t into slot snap[b] + (t - t0) (block-uniform branch)
            const long long ss = (long long)snap[b] + (t - t0);
            gdn_store_rows<S, DK>(state + ((ss * HV + j) * DK + warp * RPW) * (long long)DV + min(col, DV - 1), DV,
                                  live, s);
            if (CONV)  // the v channels of this tile (the q/k channels: gdn_step_post, or qk_snap's block)
                gdn_store_windows<DK>(conv_state, ss, C, g, win, tid, qk_snap ? 0 : 2 * DK, NCH);
        }
        float xc[CPT];
#pragma unroll
        for (int u = 0; u < CPT; ++u) xc[u] = xn[u];
        const float ac = an, bc = bn;
        if (t + 1 < t1) {
#pragma unroll
            for (int u = 0; u < CPT; ++u) xn[u] = g[u] >= 0 ? to_f(qkv[(long long)(t + 1) * ldqkv + g[u]]) : 0.f;
            an = to_f(a[(long long)(t + 1) * lda + j]);
            bn = to_f(bb[(long long)(t + 1) * ldb + j]);
        }
        gdn_stage_x<T, DK, CONV>(xs, xc, win, wc, g, tid);
        float beta, decay;
        gdn_gate(ac, bc, negA, dtb, beta, decay);
        __syncthreads();  // (A) x of token t in shared memory
        const bool sum = warp == 0 && live;
        const float os = gdn_token<DK>(s, xs, pkv, pout, beta, decay, qscale, lane, warp, sum);  // barriers (B), (C)
        if (sum) o[(long long)t * ldo + (long long)j * DV + col] = from_f<T>(os);
    }
    if (!any) return;  // block-uniform, and the same for every block of sequence b: its counters stay untouched
    gdn_store_rows<S, DK>(st, DV, live, s);
    if (CONV) gdn_store_windows<DK>(conv_state, slot, C, g, win, tid, 2 * DK, NCH);
    if (!post) return;
    // The decode epilogue in this launch (gdn_step_post's work, the same bits): the last of the value head's
    // column tiles to arrive norms the head's rows, the last of the QK head's readers stores its q/k conv windows.
    // Every block arrives (after its own o, state and v-window stores), then the counters reset themselves.
    int* const gs_last = reinterpret_cast<int*>(smem);  // x's first words: every read of x ended at barrier (C)
    int* const cnt_o = cnt + (long long)b * (HV + HK) + j;        // gridDim.z tiles write o(j)
    int* const cnt_qk = cnt + (long long)b * (HV + HK) + HV + hk;  // (HV / HK) * gridDim.z blocks read q/k(hk)
    __syncthreads();
    if (tid == 0) {
        __threadfence();  // this block's stores before its arrival
        gs_last[0] = atomicAdd(cnt_o, 1) == (int)gridDim.z - 1;
        gs_last[1] = atomicAdd(cnt_qk, 1) == (HV / HK) * (int)gridDim.z - 1;
    }
    __syncthreads();
    if (gs_last[0]) {
        __threadfence();  // the other tiles' o stores, seen after their arrivals
        for (int t = t0 + warp; t < t1; t += NW)  // one warp per row, as gdn_step_post
            gated_norm_row(o + (long long)t * ldo + (long long)j * DV, z + (long long)t * ldz + (long long)j * DV, nw,
                           y + (long long)t * ldy + (long long)j * DV, DV, eps, lane);
        if (tid == 0) *cnt_o = 0;
    }
    if (gs_last[1]) {  // every reader of these conv windows has read them (they arrived after their reads)
        gdn_store_windows<DK>(conv_state, slot, C, g, win, tid, 0, 2 * DK);
        if (tid == 0) *cnt_qk = 0;
    }
}

constexpr int GDN_CL = 4;  // gdn_step_cl: column tiles per cluster, so value heads of up to 4 * 32 columns

// gdn_step_cl's shared memory (floats): 2 mbarriers (by token parity) | flag | pad | o exchange [2][GDN_CL][CT] |
// gdn_step's x and partials
template <int DK> struct GdnStepCl {
    static constexpr int OX = 8, XS = OX + 2 * GDN_CL * GdnStep<DK>::CT;
    static constexpr int FLOATS = XS + GdnStep<DK>::FLOATS;
};

// The gated norm of token i's o row of value head j (o of this lane's column ov, as stored: rounded to T; 0 past DV)
// by warp 0 of every tile of the cluster: ov into slot [i & 1][tile][lane] of every tile's exchange, an arrival on
// every tile's mbarrier i & 1, then the lane sums o^2 over the tiles' columns lane, lane + 32, ... in tile order
// (gated_norm_row's order: the same bits) and y = gated_norm_y. Double buffers suffice: a tile writes slot / mbarrier
// i & 1 again at token i + 2 after its wait of token i + 1, which needs every tile's arrival of token i + 1, which
// each tile makes after its reads of token i.
template <typename T>
__device__ __forceinline__ void gdn_cl_norm(float* ox, unsigned long long* bar, int i, int tile, int lane, float ov,
                                            float zc, float nwc, T* yp, bool live, int DV, float eps) {
    constexpr int CT = 32;
    float* const slot = ox + (i & 1) * GDN_CL * CT;
#pragma unroll
    for (int r = 0; r < GDN_CL; ++r) st_cluster(slot + tile * CT + lane, r, ov);
#pragma unroll
    for (int r = 0; r < GDN_CL; ++r) mbar_arrive_cluster(bar + (i & 1), r);
    mbar_wait_cluster(bar + (i & 1), (i >> 1) & 1);
    float ss = 0.f;
#pragma unroll
    for (int r = 0; r < GDN_CL; ++r) {
        const float v = slot[r * CT + lane];
        ss = fmaf(v, v, ss);
    }
    const float inv = gated_norm_inv(ss, DV, eps);
    if (live) *yp = from_f<T>(gated_norm_y(ov, inv, nwc, zc));
}

// One (sequence, value head) item's inputs besides its state slice: segment, state slot, channels, conv windows
// and taps, gates and the first token's x (gdn_step_cl loads them around its pdl_wait, gdn_step_clp a whole item
// ahead)
template <int CPT> struct GdnClItem {
    long long slot;
    int t0, t1, j, g[CPT];
    float negA, dtb, an, bn, zn, xn[CPT], win[CPT][GDN_KW - 1], wc[CPT][GDN_KW];
};

// Item (b, it.j) of gdn_step_cl / gdn_step_clp on this block's column tile, its state slice in s: every token of
// the segment (the next token's inputs loaded one token ahead; barriers A, B, C; the gated norm through the
// cluster's exchange), the final state and v windows, and the q/k windows by their last reader. n: the tokens this
// cluster ran before (the mbarriers' parity, gdn_cl_norm). Returns the tokens run (cluster-uniform).
template <typename T, typename S, int DK, int CPT = GdnStep<DK>::CPT>
__device__ __forceinline__ int gdn_cl_item(GdnClItem<CPT>& it, float (&s)[GdnStep<DK>::RPW], int b, unsigned n,
                                           float* sm, const T* qkv, float* conv_state, const T* a, const T* bb,
                                           S* state, const int* snap, int nsnap, int* cnt, const T* z, T* y, int HK,
                                           int HV, int DV, long long ldqkv, long long lda, long long ldb,
                                           long long ldz, long long ldy, float eps, float nwc, float qscale) {
    using G = GdnStep<DK>;
    using GC = GdnStepCl<DK>;
    constexpr int RPW = G::RPW, NW = G::NW, CT = G::CT, NCH = G::NCH;
    unsigned long long* const bar = reinterpret_cast<unsigned long long*>(sm);
    int* const flag = reinterpret_cast<int*>(sm + 4);
    float *const ox = sm + GC::OX, *const xs = sm + GC::XS, *const pkv = xs + NCH, *const pout = pkv + NW * CT;
    const int j = it.j, t0 = it.t0, t1 = it.t1, tile = blockIdx.z, ratio = HV / HK, hk = j / ratio;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, col = tile * CT + lane;
    const bool live = col < DV, qk_snap = j % ratio == 0 && tile == 0;
    const int C = 2 * HK * DK + HV * DV;
    S* st = state + ((it.slot * HV + j) * DK + warp * RPW) * (long long)DV + min(col, DV - 1);
    const long long zcol = (long long)j * DV + min(col, DV - 1);
    int qk_old = 0;  // thread 0: the q/k counter before this block's arrival
    int* const cnt_qk = cnt + (long long)b * (HV + HK) + HV + hk;
    for (int t = t0; t < t1; ++t) {
        const int i = t - t0;
        if (nsnap) {  // snapshot: as gdn_step (block-uniform branch)
            const long long ss = (long long)snap[b] + i;
            gdn_store_rows<S, DK>(state + ((ss * HV + j) * DK + warp * RPW) * (long long)DV + min(col, DV - 1), DV,
                                  live, s);
            gdn_store_windows<DK>(conv_state, ss, C, it.g, it.win, tid, qk_snap ? 0 : 2 * DK, NCH);
        }
        float xc[CPT];
#pragma unroll
        for (int u = 0; u < CPT; ++u) xc[u] = it.xn[u];
        const float ac = it.an, bc = it.bn, zc = it.zn;
        if (t + 1 < t1) {
#pragma unroll
            for (int u = 0; u < CPT; ++u)
                it.xn[u] = it.g[u] >= 0 ? to_f(qkv[(long long)(t + 1) * ldqkv + it.g[u]]) : 0.f;
            it.an = to_f(a[(long long)(t + 1) * lda + j]);
            it.bn = to_f(bb[(long long)(t + 1) * ldb + j]);
            if (warp == 0) it.zn = to_f(z[(long long)(t + 1) * ldz + zcol]);
        }
        gdn_stage_x<T, DK, true>(xs, xc, it.win, it.wc, it.g, tid);
        float beta, decay;
        gdn_gate(ac, bc, it.negA, it.dtb, beta, decay);
        __syncthreads();  // (A) x of token t in shared memory
        if (i == 0 && tid == 0) qk_old = atomicAdd(cnt_qk, 1);  // q/k windows read (consumed in x): arrive
        const float os = gdn_token<DK>(s, xs, pkv, pout, beta, decay, qscale, lane, warp, warp == 0 && live);
        if (t + 1 == t1) {  // the final state and v windows, issued before the exchange
            gdn_store_rows<S, DK>(st, DV, live, s);
            gdn_store_windows<DK>(conv_state, it.slot, C, it.g, it.win, tid, 2 * DK, NCH);
        }
        if (warp == 0)
            gdn_cl_norm<T>(ox, bar, (int)(n + i), tile, lane, live ? to_f(from_f<T>(os)) : 0.f, zc, nwc,
                           y + (long long)t * ldy + (long long)j * DV + col, live, DV, eps);
    }
    if (t0 >= t1) return 0;  // cluster-uniform; no counter touched (every block of sequence b is empty)
    if (tid == 0) *flag = qk_old == ratio * GDN_CL - 1;
    __syncthreads();
    if (*flag) {  // the last reader of QK head hk's windows: every reader has consumed them (arrived after)
        gdn_store_windows<DK>(conv_state, it.slot, C, it.g, it.win, tid, 0, 2 * DK);
        if (tid == 0) *cnt_qk = 0;
    }
    return t1 - t0;
}

// gdn_decode's kernel (CONV with the epilogue, value heads of DV <= 128): gdn_step<T, S, DK, true>'s work and
// arithmetic with the gated norm through distributed shared memory instead of arrival counters. A cluster is the
// GDN_CL column tiles of one (sequence, value head) (grid z = GDN_CL exactly; a tile past DV computes on clamped
// columns and stores nothing); each tile normalizes its own columns and writes y, o is never stored (y may be o).
// Launch constants are read before pdl_wait: starts, slots, snap and the weights (conv taps, A_log, dt_bias, norm
// weight) must not be written by a kernel of the same programmatic-launch chain (gdn_decode's callers upload them
// by copy or compute them eagerly). The q/k conv windows: the last of the QK head's readers stores them (a counter
// per (sequence, QK head)); a block arrives right after barrier (A) of its first token, once its window loads have
// been consumed, so the atomic's round trip overlaps the recurrence instead of following the stores.
template <typename T, typename S, int DK>
__global__ void __cluster_dims__(1, 1, GDN_CL) __launch_bounds__(GdnStep<DK>::NT)
    gdn_step_cl(const T* __restrict__ qkv, const float* __restrict__ convw, float* __restrict__ conv_state,
                const T* __restrict__ a, const T* __restrict__ bb, const float* __restrict__ A_log,
                const float* __restrict__ dt_bias, S* __restrict__ state, T* o, const int* __restrict__ starts,
                const int* __restrict__ slots, int HK, int HV, int DV, long long ldqkv, long long lda, long long ldb,
                long long ldo, const int* __restrict__ snap, int nsnap, int* __restrict__ cnt,
                const T* __restrict__ z, const float* __restrict__ nw, T* y, long long ldz, long long ldy,
                float eps) {
    pdl_trigger();
    using G = GdnStep<DK>;
    using GC = GdnStepCl<DK>;
    constexpr int RPW = G::RPW, CT = G::CT, CPT = G::CPT;
    float* const sm = cluster_smem();
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < GC::FLOATS * sizeof(float) || gridDim.z != GDN_CL || DV > GDN_CL * CT) __trap();
    }
    unsigned long long* const bar = reinterpret_cast<unsigned long long*>(sm);
    const int b = blockIdx.x, j = blockIdx.y, c0 = blockIdx.z * CT, hk = j / (HV / HK);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, col = c0 + lane;
    if (tid == 0) {  // cluster rank = tile (cluster dims (1, 1, GDN_CL), grid z = GDN_CL)
        mbar_init(bar, 32 * GDN_CL);
        mbar_init(bar + 1, 32 * GDN_CL);
    }
    cluster_sync_init();  // every tile's mbarriers before any remote arrival (before pdl_wait: off the chain)
    // launch constants, before pdl_wait (see above)
    GdnClItem<CPT> it;
    it.j = j;
    it.slot = slots[b];
    it.t0 = starts[b];
    it.t1 = starts[b + 1];
    const bool any = it.t0 < it.t1;  // cluster-uniform
    const int C = 2 * HK * DK + HV * DV;
    gdn_channels<DK>(it.g, tid, hk, HK, j, DV, c0);  // channels of this thread, as gdn_step
    S* st = state + ((it.slot * HV + j) * DK + warp * RPW) * (long long)DV + min(col, DV - 1);
#ifdef __CUDA_ARCH__
    // L2 hints while the kernel ahead ends: the state rows (as gdn_step) and this thread's conv window lines
    if (lane < RPW) {
        const S* hint = state + ((it.slot * HV + j) * DK + warp * RPW + lane) * (long long)DV + min(c0, DV - 1);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(hint));
    }
#pragma unroll
    for (int u = 0; u < CPT; ++u) {  // one hint per 128-byte line: by the window that starts in its first 12 bytes
        const float* w = conv_state + (it.slot * C + it.g[u]) * (GDN_KW - 1);
        if (it.g[u] >= 0 && (reinterpret_cast<unsigned long long>(w) & 127) < 4 * (GDN_KW - 1))
            asm volatile("prefetch.global.L2 [%0];" ::"l"(w));
    }
#endif
#pragma unroll
    for (int u = 0; u < CPT; ++u)
#pragma unroll
        for (int e = 0; e < GDN_KW; ++e) it.wc[u][e] = it.g[u] >= 0 ? convw[(long long)it.g[u] * GDN_KW + e] : 0.f;
    it.negA = -expf(A_log[j]);
    it.dtb = dt_bias[j];
    const float qscale = 1.f / sqrtf((float)DK);
    const float nwc = warp == 0 ? nw[min(col, DV - 1)] : 0.f;  // warp 0 norms
    pdl_wait();
    float s[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) s[r] = st_load(st + (long long)r * DV);
#pragma unroll
    for (int u = 0; u < CPT; ++u)
#pragma unroll
        for (int e = 0; e < GDN_KW - 1; ++e)
            it.win[u][e] = it.g[u] >= 0 ? conv_state[(it.slot * C + it.g[u]) * (GDN_KW - 1) + e] : 0.f;
    // the next token's inputs are loaded one token ahead (z: warp 0, which norms)
    const long long zcol = (long long)j * DV + min(col, DV - 1);
    it.an = it.bn = it.zn = 0.f;
    if (any) {
        it.an = to_f(a[(long long)it.t0 * lda + j]);
        it.bn = to_f(bb[(long long)it.t0 * ldb + j]);
        if (warp == 0) it.zn = to_f(z[(long long)it.t0 * ldz + zcol]);
    }
#pragma unroll
    for (int u = 0; u < CPT; ++u) it.xn[u] = any && it.g[u] >= 0 ? to_f(qkv[(long long)it.t0 * ldqkv + it.g[u]]) : 0.f;
    gdn_cl_item<T, S, DK>(it, s, b, 0, sm, qkv, conv_state, a, bb, state, snap, nsnap, cnt, z, y, HK, HV, DV, ldqkv,
                          lda, ldb, ldz, ldy, eps, nwc, qscale);
}

// ---- gdn_step_clp: gdn_step_cl's clusters made persistent, for calls of many sequences ----------------------
// gdn_step_cl runs one cluster per (sequence, value head): at 5-8 sequences that is ~4 waves of blocks that each load
// their 16 KB state slice, run the token and store it, with no overlap of one block's loads and its own work (27.5 us
// per 27B call at 8 sequences against ~12 us of state bytes at the H200's copy bandwidth, docs/cuda.md "GDN decode").
// gdn_step_clp launches only as many clusters as stay resident (grid x, ninfer/cuda/gdn_step.py); cluster x takes the
// items (b, j) = divmod(x + k * gridDim.x, HV) in turn and, while item k runs, its blocks already copy item k + 1's
// state slice into the other of two shared-memory buffers (cp.async, 16 bytes a copy) and hold its small inputs
// (slot, segment, conv windows and taps, gates, first token's x) in registers. Per item the work is gdn_step_cl's
// (gdn_cl_item: gdn_stage_x, gdn_token, gdn_cl_norm, the same stores and q/k counter), so every output and state
// is the same bits; the cluster mbarriers' parity runs over the cluster's tokens across items (`n`), which
// keeps the double-buffer argument of gdn_cl_norm. Nothing waits on another cluster: the q/k counters are
// arrive-only, so a grid larger than the resident clusters would still finish.
constexpr int GDN_CLP_MIN_BLOCKS = 2;  // resident blocks per SM asked (ninfer/cuda/gdn_step.py CLP_BLOCKS_PER_SM)

// gdn_step_clp's shared memory (floats): gdn_step_cl's layout, then two state buffers [DK][CT] of S, 16-byte aligned
template <int DK> struct GdnStepClp {
    static constexpr int SB = (GdnStepCl<DK>::FLOATS + 3) / 4 * 4;
    static constexpr int SBUF = DK * GdnStep<DK>::CT;  // one buffer, floats (a bf16 state uses half of it)
    static constexpr int FLOATS = SB + 2 * SBUF;
};

// The inputs of item `item` (b, j = divmod(item, HV)) and its first token, as gdn_step_cl loads them
template <typename T, int DK, int CPT = GdnStep<DK>::CPT>
__device__ __forceinline__ void gdn_clp_load(GdnClItem<CPT>& it, int item, const T* qkv, const float* convw,
                                             const float* conv_state, const T* a, const T* bb, const float* A_log,
                                             const float* dt_bias, const T* z, const int* starts, const int* slots,
                                             int HK, int HV, int DV, long long ldqkv, long long lda, long long ldb,
                                             long long ldz, int tid, int warp, int col, int c0) {
    const int b = item / HV, j = item % HV, C = 2 * HK * DK + HV * DV;
    it.j = j;
    it.slot = slots[b];
    it.t0 = starts[b];
    it.t1 = starts[b + 1];
    gdn_channels<DK>(it.g, tid, j / (HV / HK), HK, j, DV, c0);
#pragma unroll
    for (int u = 0; u < CPT; ++u)
#pragma unroll
        for (int e = 0; e < GDN_KW; ++e) {
            it.wc[u][e] = it.g[u] >= 0 ? convw[(long long)it.g[u] * GDN_KW + e] : 0.f;
            if (e < GDN_KW - 1)
                it.win[u][e] = it.g[u] >= 0 ? conv_state[(it.slot * C + it.g[u]) * (GDN_KW - 1) + e] : 0.f;
        }
    it.negA = -expf(A_log[j]);
    it.dtb = dt_bias[j];
    const bool any = it.t0 < it.t1;
    it.an = any ? to_f(a[(long long)it.t0 * lda + j]) : 0.f;
    it.bn = any ? to_f(bb[(long long)it.t0 * ldb + j]) : 0.f;
    it.zn = any && warp == 0 ? to_f(z[(long long)it.t0 * ldz + (long long)j * DV + min(col, DV - 1)]) : 0.f;
#pragma unroll
    for (int u = 0; u < CPT; ++u) it.xn[u] = any && it.g[u] >= 0 ? to_f(qkv[(long long)it.t0 * ldqkv + it.g[u]]) : 0.f;
}

// Item (slot, j)'s state slice (DK rows, this tile's CT columns) into buf [DK][CT] of S: 16-byte cp.async copies
// where a copy's columns are all below DV and rows are 16-byte aligned (vec), else element loads (columns past DV
// clamped to DV - 1, as gdn_step_cl's lanes read them). Visible to the block after cp_async_f4_wait + a barrier.
template <typename S, int DK>
__device__ __forceinline__ void gdn_clp_stage(S* buf, const S* state, long long slot, int j, int HV, int DV, int c0,
                                              bool vec, int tid) {
    constexpr int CT = GdnStep<DK>::CT, NT = GdnStep<DK>::NT, E = 16 / (int)sizeof(S), UPR = CT / E;
    const S* src = state + (slot * HV + j) * DK * (long long)DV;
    static_assert(DK * UPR % NT == 0, "whole copies per thread");
#pragma unroll
    for (int q = 0; q < DK * UPR / NT; ++q) {
        const int u = tid + q * NT, r = u / UPR, c = (u % UPR) * E;
        if (vec && c0 + c + E <= DV)
            cp_async_f4(reinterpret_cast<float*>(buf + r * CT + c),
                        reinterpret_cast<const float*>(src + (long long)r * DV + c0 + c));
        else
#pragma unroll
            for (int e = 0; e < E; ++e) buf[r * CT + c + e] = src[(long long)r * DV + min(c0 + c + e, DV - 1)];
    }
}

// gdn_decode's kernel for many sequences (variant "persist"): gdn_step_cl's arguments plus nseq (grid x: the resident
// clusters, at most nseq * HV). starts, slots, snap and the weights are launch constants, as for gdn_step_cl.
template <typename T, typename S, int DK>
__global__ void __cluster_dims__(1, 1, GDN_CL) __launch_bounds__(GdnStep<DK>::NT, GDN_CLP_MIN_BLOCKS)
    gdn_step_clp(const T* __restrict__ qkv, const float* __restrict__ convw, float* __restrict__ conv_state,
                 const T* __restrict__ a, const T* __restrict__ bb, const float* __restrict__ A_log,
                 const float* __restrict__ dt_bias, S* __restrict__ state, T* o, const int* __restrict__ starts,
                 const int* __restrict__ slots, int HK, int HV, int DV, long long ldqkv, long long lda, long long ldb,
                 long long ldo, const int* __restrict__ snap, int nsnap, int* __restrict__ cnt,
                 const T* __restrict__ z, const float* __restrict__ nw, T* y, long long ldz, long long ldy, float eps,
                 int nseq) {
    pdl_trigger();
    using G = GdnStep<DK>;
    using GP = GdnStepClp<DK>;
    constexpr int RPW = G::RPW, CT = G::CT, CPT = G::CPT;
    constexpr int SBUF = GP::SBUF * (int)sizeof(float) / (int)sizeof(S);  // one state buffer, in S elements
    float* const sm = cluster_smem();
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < GP::FLOATS * sizeof(float) || gridDim.z != GDN_CL || DV > GDN_CL * CT) __trap();
    }
    unsigned long long* const bar = reinterpret_cast<unsigned long long*>(sm);
    S* const sbuf = reinterpret_cast<S*>(sm + GP::SB);  // buffer q at sbuf + q * SBUF
    const int c0 = blockIdx.z * CT, nitems = nseq * HV;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, col = c0 + lane;
    const bool vec = (DV * (int)sizeof(S)) % 16 == 0;
    if (tid == 0) {
        mbar_init(bar, 32 * GDN_CL);
        mbar_init(bar + 1, 32 * GDN_CL);
    }
    cluster_sync_init();
    int item = blockIdx.x;  // cluster-uniform
    if (item >= nitems) return;
#ifdef __CUDA_ARCH__
    if (lane < RPW) {  // the first item's state rows into the L2 while the kernel ahead ends (as gdn_step_cl)
        const S* hint = state + (((long long)slots[item / HV] * HV + item % HV) * DK + warp * RPW + lane) * (long long)DV +
                        min(c0, DV - 1);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(hint));
    }
#endif
    const float qscale = 1.f / sqrtf((float)DK), nwc = warp == 0 ? nw[min(col, DV - 1)] : 0.f;
    pdl_wait();
    GdnClItem<CPT> cur;
    gdn_clp_load<T, DK>(cur, item, qkv, convw, conv_state, a, bb, A_log, dt_bias, z, starts, slots, HK, HV, DV, ldqkv,
                        lda, ldb, ldz, tid, warp, col, c0);
    gdn_clp_stage<S, DK>(sbuf, state, cur.slot, cur.j, HV, DV, c0, vec, tid);
    unsigned n = 0;  // tokens this cluster has run (every tile the same): the mbarriers' parity
    for (int k = 0; item < nitems; ++k, item += gridDim.x) {
        // item k's slice is in buffer k & 1; every thread's reads of buffer (k + 1) & 1 (item k - 1's) are done
        cp_async_f4_wait();
        __syncthreads();
        const S* sb = sbuf + (k & 1) * SBUF;
        float s[RPW];
#pragma unroll
        for (int r = 0; r < RPW; ++r) s[r] = to_f(sb[(warp * RPW + r) * CT + lane]);
        GdnClItem<CPT> nx;
        const int next = item + gridDim.x;
        if (next < nitems) {  // item k + 1: its inputs into registers, its slice into the other buffer
            gdn_clp_load<T, DK>(nx, next, qkv, convw, conv_state, a, bb, A_log, dt_bias, z, starts, slots, HK, HV,
                                DV, ldqkv, lda, ldb, ldz, tid, warp, col, c0);
            gdn_clp_stage<S, DK>(sbuf + ((k + 1) & 1) * SBUF, state, nx.slot, nx.j, HV, DV, c0, vec, tid);
        }
        n += gdn_cl_item<T, S, DK>(cur, s, item / HV, n, sm, qkv, conv_state, a, bb, state, snap, nsnap, cnt, z, y, HK,
                                   HV, DV, ldqkv, lda, ldb, ldz, ldy, eps, nwc, qscale);
        cur = nx;
    }
}

// Epilogue of gdn_step<..., CONV = true>, one launch after it:
//   blockIdx.y == 0: the gated RMSNorm of rows (t, j) = 4 * blockIdx.x + warp (t = row / HV), o -> y (y may be
//     o: no __restrict__ on either; gated_norm_row, the same bits as gated_rmsnorm);
//   blockIdx.y == 1 + b: the conv state of q/k channel 128 * blockIdx.x + tid of sequence b: the last KW-1 raw
//     inputs of [old window, tokens of b] (the same values causal_conv leaves); with nsnap, also the window before
//     each token t of b into slot snap[b] + (t - t0), as gdn_step snapshots the v channels.
template <typename T>
__global__ void __launch_bounds__(128)
    gdn_step_post(const T* o, const T* __restrict__ z, const float* __restrict__ nw, T* y,
                  const T* __restrict__ x, float* __restrict__ conv_state, const int* __restrict__ starts,
                  const int* __restrict__ slots, int rows, int HV, int DV, int QKC, int C, float eps, long long ldo,
                  long long ldz, long long ldy, long long ldx, const int* __restrict__ snap, int nsnap) {
    pdl_trigger();
    const int tid = threadIdx.x;
    if (blockIdx.y == 0) {
        const long long row = (long long)blockIdx.x * 4 + (tid >> 5);
        if (row >= (long long)rows * HV) return;  // warp-uniform
        const long long t = row / HV, jd = (row % HV) * DV;
        gated_norm_row(o + t * ldo + jd, z + t * ldz + jd, nw, y + t * ldy + jd, DV, eps, tid & 31);
        return;
    }
    const int b = blockIdx.y - 1, c = blockIdx.x * 128 + tid;
    const int t0 = starts[b], t1 = starts[b + 1];
    if (c >= QKC || t0 >= t1) return;
    float* st = conv_state + ((long long)slots[b] * C + c) * (GDN_KW - 1);
    float win[GDN_KW - 1];
#pragma unroll
    for (int e = 0; e < GDN_KW - 1; ++e) win[e] = st[e];
    for (int t = nsnap ? t0 : max(t0, t1 - (GDN_KW - 1)); t < t1; ++t) {
        if (nsnap) {  // snapshot: the window before token t into slot snap[b] + (t - t0)
            float* sp = conv_state + ((long long)(snap[b] + (t - t0)) * C + c) * (GDN_KW - 1);
#pragma unroll
            for (int e = 0; e < GDN_KW - 1; ++e) sp[e] = win[e];
        }
#pragma unroll
        for (int e = 0; e < GDN_KW - 2; ++e) win[e] = win[e + 1];
        win[GDN_KW - 2] = to_f(x[(long long)t * ldx + c]);
    }
#pragma unroll
    for (int e = 0; e < GDN_KW - 1; ++e) st[e] = win[e];
}
