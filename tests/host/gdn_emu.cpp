// Host emulation of CUDA kernels (tests/test_gdn_chunked_host.py, test_gdn_step_host.py, test_norm_host.py): the
// kernel text is compiled by g++ after this prelude, which maps the CUDA built-ins it uses onto std::thread: one
// thread per CUDA thread, __syncthreads a block barrier, __shfl_xor_sync an exchange between per-warp barriers,
// named barriers std::barriers of their count, dynamic shared memory one global array (a test may redefine
// __shared__ as `static` for kernels with static
// shared arrays: one copy per kernel instance, shared by its threads). emu_launch runs blocks one after another;
// emu_launch_cluster runs the blocks of one thread-block cluster concurrently, each with its own NaN-filled shared
// memory (cluster_smem()), with the cluster barrier, distributed shared memory (emu_peer: the same offset in
// another block's shared memory) and mbarriers (emu_mbar_*: expected count, pending count and phase in the 64-bit
// word, as the hardware keeps them in shared memory) of cluster.cuh. The test appends the kernel source and the
// driver below it.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
using std::max;
using std::min;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __shared__
#define __align__(n) alignas(n)
#define __trap() std::abort()
unsigned dyn;  // the only inline asm the kernel uses reads %dynamic_smem_size into its local `dyn`
unsigned emu_dyn_smem;
#define asm(...) (dyn = emu_dyn_smem)

struct emu_dim3 {
    unsigned x = 0, y = 0, z = 0;
};
thread_local emu_dim3 threadIdx, blockIdx;
emu_dim3 blockDim, gridDim;
constexpr int EMU_SMEM_FLOATS = 227 * 1024 / 4;  // the H200's per-block limit
alignas(16) float smem[EMU_SMEM_FLOATS];

// one running block: its barriers, the warp exchange and its shared memory (the global smem for emu_launch)
struct EmuBlock {
    std::unique_ptr<std::barrier<>> bar, warp[32], named[16];
    float xchg[1024];
    std::vector<float> own;
    float* smem = nullptr;
    void start(unsigned threads, float* mem) {
        bar = std::make_unique<std::barrier<>>(threads);
        for (unsigned w = 0; w < threads / 32; ++w) warp[w] = std::make_unique<std::barrier<>>(32);
        smem = mem;
    }
};
struct EmuCluster {
    std::vector<EmuBlock>* blocks;
    std::unique_ptr<std::barrier<>> bar;
};
thread_local EmuBlock* emu_blk;
thread_local EmuCluster* emu_cl;

