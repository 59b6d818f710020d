// Schedule of the warp-specialized fp16 GEMM (gemm_sm90_ws.cu): which work units (output tile, K split) a
// persistent CTA walks, the smem ring's stage / parity bookkeeping, and the producer / consumer loops themselves,
// written against an `Ops` policy so that the very same loops run on the device (mbarrier + TMA + wgmma,
// gemm_sm90_ws.cu) and on the host (std::thread per role, emulated mbarriers and TMA; tests/test_gemm_ws_host.py).
// __host__ __device__ throughout.
//
// Tiles: 128 (M) x 256 (N) outputs (x 128 for the group formats: WsCfg); tile b in [0, tm * tn) -> (mt, nt) by gs_raster (groups of GS_GROUP_M row
// tiles walk the column tiles together, as the non-persistent kernels' grid does).
// Work units (split-K): each tile's nk K tiles are cut into S splits, split s covering K tiles
// [s nk / S, (s + 1) nk / S) (floor: lengths differ by at most one; a split may be empty only if S > nk, which the
// host never chooses, and then contributes zeros). Unit u in [0, tm tn S) is split u % S of tile u / S: the splits of
// one tile are consecutive units, so they run at the same time on neighbouring CTAs (the units in flight read the
// same window of tiles' A rows and B rows as without splits, each over its own K range). With S = 1 unit u is tile
// u over all of K: the schedule, and every value, is the unsplit kernel's. CTA c of a grid of G walks
// u = c, c + G, c + 2G, ...: every unit exactly once, in increasing u per CTA, so the units in flight at any time
// are a window of consecutive u (the same L2 footprint as one wave of the non-persistent grid).
//
// Ring: WS_STAGES slots of one K tile each (A 128 x 64 fp16, B 256 x 64 fp16). Producer and consumers count the
// K tiles they have handled over all of the CTA's work units (`it`, the same sequence on both sides): it uses
// slot it % WS_STAGES in round it / WS_STAGES. full[s] completes one phase per fill (the producer's arrive.expect_tx + the TMA's
// transaction bytes); empty[s] one phase per release (every consumer warp arrives once, after wgmma.wait_group
// has retired the wgmmas that read the slot). Round j of slot s: the consumers wait for full[s]'s phase j (parity
// j & 1); the producer, before refilling for round j, waits for empty[s]'s phase j - 1 (parity (j & 1) ^ 1, which a
// fresh barrier reports complete for j = 0). A phase bit can stand for "round j" only because neither side can get
// two rounds ahead of the other: the producer cannot start round j + 1 of a slot before round j was released, and a
// consumer cannot wait for round j + 1 before it released round j itself.
#pragma once
#include "common.cuh"
#include "wdq.cuh"

#define WS_BN 256        // CTA columns (weight rows): the m64n256k16 wgmma of the cp.async kernel
#define WS_STAGES 4      // 4 x 48 KB ring (+ barriers) in the 227 KB opt-in maximum
#define WS_THREADS 384   // warpgroup 0: producer (one thread issues TMA); 1, 2: consumers (rows 0-63, 64-127)
#define WS_CONSUMER_WARPS 8
#define WS_A_BYTES (GS_BM * 128)  // 128 rows x 64 fp16
#define WS_B_BYTES (WS_BN * 128)  // 256 rows x 64 fp16
#define WS_STAGE_BYTES (WS_A_BYTES + WS_B_BYTES)
// The group-int formats (gemm90_f16_wsg<GPT>: fp16 codes, fp32 group scales on partial sums): 128 columns per tile
// (a consumer holds 64 accumulators and GPT x 64 partial sums), the slot's B tile 128 rows, then the K tile's GPT
// scale rows of 128 fp32 (512 or 1024 bytes; 1024 reserved so that the slots stay 1024-aligned): 33 KB, 6 slots.
#define WSG_BN 128
#define WSG_B_BYTES (WSG_BN * 128)
#define WSG_S_BYTES 1024
#define WSG_STAGE_BYTES (WS_A_BYTES + WSG_B_BYTES + WSG_S_BYTES)
#define WSG_STAGES 6

// The ring of a kernel instance: GPT = 0 the NVFP4 / FP8 kernels' (48 KB slots), else the group formats' (33 KB);
// TX: the bytes one fill's box copies bring (the full barrier's transaction count).
template <int GPT> struct WsCfg {
    static constexpr int BN = GPT ? WSG_BN : WS_BN, STAGES = GPT ? WSG_STAGES : WS_STAGES;
    static constexpr int STAGE_BYTES = GPT ? WSG_STAGE_BYTES : WS_STAGE_BYTES;
    static constexpr int TX = GPT ? WS_A_BYTES + WSG_B_BYTES + GPT * WSG_BN * 4 : WS_STAGE_BYTES;
};

