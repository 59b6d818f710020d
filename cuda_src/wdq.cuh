// Weight tiles of the Hopper prefill GEMM (gemm_sm90.cu): every stored format copied raw (cp.async) into a
// pipeline stage, then dequantized into exact bf16 in the 128B-swizzled K-major layout wgmma reads (wgmma.cuh).
//
// A K tile is 64 consecutive k (k0 = 64 kt) of BN weight rows. Each format struct D provides
//   BN      CTA columns (weight rows per tile): 256, or 128 for the group formats (their fp32 partial sums need
//           registers of their own);
//   DIRECT  the stored rows are bf16 already (BF16): copy() writes the swizzled operand tile itself;
//   GPT     scale groups per K tile (0 = none: the row scale multiplies the result; 1 = Q g64; 2 = W8 g32, each
//           group two k16 steps);
//   BYTES   raw bytes per stage (a multiple of 1024, so stages stay 1024-aligned);
//   Loader  this thread's cp.async streams (built once per CTA), copy(stage, kt, K, fb) issues tile kt's (rows
//           >= nvalid zero-filled; the unpadded formats zero-fill past K, the padded ones read their own padding,
//           whose products meet zero activations);
//   fetch   the raw bits of row r, k 8c .. 8c+7 of the tile (8 bytes), make() their 8 bf16 as one 16-byte vector
//           (low half = lower k);
//   gscale  group g's scale of row r (GPT > 0); row_scale(p1, p2, n) the factor applied to the fp32 result.
// Exactness (as wfrag.cuh, see there): FP8 e4m3 bits placed in a bf16 (x 2^-120) then x 2^120; NVFP4 e2m1 bits
// placed (x 2^-126) then x e4m3 block scale x 2^119, row scale 2^7 g; Q codes via bf16(128 + offset code) - 128 -
// offset; W8 int8 via float. Every operand is the stored value times a power of two or a block scale, exactly.
// Everything is __host__ __device__ (cp.async is a memcpy on the host) so tests/test_gemm_sm90_host.py runs the
// same copy/convert code on the CPU. Work split: thread tid takes fixed rows and chunks of every tile, so the
// addresses are computed once per CTA (Stream) and the swizzle phase is shared by its rows (r0 + 32 i).
#pragma once
#include "common.cuh"
#include "wformat.cuh"
#include "wfrag.cuh"
#include "f16row.cuh"
#include "wgmma.cuh"

#define GS_BM 128       // CTA rows: two consumer warpgroups of 64
#define GS_BK 64        // K tile: one 128-byte swizzle row of bf16
#define GS_THREADS 256  // two warpgroups
#define HD __host__ __device__ __forceinline__


// One thread's cp.async stream of one plane: NI pieces of B bytes; piece i reads the row r0 + i * rstep of the plane
// (rowbytes apart; `row` = the absolute row of piece 0) at byte `off` + (kt >> KSH) * TB + (kt mod 2^KSH) * SUB and
// lands at stage byte dst0 + i * DSTEP. Pieces whose row is out of range (i * rstep >= left), or the whole tile when kin is false, are
// zero-filled without reading (cp.async src-size 0, source `fb`: any valid global address). Built once per CTA, so
// the per-tile cost is an add per piece (the addresses are loop-invariant).
template <int NI, int B, int TB, int DSTEP, int KSH = 0, int SUB = 0>
struct Stream {
    const u8* src;
    long long rstride;
    int dst0;
    u32 ok;
    HD void init(const void* plane, long long row, long long rowbytes, int rstep, int off, int dst, int left) {
        src = reinterpret_cast<const u8*>(plane) + row * rowbytes + off;
        rstride = rstep * rowbytes;
        dst0 = dst;
        ok = 0;
#pragma unroll
        for (int i = 0; i < NI; ++i) ok |= (i * rstep < left ? 1u : 0u) << i;
    }
    HD void copy(u8* st, int kt, bool kin, const void* fb) const {
        const u8* s = src + (long long)(kt >> KSH) * TB + (kt & ((1 << KSH) - 1)) * SUB;
#pragma unroll
        for (int i = 0; i < NI; ++i) {
            const bool in = kin && ((ok >> i) & 1u);
            cp_async<B>(st + dst0 + i * DSTEP, in ? s + i * rstride : reinterpret_cast<const u8*>(fb), in);
        }
    }
};

