// Sampling building blocks on the GPU (the NumPy sampler is ninfer/engine/sampler.py).
//
// argmax_masked: greedy pick per row over ids < limit that the packed bitmask allows (XGrammar layout: int32
//   words, bit i%32 of word i/32 set = allowed; mask == nullptr allows all), ties to the lowest id; a row with
//   nothing allowed gives -1. One block per row; per-thread strided scans in ascending id order, then a fixed
//   tree that prefers the lower id on equal values.
// counter_uniform: the request's uniform for (seed, position), the same SplitMix64 function as
//   ninfer.engine.sampler.uniform (53-bit double), so a GPU sampler draws exactly what the CPU one draws.
// apply_penalties_rows + sample_rows: the engine's sampler (its definition is the docstring of
//   ninfer/engine/sampler.py) computed on the device, token for token the same as the NumPy oracle.
// argmax_split: sample_rows' greedy pick (temperature <= 0) with the vocabulary split over many blocks per row.
// split_max / split_hist / split_gather (sample_split.cuh): sample_rows' function with each row's
//   vocabulary split over many blocks; sample_rows itself stays as the one-block-per-row baseline.
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

#define HD __host__ __device__ __forceinline__

HD u64 mix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

HD double counter_u(u64 seed, u64 pos) {
    return (double)(mix64(mix64(seed) ^ pos) >> 11) * (1.0 / 9007199254740992.0);
}

__global__ void counter_uniform(const u64* __restrict__ seeds, const u64* __restrict__ positions,
                                double* __restrict__ out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = counter_u(seeds[i], positions[i]);
}

// ---- the exact sampler ------------------------------------------------------------------------------------
// Penalties on a device copy of the rows: ids[row, P] (distinct per row, -1 padding) generated so far with their
// counts. One rounding per operation, no FMA contraction, exactly NumPy's float32 arithmetic:
//   x = x > 0 ? x / r : x * r;  x = (x - f * count) - p.
__global__ void apply_penalties_rows(float* __restrict__ x, long long ld, int V, const int* __restrict__ ids,
                                     const int* __restrict__ counts, int P, const float* __restrict__ rep,
                                     const float* __restrict__ freq, const float* __restrict__ pres) {
    const long long row = blockIdx.y;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= P) return;
    const int id = ids[row * P + j];
    if (id < 0 || id >= V) return;
    float v = x[row * ld + id];
    const float r = rep[row];
    v = v > 0.f ? __fdiv_rn(v, r) : __fmul_rn(v, r);
    v = __fsub_rn(__fsub_rn(v, __fmul_rn(freq[row], (float)counts[row * P + j])), pres[row]);
    x[row * ld + id] = v;
}

// Order key: descending key = descending x, then ascending id. Float bits mapped so that unsigned order is float
// order (-0 taken as +0). An allowed token's key is never 0 (the smallest, -inf, maps to 0x007fffff), so 0 means
// "nothing allowed" in the max reduction.
HD u64 sort_key(float x, int id) {
    if (x == 0.f) x = 0.f;
    const u32 u = f32_bits(x);
    const u32 o = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((u64)o << 32) | (u64)(0xffffffffu - (u32)id);
}

HD int key_id(u64 key) { return (int)(0xffffffffu - (u32)key); }

// Integer mass q = floor(e * 2^44), e = exp((double(x) - double(m)) / T), e = 1 where x == m.
HD u64 token_mass(float x, float m, double T, double& e) {
    e = x == m ? 1.0 : exp(((double)x - (double)m) / T);
    return (u64)floor(e * 17592186044416.0);
}

__device__ __forceinline__ u64 block_max_u64(u64 v, u64* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u64 w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    u64 t = 0;
    for (int i = 0; i < nw; ++i) t = scratch[i] > t ? scratch[i] : t;
    __syncthreads();
    return t;
}

// Workspace entries of the candidates: (q - 1) << 20 | id (q in [1, 2^44], id < 2^20).
HD u64 ws_mass(u64 w) { return (w >> 20) + 1; }
HD int ws_id(u64 w) { return (int)(w & 0xfffffu); }

// Sum of q over the candidates whose key >= lo (shared-memory u64 atomics: exact in any order).
__device__ u64 kept_mass(const u64* ws, int n, const float* x, u64 lo, u64* acc) {
    if (threadIdx.x == 0) *acc = 0;
    __syncthreads();
    u64 s = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const u64 w = __ldcg(ws + j);  // L2: the split path reads lists other blocks wrote
        if (sort_key(x[ws_id(w)], ws_id(w)) >= lo) s += ws_mass(w);
    }
    atomicAdd(acc, s);
    __syncthreads();
    const u64 t = *acc;
    __syncthreads();
    return t;
}

