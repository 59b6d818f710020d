// Host emulation of cuda_src/attention.cu's `attention` (tests/test_attention_decode_host.py): the kernel text is
// compiled by g++ after this prelude, which maps the CUDA built-ins it uses onto std::thread: one thread per CUDA
// thread, __syncthreads a block barrier, shuffles and mma.sync exchanges between per-warp barriers (the mma on its
// PTX fragment layout, products summed in double), dynamic shared memory one NaN-filled global array. Blocks run
// one after another in a shuffled order (the result must not depend on it); atomics need no locking.
// emu_launch_cluster_poisoned runs thread-block clusters (along y, gemv.cu's K-split clusters) one after another
// in a shuffled order, the blocks of a cluster concurrently, each with its own barriers, exchange buffers and
// NaN-filled shared memory (emu_block_smem), with the cluster barrier (emu_cluster_sync) and distributed shared
// memory (emu_peer: the same offset in another block's shared memory).
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>
using std::max;
using std::min;

#define ATT_HOST_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) alignas(n)
#define __trap() std::abort()
#define asm(...) std::abort()  // device-only paths (the kernel's own helpers take their #else branches)

struct emu_dim3 {
    unsigned x = 0, y = 0, z = 0;
};
thread_local emu_dim3 threadIdx, blockIdx;
emu_dim3 blockDim, gridDim;
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

constexpr int EMU_SMEM = 227 * 1024;
uint4 att_smem[EMU_SMEM / 16];
// one running block: its barriers, warp exchange and mma fragments, and (cluster launches) its own shared memory
struct EmuBlock {
    std::unique_ptr<std::barrier<>> bar, warp[32];
    unsigned xchg[1024];
    unsigned a[32][32][4], b[32][32][2];
    std::vector<uint4> own;
    void start(unsigned threads, unsigned smem_bytes) {
        bar = std::make_unique<std::barrier<>>(threads);
        for (unsigned w = 0; w < threads / 32; ++w) warp[w] = std::make_unique<std::barrier<>>(32);
        if (smem_bytes) own.assign((smem_bytes + 15) / 16, uint4{~0u, ~0u, ~0u, ~0u});  // NaN floats, -1 ints
    }
};
struct EmuCluster {
    std::vector<EmuBlock>* blocks;
    std::unique_ptr<std::barrier<>> bar;
};
thread_local EmuBlock* emu_blk;
thread_local EmuCluster* emu_cl;  // null outside a cluster launch

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline void __syncthreads() { emu_blk->bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_blk->warp[threadIdx.x >> 5]->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) {  // blocks run one at a time, and only thread 0 of a block calls this
    const int old = *p;
    *p = old + v;
    return old;
}
inline float __ldcg(const float* p) { return *p; }
inline int __ldcg(const int* p) { return *p; }
inline float2 __ldcg(const float2* p) { return *p; }
inline float4 __ldcg(const float4* p) { return *p; }

inline unsigned emu_exchange(unsigned v, int src) {
    const int t = threadIdx.x, w = t >> 5;
    emu_blk->xchg[t] = v;
    emu_blk->warp[w]->arrive_and_wait();
    const unsigned r = emu_blk->xchg[(w << 5) | (src & 31)];
    emu_blk->warp[w]->arrive_and_wait();
    return r;
}
inline float __shfl_xor_sync(unsigned, float v, int off) {
    return __uint_as_float(emu_exchange(__float_as_uint(v), (threadIdx.x & 31) ^ off));
}
inline unsigned __shfl_xor_sync(unsigned, unsigned v, int off) { return emu_exchange(v, (threadIdx.x & 31) ^ off); }
inline int __shfl_xor_sync(unsigned, int v, int off) { return (int)emu_exchange((unsigned)v, (threadIdx.x & 31) ^ off); }
inline float __shfl_sync(unsigned, float v, int src) { return __uint_as_float(emu_exchange(__float_as_uint(v), src)); }
inline int __shfl_sync(unsigned, int v, int src) { return (int)emu_exchange((unsigned)v, src); }

// mma.m16n8k16 row.col bf16 x bf16 + f32 (PTX fragment layout, g = lane / 4, t = lane % 4).
inline float emu_bf(unsigned h) { return __uint_as_float(h << 16); }
inline void emu_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    auto& emu_a = emu_blk->a;
    auto& emu_b = emu_blk->b;
    emu_a[w][l][0] = a0, emu_a[w][l][1] = a1, emu_a[w][l][2] = a2, emu_a[w][l][3] = a3;
    emu_b[w][l][0] = b0, emu_b[w][l][1] = b1;
    emu_blk->warp[w]->arrive_and_wait();
    float A[16][16], B[16][8];
    for (int x = 0; x < 32; ++x) {
        const int g = x >> 2, t = x & 3;
        const int rr[4] = {g, g + 8, g, g + 8}, cc[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int j = 0; j < 4; ++j) {
            A[rr[j]][cc[j]] = emu_bf(emu_a[w][x][j] & 0xffffu);
            A[rr[j]][cc[j] + 1] = emu_bf(emu_a[w][x][j] >> 16);
        }
        B[2 * t][g] = emu_bf(emu_b[w][x][0] & 0xffffu), B[2 * t + 1][g] = emu_bf(emu_b[w][x][0] >> 16);
        B[2 * t + 8][g] = emu_bf(emu_b[w][x][1] & 0xffffu), B[2 * t + 9][g] = emu_bf(emu_b[w][x][1] >> 16);
    }
    emu_blk->warp[w]->arrive_and_wait();
    const int g = l >> 2, t = l & 3;
    for (int e = 0; e < 4; ++e) {
        const int r = g + (e >> 1) * 8, c = 2 * t + (e & 1);
        double s = d[e];
        for (int k = 0; k < 16; ++k) s += (double)A[r][k] * B[k][c];
        d[e] = (float)s;
    }
}

