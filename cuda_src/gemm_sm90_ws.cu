// The fp16-mode prefill GEMM, warp-specialized (sm_90a): gemm90_f16_ws<D> computes exactly what gemm_sm90.cu's
// gemm90_f16<D> computes, y[m, n] = (sum_k xh[m, k] W[n, k]) * row_scale(n) * rowf[m] with xh, rowf from
// split_f16row and W the fp16 operand rows from dequant90<F, true>, with a different main loop:
//   - TMA (cp.async.bulk.tensor.2d, 128B swizzle) copies the A box (64 k x 128 rows of xh) and the B box (64 k x 256
//     rows of W) of one K tile into a WS_STAGES-slot ring guarded by full / empty mbarriers (ws_sched.cuh);
//   - warpgroup 0 is the producer: setmaxnreg.dec to 40 registers, one thread issues every TMA, the rest exit;
//   - warpgroups 1 and 2 consume: setmaxnreg.inc to 232, each owns 64 rows x 256 columns (128 fp32 accumulators),
//     per K tile four m64n256k16 f16 wgmmas (k16 steps 0..3) on the slot's descriptors;
//   - persistent: grid = min(units, SMs), CTA c walks work units c, c + G, ... (ws_sched.cuh: unit = output tile x
//     K split), so the producer fills the next unit's slots while the consumers run the epilogue of the current one;
//   - split-K (splits = S > 1, chosen by the host from (M, N, K) only: gemm_pair.splitk_splits): split s of a tile
//     covers K tiles [s nk / S, (s + 1) nk / S) and writes its unscaled fp32 accumulators to part[s]; then
//     gemm90_f16_ws_reduce adds part[0] + part[1] + ... + part[S - 1] in that order and applies the epilogue.
// Bitwise contract with gemm90_f16 at S = 1: the same operand values (TMA's zero fill out of bounds = the cp.async
// zero fill at rows >= M, N and k >= K), the same instruction (m64n256k16.f32.f16.f16, scale-d 1 on zeroed
// accumulators), the same k16 order over K into one accumulator per output, and the same epilogue expression. Which
// CTA computes a unit, the grid size and the ring depth change no value. At S > 1 each split's sum is the same k16
// order over its K range, and y = epilogue(sum of the splits in order): a function of (M, N, K, S), deterministic.
// tests/test_cuda_gemm_ws.py checks it on the device; tests/test_gemm_ws_host.py runs ws_sched.cuh's loops and the
// split sum, the tensor maps (ninfer/cuda/tensor_map.py) and the descriptor addresses on the CPU.
// Measured on the H200 (docs/cuda.md), the split-K rule's constants too (perf/bench_gemm.py --splitk).
#include "common.cuh"
#include "wdq.cuh"
#include "wgmma.cuh"
#include "gate_up.cuh"
#include "ws_sched.cuh"
#include "mbarrier.cuh"

#define WS_SMEM 232448  // the opt-in maximum, as every gemm_sm90.cu instance: one CTA per SM

// CUtensorMap (cuda.h): 128 opaque bytes, 64-byte aligned, encoded on the host (ninfer/cuda/tensor_map.py).
struct __align__(64) NiTensorMap {
    u64 opaque[16];
};