// Stream with a source row of its own per piece (Stream's pieces are rstep rows apart): piece i reads row
// rows[r0 + i * rstep] of the plane (rowbytes apart) at byte `off` + kt * TB and lands at stage byte dst0 + i * DSTEP;
// pieces with i * rstep >= left (rows[] not read there) or the whole tile when kin is false are zero-filled from `fb`
// as Stream's are. The row addresses are computed once per CTA (a pointer per piece).
template <int NI, int B, int TB, int DSTEP>
struct GatherStream {
    const u8* src[NI];
    int dst0;
    u32 ok;
    HD void init(const void* plane, const int* rows, int r0, long long rowbytes, int rstep, int off, int dst,
                 int left) {
        dst0 = dst;
        ok = 0;
#pragma unroll
        for (int i = 0; i < NI; ++i) {
            const bool in = i * rstep < left;
            ok |= (in ? 1u : 0u) << i;
            src[i] = reinterpret_cast<const u8*>(plane) + (in ? rows[r0 + i * rstep] * rowbytes + off : 0);
        }
    }
    HD void copy(u8* st, int kt, bool kin, const void* fb) const {
#pragma unroll
        for (int i = 0; i < NI; ++i) {
            const bool in = kin && ((ok >> i) & 1u);
            cp_async<B>(st + dst0 + i * DSTEP, in ? src[i] + (long long)kt * TB : reinterpret_cast<const u8*>(fb), in);
        }
    }
};

HD uint4 make4(u32 a, u32 b, u32 c, u32 d) {
    uint4 v;
    v.x = a, v.y = b, v.z = c, v.w = d;
    return v;
}

// Nibbles 2j and 2j+1 of `w` at bits 0..3 and 16..19 (other bits junk, masked by the callers).
struct NibblePairs {
    u32 e, o;  // even / odd nibbles, one per byte
    HD explicit NibblePairs(u32 w) : e(w & 0x0f0f0f0fu), o((w >> 4) & 0x0f0f0f0fu) {}
    HD u32 operator[](int j) const { return prmt(e, o, (u32)j | ((u32)(4 + j) << 8)); }
};

struct DqBF16 {
    static constexpr int BN = 256, GPT = 0, BYTES = BN * 128;
    static constexpr bool DIRECT = true;
    struct Loader {  // row (tid / 8) + 32 i, chunk tid % 8, straight into the swizzled operand tile
        Stream<BN / 32, 16, 128, 4096> s;
        int kc;
        HD Loader(const u8* p0, const u8*, const u8*, int K, long long nbase, int nvalid, int tid) {
            const int r0 = tid >> 3, c = tid & 7;
            kc = 8 * c;
            s.init(p0, nbase + r0, 2ll * K, 32, 16 * c, sw128(r0, c), nvalid - r0);
        }
        HD void copy(u8* st, int kt, int K, const u8* fb) const { s.copy(st, kt, kt * GS_BK + kc < K, fb); }
    };
    static HD float gscale(const u8*, int, int, int) { return 1.f; }
    static HD float row_scale(const u8*, const u8*, long long) { return 1.f; }
};

template <bool ROW>
struct DqFP8 {
    static constexpr int BN = 256, GPT = 0, BYTES = BN * 64;
    static constexpr bool DIRECT = false;
    struct Loader {  // row (tid / 8) + 32 i, 8 bytes at k 8 (tid % 8): FP8 rows are only 8-byte aligned
        Stream<BN / 32, 8, 64, 2048> s;
        int kc;
        HD Loader(const u8* p0, const u8*, const u8*, int K, long long nbase, int nvalid, int tid) {
            const int r0 = tid >> 3, c = tid & 7;
            kc = 8 * c;
            s.init(p0, nbase + r0, K, 32, 8 * c, r0 * 64 + 8 * c, nvalid - r0);
        }
        HD void copy(u8* st, int kt, int K, const u8* fb) const { s.copy(st, kt, kt * GS_BK + kc < K, fb); }
    };
    static HD u32 pair(u32 w, int j) {  // bytes 2j, 2j+1 of w -> bf16x2 (exact)
        const u32 u = prmt(w, w, ((u32)(2 * j) << 4) | ((u32)(2 * j + 1) << 12));  // to bits 8..15 / 24..31
        return bf16x2_mul((u & 0x80008000u) | ((u & 0x7f007f00u) >> 4), 0x7b807b80u);  // e4m3 2^-120, x 2^120
    }
    static HD uint2 fetch(const u8* st, int r, int c) { return *reinterpret_cast<const uint2*>(st + r * 64 + 8 * c); }
    static HD uint4 make(uint2 v, int) { return make4(pair(v.x, 0), pair(v.x, 1), pair(v.y, 0), pair(v.y, 1)); }
    static HD float gscale(const u8*, int, int, int) { return 1.f; }
    static HD float row_scale(const u8* p1, const u8*, long long n) {
        return reinterpret_cast<const float*>(p1)[ROW ? n : 0];
    }
};

