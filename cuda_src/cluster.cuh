// Thread-block cluster primitives (sm_90): distributed shared memory stores and mbarriers across the blocks of a
// cluster, for kernels that exchange a few values between blocks without a global-memory round trip
// (gdn_step.cu's gdn_step_cl). A kernel takes its dynamic shared memory from cluster_smem() so that the host
// emulation (tests/host/gdn_emu.cpp, GDN_HOST_EMU), which runs a cluster's blocks concurrently, can give each block
// its own; the emulation defines the emu_* functions used below.
//
// Protocol (push): block X stores into block P's shared memory (st_cluster), then arrives on P's mbarrier with
// release semantics at cluster scope (mbar_arrive_cluster); P waits on its own mbarrier with acquire semantics
// (mbar_wait_cluster) and then reads its shared memory. Every mbarrier a peer may arrive on must be initialised and
// published (mbar_init, then cluster_sync_init by every thread of every block) before the first remote arrival.
#pragma once
#include "common.cuh"

// the dynamic shared memory of this block (16-byte aligned)
__device__ __forceinline__ float* cluster_smem() {
#ifdef GDN_HOST_EMU
    return emu_block_smem();
#else
    extern __shared__ __align__(16) float cluster_smem_[];
    return cluster_smem_;
#endif
}

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
#ifdef __CUDA_ARCH__
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(bar)),
                 "r"(count)
                 : "memory");
#elif defined(GDN_HOST_EMU)
    emu_mbar_init(bar, count);
#endif
}

// Every thread of every block of the cluster: the mbarrier initialisations of all blocks become visible to the
// cluster (fence.mbarrier_init), then a full cluster barrier.
__device__ __forceinline__ void cluster_sync_init() {
#ifdef __CUDA_ARCH__
    asm volatile(
        "fence.mbarrier_init.release.cluster;\n\t"
        "barrier.cluster.arrive.relaxed.aligned;\n\t"
        "barrier.cluster.wait.aligned;" ::
            : "memory");
#elif defined(GDN_HOST_EMU)
    emu_cluster_sync();
#endif
}

// *p of block `rank` of this cluster (p: an address in this block's shared memory; the same offset there) = v
__device__ __forceinline__ void st_cluster(float* p, unsigned rank, float v) {
#ifdef __CUDA_ARCH__
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote)
                 : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
#elif defined(GDN_HOST_EMU)
    *emu_peer(p, rank) = v;
#endif
}

// one arrival on block `rank`'s copy of mbarrier `bar`, ordered after this thread's earlier stores (release.cluster)
__device__ __forceinline__ void mbar_arrive_cluster(unsigned long long* bar, unsigned rank) {
#ifdef __CUDA_ARCH__
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote)
                 : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(rank));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
#elif defined(GDN_HOST_EMU)
    emu_mbar_arrive(emu_peer(bar, rank));
#endif
}

// until the phase of this block's mbarrier `bar` with parity `parity` has completed (acquire.cluster: the stores
// that the arrivals released are visible afterwards)
__device__ __forceinline__ void mbar_wait_cluster(unsigned long long* bar, unsigned parity) {
#ifdef __CUDA_ARCH__
    const unsigned a = (unsigned)__cvta_generic_to_shared(bar);
    unsigned done = 0;
    while (!done)
        asm volatile(
            "{\n\t.reg .pred p;\n\t"
            "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(a), "r"(parity)
            : "memory");
#elif defined(GDN_HOST_EMU)
    emu_mbar_wait(bar, parity);
#endif
}