#ifdef __CUDA_ARCH__
// box at (c0 = k, c1 = row) of a 2-D tensor map -> shared memory at dst; completes `bytes` on bar
__device__ __forceinline__ void tma_load_2d(u32 dst, const NiTensorMap* map, int c0, int c1, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// Shared memory: 1024-aligned ring (slot s at ring + s * SB: A tile, then B tile, then the group formats' scale
// rows), then full[S], empty[S].
template <int SB> struct WsSmemT {
    u32 ring, full, empty;
    __device__ u32 bar_full(int s) const { return full + 8 * s; }
    __device__ u32 bar_empty(int s) const { return empty + 8 * s; }
    __device__ u32 a(int s) const { return ring + s * SB; }
    __device__ u32 b(int s) const { return ring + s * SB + WS_A_BYTES; }
    __device__ u32 sc(int s) const { return ring + s * SB + WS_A_BYTES + WSG_B_BYTES; }  // GPT > 0 only
};

// two consecutive fp32 of shared memory (the scales of columns c, c + 1; c even: 8-byte aligned)
__device__ __forceinline__ float2 lds_f32x2(u32 addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
    return v;
}


// SW (gemm90_f16_ws_swiglu): W is [gate | up] (2 half rows) and column tile nt holds gate rows 128 nt .. + 127, then
// the same features' up rows half + 128 nt ..: two 128-row boxes (mb's box is 64 x 128), the second at B + 16 KB,
// a multiple of the swizzle's 1024-byte atom, so the slot's layout is that of one 256-row box.
// GPT > 0 (the group formats): mb's box is 64 x 128 code rows, and ms (the scales [groups, N] fp32) adds the K
// tile's GPT groups' scales of the tile's 128 columns (box 128 x GPT at column n0, group GPT kt).
template <bool SW = false, int GPT = 0> struct WsProducer {
    static constexpr int STAGES = WsCfg<GPT>::STAGES;
    WsSmemT<WsCfg<GPT>::STAGE_BYTES> sm;
    const NiTensorMap *ma, *mb, *ms;
    int half;  // SW: the up rows' offset (the gate rows' count), a multiple of 128
    __device__ void wait_empty(int s, u32 parity) const { mbar_wait(sm.bar_empty(s), parity); }
    __device__ void fill(int s, int kt, int mt, int nt) const {
        mbar_expect_tx(sm.bar_full(s), WsCfg<GPT>::TX);
        tma_load_2d(sm.a(s), ma, kt * GS_BK, mt * GS_BM, sm.bar_full(s));
        if constexpr (GPT > 0) {
            tma_load_2d(sm.b(s), mb, kt * GS_BK, nt * WSG_BN, sm.bar_full(s));
            tma_load_2d(sm.sc(s), ms, nt * WSG_BN, kt * GPT, sm.bar_full(s));
        } else if constexpr (SW) {
            tma_load_2d(sm.b(s), mb, kt * GS_BK, nt * (WS_BN / 2), sm.bar_full(s));
            tma_load_2d(sm.b(s) + WS_B_BYTES / 2, mb, kt * GS_BK, half + nt * (WS_BN / 2), sm.bar_full(s));
        } else {
            tma_load_2d(sm.b(s), mb, kt * GS_BK, nt * WS_BN, sm.bar_full(s));
        }
    }
};

// GPT > 0 (the group formats, D = WsGroup<GPT>): 64 x 128 outputs per warpgroup; each group's k16 steps into a
// partial sum (g0; W8's second group of the tile g1), then acc += scale(column) * partial once they are done:
// gemm_sm90.cu's gs_issue / gs_scale order, so every output's fp32 order is the in-loop group kernel's.
// DEFER (GPT = 1 only, gemm90_f16_wsgd): a K tile's partial is scaled after the next tile's wgmmas are issued, so
// that a warpgroup's scaling overlaps its own next wgmmas instead of only the other warpgroup's. The wgmmas always
// write g1; before the next tile's are issued, the finished partial moves to g0 (64 register moves), which is then
// scaled while g1 fills again (a runtime choice of the array in flight made ptxas serialize the wgmmas). The unit's
// last partial is scaled by drain() before its slot is released. The same fmaf per output in the same K order:
// bitwise the undeferred kernel.
template <typename D, bool SW = false, int GPT = 0, bool DEFER = false> struct WsConsumer {
    static_assert(!DEFER || GPT == 1, "deferred scaling: one group per K tile (g1 is the second buffer)");
    static constexpr int BN = WsCfg<GPT>::BN, STAGES = WsCfg<GPT>::STAGES;
    float (&acc)[BN / 2];
    float (&g0)[BN / 2];  // GPT > 0: the groups' partial sums (unused otherwise)
    float (&g1)[BN / 2];
    WsSmemT<WsCfg<GPT>::STAGE_BYTES> sm;
    int ctid;  // 0 .. 255: thread of the two consumer warpgroups (warpgroup ctid / 128 owns rows 64 (ctid / 128) ..)
    const u8 *p1, *p2;
    const float* rowf;
    float* y;
    int M, N;
    long long ldy;
    float* part;  // S > 1: the split partials [S][M][N]
    int splits;
    float* tmax;  // SW: [M][tn] each row's largest |h| per column tile
    int half;     // SW: gate rows (= h's columns; multiple of 128)
    u32 pend_sc = 0;     // DEFER: the scale row of the partial in g1 (its slot's)
    bool pend = false;   // DEFER: g1 holds (or is computing) a partial not yet scaled

    __device__ void zero() {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    }
    __device__ void wait_full(int s, u32 parity) const { mbar_wait(sm.bar_full(s), parity); }
    __device__ void mma(int s) {  // gs_issue<D, ActF16> of gemm_sm90.cu: the same four wgmmas in the same order
        const u32 a = sm.a(s) + (ctid >> 7) * 64 * 128, b = sm.b(s);
        if constexpr (GPT > 0) {
            mma_groups(a, b, sm.sc(s));
        } else {
            fence_regs(acc);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) Wgmma<BN, true>::mma(acc, desc_sw128(a + 32 * ks), desc_sw128(b + 32 * ks), 1);
            wgmma_commit();
            fence_regs(acc);
        }
    }
    // the group formats: the K tile's groups (gs_issue with acc0 = false: each group's first k16 step overwrites its
    // partial), waited for at once (the other consumer warpgroup's wgmmas keep the tensor cores busy meanwhile),
    // then gs_scale's fmaf per accumulator with the column's scale from the slot's scale rows
    __device__ void mma_groups(u32 a, u32 b, u32 sc) {
        if constexpr (DEFER) {
            const bool scale_prev = pend;
            const u32 prev_sc = pend_sc;
            if (pend) take_pending(true);
            issue_group(g1, a, b);
            if (scale_prev) {
                fence_regs(g0);
                fence_regs(acc);
                scale_group(g0, prev_sc);
                fence_regs(acc);
            }
            pend = true, pend_sc = sc;
            return;
        }
        fence_regs(g0);
        if (GPT == 2) fence_regs(g1);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            float (&d)[BN / 2] = (GPT == 2 && ks >= 2) ? g1 : g0;
            Wgmma<BN, true>::mma(d, desc_sw128(a + 32 * ks), desc_sw128(b + 32 * ks), (ks & (GPT == 2 ? 1 : 3)) ? 1 : 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(g0);
        if (GPT == 2) fence_regs(g1);
        fence_regs(acc);
        scale_group(g0, sc);
        if (GPT == 2) scale_group(g1, sc + WSG_BN * 4);
        fence_regs(acc);
    }
    // DEFER: the K tile's four k16 wgmmas into partial d (the first overwrites), committed, not waited for
    __device__ void issue_group(float (&d)[BN / 2], u32 a, u32 b) {
        fence_regs(d);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) Wgmma<BN, true>::mma(d, desc_sw128(a + 32 * ks), desc_sw128(b + 32 * ks), ks ? 1 : 0);
        wgmma_commit();
    }
    // DEFER: the previous tile's partial, once its wgmmas are done: `move`, from g1 to g0 (scaled there after the
    // next tile's wgmmas are issued); otherwise scaled into acc right away (the unit's last, drain)
    __device__ void take_pending(bool move) {
        wgmma_wait<0>();
        fence_regs(g1);
        if (move) {
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) g0[i] = g1[i];
            fence_regs(g0);
        } else {
            fence_regs(acc);
            scale_group(g1, pend_sc);
            fence_regs(acc);
        }
    }
    // ws_consume after the unit's last K tile (retire_all), before its slot s is released: DEFER scales the last
    // partial, whose scale row is in slot s; otherwise nothing is pending
    __device__ void drain(int) {
        if constexpr (DEFER) {
            if (!pend) return;
            take_pending(false);
            pend = false;
            __syncwarp();  // every lane's scale reads done before lane 0 releases the slot (ws_consume's release)
        }
    }
    __device__ void scale_group(float (&part)[BN / 2], u32 row) {  // row: the group's 128 fp32 scales
        const int t = ctid & 3;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const float2 sv = lds_f32x2(row + 4 * (8 * j + 2 * t));
            acc[4 * j + 0] = fmaf(sv.x, part[4 * j + 0], acc[4 * j + 0]);
            acc[4 * j + 1] = fmaf(sv.y, part[4 * j + 1], acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(sv.x, part[4 * j + 2], acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(sv.y, part[4 * j + 3], acc[4 * j + 3]);
        }
    }
    __device__ void retire_prev() { wgmma_wait<1>(); fence_regs(acc); }
    __device__ void retire_all() { wgmma_wait<0>(); fence_regs(acc); }
    __device__ void release(int s) const {
        if ((ctid & 31) == 0) mbar_arrive(sm.bar_empty(s));
    }
    // S = 1: gs_tile's epilogue, element for element, into y: v = acc * row_scale(column) * rowf[row]. S > 1: the
    // unscaled accumulators into the unit's split partial part[split] ([M][N], row stride N); gemm90_f16_ws_reduce
    // sums the splits in order and applies the same expression.
    __device__ void epilogue(const WsUnit& u) const {
        if constexpr (SW) {
            store_swiglu(u.mt, u.nt);
            return;
        }
        if (splits > 1) {
            store<false>(part + (long long)u.split * M * N, N, u.mt, u.nt);
            return;
        }
        store<true>(y, ldy, u.mt, u.nt);
    }
    // Registers 4j + 2h and 4j + 2h + 1 hold columns c, c + 1 (c even) of one row, stored as one float2 where the
    // output's rows allow it (8-byte aligned base, even ld and N: then n0 + c < N implies n0 + c + 1 < N); the values
    // are the same either way.
    template <bool SCALE> __device__ void store(float* out, long long ld, int mt, int nt) const {
        const int m0 = mt * GS_BM, n0 = nt * BN, mvalid = min(M - m0, GS_BM);
        const bool pairs = ((reinterpret_cast<size_t>(out) & 7) | ((size_t)ld & 1) | ((size_t)N & 1)) == 0;
        if (pairs) {
#pragma unroll
            for (int i = 0; i < BN / 2; i += 2) {
                int r, c;
                frag_rc(ctid, i, r, c);
                if (r < mvalid && n0 + c < N) {
                    float2 v;
                    if (SCALE) {
                        const float f = rowf[m0 + r];
                        v.x = acc[i] * D::row_scale(p1, p2, n0 + c) * f;
                        v.y = acc[i + 1] * D::row_scale(p1, p2, n0 + c + 1) * f;
                    } else {
                        v.x = acc[i], v.y = acc[i + 1];
                    }
                    *reinterpret_cast<float2*>(out + (long long)(m0 + r) * ld + n0 + c) = v;
                }
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            int r, c;
            frag_rc(ctid, i, r, c);
            if (r < mvalid && n0 + c < N) {
                const float v = SCALE ? acc[i] * D::row_scale(p1, p2, n0 + c) : acc[i];
                out[(long long)(m0 + r) * ld + n0 + c] = SCALE ? v * rowf[m0 + r] : v;
            }
        }
    }

    // SW: registers i < 64 hold gate columns c < 128 of the tile, i + 64 the same features' up columns (frag_rc:
    // c + 128): gate_up.cuh's epilogue, shared with the expert launch (h = silu(g) * u of g, u with the epilogue's
    // own expression, the values store<true> would have written into [gate | up], and the swiglu kernel's, so h is
    // bitwise the SwiGLU of the plain kernel's output; per (row, tile) the largest |h| into tmax).
    __device__ void store_swiglu(int mt, int nt) const {
        const int m0 = mt * GS_BM, f0 = nt * (WS_BN / 2), mvalid = min(M - m0, GS_BM), tn = half / (WS_BN / 2);
        gate_up_store<D>(acc, ctid, mvalid, p1, p2, 0, half, rowf, y, ldy, tmax, tn, nt, m0, f0);
    }
};

// The kernels' common body (ma, mb: the __grid_constant__ tensor maps' addresses).
// GPT > 0: the group formats (D = WsGroup<GPT>, ms the scales' map).
template <typename D, bool SW, int GPT = 0, bool DEFER = false>
__device__ __forceinline__ void ws_gemm(const NiTensorMap* ma, const NiTensorMap* mb, const u8* __restrict__ p1,
                                        const u8* __restrict__ p2, const float* __restrict__ rowf,
                                        float* __restrict__ y, int M, int N, int K, long long ldy,
                                        float* __restrict__ part, int splits, float* __restrict__ tmax, int half,
                                        const NiTensorMap* ms = nullptr) {
    typedef WsCfg<GPT> C;
    static_assert(D::DIRECT && D::BN == C::BN, "fp16 mode: 256 operand rows per tile (group formats: 128)");
    static_assert(1024 + C::STAGES * C::STAGE_BYTES + 16 * C::STAGES <= WS_SMEM, "shared memory: 227 KB at most");
    static_assert(!(SW && GPT), "gate | up tiles: formats without group scales");
    extern __shared__ __align__(1024) u8 ws_smem_raw[];
    const u32 base = smem_u32(ws_smem_raw), ring = base + ((1024 - (base & 1023)) & 1023);
    const u32 bars = ring + C::STAGES * C::STAGE_BYTES;
    const WsSmemT<C::STAGE_BYTES> sm{ring, bars, bars + 8 * C::STAGES};
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < C::STAGES; ++s) {
            mbar_init(sm.bar_full(s), 1);  // the producer's arrive.expect_tx (+ the TMA's transaction bytes)
            mbar_init(sm.bar_empty(s), WS_CONSUMER_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const WsSched sc(M, N, K, splits, C::BN);
    if (tid < 128) {  // producer warpgroup
        setmaxnreg_dec<40>();
        if (tid == 0) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(ma)) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(mb)) : "memory");
            if (GPT) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(ms)) : "memory");
            WsProducer<SW, GPT> pr{sm, ma, mb, ms, half};
            ws_produce(pr, sc, blockIdx.x, gridDim.x);
        }
    } else {
        setmaxnreg_inc<232>();
        constexpr bool TWO = GPT == 2 || DEFER;  // two partial arrays
        float acc[C::BN / 2], pa[GPT ? C::BN / 2 : 1], pb[TWO ? C::BN / 2 : 1];
        float(&q0)[C::BN / 2] = *reinterpret_cast<float(*)[C::BN / 2]>(GPT ? pa : acc);
        float(&q1)[C::BN / 2] = *reinterpret_cast<float(*)[C::BN / 2]>(TWO ? pb : (GPT ? pa : acc));
        WsConsumer<D, SW, GPT, DEFER> co{acc, q0, q1, sm, tid - 128, p1, p2, rowf, y, M, N, ldy, part, splits, tmax,
                                         half};
        ws_consume(co, sc, blockIdx.x, gridDim.x);
    }
}
#endif  // __CUDA_ARCH__