template <bool ROWG>
struct DqNVFP4 {
    static constexpr int BN = 256, GPT = 0, BYTES = BN * 32 + BN * 4;  // codes, then one scale word per row
    static constexpr bool DIRECT = false;
    // codes: row tid / 2 + 128 i, half tid % 2; scales: row tid. The device layout (wformat.cuh nv4_codes) keeps a
    // row's 64 code bytes and 8 scale bytes of a 128-wide K tile together: GEMM tile kt (64 k) is half kt % 2 of
    // layout tile kt / 2, and rows 128 apart are 128 natural rows' bytes apart (groups of 16 rows).
    struct Loader {
        Stream<BN / 128, 16, 1024, 4096, 1, 32> codes;
        Stream<1, 4, 128, 0, 1, 4> scales;
        HD Loader(const u8* p0, const u8* p1, const u8*, int K, long long nbase, int nvalid, int tid) {
            const long long kp = kpad128(K), rc = nbase + (tid >> 1), rs = nbase + tid;
            const int h = tid & 1;
            codes.init(p0, rc & ~15LL, kp / 2, 128, (int)(rc & 15) * 64 + 16 * h, (tid >> 1) * 32 + 16 * h,
                       nvalid - (tid >> 1));
            scales.init(p1, rs & ~15LL, kp / 16, 1, (int)(rs & 15) * 8, BN * 32 + tid * 4, nvalid - tid);
        }
        HD void copy(u8* st, int kt, int, const u8* fb) const {
            codes.copy(st, kt, true, fb);
            scales.copy(st, kt, true, fb);
        }
    };
    static HD uint2 fetch(const u8* st, int r, int c) {  // the 8 codes (a device word), the block scale (c / 2)
        uint2 v;
        v.x = *reinterpret_cast<const u32*>(st + r * 32 + 4 * c);
        v.y = st[BN * 32 + r * 4 + (c >> 1)];
        return v;
    }
    static HD uint4 make(uint2 v, int) {
        // pairs (c_i, c_i+4) as the word gives them, scaled, then regrouped into adjacent k: (c0 c1) (c2 c3) ...
        const u32 s = FragNVFP4::scale2(v.y);
        const u32 a = bf16x2_mul(nv4_pair(v.x, 0), s), b = bf16x2_mul(nv4_pair(v.x, 1), s);
        const u32 c = bf16x2_mul(nv4_pair(v.x, 2), s), d = bf16x2_mul(nv4_pair(v.x, 3), s);
        return make4(prmt(a, b, 0x5410u), prmt(c, d, 0x5410u), prmt(a, b, 0x7632u), prmt(c, d, 0x7632u));
    }
    static HD float gscale(const u8*, int, int, int) { return 1.f; }
    static HD float row_scale(const u8*, const u8* p2, long long n) {
        return 128.f * reinterpret_cast<const float*>(p2)[ROWG ? n : 0];
    }
};

