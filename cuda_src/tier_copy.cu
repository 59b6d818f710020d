// Host-tier page copies (ninfer/cuda/host_tier.py, docs/tiering.md): one launch moves a chunk of KV pages of
// every attention-layer array between the device page pool and the staging buffer, whose rows are host pages
// (page-major: the page of array 0, then array 1, ... at the byte offsets of the table).
//
// table[3k .. 3k+2] for array k: its base address, the bytes of one of its pages (axis 0 holds the pages and
// the array is contiguous), and the page's byte offset inside a staging row. Grid: (blocks per page, pages of
// the chunk, arrays); staging row i holds device page pages[i]. A plain byte copy: bitwise whatever the dtype.
#include "common.cuh"

__global__ void __launch_bounds__(256)
tier_pages(u8* __restrict__ stage, const long long* __restrict__ table, const int* __restrict__ pages,
           long long page_bytes, int to_stage) {
    const int i = blockIdx.y;
    const int k = blockIdx.z;
    const long long size = table[3 * k + 1];
    u8* dev = reinterpret_cast<u8*>(table[3 * k]) + (long long)pages[i] * size;
    u8* row = stage + (long long)i * page_bytes + table[3 * k + 2];
    u8* dst = to_stage ? row : dev;
    const u8* src = to_stage ? dev : row;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long step = (long long)gridDim.x * blockDim.x;
    if (((reinterpret_cast<u64>(dst) | reinterpret_cast<u64>(src) | (u64)size) & 15) == 0) {
        const long long n = size >> 4;
        uint4* d = reinterpret_cast<uint4*>(dst);
        const uint4* s = reinterpret_cast<const uint4*>(src);
        for (long long j = first; j < n; j += step) d[j] = s[j];
    } else {
        for (long long j = first; j < size; j += step) dst[j] = src[j];
    }
}
