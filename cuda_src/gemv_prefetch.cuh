// The decode GEMV's L2 prefetch of the next product's weights (gemv.cu: gemv_mma_pf, and the expert launches'
// hint of their down projection). NVFP4 device layout only (GvPf). Part of gemv.cu: uses its GV_* geometry
// defines, which it sets before including this.
#pragma once
#include "common.cuh"
#include "wfrag.cuh"

// L2 prefetch of the next product's weights (decode chains: linear.gemv's ``prefetch``). A chain of GEMVs runs at
// 50-65% of copy bandwidth on the 27B's mid-size matrices although the lm_head reaches 77% and, without the
// dequantization, 97% (perf/results/device_run_5c07f3d.txt): each launch ramps up and drains, and under PDL the
// next launch can only issue its first GV_STAGES - 1 tiles per warp before it waits for this one. Here the blocks
// of this launch that finish last (the tail, when DRAM has spare bandwidth) each fetch into L2 the first
// GV_PF_TILES K-tiles of one block of the next launch's first wave (next block j = G - 1 - L for this block's
// linear id L, then j + G, ... below min(next grid, GV_PF_WAVE)), so that its main loop starts from L2.
// q0 / q1: the next weight's NVFP4 code and scale planes (wformat.cuh's device layout: a 16-row group's K tiles
// are consecutive 1 KiB code / 128 B scale blocks, so one bulk prefetch per group and plane), qn x qk its shape,
// qbx x qsplits its grid (gemv_geometry.gemv_plan). Only hints: nothing reads the prefetched bytes but the next
// launch's own loads, so results never change. Formats other than NVFP4 (GvPf<F>::ON false) ignore q0.
// GV_PF_START 1 (the default since 2026-12-04; measured 0 above: a loss): every block issues its hints at its start,
// after its own first tiles and before its PDL wait (block L hints next block L, L + G, ...), so the bytes move
// while this launch streams instead of extending its drain (likely why the end placement lost: a grid completes only
// after its bulk operations have).
// Expert launches (experts == 1, e.g. gate | up) hint the down projection of their own slot's expert instead
// (gv_prefetch_expert): q0 / q1 that weight's planes, qn its rows per expert, qk its K; the slot's blocks share it.
#ifndef GV_PF_START
#define GV_PF_START 1
#endif
#ifndef GV_PF_TILES
#define GV_PF_TILES 4
#endif
#define GV_PF_WAVE 528  // one wave of the GEMV on a 132-SM H200 (gemv_geometry._GV_WAVE_BLOCKS)
template <typename F> struct GvPf { static constexpr bool ON = false; };
template <> struct GvPf<FragNVFP4> { static constexpr bool ON = true; };
template <> struct GvPf<FragNVFP4RowG> { static constexpr bool ON = true; };

__device__ __forceinline__ void gv_l2_prefetch(const u8* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p, (void)bytes;
#endif
}

template <int ROWS>
__device__ __forceinline__ void gv_prefetch_next(const u8* q0, const u8* q1, int qn, int qk, int qbx, int qsplits) {
    const int tid = threadIdx.x;
    if (tid >= 2 * (ROWS / 16)) return;  // one thread per (16-row group, plane)
    const long long g = gridDim.x * (long long)gridDim.y * gridDim.z;
    const long long l = blockIdx.x + gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
    const long long wave = min((long long)qbx * qsplits, (long long)GV_PF_WAVE);
    const int ntiles = (qk + 127) / 128, grp = tid % (ROWS / 16), codes = tid < ROWS / 16;
    const long long kp = kpad128(qk);
    for (long long j = GV_PF_START ? l : g - 1 - l; j < wave; j += g) {
        const int bx = (int)(j % qbx), split = (int)(j / qbx);
        const int kt0 = split * ntiles / qsplits, nt = (split + 1) * ntiles / qsplits - kt0;
        const long long n = (long long)bx * ROWS + 16 * grp;
        if (n >= qn || nt <= 0) continue;
        const unsigned tiles = (unsigned)min(nt, GV_PF_TILES);
        if (codes)
            gv_l2_prefetch(q0 + nv4_codes(n, kp, kt0 * 128), tiles * 1024u);
        else
            gv_l2_prefetch(q1 + nv4_scales(n, kp, kt0 * 128), tiles * 128u);
    }
}

// An expert launch's hint (GV_PF_START): the down projection rows [e * qn, (e + 1) * qn) of expert e, every K tile:
// in the device layout one contiguous run of code bytes and one of scale bytes (qn a multiple of 16, the host
// checks), cut into equal 16-byte-aligned shares over the slot's blocks (x, y of the grid; z is the slot).
__device__ __forceinline__ void gv_prefetch_expert(const u8* q0, const u8* q1, int qn, int qk, long long e) {
    const int tid = threadIdx.x;
    if (tid >= 2) return;  // thread 0 the codes, thread 1 the scales
    const long long kp = kpad128(qk), n0 = e * qn;
    const long long size = tid == 0 ? qn * kp / 2 : qn * kp / 16;
    const u8* base = tid == 0 ? q0 + nv4_codes(n0, kp, 0) : q1 + nv4_scales(n0, kp, 0);
    const long long parts = (long long)gridDim.x * gridDim.y, l = blockIdx.x + (long long)gridDim.x * blockIdx.y;
    const long long share = (size + parts * 16 - 1) / (parts * 16) * 16, off = l * share;
    if (off < size) gv_l2_prefetch(base + off, (unsigned)min(share, size - off));
}