// Q{4,5,6} g64: one group per K tile (group index = row * gpr + kt, gpr = kpad / 64 even).
template <int BITS>
struct DqQG64 {
    static constexpr int H = BITS == 4 ? 0 : (BITS == 5 ? 8 : 16);  // high-plane bytes per group
    static constexpr int BN = 128, GPT = 1, BYTES = (BN * (32 + H + 4) + 1023) / 1024 * 1024;
    static constexpr bool DIRECT = false;
    // base codes: row tid / 2, half tid % 2; warps 0-3: the row tid's high bits (Q5/Q6), warps 4-7: the row
    // tid - 128's scale pair (the aligned f16 pair holding the group's scale: groups 2j, 2j+1 of one row, at
    // 4 (kt / 2) past the row's first since gpr is even)
    struct Loader {
        Stream<1, 16, 32, 0> base;
        Stream<1, H ? H : 8, H ? H : 8, 0> high;
        Stream<1, 4, 64, 0, 1> scale;  // tiled scales: the next 128 k's pair 64 bytes on
        bool hw;  // this warp copies high bits (else scales)
        HD Loader(const u8* p0, const u8* p1, const u8* p2, int K, long long nbase, int nvalid, int tid) {
            const long long gpr = kpad128(K) / 64;
            const int r0 = tid >> 1, h = tid & 1, rs = tid - GS_THREADS / 2;
            hw = tid < GS_THREADS / 2;
            base.init(p0, nbase + r0, gpr * 32, 1, 16 * h, r0 * 32 + 16 * h, nvalid - r0);
            high.init(p1, nbase + tid, gpr * H, 1, 0, BN * 32 + tid * H, nvalid - tid);
            // the row's scale pair of K tiles 2j, 2j + 1 in the tiled plane (qg_scale_word): 64 bytes per 128 k
            const long long sr = nbase + rs;
            scale.init(p2 + 2 * qg_scale_word(sr < 0 ? 0 : sr, gpr, 0), 0, 0, 1, 0, BN * (32 + H) + rs * 4, nvalid - rs);
        }
        HD void copy(u8* st, int kt, int, const u8* fb) const {
            base.copy(st, kt, true, fb);
            if (hw) {
                if (H) high.copy(st, kt, true, fb);
            } else {
                scale.copy(st, kt, true, fb);
            }
        }
    };
    static HD uint2 fetch(const u8* st, int r, int c) {  // the 8 base nibbles, their high bits
        uint2 v;
        v.x = *reinterpret_cast<const u32*>(st + r * 32 + 4 * c);
        v.y = 0;
        if (H == 8) v.y = st[BN * 32 + r * 8 + c];                                       // bit i: code i
        if (H == 16) v.y = *reinterpret_cast<const u16*>(st + BN * 32 + r * 16 + 2 * c);  // bits 2i, 2i+1: code i
        return v;
    }
    static HD uint4 make(uint2 v, int) {
        const NibblePairs np(v.x);
        const u32 hb = v.y;
        constexpr u32 OFF = 1u << (BITS - 1), MAGIC = 0x4300u | OFF;  // bf16(128 + OFF)
        u32 o[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            u32 u = np[j] & 0x000f000fu;
            if (H == 8) u |= (((hb >> (2 * j)) & 1u) << 4) | (((hb >> (2 * j + 1)) & 1u) << 20);
            if (H == 16) u |= (((hb >> (4 * j)) & 3u) << 4) | (((hb >> (4 * j + 2)) & 3u) << 20);
            const u32 v = (u ^ (OFF | (OFF << 16))) | 0x43004300u;                           // bf16(128 + u ^ OFF)
            o[j] = bf16x2_fma(v, 0x3f803f80u, (MAGIC | 0x8000u) | ((MAGIC | 0x8000u) << 16));  // - (128 + OFF)
        }
        return make4(o[0], o[1], o[2], o[3]);
    }
    static HD float gscale(const u8* st, int r, int, int kt) {
        const u32 w = *reinterpret_cast<const u32*>(st + BN * (32 + H) + r * 4);
        return hd_f16_to_f((u16)(w >> (16 * (kt & 1))));
    }
    static HD float row_scale(const u8*, const u8*, long long) { return 1.f; }
};