inline void __syncthreads() { emu_blk->bar->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline float __shfl_xor_sync(unsigned, float v, int off) {
    const int t = threadIdx.x, w = t >> 5, l = t & 31;
    emu_blk->xchg[t] = v;
    emu_blk->warp[w]->arrive_and_wait();
    const float r = emu_blk->xchg[(w << 5) | (l ^ off)];
    emu_blk->warp[w]->arrive_and_wait();
    return r;
}

// common.cuh's named barriers: created with their thread count on first use
std::mutex emu_named_mu;
inline void emu_named_bar(int id, int count, bool wait) {
    std::barrier<>* b;
    {
        std::lock_guard<std::mutex> lock(emu_named_mu);
        if (id < 1 || id > 15) std::abort();
        auto& slot = emu_blk->named[id];
        if (!slot) slot = std::make_unique<std::barrier<>>(count);
        b = slot.get();
    }
    if (wait)
        b->arrive_and_wait();
    else
        (void)b->arrive();
}

// cluster.cuh's primitives
inline float* emu_block_smem() { return emu_blk->smem; }
template <typename P> P* emu_peer(P* p, unsigned rank) {
    const std::ptrdiff_t off = reinterpret_cast<char*>(p) - reinterpret_cast<char*>(emu_blk->smem);
    if (off < 0 || (size_t)off >= emu_blk->own.size() * sizeof(float) || rank >= emu_cl->blocks->size()) std::abort();
    return reinterpret_cast<P*>(reinterpret_cast<char*>((*emu_cl->blocks)[rank].smem) + off);
}
inline void emu_cluster_sync() { emu_cl->bar->arrive_and_wait(); }
constexpr unsigned long long EMU_MB_CNT = (1ull << 21) - 1, EMU_MB_PHASE = 1ull << 63;
inline void emu_mbar_init(unsigned long long* bar, unsigned count) {
    std::atomic_ref<unsigned long long>(*bar).store(((unsigned long long)count << 21) | count);
}
inline void emu_mbar_arrive(unsigned long long* bar) {  // release: the arriving thread's earlier stores
    std::atomic_ref<unsigned long long> w(*bar);
    unsigned long long v = w.load(std::memory_order_relaxed), n;
    do {
        const unsigned long long pending = v & EMU_MB_CNT, expected = (v >> 21) & EMU_MB_CNT;
        if (pending == 0) std::abort();  // more arrivals than the phase expects
        n = pending > 1 ? v - 1 : ((v ^ EMU_MB_PHASE) & ~EMU_MB_CNT) | expected;
    } while (!w.compare_exchange_weak(v, n, std::memory_order_acq_rel, std::memory_order_relaxed));
}
inline void emu_mbar_wait(unsigned long long* bar, unsigned parity) {  // acquire: the arrivals' stores
    std::atomic_ref<unsigned long long> w(*bar);
    while (((w.load(std::memory_order_acquire) >> 63) & 1) == parity) std::this_thread::yield();
}
struct alignas(8) float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
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

// mma.m16n8k8 row.col tf32 x tf32 + f32 (PTX fragment layout, g = lane / 4, t = lane % 4; tf32_frag.cuh): the
// operands' low 13 bits are ignored, as by the tensor cores; the 8 products and d are summed exactly (double) and
// rounded once. One warp barrier per call: the lanes' fragments go to one of two buffers by call parity (a buffer
// is rewritten only after every lane has passed the next call's barrier, i.e. finished reading it).
#define GDN_HOST_EMU 1
float emu_tf_a[2][32][32][4], emu_tf_b[2][32][32][2];
thread_local unsigned emu_tf_calls;
inline double emu_tf32(float x) { return (double)__uint_as_float(__float_as_uint(x) & 0xffffe000u); }
inline void emu_mma_tf32(float (&d)[4], float a0, float a1, float a2, float a3, float b0, float b1) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, p = emu_tf_calls++ & 1;
    float* a = emu_tf_a[p][w][l];
    a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
    emu_tf_b[p][w][l][0] = b0, emu_tf_b[p][w][l][1] = b1;
    emu_blk->warp[w]->arrive_and_wait();
    const int g = l >> 2, t = l & 3;
    for (int e = 0; e < 4; ++e) {
        const int r = g + (e >> 1) * 8, c = 2 * t + (e & 1);  // C element e: row r, column c
        double s = d[e];
        for (int k = 0; k < 8; ++k) {  // A[r][k] from lane (r % 8, k % 4) reg (r / 8) + 2 (k / 4); B[k][c] likewise
            const double av = emu_tf32(emu_tf_a[p][w][4 * (r & 7) + (k & 3)][(r >> 3) + 2 * (k >> 2)]);
            s += av * emu_tf32(emu_tf_b[p][w][4 * c + (k & 3)][k >> 2]);
        }
        d[e] = (float)s;
    }
}

// Runs fn() as every thread of every block of the grid (threads of one block concurrently).
template <typename F> void emu_launch(emu_dim3 grid, unsigned threads, unsigned smem_bytes, F fn) {
    if (smem_bytes > sizeof(smem)) std::abort();
    gridDim = grid;
    blockDim = {threads, 1, 1};
    emu_dyn_smem = smem_bytes;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                std::fill(smem, smem + EMU_SMEM_FLOATS, __uint_as_float(0x7fc00000u));  // NaN: catches reads of unwritten smem
                EmuBlock blk;
                blk.start(threads, smem);
                std::vector<std::thread> pool;
                for (unsigned t = 0; t < threads; ++t)
                    pool.emplace_back([=, &blk] {
                        threadIdx = {t, 0, 0};
                        blockIdx = {x, y, z};
                        emu_blk = &blk;
                        fn();
                    });
                for (auto& th : pool) th.join();
            }
}

// Runs fn() as every thread of every block, clusters of cz blocks along z (rank = blockIdx.z % cz) one after
// another, the blocks of a cluster concurrently, each with its own NaN-filled shared memory of smem_bytes.
template <typename F> void emu_launch_cluster(emu_dim3 grid, unsigned cz, unsigned threads, unsigned smem_bytes, F fn) {
    if (grid.z % cz || smem_bytes > sizeof(smem)) std::abort();
    gridDim = grid;
    blockDim = {threads, 1, 1};
    emu_dyn_smem = smem_bytes;
    for (unsigned zc = 0; zc < grid.z / cz; ++zc)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                std::vector<EmuBlock> blocks(cz);
                EmuCluster cl{&blocks, std::make_unique<std::barrier<>>(cz * threads)};
                for (auto& blk : blocks) {
                    blk.own.assign((smem_bytes + 3) / 4, __uint_as_float(0x7fc00000u));
                    blk.start(threads, blk.own.data());
                }
                std::vector<std::thread> pool;
                for (unsigned r = 0; r < cz; ++r)
                    for (unsigned t = 0; t < threads; ++t)
                        pool.emplace_back([=, &blocks, &cl] {
                            threadIdx = {t, 0, 0};
                            blockIdx = {x, y, zc * cz + r};
                            emu_blk = &blocks[r];
                            emu_cl = &cl;
                            fn();
                        });
                for (auto& th : pool) th.join();
            }
}
