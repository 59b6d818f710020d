// MoE router (docs/model-math.md §5): moe_route selects each token's top-k experts with route_row.cuh (fp32
// softmax over all E experts, ties to the lower id, best first; one warp per token) and writes their ids and
// weights renormalised over the selected k, w = p_sel / sum(p_sel). Every id written is a real expert in [0, E) and
// the k ids are distinct, so the expert kernels never index outside the weight; a row that had to select a NaN
// expert gets NaN weights. gemv.cu's routed expert launch runs the same selection (the same bits).
// shared >= 0: the slot list continues after the rows * K routed ids with one id `shared` per row (the MoE shared
// expert stored as expert E of the same weight, ninfer/cuda/fuse.py), so one expert launch runs both.
#include "route_row.cuh"

template <typename T, int MAXE>
__global__ void moe_route(const T* __restrict__ logits, int* __restrict__ ids, float* __restrict__ weights,
                          int rows, int E, int K, long long ld, int shared) {
    pdl_trigger();
    pdl_wait();  // launched with PDL inside decode graphs (ninfer/cuda/router.py): nothing read before
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const RouteSel r = route_row<T, MAXE>(logits + row * ld, E, K, lane);
    if (shared >= 0 && lane == 0) ids[(long long)rows * K + row] = shared;
    if (lane < K) {
        ids[row * K + lane] = r.id;
        weights[row * K + lane] = route_weight(r);
    }
}

// moe_sort: a prefill chunk's expert-sorted slot list in one launch (no sort library, no host sync). The routed
// pairs flat[0 .. n) (pair i: token i / K, choice i % K; ids in [0, NE), as moe_route writes them) are ordered by
// expert id, ties by position: a stable counting sort, so exactly the order a stable argsort gives. Slot s of the
// order gets ids[s] (its expert) and xrow[s] (its token row), pair i its slot where[i]; slots n .. ns - 1 (the
// shared expert's, one per token) follow unsorted: ids[s] = flat[s], xrow[s] = s - n.
// One block of MS_NT threads. Warp w owns the contiguous pairs [w·L, min(n, (w+1)·L)), L = ceil(n / 32), and walks
// them 32 at a time in order; the lanes holding one id form a __match_any_sync group. Pass 1: the group's first
// lane adds the group's size to hist[w][id]. Then hist becomes each (warp, id)'s first slot: ids in order, warps in
// order within an id (an exclusive scan of the per-id totals, then a walk down each id's column). Pass 2: a lane's
// slot is hist[w][id] + its rank in its group, and the group's first lane advances hist[w][id] by the group's size.
// So slots follow (id, warp, step, lane) = (id, position) order. Shared memory: 32 * NE ints.
constexpr int MS_NT = 1024;

__global__ void __launch_bounds__(MS_NT) moe_sort(const int* __restrict__ flat, int* __restrict__ ids,
                                                  int* __restrict__ xrow, int* __restrict__ where, int n, int ns,
                                                  int K, int NE) {
    extern __shared__ int hist[];  // [32 warps][NE]
    __shared__ int wsum[32];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    for (int i = tid; i < 32 * NE; i += MS_NT) hist[i] = 0;
    __syncthreads();
    const int L = (n + 31) / 32, b0 = w * L, b1 = min(n, b0 + L);
    int* hw = hist + w * NE;
    for (int i0 = b0; i0 < b1; i0 += 32) {  // pass 1: counts per (warp, id)
        const int i = i0 + lane;
        const int x = i < b1 ? flat[i] : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, x);
        if (x >= 0 && lane == __ffs(peers) - 1) hw[x] += __popc(peers);
    }
    __syncthreads();
    int total = 0;  // thread x < NE: id x's count over all warps
    if (tid < NE)
        for (int v = 0; v < 32; ++v) total += hist[v * NE + tid];
    int incl = total;  // block-wide inclusive scan of the totals (NE <= MS_NT)
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) wsum[w] = incl;
    __syncthreads();
    if (w == 0) {
        int s = wsum[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        wsum[lane] = s;
    }
    __syncthreads();
    if (tid < NE) {  // id tid's first slot per warp
        int run = incl - total + (w > 0 ? wsum[w - 1] : 0);
        for (int v = 0; v < 32; ++v) {
            const int c = hist[v * NE + tid];
            hist[v * NE + tid] = run;
            run += c;
        }
    }
    __syncthreads();
    for (int i0 = b0; i0 < b1; i0 += 32) {  // pass 2: the slots, in position order within each (warp, id)
        const int i = i0 + lane;
        const int x = i < b1 ? flat[i] : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, x);
        const int pos = x >= 0 ? hw[x] + __popc(peers & ((1u << lane) - 1u)) : 0;
        __syncwarp();
        if (x >= 0 && lane == __ffs(peers) - 1) hw[x] += __popc(peers);
        __syncwarp();
        if (x >= 0) {
            ids[pos] = x;
            xrow[pos] = i / K;
            where[i] = pos;
        }
    }
    for (int s = n + tid; s < ns; s += MS_NT) {
        ids[s] = flat[s];
        xrow[s] = s - n;
    }
}