// W8 g32: two groups per K tile (k 0..31: k16 steps 0-1, k 32..63: steps 2-3); group index row * gpr + 2 kt.
struct DqW8G32 {
    static constexpr int BN = 128, GPT = 2, BYTES = (BN * (64 + 4) + 1023) / 1024 * 1024;
    static constexpr bool DIRECT = false;
    struct Loader {  // codes: row tid / 4 + 64 i, quarter tid % 4; warps 0-3: row tid's two f16 scales
        Stream<2, 16, 64, 4096> codes;
        Stream<1, 4, 4, 0> scales;
        bool sw;
        HD Loader(const u8* p0, const u8*, const u8* p2, int K, long long nbase, int nvalid, int tid) {
            const long long gpr = kpad128(K) / 32;
            const int r0 = tid >> 2, pc = tid & 3;
            sw = tid < BN;
            codes.init(p0, nbase + r0, gpr * 32, 64, 16 * pc, r0 * 64 + 16 * pc, nvalid - r0);
            scales.init(p2, nbase + tid, gpr * 2, 1, 0, BN * 64 + tid * 4, nvalid - tid);
        }
        HD void copy(u8* st, int kt, int, const u8* fb) const {
            codes.copy(st, kt, true, fb);
            if (sw) scales.copy(st, kt, true, fb);
        }
    };
    static HD u32 pair(u32 w, int j) {
        return pack_bf16x2((float)(int)(signed char)(w >> (16 * j)), (float)(int)(signed char)(w >> (16 * j + 8)));
    }
    static HD uint2 fetch(const u8* st, int r, int c) { return *reinterpret_cast<const uint2*>(st + r * 64 + 8 * c); }
    static HD uint4 make(uint2 v, int) { return make4(pair(v.x, 0), pair(v.x, 1), pair(v.y, 0), pair(v.y, 1)); }
    static HD float gscale(const u8* st, int r, int g, int) {
        const u32 w = *reinterpret_cast<const u32*>(st + BN * 64 + r * 4);
        return hd_f16_to_f((u16)(w >> (16 * g)));
    }
    static HD float row_scale(const u8*, const u8*, long long) { return 1.f; }
};

// ---- exact folding: the operand tile once per GEMM instead of once per CTA and K tile --------------------------
// A format whose make() writes the stored weight times a fixed per-format power of two (FP8: the e4m3 value; NVFP4:
// e2m1 x e4m3 block scale x 2^-7, at most 2 x 4 = 6 significant bits, magnitudes 2^-17 .. 21: normal bf16) has an
// operand tile that is a pure function of the weight: dequant90 writes it once into a bf16 [N, K] scratch
// (dequant_tile, the same make()), and the pair GEMM reads that scratch as BF16 weights (DqFolded: DqBF16's copy
// straight into the swizzled tile) with the format's row scale in the epilogue, unchanged. The group-int formats
// are not foldable: code x f16 group scale needs up to 8 + 11 significant bits, so their scale stays on the fp32
// partial sums (tests/test_gemm_pair_host.py enumerates every code x scale of the folded formats).
template <typename F> struct DqFolded : DqBF16 {
    static_assert(!F::DIRECT && F::GPT == 0, "only formats without group scales fold into bf16");
    static HD float row_scale(const u8* p1, const u8* p2, long long n) { return F::row_scale(p1, p2, n); }
};

// The group formats' fp16 mode (gemm90_f16_wsg<GPT>, gemm_sm90_ws.cu): the operand rows hold the codes themselves
// (dequant90<D, true> of DqQG64 / DqW8G32: small integers, exact in fp16) and the group scales multiply the partial
// sums in the kernel, so the weight factor is 1 and only the row factor rowf remains for the epilogue.
template <int G> struct WsGroup {
    static constexpr int BN = 128, GPT = G;
    static constexpr bool DIRECT = true;
    static HD float row_scale(const u8*, const u8*, long long) { return 1.f; }
};

// BF16 weights in the fp16 mode (bf16_f16_rows, gemm_sm90.cu): a bf16 weight of a row scaled by 2^k (scale; inv =
// 2^-k, f16row_scale of the row's largest |w|) as fp16 bits h. True when h 2^-k is the weight exactly: zeros
// always, normal values when fp16 holds every bit of w 2^k (above 2^-24 of the scaled row's [2^14, 2^15) maximum);
// bf16 subnormals and non-finite values never (such a weight stays on the exact pair mode). The test compares the
// widened fp16 value scaled back with the weight, so a product that rounded or flushed cannot pass.
HD bool bf16_f16_scaled(u32 b, float scale, float inv, u32& h) {
    const float v = f32_from_bits(b << 16);
    h = f16_rne_bits(v * scale);
    if ((b & 0x7fffu) == 0) return true;
    const u32 e = (b >> 7) & 0xffu;
    if (e == 0 || e == 0xffu) return false;
    return hd_f16_to_f((u16)h) * inv == v;
}

// Its row factor in the fp16 GEMM's epilogue: 2^-k per weight row, float [N] in plane p2 (bf16_f16_rows' rs).
struct RowPow2 {
    static constexpr int GPT = 0;
    static constexpr bool DIRECT = false;
    static HD float row_scale(const u8*, const u8* p2, long long n) { return reinterpret_cast<const float*>(p2)[n]; }
};

