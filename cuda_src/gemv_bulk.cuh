// The decode GEMV's weight ring filled by bulk copies (GV_BULK, an experiment: 0 by default, so the default
// instances are unchanged). With cp.async every lane of a warp issues its own 16-byte code and 4-byte scale copies
// per K-tile (8 per lane, 256 per warp), and each lane waits on its own copies. With GV_BULK one lane issues the
// stage's 2 * MT bulk copies (cp.async.bulk, the TMA unit's 1-D form: no tensor map) that complete on one mbarrier
// per stage, and the warp waits on that mbarrier. NVFP4 formats only (FragNVFP4, FragNVFP4RowG: their device layout
// keeps a 16-row group's K-tile as one 1 KiB block of codes and one 128-byte block of scales, and the codes' block is
// exactly the stage's lane order, wfrag.cuh); other formats keep cp.async. GV_BULK 2 adds an L2 evict-first hint
// to the copies (the weights are read once per step). The scales land compact (128 bytes per m-tile, not the
// cp.async path's 512-byte lane-per-word copy), so F::read_bulk reads them there. Same bytes in registers, same
// arithmetic: the same bits as the cp.async ring. The copies take whole 16-row groups of the device layout, so a
// launch's first row (row0) and an expert's rows must be multiples of 16 (every 27B and 35B-A3B shape; the
// experiment does not check it). Part of gemv.cu (included by gemv_products.cuh).
#pragma once
#include "common.cuh"
#include "wfrag.cuh"

#ifndef GV_BULK
#define GV_BULK 0
#endif

template <typename F> struct GvBulk { static constexpr bool ON = false; };
#if GV_BULK
template <> struct GvBulk<FragNVFP4> { static constexpr bool ON = true; };
template <> struct GvBulk<FragNVFP4RowG> { static constexpr bool ON = true; };
#endif

#ifdef GV_HOST_EMU
// The host emulation (tests/host/attn_emu.cpp): the copy is a memcpy by the issuing lane, the mbarrier a count of
// completed phases that the other lanes poll.
__device__ __forceinline__ std::atomic<unsigned long long>* gv_mbar_emu(u8* bar) {
    return reinterpret_cast<std::atomic<unsigned long long>*>(bar);
}
#endif

// lane 0 of the warp: the ring's GV_STAGES mbarriers (one arrival each: the issuing lane's expect_tx) at
// stage + F::BULK, then published to the async proxy; every lane: ordered after them (__syncwarp)
template <typename F> __device__ __forceinline__ void gv_bulk_init(u8* wsm, int lane) {
    constexpr int STAGE = F::VECS * 512;
    static_assert(F::BULK % 8 == 0 && F::BULK + 8 <= STAGE, "the mbarrier sits after the stage's bytes");
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < GV_STAGES; ++s) {
            u8* bar = wsm + s * STAGE + F::BULK;
#ifdef __CUDA_ARCH__
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((u32)__cvta_generic_to_shared(bar)) : "memory");
#elif defined(GV_HOST_EMU)
            new (bar) std::atomic<unsigned long long>(0ull);
#endif
        }
#ifdef __CUDA_ARCH__
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
    }
    __syncwarp();
}

// after the block's last read of the ring (gv_products ends with a block barrier): the mbarriers' memory may be
// reused (the cluster reduction writes its partial tile there)
template <typename F> __device__ __forceinline__ void gv_bulk_inval(u8* wsm, int lane) {
#ifdef __CUDA_ARCH__
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < GV_STAGES; ++s)
            asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(
                             (u32)__cvta_generic_to_shared(wsm + s * F::VECS * 512 + F::BULK))
                         : "memory");
    }
#else
    (void)wsm, (void)lane;
#endif
}

// lane 0: the stage's expected bytes on its mbarrier (one arrival), before its copies
__device__ __forceinline__ void gv_mbar_expect(u8* bar, u32 bytes) {
#ifdef __CUDA_ARCH__
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"((u32)__cvta_generic_to_shared(bar)),
                 "r"(bytes)
                 : "memory");
#else
    (void)bar, (void)bytes;
#endif
}

// lane 0: `bytes` (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst, counted on bar
__device__ __forceinline__ void gv_bulk_g2s(u8* dst, const u8* src, u32 bytes, u8* bar) {
#ifdef __CUDA_ARCH__
#if GV_BULK == 2
    u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            (u32)__cvta_generic_to_shared(dst)),
        "l"(src), "r"(bytes), "r"((u32)__cvta_generic_to_shared(bar)), "l"(pol)
        : "memory");
#else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     (u32)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(bytes), "r"((u32)__cvta_generic_to_shared(bar))
                 : "memory");
#endif
#else
    memcpy(dst, src, bytes);
    (void)bar;
#endif
}

// lane 0, after its copies: (emulation) the phase completes now; on the device the copies complete it
__device__ __forceinline__ void gv_bulk_issued(u8* bar) {
#ifdef GV_HOST_EMU
    gv_mbar_emu(bar)->fetch_add(1ull, std::memory_order_release);
#else
    (void)bar;
#endif
}

// every lane of the warp: the stage's reads (earlier rounds, by any lane) are done before lane 0's copies overwrite
// it (__syncwarp), and the generic proxy's reads are ordered before the async proxy's writes (fence.proxy.async)
__device__ __forceinline__ void gv_bulk_release_stage(int lane) {
    __syncwarp();
#ifdef __CUDA_ARCH__
    if (lane == 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
    (void)lane;
#endif
}

// every lane: until phase `parity` of the stage's mbarrier has completed (its bytes have landed and are visible)
__device__ __forceinline__ void gv_mbar_wait(u8* bar, u32 parity) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "{\n\t.reg .pred p;\n"
        "GV_BULK_WAIT:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
        "@!p bra GV_BULK_WAIT;\n}" ::"r"((u32)__cvta_generic_to_shared(bar)),
        "r"(parity)
        : "memory");
#elif defined(GV_HOST_EMU)
    while ((gv_mbar_emu(bar)->load(std::memory_order_acquire) & 1ull) == parity) std::this_thread::yield();
#endif
}

// The warp's next K-tile into stage st: the bulk copies (GvBulk) or each lane's cp.async copies
template <typename F>
__device__ __forceinline__ void gv_copy_stage(u8* st, int lane, typename F::Src& src, int t) {
    if constexpr (GvBulk<F>::ON) {
        gv_bulk_release_stage(lane);
        if (lane == 0) {
            u8* bar = st + F::BULK;
            gv_mbar_expect(bar, F::BULK);
            F::copy_bulk(st, src, [bar](u8* d, const u8* g, u32 n) { gv_bulk_g2s(d, g, n, bar); });
            gv_bulk_issued(bar);
        }
        F::advance_bulk(src);
    } else {
        F::copy_next(st, lane, src, t);
    }
}

// Tile i's stage of the warp's ring wsm has landed for this lane: its bulk copies' mbarrier phase, or this lane's
// cp.async group
template <typename F> __device__ __forceinline__ void gv_wait_stage(u8* wsm, int i) {
    if constexpr (GvBulk<F>::ON) {
        gv_mbar_wait(wsm + (i % GV_STAGES) * F::VECS * 512 + F::BULK, (u32)((i / GV_STAGES) & 1));
    } else {
        (void)wsm, (void)i;
        cp_async_wait<GV_STAGES - 2>();
        if constexpr (GvXlane<F>::ON) __syncwarp();  // the quad's other lanes' copies of the tile (wfrag.cuh)
    }
}
