// The slot table of the expert-lanes GEMV (gemv.cu, experts == 2), built on the device from the routing so that a
// MoE prefill chunk needs no host synchronization (ninfer/cuda/moe_lanes.py).
//
// Input: the S routed (token, expert) pairs sorted by expert: ids[s] non-decreasing in [0, E) (the router's ids,
// the shared expert's id E - 1 last), xrow[s] the token row of pair s. Expert e owns the sorted pairs
// off[e] .. off[e + 1] and ceil(count / NB) slots, in expert order; slot z of expert e holds its pairs
// off[e] + j * NB + g (j the slot's rank inside the expert, g < NB the lane) while they exist.
// Output, for the Z slots of the launch bound (Z >= the slots filled: floor(S / NB) + E suffices):
//   sid[z]                 the slot's expert, -1 for an empty slot (its GEMV blocks exit at once);
//   tx[z*2NB + g]          lane g's activation row: xrow[s] (the gate|up input is the token's row) ...
//   tx[z*2NB + NB + g]     ... and its output row: s (products land in sorted-pair order, as gemm_experts');
//   ts[z*2NB + g], ts[z*2NB + NB + g]   s and s (the down projection reads and writes pair rows);
// -1 in both for lanes past the slot's pairs. One block (E < blockDim.x); dynamic shared memory (E + 1 +
// blockDim.x) ints: off[E + 1], then the inclusive prefix sum of the slots per expert.
#include "common.cuh"

template <int NB>
__global__ void __launch_bounds__(1024) gemv_lanes_table(const int* __restrict__ ids, const int* __restrict__ xrow,
                                                         int S, int E, int Z, int* __restrict__ sid,
                                                         int* __restrict__ tx, int* __restrict__ ts) {
    pdl_trigger();
    extern __shared__ int ml_sm[];
    int* off = ml_sm;            // [E + 1]: expert e's pairs are off[e] .. off[e + 1]
    int* fin = ml_sm + E + 1;    // [blockDim.x]: slots of experts 0..i, inclusive
    const int i = threadIdx.x;
    if (i <= E) {  // first pair whose expert is >= i
        int lo = 0, hi = S;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (ids[mid] < i) lo = mid + 1;
            else hi = mid;
        }
        off[i] = lo;
    }
    __syncthreads();
    fin[i] = i < E ? (off[i + 1] - off[i] + NB - 1) / NB : 0;
    __syncthreads();
    for (int d = 1; d < (int)blockDim.x; d <<= 1) {  // Hillis-Steele inclusive scan
        const int v = i >= d ? fin[i - d] : 0;
        __syncthreads();
        fin[i] += v;
        __syncthreads();
    }
    const int total = fin[E - 1];
    for (int z = i; z < Z; z += blockDim.x) {
        int e = -1, s0 = 0, s1 = 0;
        if (z < total) {
            int lo = 0, hi = E - 1;  // the first expert whose slots end past z
            while (lo < hi) {
                const int mid = (lo + hi) >> 1;
                if (fin[mid] <= z) lo = mid + 1;
                else hi = mid;
            }
            e = lo;
            const int first = fin[e] - (off[e + 1] - off[e] + NB - 1) / NB;
            s0 = off[e] + (z - first) * NB, s1 = off[e + 1];
        }
        sid[z] = e;
        int* a = tx + (long long)z * 2 * NB;
        int* b = ts + (long long)z * 2 * NB;
#pragma unroll
        for (int g = 0; g < NB; ++g) {
            const int s = s0 + g;
            const bool in = e >= 0 && s < s1;
            a[g] = in ? xrow[s] : -1;
            a[NB + g] = b[g] = b[NB + g] = in ? s : -1;
        }
    }
}