// The float activation split of every GEMM path (in place in the stage, Act<float>::split; once per GEMM,
// split_hilo): hi = bf16(x) rounded to nearest even, lo = bf16(x - hi), 8 consecutive k as bf16x2 words (low half
// = lower k). For 2^e <= |x| < 2^(e+1): |x - hi| <= 2^(e-8), and x - hi is exact in fp32 (a multiple of x's last
// bit below 2^(e-7)); lo rounds it to 8 significant bits, which is exact when |x - hi| = 2^(e-8) and else errs by
// at most 2^(e-9-8): |x - hi - lo| <= 2^-17 |x|. (Under -ftz a difference below 2^-126 flushes to zero: an absolute
// error < 2^-126, for |x| < 2^-118 only.)
HD void split8(const float x[8], uint4& hi, uint4& lo) {
    u32 h[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        h[j] = pack_bf16x2(x[2 * j], x[2 * j + 1]);
        l[j] = pack_bf16x2(x[2 * j] - bf16_val(h[j] & 0xffffu), x[2 * j + 1] - bf16_val(h[j] >> 16));
    }
    hi = make4(h[0], h[1], h[2], h[3]);
    lo = make4(l[0], l[1], l[2], l[3]);
}

// ---- activations -------------------------------------------------------------------------------------------
// at(x, r, ldx): the source from row r on (a tile's first row: gs_dense_tile, gs_expert_tile).
// bf16: chunk (r, c) of the A tile straight from x (rows >= mvalid and k >= K zero-filled).
// float: the chunk's first 4 floats land in the hi tile's slot of (r, c), the last 4 in the lo tile's slot; split()
// then rewrites the two slots in place as hi = bf16(x), lo = bf16(x - hi) (only the thread that splits a chunk
// touches its slots, so no barrier is needed between the read and the write).
template <typename T> struct Act;
template <> struct Act<bf16> {
    typedef const bf16* Src;
    static constexpr bool SPLIT = false, F16 = false;
    static constexpr int BYTES = GS_BM * 128;
    struct Loader {  // row tid / 8 + 32 i, chunk tid % 8
        Stream<GS_BM / 32, 16, 128, 4096> s;
        int kc;
        HD Loader(const bf16* x, long long ldx, int mvalid, int tid) {
            const int r0 = tid >> 3, c = tid & 7;
            kc = 8 * c;
            s.init(x, r0, 2 * ldx, 32, 16 * c, sw128(r0, c), mvalid - r0);
        }
        HD void copy(u8* st, int kt, int K, const void* fb) const { s.copy(st, kt, kt * GS_BK + kc < K, fb); }
    };
    static HD void split(u8*, int) {}
    static HD Src at(Src x, long long r, long long ldx) { return x + r * ldx; }
};
template <> struct Act<float> {
    typedef const float* Src;
    static constexpr bool SPLIT = true, F16 = false;
    static constexpr int BYTES = 2 * GS_BM * 128;  // hi tile, then lo tile
    struct Loader {  // row tid / 16 + 16 i, chunk (tid / 2) % 8, half tid % 2
        Stream<GS_BM / 16, 16, 256, 2048> s;
        int kc;
        HD Loader(const float* x, long long ldx, int mvalid, int tid) {
            const int r0 = tid >> 4, c = (tid >> 1) & 7, h = tid & 1;
            kc = 8 * c;
            s.init(x, r0, 4 * ldx, 16, 32 * c + 16 * h, h * GS_BM * 128 + sw128(r0, c), mvalid - r0);
        }
        HD void copy(u8* st, int kt, int K, const void* fb) const { s.copy(st, kt, kt * GS_BK + kc < K, fb); }
    };
    static HD void split(u8* st, int tid) {
        const int d0 = sw128(tid >> 3, tid & 7);  // chunk tid + 256 i: row tid / 8 + 32 i, same swizzle phase
#pragma unroll
        for (int i = 0; i < GS_BM * 8 / GS_THREADS; ++i) {
            uint4* ph = reinterpret_cast<uint4*>(st + d0 + 4096 * i);
            uint4* pl = reinterpret_cast<uint4*>(st + GS_BM * 128 + d0 + 4096 * i);
            const uint4 a = *ph, b = *pl;
            const float x[8] = {f32_from_bits(a.x), f32_from_bits(a.y), f32_from_bits(a.z), f32_from_bits(a.w),
                                f32_from_bits(b.x), f32_from_bits(b.y), f32_from_bits(b.z), f32_from_bits(b.w)};
            split8(x, *ph, *pl);
        }
    }
    static HD Src at(Src x, long long r, long long ldx) { return x + r * ldx; }
};

