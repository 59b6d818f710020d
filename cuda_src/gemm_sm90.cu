// Prefill matrix products on Hopper tensor cores (sm_90a): y[m, n] = sum_k x[m, k] W[n, k], x float or bf16,
// W in any stored format; wgmma.mma_async (bf16 x bf16 -> f32, both operands in shared memory) fed by a cp.async
// ring. The loader compiles this family with -arch=sm_90a on compute capability 9.0 (ninfer/cuda/loader.py);
// gemm.cu (mma.sync) remains the path for other devices.
//
// CTA tile 128 (M) x BN (N, 256; 128 for the group-scale formats), K tile 64. 256 threads = two warpgroups, WG w
// computing rows [64 w, 64 w + 64) x all BN columns (one m64nBNk16 wgmma per k16 step and activation half).
// Pipeline (every thread does everything; no producer warps, see below):
//   ring of S raw stages (as many as fit in 227 KB, at most 6; bf16 x: BF16 4, FP8 5, NVFP4/Q/W8 6; float x:
//   BF16/FP8/NVFP4 3, Q4/Q5 5, Q6/W8 4): the activation tile (bf16: the swizzled operand itself;
//   float: fp32 landing in the hi/lo operand tiles, split in place) and the weight tile (BF16: the swizzled operand
//   itself; other formats: the stored bytes), loaded S - 1 tiles ahead with cp.async (zero-filled out of range);
//   two converted bf16 weight tiles (double buffer) written by all 256 threads from the raw stage.
//   Iteration kt: issue tile kt's wgmmas (async) | wait for tile kt-1's | cp.async wait + barrier | convert tile
//   kt + 1 (weights; float activations split) + proxy fence | load tile kt + S - 1 into the slot tile kt - 1 used |
//   barrier. The tensor cores run tile kt while the CUDA cores convert tile kt + 1.
// Why no TMA / warp specialization: CuPy does not wrap cuTensorMapEncodeTiled, and a hand-built CUtensorMap or
// mbarrier protocol could not be tried on a GPU while this was written; cp.async into the swizzled layout is plain
// address arithmetic that the host test (tests/test_gemm_sm90_host.py) runs on the CPU. The conversion needs every
// thread's issue slots anyway (it, not the copy, is the CUDA-core work), so a producer warp would only issue cp.async.
//
// Pair mode (gemm90_pair; ninfer/cuda/gemm_pair.py dispatches float x of >= 128 rows to it): with float x the
// in-loop conversion above is the bottleneck, not the tensor cores. Per K tile and SM the wgmmas read ~160 KB of
// shared memory (each warpgroup its A tile and the whole B tile, twice with hi / lo) and the copies write 64 KB; the
// split adds a 32 KB read and write of the activation tile, a weight conversion the raw read and the 32 KB operand
// write, which by this estimate puts shared memory above its ~128 B/clock while the tensor pipe idles (H200: float x
// 150-190 TFLOP/s against 478-585 for bf16 x with BF16 weights). So the conversions move out of the loop, each
// once per GEMM: split_hilo writes hi / lo [M, K] with the very split8 of the in-loop split, and for the formats
// whose operand values are the stored weight times a power of two (BF16: as stored; FP8: e4m3 codes; NVFP4: e2m1 x
// e4m3 block scale x 2^-7; exact in bf16, see DqFolded in wdq.cuh) dequant90 writes the operand rows once into a
// bf16 scratch with the format's own make(). The pair kernel then cp.asyncs hi, lo and the bf16 weight rows
// straight into the swizzled operand tiles (ActPair, DqBF16's loader) and issues hi then lo per k16 step as above:
// the same operands in the same MMA order and the same epilogue (the format's row scale), so its result is bitwise
// gemm90<D, float>'s, and the main loop is copies and wgmmas only (3 stages of 64 KB). The pre-passes are
// memory-bound (split: 8 bytes per activation, dequant: ~2.6 per weight), a few % of a 2K-row GEMM. The group-int
// formats (Q4/5/6, W8: f16 group scales on partial sums, not foldable) keep the in-loop kernel.
//
// Exactness and order: weight operands are exact in bf16 (wdq.cuh), bf16 x exact, float x split into hi + lo
// (|x - hi - lo| <= 2^-17 |x|) and both multiplied (hi then lo per k16 step, same accumulator). Group formats sum each
// group into a partial accumulator (first step overwrites) and add scale * partial to acc in group order; row scales
// multiply the result. Every output's fp32 accumulation order depends only on K: a row never depends on M, on its
// tile or on the other rows of the launch. The group formats scale a tile's partial sums after waiting for its
// wgmmas, so their MMAs overlap the conversion but not the scaling: partial accumulators double-buffered across
// iterations (scaling tile kt - 1 while tile kt runs) made ptxas serialize every wgmma (C7514) and spill.
#include "common.cuh"
#include "wdq.cuh"
#include "wgmma.cuh"
#include "gate_up.cuh"

