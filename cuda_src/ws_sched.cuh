// Schedule of the warp-specialized fp16 GEMM (gemm_sm90_ws.cu): which output tiles a persistent CTA walks, the
// smem ring's stage / parity bookkeeping, and the producer / consumer loops themselves, written against an `Ops`
// policy so that the very same loops run on the device (mbarrier + TMA + wgmma, gemm_sm90_ws.cu) and on the host
// (std::thread per role, emulated mbarriers and TMA; tests/test_gemm_ws_host.py). __host__ __device__ throughout.
//
// Tiles: 128 (M) x 256 (N) outputs; tile b in [0, tm * tn) -> (mt, nt) by gs_raster (groups of GS_GROUP_M row
// tiles walk the column tiles together, as the non-persistent kernels' grid does). CTA c of a grid of G walks
// b = c, c + G, c + 2G, ...: every tile exactly once, in increasing b per CTA, so the tiles in flight at any time
// are a window of consecutive b (the same L2 footprint as one wave of the non-persistent grid).
//
// Ring: WS_STAGES slots of one K tile each (A 128 x 64 fp16, B 256 x 64 fp16). Producer and consumers count the
// K tiles they have handled over all of the CTA's output tiles (`it`, the same sequence on both sides): it uses
// slot it % S in round it / S. full[s] completes one phase per fill (the producer's arrive.expect_tx + the TMA's
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

struct WsSched {
    int tm, tn, nk, ntiles;
    HD WsSched(int M, int N, int K)
        : tm((M + GS_BM - 1) / GS_BM), tn((N + WS_BN - 1) / WS_BN), nk((K + GS_BK - 1) / GS_BK), ntiles(tm * tn) {}
    HD void tile(int b, int& mt, int& nt) const { gs_raster(b, tm, tn, mt, nt); }
};

struct WsRing {
    u32 it = 0;
    HD int stage() const { return (int)(it % WS_STAGES); }
    HD u32 parity() const { return (it / WS_STAGES) & 1u; }
    HD void next() { ++it; }
};

// The loops call the policy's members, __device__ in the kernel and host-only in the host test (whose instances never
// reach device code): nvcc's check of host calls from __host__ __device__ templates is off for them.
#if defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#define WS_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define WS_HD_TEMPLATE
#endif

// Producer (one thread): for each K tile of each of the CTA's output tiles, wait until the slot is free, then fill
// it (arm full[s] with the stage's bytes and issue the A and B box copies).
//   o.wait_empty(s, parity), o.fill(s, kt, mt, nt)
WS_HD_TEMPLATE
template <typename O> HD void ws_produce(O& o, const WsSched& sc, int cta, int grid) {
    WsRing r;
    for (int b = cta; b < sc.ntiles; b += grid) {
        int mt, nt;
        sc.tile(b, mt, nt);
        for (int kt = 0; kt < sc.nk; ++kt, r.next()) {
            o.wait_empty(r.stage(), r.parity() ^ 1u);
            o.fill(r.stage(), kt, mt, nt);
        }
    }
}

// Consumer warpgroup: per output tile, zero the accumulators, then per K tile wait for its slot, issue its four k16
// wgmmas (async), retire the previous K tile's wgmmas and release that slot; after the last K tile retire all and
// release, then the epilogue (registers -> global) while the producer already fills the next tile's slots.
//   o.zero(), o.wait_full(s, parity), o.mma(s), o.retire_prev(), o.retire_all(), o.release(s), o.epilogue(mt, nt)
WS_HD_TEMPLATE
template <typename O> HD void ws_consume(O& o, const WsSched& sc, int cta, int grid) {
    WsRing r;
    for (int b = cta; b < sc.ntiles; b += grid) {
        int mt, nt;
        sc.tile(b, mt, nt);
        o.zero();
        int prev = -1;
        for (int kt = 0; kt < sc.nk; ++kt, r.next()) {
            o.wait_full(r.stage(), r.parity());
            o.mma(r.stage());
            o.retire_prev();  // wgmma.wait_group 1: the previous K tile's wgmmas are done reading their slot
            if (prev >= 0) o.release(prev);
            prev = r.stage();
        }
        o.retire_all();
        if (prev >= 0) o.release(prev);
        o.epilogue(mt, nt);
    }
}