// Pre-split float activations (the "pair" mode, gemm90_pair): hi and lo as two bf16 [M, K] arrays of the same row
// stride (split_hilo wrote them with split8), each copied like bf16 x straight into its swizzled operand tile (hi
// tile, then lo tile, as Act<float> leaves them after split()), so the main loop does no conversion.
struct PairX {
    const bf16* hi;
    const bf16* lo;
};
HD PairX operator+(PairX p, long long o) { return PairX{p.hi + o, p.lo + o}; }
struct ActPair {
    typedef PairX Src;
    static constexpr bool SPLIT = true, F16 = false;  // two MMAs per k16 step, as Act<float>
    static constexpr int BYTES = 2 * GS_BM * 128;
    struct Loader {  // row tid / 8 + 32 i, chunk tid % 8, of each half
        Stream<GS_BM / 32, 16, 128, 4096> h, l;
        int kc;
        HD Loader(PairX x, long long ldx, int mvalid, int tid) {
            const int r0 = tid >> 3, c = tid & 7;
            kc = 8 * c;
            h.init(x.hi, r0, 2 * ldx, 32, 16 * c, sw128(r0, c), mvalid - r0);
            l.init(x.lo, r0, 2 * ldx, 32, 16 * c, GS_BM * 128 + sw128(r0, c), mvalid - r0);
        }
        HD void copy(u8* st, int kt, int K, const void* fb) const {
            const bool kin = kt * GS_BK + kc < K;
            h.copy(st, kt, kin, fb);
            l.copy(st, kt, kin, fb);
        }
    };
    static HD void split(u8*, int) {}
    static HD Src at(Src x, long long r, long long ldx) { return x + r * ldx; }
};

// fp16 mode (gemm90_f16): the activation rows as fp16 words from split_f16row, loaded exactly as bf16 words are
// (16-bit words; only the MMA's operand type differs), one MMA per k16 step.
struct ActF16 : Act<bf16> {
    static constexpr bool F16 = true;
};

// The fp16 mode's gathered rows (gemm90_experts_f16g, the MoE prefill's gate | up product): A-tile row r is row
// rows[r] of xh (split_f16row of the tokens' rows, row stride ldx), read in place instead of from a per-slot copy.
// The same chunks, destinations and zero fill as ActF16 (rows >= mvalid: rows[] not read), so the tile is byte for
// byte ActF16's over the gathered copy xh[rows] (a row's fp16 words depend only on that row; the host test
// tests/test_gemm_pair_host.py compares the stages). at() offsets the index, not the rows.
struct GatherX {
    const bf16* xh;
    const int* rows;
};
struct ActF16G {
    typedef GatherX Src;
    static constexpr bool SPLIT = false, F16 = true;
    static constexpr int BYTES = GS_BM * 128;
    struct Loader {  // row tid / 8 + 32 i, chunk tid % 8, as Act<bf16>'s
        GatherStream<GS_BM / 32, 16, 128, 4096> s;
        int kc;
        HD Loader(GatherX x, long long ldx, int mvalid, int tid) {
            const int r0 = tid >> 3, c = tid & 7;
            kc = 8 * c;
            s.init(x.xh, x.rows, r0, 2 * ldx, 32, 16 * c, sw128(r0, c), mvalid - r0);
        }
        HD void copy(u8* st, int kt, int K, const void* fb) const { s.copy(st, kt, kt * GS_BK + kc < K, fb); }
    };
    static HD void split(u8*, int) {}
    static HD Src at(Src x, long long r, long long) { return GatherX{x.xh, x.rows + r}; }
};

// 8 bf16 operand values -> the same 8 values as fp16 words (exact for every folded format: NVFP4 operands are
// e2m1 x e4m3 x 2^-7, multiples of 2^-17 below 22; FP8 e4m3 codes are multiples of 2^-9 below 449).
HD uint4 bf16x8_to_f16(uint4 v) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
    u32 o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = f16_rne_bits(bf16_val(w[j] & 0xffffu)) | f16_rne_bits(bf16_val(w[j] >> 16)) << 16;
    return make4(o[0], o[1], o[2], o[3]);
}