#define GS_SMEM 232448  // 227 KB, the opt-in maximum: one CTA per SM, every instance launched with it
#define GS_SMAX 6       // 5 tiles of loads in flight at most (not tuned on a GPU yet)

template <typename D, typename A> struct GsCfg {
    static constexpr int BN = D::BN, NACC = BN / 2, ABYTES = A::BYTES;
    static constexpr int STAGE = ABYTES + D::BYTES;
    static constexpr int CONV = D::DIRECT ? 0 : 2 * BN * 128;
    static constexpr int FIT = (GS_SMEM - 1024 - CONV) / STAGE;
    static constexpr int S = FIT < GS_SMAX ? FIT : GS_SMAX;
    static_assert(S >= 3, "at least three stages");
    static_assert(1024 + CONV + S * STAGE <= GS_SMEM, "shared memory: 227 KB at most");
    static_assert(STAGE % 1024 == 0 && ABYTES % 1024 == 0, "swizzled tiles need 1024-byte alignment");
};

// Issue the wgmmas of one K tile (4 k16 steps, hi then lo for float x and pairs) into d0 (GPT <= 1) or d0 / d1
// (W8: steps 0-1 / 2-3). acc0 = false: the first step of each group overwrites its accumulator.
template <typename D, typename A>
__device__ __forceinline__ void gs_issue(u32 a, u32 b, float (&d0)[D::BN / 2], float (&d1)[D::BN / 2], bool acc0) {
    constexpr int BN = D::BN;
    fence_regs(d0);
    if (D::GPT == 2) fence_regs(d1);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
        float (&d)[BN / 2] = (D::GPT == 2 && ks >= 2) ? d1 : d0;
        const int accumulate = (acc0 || (ks & (D::GPT == 2 ? 1 : 3))) ? 1 : 0;
        Wgmma<BN, A::F16>::mma(d, desc_sw128(a + 32 * ks), desc_sw128(b + 32 * ks), accumulate);
        if (A::SPLIT) Wgmma<BN>::mma(d, desc_sw128(a + GS_BM * 128 + 32 * ks), desc_sw128(b + 32 * ks), 1);
    }
    wgmma_commit();
    fence_regs(d0);
    if (D::GPT == 2) fence_regs(d1);
}