// expert_tiles: the grouped expert GEMM's tile table (gemm.expert_tiles) from the expert-sorted slot ids in one
// launch (it was ~12 CuPy launches per GEMM: searchsorted, cumsum, take, casts): for ids[0..S) non-decreasing in
// [0, E), off[e] = the first slot of expert e (e = 0..E, off[E] = S), cnt_e = ceil((off[e+1] - off[e]) / BM)
// tiles per expert, end = their inclusive prefix sum; tile i < bound belongs to expert te = min(#{e: end[e] <= i},
// E - 1) and starts at slot off[te] + (i - (end[te] - cnt_te)) BM; ntiles[0] = end[E - 1]. Integers: exactly the
// CuPy expressions' values. One block of ET_NT threads; E <= ET_NT * ET_PER.
constexpr int ET_NT = 256, ET_PER = 4, ET_UNROLL = 16;
__global__ void __launch_bounds__(ET_NT)
    expert_tiles(const int* __restrict__ ids, int S, int E, int BM, int bound, int* __restrict__ off,
                 int* __restrict__ tile_e, int* __restrict__ tile_s0, int* __restrict__ ntiles) {
    __shared__ int s_off[ET_NT * ET_PER + 1], s_end[ET_NT * ET_PER], s_part[ET_NT];
    const int tid = threadIdx.x;
    // boundaries: the first slot of every expert, whichever experts have none (a run of them shares a boundary)
    for (int e = tid; e <= E; e += ET_NT) s_off[e] = S;
    __syncthreads();
    // ET_UNROLL slots per thread and round, their ids loaded before any is used (one load latency per round, not
    // per slot: the rolled loop waited on every slot's load, ~45 us of the 35B-A3B's 32768-slot chunk)
    for (int s0 = 0; s0 < S; s0 += ET_NT * ET_UNROLL) {
        int cur[ET_UNROLL], prev[ET_UNROLL];
#pragma unroll
        for (int j = 0; j < ET_UNROLL; ++j) {
            const int s = s0 + j * ET_NT + tid;
            cur[j] = s < S ? ids[s] : -1;
            prev[j] = s < S && s ? ids[s - 1] : -1;
        }
#pragma unroll
        for (int j = 0; j < ET_UNROLL; ++j) {
            const int s = s0 + j * ET_NT + tid;
            for (int e = prev[j] + 1; e <= cur[j]; ++e) s_off[e] = s;  // experts prev+1 .. cur start here
        }
    }
    __syncthreads();
    // tiles per expert, then the inclusive sum over experts: thread tid owns experts ET_PER tid .. + ET_PER - 1
    int c[ET_PER], run = 0;
#pragma unroll
    for (int j = 0; j < ET_PER; ++j) {
        const int e = ET_PER * tid + j;
        c[j] = e < E ? (s_off[e + 1] - s_off[e] + BM - 1) / BM : 0;
        run += c[j];
    }
    s_part[tid] = run;
    __syncthreads();
    for (int o = 1; o < ET_NT; o <<= 1) {  // inclusive scan of the threads' counts (integers: exact in any order)
        const int v = tid >= o ? s_part[tid - o] : 0;
        __syncthreads();
        s_part[tid] += v;
        __syncthreads();
    }
    int before = s_part[tid] - run;
#pragma unroll
    for (int j = 0; j < ET_PER; ++j) {
        const int e = ET_PER * tid + j;
        before += c[j];
        if (e < E) s_end[e] = before;
    }
    __syncthreads();
    for (int e = tid; e <= E; e += ET_NT) off[e] = s_off[e];
    if (tid == 0) ntiles[0] = s_end[E - 1];
    for (int i = tid; i < bound; i += ET_NT) {
        int lo = 0, hi = E;  // the number of experts with end <= i (upper bound of i)
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (s_end[mid] <= i) lo = mid + 1; else hi = mid;
        }
        const int te = lo < E - 1 ? lo : E - 1;
        const int cnt = (s_off[te + 1] - s_off[te] + BM - 1) / BM;
        tile_e[i] = te;
        tile_s0[i] = s_off[te] + (i - (s_end[te] - cnt)) * BM;
    }
}