// The fp16 mode's row split with the attention output gate (gemm_sm90.cu split_f16row_gate): 8 consecutive inputs
// of row xr at column k, x * sigmoid(gate) with sigmoid_gate's own per-element value (common.cuh sigmoid_gated;
// activation.cu, float rows), the gate read in place from the q|gate projection's row gr (gr[0]: head 0's first
// gate element; head h's gates at gr + 2 D h), so the values are bitwise those sigmoid_gate would have stored.
// D % 8 == 0: the 8 columns lie in one head. Here for the host test (tests/test_gemm_f16_host.py).
HD void split_gate8(const float* xr, const float* gr, int D, int k, float v[8]) {
    float g[8];
    load8x(xr + k, v);
    load8x(gr + (long long)(k / D) * 2 * D + k % D, g);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = sigmoid_gated(v[j], g[j]);
}

// ---- tile bookkeeping shared by the kernel and the host test ---------------------------------------------------
// Weight tile kt of format D, raw stage -> swizzled bf16 operand tile (non-DIRECT formats): chunk q = tid + 256 i
// is row q / 8, k 8 (q % 8) .. +7; a warp reads 4 whole raw rows and writes 4 whole 128-byte operand rows.
// All raw reads first, then the conversions and stores: the stores go to another buffer than the reads, which the
// compiler cannot prove, so interleaved it would wait for each read's latency in turn.
// F16 (the fp16 mode's in-loop kernel, gemm90_f16il): the same values as fp16 words (bf16x8_to_f16), exactly what
// dequant_tile<D, true> writes to the scratch the pair-layout fp16 kernel reads.
template <typename D, bool F16 = false> HD void convert_tile(const u8* raw, u8* dst, int kt, int tid) {
    constexpr int NI = D::BN * 8 / GS_THREADS;
    static_assert(D::BN * 8 % GS_THREADS == 0, "whole chunks per thread");
    const int r0 = tid >> 3, c = tid & 7, d0 = sw128(r0, c);  // sw128(r0 + 32 i, c) = d0 + 4096 i
    uint2 v[NI];
#pragma unroll
    for (int i = 0; i < NI; ++i) v[i] = D::fetch(raw, r0 + 32 * i, c);
#pragma unroll
    for (int i = 0; i < NI; ++i) {
        const uint4 b = D::make(v[i], kt);
        *reinterpret_cast<uint4*>(dst + d0 + 4096 * i) = F16 ? bf16x8_to_f16(b) : b;
    }
}

// Weight tile kt of format D, raw stage -> bf16 rows in global memory: w (the tile's first row) [nvalid, K] with row
// stride K; the same chunks and make() as convert_tile (so the scratch holds the operand tile's values, unswizzled);
// chunks at k >= K (the padded formats' padding) are not written.
// F16: the same values as fp16 words (bf16x8_to_f16, exact for the folded formats).
template <typename D, bool F16 = false>
HD void dequant_tile(const u8* raw, bf16* w, int K, int nvalid, int kt, int tid) {
    constexpr int NI = D::BN * 8 / GS_THREADS;
    const int r0 = tid >> 3, c = tid & 7, k = kt * GS_BK + 8 * c;
    if (k >= K) return;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
        const int r = r0 + 32 * i;
        if (r >= nvalid) continue;
        const uint4 v = D::make(D::fetch(raw, r, c), kt);
        *reinterpret_cast<uint4*>(w + (long long)r * K + k) = F16 ? bf16x8_to_f16(v) : v;
    }
}

// Accumulator register i of thread tid (m64nN wgmma per warpgroup, warpgroup tid / 128 owning rows 64 wg ..):
// the tile row and column it holds.
HD void frag_rc(int tid, int i, int& r, int& c) {
    const int lane = tid & 31;
    r = (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2) + 8 * ((i >> 1) & 1);
    c = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
}

// CTA b of the 1-D grid -> (row tile, column tile): groups of GS_GROUP_M row tiles walk the column tiles together,
// so a weight tile is read by GS_GROUP_M row tiles while it is in L2. Every tile exactly once for b < tm * tn.
#define GS_GROUP_M 8
HD void gs_raster(int b, int tm, int tn, int& mt, int& nt) {
    const int per = GS_GROUP_M * tn, first = b / per * GS_GROUP_M;
    const int gs = tm - first < GS_GROUP_M ? tm - first : GS_GROUP_M;
    mt = first + (b % per) % gs, nt = (b % per) / gs;
}