// The bin (255 down to 0) where the descending cumulative weight of hist[256] reaches r (1 <= r <= total), by the
// sums of its 32 groups of 8 bins (group g = bins 255-8g .. 248-8g): sh[0] = the bin, sh[1] = r minus the weight of
// the bins above it. Shared by the kernel (lane 0 of warp 0) and the host check (tests/sampling_host.cu).
HD void find_bin(const u64* hist, const u64* group, u64 r, u64* sh) {
    u64 c = 0;
    int g = 0;
    while (g < 31 && c + group[g] < r) c += group[g++];
    int b = 255 - 8 * g;
    while (b > 248 - 8 * g && c + hist[b] < r) c += hist[b--];
    sh[0] = (u64)b;
    sh[1] = r - c;
}

// top-p: the prefix mass to reach, target = min(max(ceil(top_p * double(S)), 1), S).
HD u64 top_p_target(double top_p, u64 S) {
    const u64 t = (u64)ceil(top_p * (double)S);
    return t < 1 ? 1 : (t > S ? S : t);
}

// The draw: the rank (in mass units) the picked token's cumulative mass must reach, min(floor(u * double(S)) + 1, S):
// the first kept token whose cumulative q exceeds t, or the last kept one.
HD u64 draw_target(double u, u64 S) {
    const u64 t = (u64)floor(u * (double)S);
    return t + 1 < S ? t + 1 : S;
}

// Radix search over the candidates with key >= lo, in descending key order: the key K with
// W(keys > K) < r <= W(keys >= K), W = count (mass == false) or q mass; needs 1 <= r <= W(all). Eight passes of
// eight bits from the top; per pass an integer histogram (exact, order-independent), then find_bin.
__device__ u64 radix_select(const u64* ws, int n, const float* x, u64 lo, u64 r, bool mass, u64* hist, u64* group,
                            u64* sh) {
    u64 prefix = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            const u64 w = __ldcg(ws + j);
            const u64 key = sort_key(x[ws_id(w)], ws_id(w));
            if (key < lo || (shift < 56 && (key >> (shift + 8)) != (prefix >> (shift + 8)))) continue;
            atomicAdd(&hist[(key >> shift) & 255u], mass ? ws_mass(w) : 1ull);
        }
        __syncthreads();
        if (threadIdx.x < 32) {  // warp 0: the 32 sums of 8 descending bins, then lane 0 walks them
            u64 s = 0;
            for (int k = 0; k < 8; ++k) s += hist[255 - 8 * threadIdx.x - k];
            group[threadIdx.x] = s;
            __syncwarp();
            if (threadIdx.x == 0) find_bin(hist, group, r, sh);
        }
        __syncthreads();
        prefix |= sh[0] << shift;
        r = sh[1];
        __syncthreads();
    }
    return prefix;
}

// One block per row. Greedy: the largest allowed key. Else: candidates (q > 0, e >= min_p) compacted into the
// row's workspace through an atomic counter (their order there is irrelevant: every later step is a histogram),
// then top-k (count search), top-p (mass search), and the draw (mass search). out = -1: nothing allowed.
__global__ void __launch_bounds__(1024)
    sample_rows(const float* __restrict__ logits, long long ld, const int* __restrict__ mask, long long ldm,
                int V, int limit, const double* __restrict__ temp, const int* __restrict__ topk,
                const double* __restrict__ topp, const double* __restrict__ minp, const u64* __restrict__ seeds,
                const u64* __restrict__ positions, u64* __restrict__ ws_all, long long ldw, int* __restrict__ out) {
    __shared__ u64 hist[256];
    __shared__ u64 scratch[32];
    __shared__ u64 group[32];
    __shared__ u64 sh[2];
    __shared__ unsigned int count;
    const long long row = blockIdx.x;
    const float* x = logits + row * ld;
    const int* m = mask ? mask + row * ldm : nullptr;
    u64* ws = ws_all + row * ldw;
    const int lim = limit < V ? limit : V;
    u64 best = 0;
    for (int i = threadIdx.x; i < lim; i += blockDim.x) {
        if (m && !((m[i >> 5] >> (i & 31)) & 1)) continue;
        const float v = x[i];
        if (v != v) continue;  // NaN: banned
        const u64 k = sort_key(v, i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best, scratch);
    const double T = temp[row];
    if (best == 0 || T <= 0.0) {  // nothing allowed, or greedy
        if (threadIdx.x == 0) out[row] = best == 0 ? -1 : key_id(best);
        return;
    }
    const float mx = x[key_id(best)];
    const double mp = minp[row];
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < lim; i += blockDim.x) {
        if (m && !((m[i >> 5] >> (i & 31)) & 1)) continue;
        const float v = x[i];
        if (v != v) continue;  // NaN: banned
        double e;
        const u64 q = token_mass(v, mx, T, e);
        if (q == 0 || (mp > 0.0 && e < mp)) continue;
        ws[atomicAdd(&count, 1u)] = ((q - 1) << 20) | (u64)i;
    }
    __syncthreads();
    const int n = (int)count;
    u64 lo = 0;  // kept: candidates with key >= lo
    const int k = topk[row];
    if (k > 0 && k < n) lo = radix_select(ws, n, x, 0, (u64)k, false, hist, group, sh);
    const double tp = topp[row];
    if (tp < 1.0) {
        const u64 S = kept_mass(ws, n, x, lo, scratch);
        lo = radix_select(ws, n, x, lo, top_p_target(tp, S), true, hist, group, sh);
    }
    const u64 S2 = kept_mass(ws, n, x, lo, scratch);
    const u64 r = draw_target(counter_u(seeds[row], positions[row]), S2);
    const u64 key = radix_select(ws, n, x, lo, r, true, hist, group, sh);
    if (threadIdx.x == 0) out[row] = key_id(key);
}