// acc += s(column) * part for group g of tile kt (raw scales still in the tile's ring slot).
template <typename D>
__device__ __forceinline__ void gs_scale(float (&acc)[D::BN / 2], float (&part)[D::BN / 2], const u8* raw, int g,
                                         int kt, int t) {
    fence_regs(part);
#pragma unroll
    for (int j = 0; j < D::BN / 8; ++j) {
        const float s0 = D::gscale(raw, 8 * j + 2 * t, g, kt), s1 = D::gscale(raw, 8 * j + 2 * t + 1, g, kt);
        acc[4 * j + 0] = fmaf(s0, part[4 * j + 0], acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(s1, part[4 * j + 1], acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(s0, part[4 * j + 2], acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(s1, part[4 * j + 3], acc[4 * j + 3]);
    }
}

// One 128 x BN output tile: rows [0, min(M, 128)) of x / y (already offset to the tile's first row), columns
// [n0, min(n0 + BN, N)), weight rows wbase + n. A: the activation operand (Act<T>, ActPair or ActF16), TY: the
// output type; rowf (fp16 mode): a power of two per row of the tile, multiplying its results.
// SW (gate_up.cuh): the weight rows wbase .. + N are [gate | up] (N / 2 each, N / 2 % (BN / 2) == 0) and the tile
// holds features n0 / 2 .. + BN / 2 - 1 of both (GateUpLoader); y (float) gets h = silu(gate) * up, [M, N / 2] with
// row stride ldy, and tmax (offset to the tile's first row) each row's largest |h| per tile, [M][N / BN]
// (gate_up_store). The main loop is the same code either way.
template <typename D, typename A, typename TY, bool SW = false>
__device__ __forceinline__ void gs_tile(const u8* __restrict__ p0, const u8* __restrict__ p1,
                                        const u8* __restrict__ p2, typename A::Src x, TY* __restrict__ y, int M,
                                        int N, int K, long long ldx, long long ldy, int n0, long long wbase,
                                        const float* __restrict__ rowf = nullptr, float* __restrict__ tmax = nullptr) {
    typedef GsCfg<D, A> C;
    constexpr int BN = C::BN, NACC = C::NACC, S = C::S;
    extern __shared__ __align__(1024) u8 gs_smem_raw[];
    u8* smem = gs_smem_raw + ((1024 - (smem_u32(gs_smem_raw) & 1023)) & 1023);
    u8* conv = smem + S * C::STAGE;  // two converted weight tiles (non-DIRECT formats)
    const int tid = threadIdx.x, wg = tid >> 7, t = tid & 3;
    const int mvalid = min(M, GS_BM), nvalid = min(BN, N - n0), nk = (K + GS_BK - 1) / GS_BK;

    const typename A::Loader al(x, ldx, mvalid, tid);
    const typename GsWeightLoader<D, SW>::T wl(p0, p1, p2, K, SW ? wbase + n0 / 2 : wbase + n0, SW ? N / 2 : nvalid,
                                               tid);
    auto stage = [&](int kt) { return smem + (kt % S) * C::STAGE; };
    auto load = [&](int kt) {
        al.copy(stage(kt), kt, K, p0);  // p0: any valid address for the zero-filled copies
        wl.copy(stage(kt) + C::ABYTES, kt, K, p0);
    };
    auto convert = [&](int kt) {
        A::split(stage(kt), tid);
        if constexpr (!D::DIRECT)
            convert_tile<D, A::F16>(stage(kt) + C::ABYTES, conv + (kt & 1) * BN * 128, kt, tid);
        fence_proxy_async();
    };
    // operand addresses of tile kt for this warpgroup
    auto a_addr = [&](int kt) { return smem_u32(stage(kt)) + wg * 64 * 128; };
    auto b_addr = [&](int kt) {
        return D::DIRECT ? smem_u32(stage(kt) + C::ABYTES) : smem_u32(conv + (kt & 1) * BN * 128);
    };

    float acc[NACC], p0acc[NACC], p1acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;

#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (s < nk) load(s);
        cp_async_commit();
    }
    cp_async_wait<S - 2>();
    __syncthreads();
    convert(0);
    __syncthreads();

    for (int kt = 0; kt < nk; ++kt) {
        if (D::GPT == 0) {
            gs_issue<D, A>(a_addr(kt), b_addr(kt), acc, acc, true);
            wgmma_wait<1>();  // tile kt - 1 done: its stage and converted tile may be reused
        } else {  // group formats: partial sums of tile kt, scaled once its wgmmas are done (below)
            gs_issue<D, A>(a_addr(kt), b_addr(kt), p0acc, p1acc, false);
        }
        if (kt + 1 < nk) {
            cp_async_wait<S - 3>();  // tile kt + 1 landed (this thread's copies) ...
            __syncthreads();         // ... everyone's; and every warpgroup is past tile kt - 1's wgmmas
            // Convert before refilling: the proxy fence ending convert() compiles to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC,
            // and if the MEMBAR waits for this thread's cp.asyncs, it should not wait for the ones just issued. (No
            // fence is needed before rewriting what finished wgmmas read: their completion, observed through
            // wgmma.wait_group and the barrier, orders those reads.)
            convert(kt + 1);
            if (kt + S - 1 < nk) load(kt + S - 1);
            cp_async_commit();
            __syncthreads();
        }
        if (D::GPT) {  // tile kt's groups; the next issue overwrites the partial accumulators
            wgmma_wait<0>();
            gs_scale<D>(acc, p0acc, stage(kt) + C::ABYTES, 0, kt, t);
            if (D::GPT == 2) gs_scale<D>(acc, p1acc, stage(kt) + C::ABYTES, 1, kt, t);
        }
    }
    wgmma_wait<0>();
    fence_regs(acc);

    if constexpr (SW) {
        static_assert(D::GPT == 0, "gate | up tiles: formats without group scales");
        gate_up_store<D>(acc, tid, mvalid, p1, p2, wbase + n0 / 2, wbase + N / 2 + n0 / 2, rowf, y + n0 / 2, ldy,
                         tmax, N / BN, n0 / BN);
    } else {
#pragma unroll
        for (int i = 0; i < NACC; ++i) {
            int r, c;
            frag_rc(tid, i, r, c);
            if (r < mvalid && n0 + c < N) {
                const float v = acc[i] * D::row_scale(p1, p2, wbase + n0 + c);
                y[(long long)r * ldy + n0 + c] = from_f<TY>(rowf ? v * rowf[r] : v);
            }
        }
    }
}

// One CTA of a dense GEMM: its (row tile, column tile) of the 1-D grid in gs_raster order (rowf: the fp16 mode's
// per-row factors, or null).
template <typename D, typename A, typename TY>
__device__ __forceinline__ void gs_dense_tile(const u8* __restrict__ p0, const u8* __restrict__ p1,
                                              const u8* __restrict__ p2, typename A::Src x, TY* __restrict__ y,
                                              int M, int N, int K, long long ldx, long long ldy,
                                              const float* __restrict__ rowf) {
    int mt, nt;
    gs_raster(blockIdx.x, (M + GS_BM - 1) / GS_BM, (N + D::BN - 1) / D::BN, mt, nt);
    const long long m0 = (long long)mt * GS_BM;
    gs_tile<D, A, TY>(p0, p1, p2, A::at(x, m0, ldx), y + m0 * ldy, M - (int)m0, N, K, ldx, ldy, nt * D::BN, 0,
                      rowf ? rowf + m0 : nullptr);
}

// x: [M, K] (row stride ldx), y: [M, N] (row stride ldy), K % 8 == 0 (checked by the wrapper). 1-D grid of
// ceil(M / 128) * ceil(N / BN) tiles, rasterized in groups of GS_GROUP_M row tiles.
template <typename D, typename T>
__global__ void __launch_bounds__(GS_THREADS, 1)
    gemm90(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2, const T* __restrict__ x,
           T* __restrict__ y, int M, int N, int K, long long ldx, long long ldy) {
    gs_dense_tile<D, Act<T>, T>(p0, p1, p2, x, y, M, N, K, ldx, ldy, nullptr);
}

// MoE prefill (grouped), as gemm.cu's gemm_experts: tile i (blockIdx.y) covers rows tile_s0[i] ..
// min(tile_s0[i] + 128, off[tile_e[i] + 1]) with expert tile_e[i]'s weight rows; tiles at or beyond *ntiles exit.
// One CTA of either expert kernel: its tile of the table (rowf: the fp16 mode's per-row factors, or null; SW:
// gs_tile's gate | up tile, tmax [slots][N / BN]).
template <typename D, typename A, typename TY, bool SW = false>
__device__ __forceinline__ void gs_expert_tile(const u8* __restrict__ p0, const u8* __restrict__ p1,
                                               const u8* __restrict__ p2, typename A::Src x, TY* __restrict__ y,
                                               const int* __restrict__ off, const int* __restrict__ tile_e,
                                               const int* __restrict__ tile_s0, const int* __restrict__ ntiles,
                                               int N, int K, long long ldx, long long ldy,
                                               const float* __restrict__ rowf, float* __restrict__ tmax = nullptr) {
    const int i = blockIdx.y;
    if (i >= *ntiles) return;
    const int e = tile_e[i], s0 = tile_s0[i], rows = min(GS_BM, off[e + 1] - s0);
    gs_tile<D, A, TY, SW>(p0, p1, p2, A::at(x, s0, ldx), y + (long long)s0 * ldy, rows, N, K, ldx, ldy,
                          blockIdx.x * D::BN, (long long)e * N, rowf ? rowf + s0 : nullptr,
                          SW ? tmax + (long long)s0 * (N / D::BN) : nullptr);
}

template <typename D, typename T>
__global__ void __launch_bounds__(GS_THREADS, 1)
    gemm90_experts(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
                   const T* __restrict__ x, T* __restrict__ y, const int* __restrict__ off,
                   const int* __restrict__ tile_e, const int* __restrict__ tile_s0, const int* __restrict__ ntiles,
                   int N, int K, long long ldx, long long ldy) {
    gs_expert_tile<D, Act<T>, T>(p0, p1, p2, x, y, off, tile_e, tile_s0, ntiles, N, K, ldx, ldy, nullptr);
}

// ---- pair mode: float activations split once per GEMM, foldable weights dequantized once per GEMM --------------
// y[m, n] = sum_k (hi[m, k] + lo[m, k]) W[n, k] * row_scale(n): hi / lo bf16 [M, K] (row stride ldx) from
// split_hilo, W the bf16 operand rows (BF16 weights, or a dequant90 scratch of a folded format: D = DqFolded<F>,
// p1 / p2 the stored format's planes for its row scale). Same tiles, stages, MMA order and epilogue as gemm90<D,
// float> (whose stage holds exactly these hi / lo and operand tiles after its in-loop conversion), so the result is
// bitwise gemm90's; the main loop is cp.async + wgmma only.
template <typename D>
__global__ void __launch_bounds__(GS_THREADS, 1)
    gemm90_pair(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
                const bf16* __restrict__ xhi, const bf16* __restrict__ xlo, float* __restrict__ y, int M, int N,
                int K, long long ldx, long long ldy) {
    static_assert(D::DIRECT, "pair mode reads bf16 weight rows");
    gs_dense_tile<D, ActPair, float>(p0, p1, p2, PairX{xhi, xlo}, y, M, N, K, ldx, ldy, nullptr);
}

// x [M, K] (row stride ldx, K % 8 == 0) -> hi, lo [M, K] (row stride K), split8 per 8 consecutive k; one thread per
// 8 k of a row.
__global__ void __launch_bounds__(256) split_hilo(const float* __restrict__ x, bf16* __restrict__ hi,
                                                  bf16* __restrict__ lo, int M, int K, long long ldx) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, per = K / 8;
    if (i >= (long long)M * per) return;
    const long long r = i / per, k = 8 * (i % per);
    float v[8];
    load8x(x + r * ldx + k, v);
    uint4 h, l;
    split8(v, h, l);
    *reinterpret_cast<uint4*>(hi + r * K + k) = h;
    *reinterpret_cast<uint4*>(lo + r * K + k) = l;
}

// Weight rows [nb, nb + rows) of format D -> w [rows, K] bf16 operand values (row scale not applied): CTA
// (blockIdx.x, blockIdx.y) = K tile, BN-row tile; the raw tile through D's loader (as in gs_tile), then
// dequant_tile. Memory-bound: ~(stored bytes + 2) per weight. F16: the same values as fp16 words (the fp16 mode
// below; exact for the folded formats, bf16x8_to_f16).
template <typename D, bool F16 = false>
__global__ void __launch_bounds__(GS_THREADS)
    dequant90(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2, bf16* __restrict__ w,
              int rows, int K, long long nb) {
    // the group formats: their codes only, as fp16 (the fp16 mode's gemm90_f16_wsg; scales: group_scales_t)
    static_assert(!D::DIRECT && (D::GPT == 0 || F16), "only formats without group scales fold into bf16");
    static_assert(D::BYTES <= 48 * 1024, "static shared memory");
    __shared__ __align__(1024) u8 raw[D::BYTES];
    const int kt = blockIdx.x, r0 = blockIdx.y * D::BN, tid = threadIdx.x;
    const int nvalid = min(D::BN, rows - r0);
    const typename D::Loader wl(p0, p1, p2, K, nb + r0, nvalid, tid);
    wl.copy(raw, kt, K, p0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    dequant_tile<D, F16>(raw, w + (long long)r0 * K, K, nvalid, kt, tid);
}

// The group formats' f16 scales (plane p2 of weight rows nb + r, gpr groups per row: row-major [rows][gpr] for
// W8G32, Q4/Q5/Q6's tiled plane where `tiled`, wformat.cuh qg_scale_word) as fp32 [gpr][rows], the scale map of
// gemm90_f16_wsg (widening is exact). Block (bx, by): groups 32 bx .., rows 32 by .. through a shared tile, so that
// the writes (along a group's rows) are contiguous runs of 32 (the row-major reads too); 256 threads, 4 elements each.
__global__ void __launch_bounds__(256) group_scales_t(const u16* __restrict__ p2, float* __restrict__ out, int rows,
                                                     int gpr, long long nb, int tiled) {
    __shared__ float tile[32][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5, g0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int r = r0 + ty + 8 * j, g = g0 + tx;
        if (r < rows && g < gpr)
            tile[ty + 8 * j][tx] = hd_f16_to_f(p2[tiled ? qg_scale_word(nb + r, gpr, g) : (nb + r) * gpr + g]);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int g = g0 + ty + 8 * j, r = r0 + tx;
        if (r < rows && g < gpr) out[(long long)g * rows + r] = tile[tx][ty + 8 * j];
    }
}

// ---- fp16 mode: float activations rounded once per GEMM to fp16 with a power-of-two scale per row --------------
// (docs/cuda.md, "Prefill GEMM inputs"). One MMA per k16 step instead of the pair's two: the activations lose what
// fp16 cannot hold (11 significant bits of every value above 2^-14 of the row's largest; perf/fidelity_prefill.py
// measures the cost), the weights of the folded formats stay exact (bf16x8_to_f16). A row's result depends only on
// its own values and K, as in every other mode.
// y[m, n] = (sum_k xh[m, k] W[n, k]) * row_scale(n) * rowf[m]: xh, rowf from split_f16row, W the fp16 operand rows
// from dequant90<F, true>; the pair kernel's tiles, stages and MMA order otherwise.
template <typename D>
__global__ void __launch_bounds__(GS_THREADS, 1)
    gemm90_f16(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
               const bf16* __restrict__ xh, const float* __restrict__ rowf, float* __restrict__ y, int M, int N, int K,
               long long ldx, long long ldy) {
    static_assert(D::DIRECT, "fp16 mode reads operand rows");
    gs_dense_tile<D, ActF16, float>(p0, p1, p2, xh, y, M, N, K, ldx, ldy, rowf);
}

// The fp16 mode with the weights converted in the main loop (gs_tile's convert_tile<D, true>, every thread) instead
// of once per GEMM into a scratch: for chunks of few rows (a follow-up turn's 256 tokens: two row tiles), where the
// dequant pass's traffic (stored bytes + 2 B written + 2 B read back per weight) is not spread over many row tiles.
// D: the stored format (DqNVFP4, DqFP8); the operand tile is byte for byte the one gemm90_f16<DqFolded<D>> copies
// from dequant90<D, true>'s scratch (tests/test_gemm_pair_host.py), with the same MMA order and epilogue, so the
// result is bitwise gemm90_f16's: the row threshold in gemm_pair.py moves time, never values.
template <typename D>
__global__ void __launch_bounds__(GS_THREADS, 1)
    gemm90_f16il(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
                 const bf16* __restrict__ xh, const float* __restrict__ rowf, float* __restrict__ y, int M, int N,
                 int K, long long ldx, long long ldy) {
    static_assert(!D::DIRECT && D::GPT == 0, "the folded formats: operand values exact in fp16");
    gs_dense_tile<D, ActF16, float>(p0, p1, p2, xh, y, M, N, K, ldx, ldy, rowf);
}

// The fp16 mode of the MoE prefill GEMM: gemm90_experts over split_f16row's rows (the expert-sorted slots' inputs)
// with the weights converted in the main loop as gemm90_f16il does; y[s, n] = (sum_k xh[s, k] W_e[n, k]) *
// row_scale(e N + n) * rowf[s]. A slot's result depends only on its own row, its expert and K.
template <typename D>
__global__ void __launch_bounds__(GS_THREADS, 1)
    gemm90_experts_f16(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
                       const bf16* __restrict__ xh, const float* __restrict__ rowf, float* __restrict__ y,
                       const int* __restrict__ off, const int* __restrict__ tile_e, const int* __restrict__ tile_s0,
                       const int* __restrict__ ntiles, int N, int K, long long ldx, long long ldy) {
    static_assert(!D::DIRECT && D::GPT == 0, "the folded formats: operand values exact in fp16");
    gs_expert_tile<D, ActF16, float>(p0, p1, p2, xh, y, off, tile_e, tile_s0, ntiles, N, K, ldx, ldy, rowf);
}

// gemm90_experts_f16 with the slots' rows read in place (ActF16G): slot s's A row is row rows[s] of xh (split_f16row
// of the tokens' rows [T, K], row stride ldx) instead of row s of a per-slot copy (split_f16row_in<true, false>
// wrote T * top_k rows of which only T differ); rowf[s] is the factor of slot s's row (its token's, gathered per
// slot). The same operand tiles (wdq.cuh ActF16G), MMA order and epilogue: bitwise gemm90_experts_f16's result.
template <typename D>
__global__ void __launch_bounds__(GS_THREADS, 1)
    gemm90_experts_f16g(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
                        const bf16* __restrict__ xh, const int* __restrict__ rows, const float* __restrict__ rowf,
                        float* __restrict__ y, const int* __restrict__ off, const int* __restrict__ tile_e,
                        const int* __restrict__ tile_s0, const int* __restrict__ ntiles, int N, int K, long long ldx,
                        long long ldy) {
    static_assert(!D::DIRECT && D::GPT == 0, "the folded formats: operand values exact in fp16");
    gs_expert_tile<D, ActF16G, float>(p0, p1, p2, GatherX{xh, rows}, y, off, tile_e, tile_s0, ntiles, N, K, ldx, ldy,
                                      rowf);
}

// gemm90_experts_f16g with the SwiGLU in its epilogue (gate_up.cuh; the MoE prefill's gate | up product): expert
// e's N = 2 I weight rows are [gate | up] (I % (BN / 2) == 0), CTA (nt, tile) computes features (BN / 2) nt ..
// + BN / 2 - 1 of its slots from the gate rows and the same features' up rows, and writes h [slots, I] (row stride
// ldh: even, 8-byte aligned rows) = silu(gate) * up and tmax [slots][I / (BN / 2)], each slot's largest |h| per
// column tile. Grid (N / BN, tile bound). h is bitwise split_f16row_in<false, true>'s SwiGLU of what
// gemm90_experts_f16g<D> writes, and split_f16row_max over (h, tmax) bitwise that split's fp16 rows.
template <typename D>
__global__ void __launch_bounds__(GS_THREADS, 1)
    gemm90_experts_f16g_swiglu(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
                               const bf16* __restrict__ xh, const int* __restrict__ rows,
                               const float* __restrict__ rowf, float* __restrict__ h, float* __restrict__ tmax,
                               const int* __restrict__ off, const int* __restrict__ tile_e,
                               const int* __restrict__ tile_s0, const int* __restrict__ ntiles, int N, int K,
                               long long ldx, long long ldh) {
    static_assert(!D::DIRECT && D::GPT == 0, "the folded formats: operand values exact in fp16");
    gs_expert_tile<D, ActF16G, float, true>(p0, p1, p2, GatherX{xh, rows}, h, off, tile_e, tile_s0, ntiles, N, K,
                                            ldx, ldh, rowf, tmax);
}

// 8 consecutive inputs of split_f16row's row xr at column k: the stored values, or (SWIGLU: xr holds [gate | up],
// each K wide) silu(gate) * up with the swiglu kernel's own expression (activation.cu, float rows), so the values are
// bitwise those swiglu would have stored.
template <bool SWIGLU>
__device__ __forceinline__ void split_in8(const float* xr, int K, int k, float v[8]) {
    load8x(xr + k, v);
    if constexpr (SWIGLU) {
        float u[8];
        load8x(xr + K + k, u);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = siluf_(v[j]) * u[j];
    }
}

// x [M, K] (row stride ldx, K % 8 == 0) -> xh [M, K] fp16 words (row stride K) = x * 2^k rounded to nearest even,
// rowf[m] = 2^-k (f16row_scale of the row's largest |x|). One block per row: the row's max (exact: max is order-free),
// then its 8-k chunks. The input transforms (split_f16row_in): ROWS, row m is x's row rows[m] (the MoE prefill's
// expert-sorted slots read their token's row in place, no gathered copy); SWIGLU, x's rows are [gate | up] (2K wide)
// and row m is their SwiGLU (the down projection's input without the swiglu kernel's [M, K] array). Either gives
// the bits split_f16row gives on the gathered / SwiGLU'd array; GATE (split_f16row_gate), row m is x[m] times the
// sigmoid of its gate (wdq.cuh split_gate8; gate: head 0's first gate element of row 0, row stride ldg), the bits
// split_f16row gives on sigmoid_gate's output. The row's max is taken over the transformed values. keep (the launch
// gives K floats of dynamic shared memory): the first pass keeps the row's inputs there for the second, which
// otherwise reads (and transforms) them again; the same values either way. Measured (H200, 1e66f7e): the 27B's
// SwiGLU'd down-projection rows (2 x 17408 floats in) re-read from DRAM took 0.30 ms per 4096-row call, as many rows
// are in flight as the L2 holds.
// The row splits' two shared steps: the largest of the 256 threads' values m (8 warps: shuffles, then wmax[8]),
// and 8 values times the row's scale s rounded to fp16 (nearest even) into 16 bytes at dst.
__device__ __forceinline__ float f16row_block_max(float m, float (&wmax)[8]) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((tid & 31) == 0) wmax[tid >> 5] = m;
    __syncthreads();
    m = wmax[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) m = fmaxf(m, wmax[w]);
    return m;
}

__device__ __forceinline__ void f16row_put8(const float (&v)[8], float s, bf16* dst) {
    u32 o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = f16_rne_bits(v[2 * j] * s) | f16_rne_bits(v[2 * j + 1] * s) << 16;
    *reinterpret_cast<uint4*>(dst) = make4(o[0], o[1], o[2], o[3]);
}

// BF16 weights' fp16 operand (gemm_bf16.py): weight row nb + r of w (bf16 [., K]) times 2^k, k = f16row_scale of the
// row's largest |w| (its largest value in [2^14, 2^15)), as fp16 words into out [rows, K] (row stride K), 2^-k into
// rs[r]; inexact[0] += the row's weights that fp16 does not hold exactly at that scale (bf16_f16_scaled): the host
// keeps the operand only when the whole weight is exact. One block per row.
__global__ void __launch_bounds__(256)
    bf16_f16_rows(const u16* __restrict__ w, u16* __restrict__ out, float* __restrict__ rs, int* __restrict__ inexact,
                  int rows, int K, long long nb) {
    __shared__ float wmax[8];
    __shared__ int bad;
    const int r = blockIdx.x, tid = threadIdx.x;
    const u16* src = w + (nb + r) * (long long)K;
    float m = 0.f;
    for (int k = tid; k < K; k += 256) m = fmaxf(m, fabsf(f32_from_bits((u32)src[k] << 16)));
    if (tid == 0) bad = 0;
    float inv;
    const float s = f16row_scale(f16row_block_max(m, wmax), inv);  // its barrier orders bad = 0 before the adds
    if (tid == 0) rs[r] = inv;
    int nbad = 0;
    for (int k = tid; k < K; k += 256) {
        u32 h;
        nbad += bf16_f16_scaled(src[k], s, inv, h) ? 0 : 1;
        out[(long long)r * K + k] = (u16)h;
    }
    if (nbad) atomicAdd(&bad, nbad);
    __syncthreads();
    if (tid == 0 && bad) atomicAdd(inexact, bad);
}

template <bool ROWS, bool SWIGLU, bool GATE = false>
__device__ __forceinline__ void split_f16row_body(const float* __restrict__ x, const int* __restrict__ rows,
                                                  bf16* __restrict__ xh, float* __restrict__ rowf, int K,
                                                  long long ldx, bool keep, const float* __restrict__ gate = nullptr,
                                                  int D = 0, long long ldg = 0) {
    static_assert(!(GATE && (ROWS || SWIGLU)), "the gate is the only transform of its rows");
    __shared__ float wmax[8];
    extern __shared__ float4 srow4[];  // [K / 4] when keep
    float* srow = reinterpret_cast<float*>(srow4);
    const int r = blockIdx.x, tid = threadIdx.x;
    const float* xr = x + (long long)(ROWS ? rows[r] : r) * ldx;
    const float* gr = GATE ? gate + (long long)r * ldg : nullptr;
    auto in8 = [&](int k, float v[8]) {
        if constexpr (GATE)
            split_gate8(xr, gr, D, k, v);
        else
            split_in8<SWIGLU>(xr, K, k, v);
    };
    float m = 0.f;
    for (int k = 8 * tid; k < K; k += 8 * 256) {
        float v[8];
        in8(k, v);
        if (keep) {
            reinterpret_cast<float4*>(srow + k)[0] = make_float4(v[0], v[1], v[2], v[3]);
            reinterpret_cast<float4*>(srow + k)[1] = make_float4(v[4], v[5], v[6], v[7]);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(v[j]));
    }
    float inv;
    const float s = f16row_scale(f16row_block_max(m, wmax), inv);
    if (tid == 0) rowf[r] = inv;
    for (int k = 8 * tid; k < K; k += 8 * 256) {
        float v[8];
        if (keep)  // the thread's own chunks: no barrier needed between the passes
            load8x(srow + k, v);
        else
            in8(k, v);
        f16row_put8(v, s, xh + (long long)r * K + k);
    }
}

__global__ void __launch_bounds__(256) split_f16row(const float* __restrict__ x, bf16* __restrict__ xh,
                                                    float* __restrict__ rowf, int M, int K, long long ldx) {
    split_f16row_body<false, false>(x, nullptr, xh, rowf, K, ldx, false);
}

// M = the number of output rows (rows[] entries with ROWS); K = the output width (x's rows are 2K wide with SWIGLU);
// keep: K * 4 bytes of dynamic shared memory were given (split_f16row_body)
template <bool ROWS, bool SWIGLU>
__global__ void __launch_bounds__(256) split_f16row_in(const float* __restrict__ x, const int* __restrict__ rows,
                                                       bf16* __restrict__ xh, float* __restrict__ rowf, int M, int K,
                                                       long long ldx, int keep) {
    split_f16row_body<ROWS, SWIGLU>(x, rows, xh, rowf, K, ldx, keep != 0);
}

// The attention output gate applied by the row split (split_f16row_body's GATE): row m = x[m] * sigmoid(gate), the
// gate read in place from the q|gate projection ([query D | gate D] per head): gate = qg + D (head 0's first gate
// element), ldg qg's row stride; D % 8 == 0, K = heads * D, 16-byte aligned 8-element chunks of x and the gate.
// keep as split_f16row_in (K * 4 bytes of dynamic shared memory).
__global__ void __launch_bounds__(256)
    split_f16row_gate(const float* __restrict__ x, const float* __restrict__ gate, bf16* __restrict__ xh,
                      float* __restrict__ rowf, int M, int K, long long ldx, int D, long long ldg, int keep) {
    split_f16row_body<false, false, true>(x, nullptr, xh, rowf, K, ldx, keep != 0, gate, D, ldg);
}

// The fp16 rows of the SwiGLU'd MLP input that gemm90_f16_ws_swiglu (gemm_sm90_ws.cu) wrote: h [M, K] (row stride
// K), whose largest |h| per row is the max of the row's tn tile maxima tmax[m][0 .. tn). One block per row, one
// pass: the row's max (the same value split_f16row_in<false, true> finds over the same h: fmaxf from 0 is
// order-free), its scale, then h's 8-k chunks as split_f16row_body's second pass writes them; so xh and rowf are
// bitwise that kernel's on the [gate | up] rows h came from.
__global__ void __launch_bounds__(256) split_f16row_max(const float* __restrict__ h, const float* __restrict__ tmax,
                                                        bf16* __restrict__ xh, float* __restrict__ rowf, int M, int K,
                                                        int tn) {
    __shared__ float wmax[8];
    const int r = blockIdx.x, tid = threadIdx.x;
    float m = 0.f;
    for (int j = tid; j < tn; j += 256) m = fmaxf(m, tmax[(long long)r * tn + j]);
    float inv;
    const float s = f16row_scale(f16row_block_max(m, wmax), inv);
    if (tid == 0) rowf[r] = inv;
    const float* hr = h + (long long)r * K;
    for (int k = 8 * tid; k < K; k += 8 * 256) {
        float v[8];
        load8x(hr + k, v);
        f16row_put8(v, s, xh + (long long)r * K + k);
    }
}
