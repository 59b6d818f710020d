// Additions to tests/host/attn_emu.cpp for cuda_src/attention_prefill.cu (tests/test_attention_prefill_host.py):
// ldmatrix on its PTX fragment layout (each lane publishes its row address, then reads the rows of the lanes its
// fragment comes from), make_uint4, and the kernel's static shared arrays as function statics
// (blocks run one at a time).
#include <type_traits>
#define AP_STATIC_SHARED static
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

unsigned emu_ldsm_row[1024];  // per CUDA thread: its row address, in 16-bit words from the start of att_smem
// ldmatrix.x4 (.trans when trans): lanes 8i..8i+7 give the rows of matrix i; thread (g, t) gets row g, columns 2t
// and 2t+1 (trans: rows 2t and 2t+1 of column g) of matrix i in r[i], low half the lower index.
inline void emu_ldsm(unsigned r[4], const void* p, bool trans) {
    const int th = threadIdx.x, w = th >> 5, l = th & 31, g = l >> 2, t = l & 3;
    const unsigned short* sm = reinterpret_cast<const unsigned short*>(att_smem);
    const long off = reinterpret_cast<const unsigned short*>(p) - sm;
    if (off < 0 || off + 8 > (long)(sizeof(att_smem) / 2) || (off & 7)) std::abort();  // 16-byte aligned rows
    emu_ldsm_row[th] = (unsigned)off;
    emu_blk->warp[w]->arrive_and_wait();
    for (int i = 0; i < 4; ++i) {
        if (!trans) {
            const unsigned short* row = sm + emu_ldsm_row[(w << 5) | (8 * i + g)];
            r[i] = row[2 * t] | (unsigned)row[2 * t + 1] << 16;
        } else {
            const unsigned short* r0 = sm + emu_ldsm_row[(w << 5) | (8 * i + 2 * t)];
            const unsigned short* r1 = sm + emu_ldsm_row[(w << 5) | (8 * i + 2 * t + 1)];
            r[i] = r0[g] | (unsigned)r1[g] << 16;
        }
    }
    emu_blk->warp[w]->arrive_and_wait();
}