// ---- greedy rows: split-vocabulary argmax --------------------------------------------------------------------
// sample_rows' pick for temperature <= 0 (step 3 of the definition): the largest allowed sort key, i.e. the largest
// allowed x, the lowest id on ties, -0 == +0, NaN / masked / ids >= limit banned, -1 when nothing is allowed.
// sample_rows streams a row through one block (one SM: ~0.2 ms for 248K fp32 logits); here grid (splits, rows):
// block s of a row reduces ids [s * chunk, min((s + 1) * chunk, lim)) to its largest key in part[row * splits + s]
// (0: nothing allowed there), and the row's last block to arrive on cnt[row] (thread 0's acq_rel atomic releases
// the block's partial and acquires the others') takes their max, writes out[row] and resets the counter, so cnt is
// zero again after every launch (CUDA graph replays need no memset; no host synchronization). The max of distinct
// keys (the id is in them) does not depend on the order of the reductions: bitwise sample_rows' greedy token.
constexpr int ARGMAX_NT = 256;     // threads per block
constexpr int ARGMAX_UNROLL = 8;   // independent loads per thread in flight

__global__ void __launch_bounds__(ARGMAX_NT)
    argmax_split(const float* __restrict__ logits, long long ld, const int* __restrict__ mask, long long ldm, int V,
                 int limit, int chunk, u64* __restrict__ part, int* __restrict__ cnt, int* __restrict__ out) {
    __shared__ u64 scratch[32];
    __shared__ int last;
    const long long row = blockIdx.y;
    const int splits = gridDim.x;
    const float* x = logits + row * ld;
    const int* m = mask ? mask + row * ldm : nullptr;
    const int lim = limit < V ? limit : V;
    const long long lo = (long long)blockIdx.x * chunk;
    const int hi = lo + chunk < lim ? (int)(lo + chunk) : lim;
    u64 best = 0;
    for (int i = (int)lo + threadIdx.x; i < hi; i += ARGMAX_NT * ARGMAX_UNROLL) {
        float v[ARGMAX_UNROLL];
        int w[ARGMAX_UNROLL];  // the mask words, loaded with the logits (all allowed without a mask)
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; ++u) {
            const int j = i + u * ARGMAX_NT;
            v[u] = j < hi ? x[j] : 0.f;
            w[u] = m && j < hi ? m[j >> 5] : -1;
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; ++u) {
            const int j = i + u * ARGMAX_NT;
            if (j >= hi || v[u] != v[u] || !((w[u] >> (j & 31)) & 1)) continue;  // past the slice, NaN, masked
            const u64 k = sort_key(v[u], j);
            best = k > best ? k : best;
        }
    }
    best = block_max_u64(best, scratch);
    if (threadIdx.x == 0) {
        part[row * splits + blockIdx.x] = best;
        last = arrive_acq_rel(cnt + row, 1) == splits - 1;
    }
    __syncthreads();
    if (!last) return;
    u64 b = 0;
    for (int s = threadIdx.x; s < splits; s += ARGMAX_NT) {
        const u64 p = __ldcg(part + row * splits + s);
        b = p > b ? p : b;
    }
    b = block_max_u64(b, scratch);
    if (threadIdx.x == 0) {
        out[row] = b == 0 ? -1 : key_id(b);
        cnt[row] = 0;
    }
}

#include "sample_split.cuh"