// ma: xh [M, K] fp16 (box 64 x 128), mb: W [N, K] fp16 (box 64 x 256), both 128B-swizzled with zero fill
// (tensor_map.py); p1 / p2: the stored format's planes for row_scale (as gemm90_f16); y [M, N] row stride ldy.
// splits = S (ws_sched.cuh's work units): S = 1 writes y; S > 1 writes the S partials to part [S][M][N] (fp32,
// unscaled) and gemm90_f16_ws_reduce then writes y.
template <typename D>
__global__ void __launch_bounds__(WS_THREADS, 1)
    gemm90_f16_ws(const __grid_constant__ NiTensorMap ma, const __grid_constant__ NiTensorMap mb,
                  const u8* __restrict__ p1, const u8* __restrict__ p2, const float* __restrict__ rowf,
                  float* __restrict__ y, int M, int N, int K, long long ldy, float* __restrict__ part, int splits) {
#ifdef __CUDA_ARCH__
    ws_gemm<D, false>(&ma, &mb, p1, p2, rowf, y, M, N, K, ldy, part, splits, nullptr, 0);
#endif
}

// The group-int formats' fp16 mode (Q4/5/6 g64: GPT = 1, W8 g32: GPT = 2): y[m, n] = (sum over the groups g of
// s[g, n] * sum_{k in g} xh[m, k] c[n, k]) * rowf[m] with the codes c as fp16 rows [N, K] (mb: box 64 x 128, from
// dequant90<D, true>) and the scales s fp32 [groups, N] (ms: box 128 x GPT, no swizzle, from group_scales_t);
// 128-column tiles, the groups' partial sums scaled in gs_scale's order (WsConsumer::mma_groups). splits as
// gemm90_f16_ws (S > 1: gemm90_f16_ws_reduce<WsGroup<GPT>>, row scale 1).
template <int GPT>
__global__ void __launch_bounds__(WS_THREADS, 1)
    gemm90_f16_wsg(const __grid_constant__ NiTensorMap ma, const __grid_constant__ NiTensorMap mb,
                   const __grid_constant__ NiTensorMap ms, const float* __restrict__ rowf, float* __restrict__ y,
                   int M, int N, int K, long long ldy, float* __restrict__ part, int splits) {
#ifdef __CUDA_ARCH__
    ws_gemm<WsGroup<GPT>, false, GPT>(&ma, &mb, nullptr, nullptr, rowf, y, M, N, K, ldy, part, splits, nullptr, 0,
                                      &ms);
#endif
}

