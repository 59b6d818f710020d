// Shared device helpers for every cuda_src/*.cu family. Header-free on purpose: NVRTC (through CuPy) and
// nvcc compile the same text, and the loader inlines this file so CuPy's source-hash cache sees edits here.
//
// Conventions:
//  * bf16 values live in memory as raw 16-bit words (struct bf16); NumPy/CuPy have no bf16 dtype, so the
//    Python side holds them as uint16 arrays. Widening is exact; narrowing rounds to nearest even.
//  * Every reduction has a fixed order (strided per-thread sums, then an xor butterfly, then warps in
//    index order), so a row's result never depends on how many other rows a launch carries.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

struct __align__(2) bf16 {
    u16 bits;
};

#define NEG_INF __int_as_float(0xff800000)

// float <-> bits on the device and on the host (host tests compile some of these headers for the CPU).
__host__ __device__ __forceinline__ u32 f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    u32 u;
    __builtin_memcpy(&u, &f, 4);
    return u;
#endif
}

__host__ __device__ __forceinline__ float f32_from_bits(u32 u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
#endif
}

__device__ __forceinline__ float bf16_bits_to_f(u32 h) { return __uint_as_float(h << 16); }

// float -> bf16 bits, round to nearest even; NaN kept as a quiet NaN of the same sign.
__device__ __forceinline__ u16 f_to_bf16_bits(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return bf16_bits_to_f(x.bits); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) {
    bf16 r;
    r.bits = f_to_bf16_bits(x);
    return r;
}

// IEEE binary16 bits -> float (exact, subnormals included) via the PTX conversion.
__device__ __forceinline__ float f16_bits_to_f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// e4m3fn byte -> float (exact): bias 7, no inf, S.1111.111 is NaN, subnormals m * 2^-9.
// CuPy compiles every NVRTC module with -ftz=true (cupy/cuda/compiler.py appends it after our options): fp32
// arithmetic flushes subnormal inputs and results to zero. Where a subnormal matters (bit-pattern decoders, the
// reference's fp8 KV scales) these keep IEEE semantics through PTX without .ftz; the host build (tests that
// compile a function with nvcc for the CPU) has subnormals anyway.
__host__ __device__ __forceinline__ float mul_keep_denorm(float a, float b) {
#ifdef __CUDA_ARCH__
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return a * b;
#endif
}

__host__ __device__ __forceinline__ float div_keep_denorm(float a, float b) {
#ifdef __CUDA_ARCH__
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return a / b;
#endif
}

__device__ __forceinline__ float e4m3_to_f(u32 c) {
    u32 s = (c & 0x80u) << 24, e = (c >> 3) & 0xfu, m = c & 7u;
    if (e == 0xfu && m == 7u) return __uint_as_float(s | 0x7fc00000u);
    if (e == 0) {
        const float v = (float)m * 0.001953125f;
        return s ? -v : v;
    }
    return __uint_as_float(s | ((e + 120u) << 23) | (m << 20));
}

// e2m1 nibble -> float: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 is the sign (code 8 is -0).
// Computed from the bits (exponent bias 1) rather than a table: a runtime-indexed local array costs a stack frame.
__device__ __forceinline__ float e2m1_to_f(u32 c) {
    const u32 m = c & 7u;
    const float v = m < 2u ? (float)m * 0.5f : __uint_as_float((((m >> 1) + 126u) << 23) | ((m & 1u) << 22));
    return (c & 8u) ? -v : v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum with a fixed order; every thread gets the result. `scratch` holds >= 32 floats and may be
// reused right after the call returns (the trailing barrier protects it).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < nw; ++i) t += scratch[i];
    __syncthreads();
    return t;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = NEG_INF;
    for (int i = 0; i < nw; ++i) t = fmaxf(t, scratch[i]);
    __syncthreads();
    return t;
}

__host__ __device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.f + expf(-x)); }
// The attention output gate's value x * sigmoid(g): activation.cu's sigmoid_gate stores it, the fp16 GEMM's row
// split (gemm_sm90.cu split_f16row_gate) applies it itself; one expression, so the same bits (host tests too).
__host__ __device__ __forceinline__ float sigmoid_gated(float x, float g) { return x * sigmoidf_(g); }

// ---- cp.async of floats (the attention's partials, the GDN state pass's staged rows) ---------------------------
// 16 bytes global -> shared without registers (.cg: through the L2 only); a copy on the host emulations
__device__ __forceinline__ void cp_async_f4(float* dst, const float* src) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
#else
    __builtin_memcpy(dst, src, 16);
#endif
}
// every cp.async this thread issued has landed (visible to the block after the next barrier)
__device__ __forceinline__ void cp_async_f4_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
#endif
}

// ---- named barriers (warp-specialized kernels: one warp group signals, another waits) -----------------------
// barrier `id` (1-15; 0 is __syncthreads') of `count` threads, a multiple of 32: named_bar_sync counts this thread
// and waits for the phase to complete, named_bar_arrive only counts it (its earlier shared-memory stores are then
// visible to the threads that wait). A thread may arrive for the next phase only once the current one completed.
// The host emulation (tests/host/gdn_emu.cpp) runs them as std::barrier.
__device__ __forceinline__ void named_bar_sync(int id, int count) {
#ifdef __CUDA_ARCH__
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
#elif defined(GDN_HOST_EMU)
    emu_named_bar(id, count, true);
#endif
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
#ifdef __CUDA_ARCH__
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
#elif defined(GDN_HOST_EMU)
    emu_named_bar(id, count, false);
#endif
}

// ---- programmatic dependent launch (ninfer/cuda/launch.py) ----------------------------------------------------
// pdl_trigger: the kernels launched after this one with the PDL attribute may start (they still wait for this
// grid's completion in pdl_wait before touching its data); a no-op when nothing is launched that way. pdl_wait:
// returns once the grids this launch depends on have completed and their writes are visible (a no-op for a
// kernel launched without the attribute).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Arrival on a counter shared by the blocks of a grid: atomically p += v at GPU scope with release semantics for
// what this thread has observed (a __syncthreads() before it extends that to the whole block's writes) and acquire
// semantics for what the earlier arrivals released (a __syncthreads() after it extends that to the block's later
// reads): the one-instruction form of __threadfence(); atomicAdd(); __threadfence() (CUTLASS's semaphore pattern).
__host__ __device__ __forceinline__ int arrive_acq_rel(int* p, int v) {
#ifdef __CUDA_ARCH__
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
#else
    return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
#endif
}