// Runs fn() as every thread of every block of the grid (threads of one block concurrently, blocks in the order of
// a permutation seeded by `order_seed`), after poison() (the block's fresh shared memory) before each block.
template <typename P, typename F> void emu_launch_poisoned(emu_dim3 grid, unsigned threads, unsigned order_seed, P poison, F fn) {
    gridDim = grid;
    blockDim = {threads, 1, 1};
    std::vector<emu_dim3> blocks;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) blocks.push_back({x, y, z});
    std::mt19937 rng(order_seed);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (const emu_dim3 b : blocks) {
        poison();
        EmuBlock blk;
        blk.start(threads, 0);
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t)
            pool.emplace_back([=, &blk] {
                threadIdx = {t, 0, 0};
                blockIdx = b;
                emu_blk = &blk;
                emu_cl = nullptr;
                fn();
            });
        for (auto& th : pool) th.join();
    }
}

// cluster primitives (gemv.cu's gv_cl_*): blocks in this block's cluster (1 outside a cluster launch), the cluster
// barrier, this block's own shared memory (null outside a cluster launch) and p's offset in block `rank`'s
inline unsigned emu_cluster_size() { return emu_cl ? (unsigned)emu_cl->blocks->size() : 1u; }
inline void emu_cluster_sync() {
    if (!emu_cl) std::abort();
    emu_cl->bar->arrive_and_wait();
}
inline void* emu_block_smem() { return emu_cl ? (void*)emu_blk->own.data() : nullptr; }
template <typename P> P* emu_peer(P* p, unsigned rank) {
    const std::ptrdiff_t off = reinterpret_cast<const char*>(p) - reinterpret_cast<const char*>(emu_blk->own.data());
    if (!emu_cl || off < 0 || (size_t)off >= emu_blk->own.size() * sizeof(uint4) || rank >= emu_cl->blocks->size())
        std::abort();
    auto* q = reinterpret_cast<const char*>((*emu_cl->blocks)[rank].own.data()) + off;
    return reinterpret_cast<P*>(const_cast<char*>(q));
}

// Runs fn() as every thread of every block, clusters of cy blocks along y (rank = blockIdx.y % cy) in the order of
// a permutation seeded by `order_seed`, the blocks of a cluster concurrently, each with its own NaN-filled shared
// memory of smem_bytes (emu_block_smem).
template <typename F>
void emu_launch_cluster_poisoned(emu_dim3 grid, unsigned cy, unsigned threads, unsigned smem_bytes, unsigned order_seed,
                                 F fn) {
    if (cy == 0 || grid.y % cy) std::abort();
    gridDim = grid;
    blockDim = {threads, 1, 1};
    std::vector<emu_dim3> clusters;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; y += cy)
            for (unsigned x = 0; x < grid.x; ++x) clusters.push_back({x, y, z});
    std::mt19937 rng(order_seed);
    std::shuffle(clusters.begin(), clusters.end(), rng);
    for (const emu_dim3 c : clusters) {
        std::vector<EmuBlock> blocks(cy);
        EmuCluster cl{&blocks, std::make_unique<std::barrier<>>(cy * threads)};
        for (auto& blk : blocks) blk.start(threads, smem_bytes);
        std::vector<std::thread> pool;
        for (unsigned r = 0; r < cy; ++r)
            for (unsigned t = 0; t < threads; ++t)
                pool.emplace_back([=, &blocks, &cl] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {c.x, c.y + r, c.z};
                    emu_blk = &blocks[r];
                    emu_cl = &cl;
                    fn();
                });
        for (auto& th : pool) th.join();
    }
}

// The attention kernels' launch: att_smem poisoned per block (NaN floats: catches reads of unwritten shared memory).
template <typename F> void emu_launch(emu_dim3 grid, unsigned threads, unsigned smem_bytes, unsigned order_seed, F fn) {
    if (smem_bytes > sizeof(att_smem)) std::abort();
    emu_launch_poisoned(grid, threads, order_seed, [] { std::memset(att_smem, 0xff, sizeof(att_smem)); }, fn);
}