// gemm90_f16_wsg<1> with the group scaling deferred by one K tile (WsConsumer's DEFER: the wgmmas write g1, the
// finished partial moves to g0 and is scaled while g1 fills again): bitwise gemm90_f16_wsg<1>, an A/B candidate
// (gemm_plan.GROUP_DEFER).
template <int GPT>
__global__ void __launch_bounds__(WS_THREADS, 1)
    gemm90_f16_wsgd(const __grid_constant__ NiTensorMap ma, const __grid_constant__ NiTensorMap mb,
                    const __grid_constant__ NiTensorMap ms, const float* __restrict__ rowf, float* __restrict__ y,
                    int M, int N, int K, long long ldy, float* __restrict__ part, int splits) {
    static_assert(GPT == 1, "one group per K tile");
#ifdef __CUDA_ARCH__
    ws_gemm<WsGroup<GPT>, false, GPT, true>(&ma, &mb, nullptr, nullptr, rowf, y, M, N, K, ldy, part, splits, nullptr,
                                            0, &ms);
#endif
}

// The MLP's gate | up projection with the SwiGLU in its epilogue (the down projection's input without the
// [M, 2 half] array): W's rows are [gate | up] (N = 2 half, half % 128 == 0; mb's box 64 x 128), h [M, half] (row
// stride ldh, even, 8-byte aligned) = swiglu of what gemm90_f16_ws<D> would write, bitwise; tmax [M][half / 128]
// = the largest |h| of each row in each column tile (split_f16row_max takes the row's max from them: the same
// max split_f16row_in<false, true> finds). Unsplit only (S = 1).
template <typename D>
__global__ void __launch_bounds__(WS_THREADS, 1)
    gemm90_f16_ws_swiglu(const __grid_constant__ NiTensorMap ma, const __grid_constant__ NiTensorMap mb,
                         const u8* __restrict__ p1, const u8* __restrict__ p2, const float* __restrict__ rowf,
                         float* __restrict__ h, float* __restrict__ tmax, int M, int half, int K, long long ldh) {
#ifdef __CUDA_ARCH__
    ws_gemm<D, true>(&ma, &mb, p1, p2, rowf, h, M, 2 * half, K, ldh, nullptr, 1, tmax, half);
#endif
}

// Split-K reduction: y[m, n] = ws_split_sum(part, m N + n) * row_scale(n) * rowf[m], the S partials summed in split
// order, then the ws / cp kernels' epilogue expression (its operations in its order) on that sum. Block (m, j):
// row m, columns 256 j .. 256 j + 255, one per thread (coalesced loads of each partial, stores with the row
// stride ldy).
template <typename D>
__global__ void __launch_bounds__(256)
    gemm90_f16_ws_reduce(const float* __restrict__ part, const u8* __restrict__ p1, const u8* __restrict__ p2,
                         const float* __restrict__ rowf, float* __restrict__ y, int M, int N, int splits,
                         long long ldy) {
    const int m = blockIdx.x, n = blockIdx.y * 256 + threadIdx.x;
    if (n >= N) return;
    const float v = ws_split_sum(part, (long long)M * N, (long long)m * N + n, splits);
    y[(long long)m * ldy + n] = v * D::row_scale(p1, p2, n) * rowf[m];
}