// One work unit: output tile (mt, nt), split `split` of the sched's S, its K tiles [k0, k1).
struct WsUnit {
    int mt, nt, split, k0, k1;
};

struct WsSched {
    int tm, tn, nk, ntiles, splits, nunits;
    HD WsSched(int M, int N, int K, int S, int bn = WS_BN)  // bn: the tile's columns (WS_BN, or WSG_BN)
        : tm((M + GS_BM - 1) / GS_BM), tn((N + bn - 1) / bn), nk((K + GS_BK - 1) / GS_BK), ntiles(tm * tn),
          splits(S), nunits(tm * tn * S) {}
    HD WsUnit unit(int u) const {
        WsUnit w;
        const int b = u / splits;
        w.split = u - b * splits;
        gs_raster(b, tm, tn, w.mt, w.nt);
        w.k0 = (int)((long long)w.split * nk / splits);
        w.k1 = (int)((long long)(w.split + 1) * nk / splits);
        return w;
    }
};

// Split-K (S > 1): the fp32 value of output i = m N + n before the epilogue's scaling, the partials of splits
// 0, 1, ..., S - 1 (part: [S][M][N], mn = M N, each the unscaled accumulator of one unit) added in that order. The
// order depends on S only, never on which CTA finished first: the result is deterministic.
HD float ws_split_sum(const float* part, long long mn, long long i, int S) {
    float v = part[i];
    for (int s = 1; s < S; ++s) v += part[s * mn + i];
    return v;
}

template <int NS> struct WsRingT {  // NS slots: WS_STAGES, or WSG_STAGES (the ops' STAGES)
    u32 it = 0;
    HD int stage() const { return (int)(it % NS); }
    HD u32 parity() const { return (it / NS) & 1u; }
    HD void next() { ++it; }
};
typedef WsRingT<WS_STAGES> WsRing;

// The loops call the policy's members, __device__ in the kernel and host-only in the host test (whose instances never
// reach device code): nvcc's check of host calls from __host__ __device__ templates is off for them.
#if defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#define WS_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define WS_HD_TEMPLATE
#endif

// Producer (one thread): for each K tile of each of the CTA's work units, wait until the slot is free, then fill
// it (arm full[s] with the stage's bytes and issue the A and B box copies).
//   o.wait_empty(s, parity), o.fill(s, kt, mt, nt)
WS_HD_TEMPLATE
template <typename O> HD void ws_produce(O& o, const WsSched& sc, int cta, int grid) {
    WsRingT<O::STAGES> r;
    for (int u = cta; u < sc.nunits; u += grid) {
        const WsUnit w = sc.unit(u);
        for (int kt = w.k0; kt < w.k1; ++kt, r.next()) {
            o.wait_empty(r.stage(), r.parity() ^ 1u);
            o.fill(r.stage(), kt, w.mt, w.nt);
        }
    }
}

// Consumer warpgroup: per work unit, zero the accumulators, then per K tile of its split wait for its slot, issue
// its four k16 wgmmas (async; the group formats' mma also waits for them and adds the scaled partial sums, or with
// the deferred scaling adds the previous K tile's), retire
// the previous K tile's wgmmas and release that slot; after the last K tile
// retire all, drain (what the last K tile still owes its slot: the deferred group scaling) and release, then the
// epilogue (registers -> global: y itself for S = 1, the unit's split partial for S > 1) while the producer already
// fills the next unit's slots.
//   o.zero(), o.wait_full(s, parity), o.mma(s), o.retire_prev(), o.retire_all(), o.drain(s), o.release(s),
//   o.epilogue(unit)
WS_HD_TEMPLATE
template <typename O> HD void ws_consume(O& o, const WsSched& sc, int cta, int grid) {
    WsRingT<O::STAGES> r;
    for (int u = cta; u < sc.nunits; u += grid) {
        const WsUnit w = sc.unit(u);
        o.zero();
        int prev = -1;
        for (int kt = w.k0; kt < w.k1; ++kt, r.next()) {
            o.wait_full(r.stage(), r.parity());
            o.mma(r.stage());
            o.retire_prev();  // wgmma.wait_group 1: the previous K tile's wgmmas are done reading their slot
            if (prev >= 0) o.release(prev);
            prev = r.stage();
        }
        o.retire_all();
        if (prev >= 0) {
            o.drain(prev);
            o.release(prev);
        }
        o.epilogue(w);
    }
}
