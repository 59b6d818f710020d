// Host emulation of CUDA kernels (tests/test_gdn_chunked_host.py, test_gdn_step_host.py, test_norm_host.py): the
// kernel text is compiled by g++ after this prelude, which maps the CUDA built-ins it uses onto std::thread: one
// thread per CUDA thread, __syncthreads a block barrier, __shfl_xor_sync an exchange between per-warp barriers,
// dynamic shared memory one global array (a test may redefine __shared__ as `static` for kernels with static
// shared arrays: one copy per kernel instance, shared by its threads). Blocks run one after another. The test
// appends the kernel source and the driver below it.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <memory>
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
std::unique_ptr<std::barrier<>> emu_block_bar, emu_warp_bar[32];
float emu_xchg[1024];

inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline float __shfl_xor_sync(unsigned, float v, int off) {
    const int t = threadIdx.x, w = t >> 5, l = t & 31;
    emu_xchg[t] = v;
    emu_warp_bar[w]->arrive_and_wait();
    const float r = emu_xchg[(w << 5) | (l ^ off)];
    emu_warp_bar[w]->arrive_and_wait();
    return r;
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
    emu_warp_bar[w]->arrive_and_wait();
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
                emu_block_bar = std::make_unique<std::barrier<>>(threads);
                for (unsigned w = 0; w < threads / 32; ++w) emu_warp_bar[w] = std::make_unique<std::barrier<>>(32);
                std::vector<std::thread> pool;
                for (unsigned t = 0; t < threads; ++t)
                    pool.emplace_back([=] {
                        threadIdx = {t, 0, 0};
                        blockIdx = {x, y, z};
                        fn();
                    });
                for (auto& th : pool) th.join();
            }
}
