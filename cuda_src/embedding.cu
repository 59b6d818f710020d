// Embedding gather: out[t, :] = dequant(table[ids[t], :]) for a table in any stored format (wformat.cuh:
// bf16 for the optional profiles, W8/Q6 row-split in the upstream profile). One block per token.
// An id outside [0, V) yields a NaN row, so a bad id surfaces in the first finiteness check instead of
// reading out of bounds.
#include "common.cuh"
#include "wformat.cuh"

template <typename F, typename T>
__global__ void embed(const u8* __restrict__ p0, const u8* __restrict__ p1, const u8* __restrict__ p2,
                      const int* __restrict__ ids, T* __restrict__ out, int V, int H, long long ldo) {
    pdl_trigger();
    const int t = blockIdx.x;
    const int id = ids[t];
    T* o = out + (long long)t * ldo;
    for (int k0 = threadIdx.x * 8; k0 < H; k0 += blockDim.x * 8) {
        float w[8];
        if (id >= 0 && id < V) {
            F::load8(p0, p1, p2, H, id, k0, w);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) w[j] = __int_as_float(0x7fc00000);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) o[k0 + j] = from_f<T>(w[j]);
    }
}
