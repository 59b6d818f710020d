// Sampling building blocks on the GPU (the NumPy sampler is ninfer/engine/sampler.py).
//
// argmax_masked: greedy pick per row over ids < limit that the packed bitmask allows (XGrammar layout: int32
//   words, bit i%32 of word i/32 set = allowed; mask == nullptr allows all), ties to the lowest id; a row with
//   nothing allowed gives -1. One block per row; per-thread strided scans in ascending id order, then a fixed
//   tree that prefers the lower id on equal values.
// counter_uniform: the request's uniform for (seed, position), the same SplitMix64 function as
//   ninfer.engine.sampler.uniform (53-bit double), so a GPU sampler draws exactly what the CPU one draws.
#include "common.cuh"

template <typename T>
__global__ void __launch_bounds__(256)
    argmax_masked(const T* __restrict__ logits, const int* __restrict__ mask, int* __restrict__ out, int V,
                  int limit, long long ld, long long ldm) {
    __shared__ float sv[256];
    __shared__ int si[256];
    const long long row = blockIdx.x;
    const T* x = logits + row * ld;
    const int* m = mask ? mask + row * ldm : nullptr;
    float bv = NEG_INF;
    int bi = -1;
    for (int i = threadIdx.x; i < limit && i < V; i += blockDim.x) {
        if (m && !((m[i >> 5] >> (i & 31)) & 1)) continue;
        const float v = to_f(x[i]);
        if (bi < 0 || v > bv) bv = v, bi = i;
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = sv[threadIdx.x + s];
            const int oi = si[threadIdx.x + s];
            const int ci = si[threadIdx.x];
            if (oi >= 0 && (ci < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < ci)))
                sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[row] = si[0];
}

__device__ __forceinline__ u64 mix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__global__ void counter_uniform(const u64* __restrict__ seeds, const u64* __restrict__ positions,
                                double* __restrict__ out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (double)(mix64(mix64(seeds[i]) ^ positions[i]) >> 11) * (1.0 / 9007199254740992.0);
}
