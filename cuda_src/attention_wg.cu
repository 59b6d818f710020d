// Causal prefill attention with Hopper's wgmma (sm_90a): the kernel of the engine in attention_wg.cuh (which
// describes the arithmetic and the shared-memory layout), on attention_prefill_gqa.cuh's block body.
#include "attention_wg.cuh"

// grid (ceil(R / BR), HKV, splits), 256 threads; dynamic shared memory 2 D (128 (1 + split) + 4 BN) + 2048 bytes
// (1024 of alignment slack, 1024 of row sequence and position)
template <typename T, int D, bool QLO = true, bool PLO = true, int BN = AW_BN>
__global__ void __launch_bounds__(AG_THREADS, 1)
    attention_prefill_wg(const T* __restrict__ q, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                         const int* __restrict__ page_table, const int* __restrict__ row_seq,
                         const int* __restrict__ row_pos, T* __restrict__ o, int R, int HQ, int HKV, int page_size,
                         long long ldpt, float scale, int split_keys, float* __restrict__ part) {
    ag_body<AgWg<D, QLO, PLO, BN>, T, D>(q, k_cache, v_cache, page_table, row_seq, row_pos, o, R, HQ, HKV, page_size, ldpt,
                           scale, split_keys, part);
}
