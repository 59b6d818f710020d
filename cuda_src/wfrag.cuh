// Weight fragments for the tensor-core decode GEMV (gemv.cu, gemv_mma): every stored format read straight from
// its planes (no repacking) and turned into exact bf16 operands of mma.m16n8k16 (A = 16 weight rows x 16 k).
//
// K order. A K-tile is 128 consecutive k. Thread t (0..3, its index inside an mma quad) owns 32 of them, as four
// "words" of 8 consecutive k; word w starts at kofs(t, w) (per format: where its loads and scale groups fall).
// Word w feeds mma steps 2w and 2w+1; step 2w takes the weight pairs (0, 4) and (1, 5) of the word as the A
// registers a0/a1 (k slots 2t, 2t+1) and a2/a3 (k slots 2t+8, 2t+9), step 2w+1 the pairs (2, 6) and (3, 7). The
// activation fragments (B) are staged in the same order (stage_pairs), so every step multiplies matching k: a
// dot product in a permuted but fixed K order, the same for every activation row and every launch.
//
// Exactness: every weight operand is the stored value times a power of two or a per-block factor, exact in bf16:
//   BF16   as stored;
//   FP8    e4m3 bits placed in a bf16 (value * 2^-120, subnormal for e4m3 subnormals), times 2^120 (bf16 mul);
//   NVFP4  e2m1 bits placed in a bf16 (value * 2^-126, subnormal for 0.5; the device layout's words put each pair
//          one shift away, wformat.cuh nv4_pair), times the e4m3 block scale * 2^119 (bf16 mul; e2m1 * e4m3 has <= 6
//          significant bits): operand = value * block * 2^-7; row scale 2^7 * g;
//   Q4/5/6 integer codes (|q| <= 32) as bf16 via 128 + offset-binary code; the f16 group scale multiplies the fp32
//          partial sum of the group's steps (GROUP = 4 steps = the 64-wide group);
//   W8     int8 codes (exact in bf16); f16 scale per 32-wide group (GROUP = 2 steps).
// Loads of the unpadded formats (BF16, FP8) are guarded per word at K (K % 8 == 0); the padded formats (NVFP4,
// group-int) read inside the row's padding to a multiple of 128. Everything is __host__ __device__ so that a host
// program (tests/test_gemv_mma_host.py) can emulate the kernel's indexing without a GPU.
#pragma once
#include "common.cuh"
#include "wformat.cuh"

// GV_QG64_XLANE, a mask of what FragQG64's lanes copy for their quad and read across it after a __syncwarp
// (GvXlane), 5 by default since 2026-12-07 (codes and Q5 / Q6's high words; Q4 builds as at 1):
//   1  each row's 64 code bytes of a tile as one 16-byte piece per quad lane (8 cp.async per row set instead of
//      12). Nsight Compute put the Q4G64 GEMV's stalls on the shared-memory pipe (the copies' wavefronts);
//      measured (H200, perf/gemv_variants.py --variants noxlane,base): 27B Q4G64 one row 1.3-1.5x faster, eight
//      rows 1.2-1.3x, Q6G64 1.15-1.3x, the same bits (docs/cuda.md, "Groupwise-integer weights").
//   2  each row set's scale word by one quad lane (lane t: row set t) instead of all four. Measured as mask 3
//      (H100, variant xl3): 3-7% slower than 1 for Q4 and Q6 at one row.
//   4  Q5 / Q6's high-bit words as 16-byte pieces, row set t's by quad lane t (Q5 one piece for both groups, Q6
//      one per group; Q4 has none). Measured as mask 7 (variant xl7): Q6G64 1.12-1.20x faster than 1 (27B layer
//      236 -> 198 us at one row), Q4 as mask 3. Mask 5 (H100, variants base = 1, xl5, xl7, one run): Q5G64 a
//      27B layer 222.2 -> 186.8 us at one row (1.19x), 271.7 -> 233.0 at eight; Q6G64 236.2 -> 199.6 and 276.4 ->
//      241.1; mask 7 within 2% of 5 (Q5 slower, Q6 mixed): the default is 5.
// 0: the per-lane copies of before.
// GV_W8G32_XLANE 1 (an A/B candidate, off; variant w8x): FragW8G32 copies each row's 128 code bytes of a tile as
// 32 bytes per quad lane (lane t: group t, two 16-byte pieces) instead of every lane's 8 bytes of each group (8
// cp.async per row set of 4 instead of 16), read across the quad as GV_QG64_XLANE's codes; the scale words stay
// per lane (sharing them measured slower for the group-int formats). Measured (H100, variant w8x): 1.20-1.45x
// slower than the default at every 27B shape (a layer 225.5 -> 282.8 us at one row): W8G32's 8-byte copies are not
// its limit. Stays off.
#ifndef GV_W8G32_XLANE
#define GV_W8G32_XLANE 0
#endif
// GV_W8G32_FCVT 1 (the default since session 41; 0 is variant w8f's base): FragW8G32's int8 codes to float without I2F.
// Each code byte costs an I2F (16 per clock per SM on sm_90, the conversion pipe), and at copy bandwidth an H100 SM
// receives ~14.5 code bytes per clock: the conversions alone would fill ~90% of that pipe, which may be what holds
// W8G32's GEMV at 0.5-0.6 of copy. With the switch a code c becomes the float whose bits are 0x4B0000 << 8 | (c + 128)
// (one PRMT from the word XORed with 0x80808080 once), minus 2^23 + 128 (one FADD on the FMA pipe): exact, the same
// floats, the same bits. Measured (H100, base against w8f): 1.03-1.09x faster at every 27B shape, a layer's four
// products 224.6 -> 211.5 us at one row and 268.2 -> 253.1 at eight, the LM head at eight 676 -> 635 us.
#ifndef GV_W8G32_FCVT
#define GV_W8G32_FCVT 1
#endif
#ifndef GV_QG64_XLANE
#define GV_QG64_XLANE 5
#endif
// GV_QG64_SWZ 1 (an A/B candidate, session 41; measured mixed, off): FragQG64's shared slots placed for the banks.
// Nsight Compute (H100, 27B gate | up, one row) counted 6.56 M shared wavefronts for Q4G64 against NVFP4's 3.43 M at
// the same instruction count, with short-scoreboard and MIO-throttle stalls NVFP4 lacks: the 8-byte code reads across
// the quad put quads g and g + 2 on the same banks (two wavefronts per half-warp instead of one), and the 4-byte scale
// words at byte 4 r of each lane's slot put lanes l, l + 8, l + 16, l + 24 on one bank (4 wavefronts per copy and read
// instead of 1). With the switch: quad lane j's code piece sits in slot j ^ (g & 2) of its quad, row set rr's high
// words (XLANE & 4) in slot rr ^ (g >> 1) of its quad, and the scale words lane-contiguous per row set (word 32 r + L
// of their vector, as NVFP4's): every copy and read of a stage one wavefront per 128 bytes. Same bits. Measured (H100,
// perf/gemv_variants base against swz, a 27B layer's four products): Q4G64 0.94x at one row (140.8 -> 149.2 us, slower
// at every shape) and 1.05x at eight (196.0 -> 185.8); Q5G64 1.07x / 0.99x; Q6G64 0.99x / 0.97x. So the bank conflicts
// are not what holds Q4G64 at one row; the switch stays off.
#ifndef GV_QG64_SWZ
#define GV_QG64_SWZ 0
#endif
// GV_Q4_HV: the high-word vectors in Q4G64's pipeline stage, 0 since session 41 (2 before: the Q5 / Q6 layout, two
// 16-byte vectors per lane that Q4 never wrote nor read). Its stage is then 5 vectors (2560 bytes per warp) as
// NVFP4's, and a block 57,344 bytes of shared memory instead of 73,728: 4 resident blocks per SM instead of 3, the
// occupancy gemv_geometry's splits assume (one wave of 4 blocks per SM; at 3 a 528-block grid ran 1.33 waves).
// Measured (H100, perf/gemv_variants q4hv2 against base): the same time at every 27B shape (a layer 141.6 -> 141.9
// us at one row); kept for the smaller footprint. gemv_geometry.FRAG_STRUCTS holds the same vector count
// (tests/test_gemv_vecs_host.py checks the two against each other).
#ifndef GV_Q4_HV
#define GV_Q4_HV 0
#endif
// FragQG64's f16 group scales come from the tiled plane (wformat.cuh qg_scale_word, ninfer/cuda/qg64_layout.py):
// a tile's 4 scale bytes of 16 rows are 64 contiguous bytes, so a warp's copy instruction (8 rows) touches one
// 32-byte sector. The artifact's row-major plane put each row's 4 bytes in a sector of its own (8 per instruction):
// Nsight measured Q4G64's gate | up GEMV reading 1.36x its DRAM bytes from the L2 (NVFP4's tiled planes: 1.05x);
// tiled, one 27B layer's Q4G64 / Q5G64 / Q6G64 GEMVs at one row took 0.89 / 0.85 / 0.91 of the time (H100, e2ac007,
// perf/gemv_variants "tsc" against base, perf/results/device_run_e2ac007_h100.txt).

// Whether a format's lanes read stage bytes that other lanes of their quad copied (F::XLANE): the warp syncs after
// each lane's cp.async wait (gv_wait_stage), which makes the others' copies of the tile visible and orders every
// lane's reads of a stage before any lane refills it.
template <typename F, typename = void> struct GvXlane {
    static constexpr bool ON = false;
};
template <typename F> struct GvXlane<F, decltype(void(F::XLANE))> {
    static constexpr bool ON = F::XLANE != 0;
};

// ---- bf16x2 helpers (low half = lower k) --------------------------------------------------------------------
__host__ __device__ __forceinline__ u32 bf16_rne_bits(float f) {
    u32 u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

__host__ __device__ __forceinline__ float bf16_val(u32 h) { return f32_from_bits(h << 16); }

// two floats -> bf16x2, round to nearest even (cvt.rn.bf16x2.f32 on the device)
__host__ __device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
#ifdef __CUDA_ARCH__
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return bf16_rne_bits(lo) | (bf16_rne_bits(hi) << 16);
#endif
}

// a * b per half, round to nearest even, subnormals kept (every use here is exact)
__host__ __device__ __forceinline__ u32 bf16x2_mul(u32 a, u32 b) {
#ifdef __CUDA_ARCH__
    u32 r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return pack_bf16x2(bf16_val(a & 0xffffu) * bf16_val(b & 0xffffu), bf16_val(a >> 16) * bf16_val(b >> 16));
#endif
}

// a * b + c per half (exact in every use here)
__host__ __device__ __forceinline__ u32 bf16x2_fma(u32 a, u32 b, u32 c) {
#ifdef __CUDA_ARCH__
    u32 r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    return pack_bf16x2(bf16_val(a & 0xffffu) * bf16_val(b & 0xffffu) + bf16_val(c & 0xffffu),
                       bf16_val(a >> 16) * bf16_val(b >> 16) + bf16_val(c >> 16));
#endif
}

// byte permute (PTX prmt.b32 default mode; the selectors used here never set the sign-replicate bit)
__host__ __device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
#ifdef __CUDA_ARCH__
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
#else
    const unsigned long long v = (unsigned long long)a | ((unsigned long long)b << 32);
    u32 r = 0;
    for (int i = 0; i < 4; ++i) r |= (u32)((v >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
#endif
}

// word w of a 16-byte load
__host__ __device__ __forceinline__ u32 word4(const uint4& v, int w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// ---- asynchronous copies into a lane's own shared-memory slots --------------------------------------------
// A warp's pipeline stage is VECS 16-byte vectors per lane; vector v of lane l sits at byte (v * 32 + l) * 16 of
// the stage, so the 32 lanes' reads of one vector are contiguous (no bank conflicts). A lane reads back only what
// it copied itself, so its own cp.async.wait_group is the only synchronisation the weights need. `in` false
// zero-fills the destination (reads nothing). On the host the copies are plain memcpy (tests emulate the kernel).
__host__ __device__ __forceinline__ u8* gv_vec(u8* st, int v, int lane) { return st + (v * 32 + lane) * 16; }
__host__ __device__ __forceinline__ const u8* gv_vec(const u8* st, int v, int lane) {
    return st + (v * 32 + lane) * 16;
}

template <int B>
__host__ __device__ __forceinline__ void cp_async(u8* dst, const u8* src, bool in) {
#ifdef __CUDA_ARCH__
    // the builtin (not a cvta in inline asm) lets the compiler fold the stage's base and the slot offsets
    const u32 s = (u32)__cvta_generic_to_shared(dst);
    if (B == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(in ? 16 : 0) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(s), "l"(src), "n"(B), "r"(in ? B : 0)
                     : "memory");
#else
    for (int i = 0; i < B; ++i) dst[i] = in ? src[i] : 0;
#endif
}

// ---- weight sources ------------------------------------------------------------------------------------------
// A warp's view of its rows for the whole launch: F::src(...) once (rows and the split's first k), then
// F::copy_next(st, lane, src, t) fills a stage with the next K-tile (tiles in order) and advances `src`. The
// generic source (GV_ROWS_SRC) keeps the rows and recomputes each tile's addresses in F::copy; a format may keep
// per-row pointers instead (FragNVFP4: one 64-bit add per row and plane and tile instead of the layout's index
// arithmetic).
template <int MT> struct GvRows {
    const u8 *p0, *p1, *p2;
    int K, k0;
    long long n[MT][2];
};
#define GV_ROWS_SRC(SELF)                                                                                        \
    typedef GvRows<MT> Src;                                                                                      \
    static __host__ __device__ __forceinline__ Src src(const u8* p0, const u8* p1, const u8* p2, int K,          \
                                                       const long long (&n)[MT][2], int k0, int) {               \
        Src s{p0, p1, p2, K, k0, {}};                                                                            \
        for (int mt = 0; mt < MT; ++mt) s.n[mt][0] = n[mt][0], s.n[mt][1] = n[mt][1];                           \
        return s;                                                                                                \
    }                                                                                                            \
    static __host__ __device__ __forceinline__ void copy_next(u8* st, int lane, Src& s, int t) {                \
        SELF::copy(st, lane, s.p0, s.p1, s.p2, s.K, s.n, s.k0, t);                                               \
        s.k0 += 128;                                                                                             \
    }

// ---- formats ---------------------------------------------------------------------------------------------------
// Each: MT (16-row m-tiles per warp), GROUP (steps per accumulator scale; 0 = none), kofs(t, w), chunk(cc, t, w)
// (the inverse: the word at k offset 8 cc of a tile), VECS + Src/src/copy_next (cp.async of the lane's rows of
// the next tile into its stage slots; GV_ROWS_SRC builds them on a per-tile copy(..., rows n[mt][r], k0, t)) + read (one row's bits back into a Raw), Prep + prep (per-tile conversions),
// pair(p, w, i) (bf16x2 of the word's weights i and i + 4), gscale(p, h) (group h's scale when GROUP > 0) and
// row_scale(p1, p2, n) (applied to the fp32 result).

struct KMap32 {  // thread t owns k [32t, 32t + 32) of the tile (one 16-byte load of 4-bit codes)
    static __host__ __device__ __forceinline__ int kofs(int t, int w) { return 32 * t + 8 * w; }
    static __host__ __device__ __forceinline__ void chunk(int cc, int& t, int& w) { t = cc >> 2, w = cc & 3; }
};

// Word w of thread t at k 32w + 8t: a quad's loads of one word cover 32 consecutive k of the row, so 8- and
// 16-byte words (FP8, BF16) fill whole 32-byte sectors per instruction (measured: BF16 with KMap32's 64-byte
// stride per lane read every sector twice through the L2, which capped it at 48% of the copy bandwidth).
struct KMapQuad {
    static __host__ __device__ __forceinline__ int kofs(int t, int w) { return 32 * w + 8 * t; }
    static __host__ __device__ __forceinline__ void chunk(int cc, int& t, int& w) { t = cc & 3, w = cc >> 2; }
};

struct FragBF16 : KMapQuad {
    static constexpr int MT = 1, GROUP = 0;
    GV_ROWS_SRC(FragBF16)
    struct Raw {
        uint4 v[4];
    };
    typedef Raw Prep;
    static constexpr int VECS = 8 * MT;
    static __host__ __device__ __forceinline__ void copy(u8* st, int lane, const u8* p0, const u8*, const u8*, int K,
                                                         const long long (&n)[MT][2], int k0, int t) {
#pragma unroll
        for (int r = 0; r < 2 * MT; ++r)
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const int k = k0 + kofs(t, w);
                cp_async<16>(gv_vec(st, 4 * r + w, lane), p0 + (n[r >> 1][r & 1] * K + (k < K ? k : 0)) * 2, k < K);
            }
    }
    static __host__ __device__ __forceinline__ void read(const u8* st, int lane, int mt, int r, int, Raw& raw) {
#pragma unroll
        for (int w = 0; w < 4; ++w) raw.v[w] = *reinterpret_cast<const uint4*>(gv_vec(st, 4 * (2 * mt + r) + w, lane));
    }
    static __host__ __device__ __forceinline__ void prep(const Raw& r, Prep& p) { p = r; }
    static __host__ __device__ __forceinline__ u32 pair(const Prep& p, int w, int i) {
        // elements i and i + 4 of the word: u32 i/2 and i/2 + 2, half i % 2
        return prmt(word4(p.v[w], i >> 1), word4(p.v[w], (i >> 1) + 2), (i & 1) ? 0x7632u : 0x5410u);
    }
    static __host__ __device__ __forceinline__ float gscale(const Prep&, int) { return 1.f; }
    static __host__ __device__ __forceinline__ float row_scale(const u8*, const u8*, long long) { return 1.f; }
};

template <bool ROW>
struct FragFP8 : KMapQuad {
    static constexpr int MT = 2, GROUP = 0;
    GV_ROWS_SRC(FragFP8)
    struct Raw {
        uint2 v[4];
    };
    typedef Raw Prep;
    static constexpr int VECS = 4 * MT;  // per row: words 0-1, words 2-3
    static __host__ __device__ __forceinline__ void copy(u8* st, int lane, const u8* p0, const u8*, const u8*, int K,
                                                         const long long (&n)[MT][2], int k0, int t) {
#pragma unroll
        for (int r = 0; r < 2 * MT; ++r)
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const int k = k0 + kofs(t, w);
                cp_async<8>(gv_vec(st, 2 * r + (w >> 1), lane) + 8 * (w & 1), p0 + n[r >> 1][r & 1] * K + (k < K ? k : 0),
                            k < K);
            }
    }
    static __host__ __device__ __forceinline__ void read(const u8* st, int lane, int mt, int r, int, Raw& raw) {
#pragma unroll
        for (int w = 0; w < 4; ++w)
            raw.v[w] = *reinterpret_cast<const uint2*>(gv_vec(st, 2 * (2 * mt + r) + (w >> 1), lane) + 8 * (w & 1));
    }
    static __host__ __device__ __forceinline__ void prep(const Raw& r, Prep& p) { p = r; }
    static __host__ __device__ __forceinline__ u32 pair(const Prep& p, int w, int i) {
        // byte i of each half to bits 8..15 / 24..31, then sign to 15/31 and exponent|mantissa to 10..4 / 26..20
        const u32 u = prmt(p.v[w].x, p.v[w].y, ((u32)i << 4) | ((u32)(4 + i) << 12));
        const u32 v = (u & 0x80008000u) | ((u & 0x7f007f00u) >> 4);  // e4m3 * 2^-120
        return bf16x2_mul(v, 0x7b807b80u);                             // * 2^120
    }
    static __host__ __device__ __forceinline__ float gscale(const Prep&, int) { return 1.f; }
    static __host__ __device__ __forceinline__ float row_scale(const u8* p1, const u8*, long long n) {
        return reinterpret_cast<const float*>(p1)[ROW ? n : 0];
    }
};

// ---- NVFP4 pair decoding of the GEMV (docs/cuda.md, "Decode GEMV on tensor cores": the instruction diet) --------
// The same bits as wformat.cuh nv4_pair (tests/test_gemv_nv4_host.py), arranged for Hopper's pipes: the integer
// (ALU) pipe issues LOP3/SHF/IADD3/MOV/PRMT at half rate and was the decode's limit, while IMAD runs on the FMA pipe
// next to the bf16 multiplies. So every left shift is a multiply by a power of two, and ptxas emits it as an IMAD
// only if it cannot see the constant (it turns a known power of two back into SHF), hence the factors come from
// constant memory (gv_k); the masks stay LOP3 (one per pair, three for pair 3). GV_NV4_MULHI (timing variant,
// perf/gemv_variants.py) also takes pair 3's right shift as the high word of a product (IMAD.HI).
#ifdef __CUDACC__
__constant__ u32 gv_k[4] = {2u, 8u, 64u, 1u << 27};  // q << 1, << 3, << 6; hi(q * 2^27) = q >> 5
#endif
template <int J> __host__ __device__ __forceinline__ u32 gv_kmul(u32 x) {
#ifdef __CUDA_ARCH__
    return x * gv_k[J];
#else
    constexpr u32 k[3] = {2u, 8u, 64u};
    return x * k[J];
#endif
}
__host__ __device__ __forceinline__ u32 gv_shr5(u32 x) {
#if defined(__CUDA_ARCH__) && defined(GV_NV4_MULHI)
    return __umulhi(x, gv_k[3]);
#else
    return x >> 5;
#endif
}
__host__ __device__ __forceinline__ u32 gv_nv4_pair(u32 q, int i) {
    if (i == 0) return q & 0x81C081C0u;
    if (i == 1) return gv_kmul<1>(q) & 0x81C081C0u;
    if (i == 2) return gv_kmul<2>(q) & 0x81C081C0u;
    // pair 3: bits 10, 11 -> 6, 7 (as (q >> 5) << 1), 13 -> 8, 14 -> 15 (and + 16)
    const u32 y = gv_shr5(q);
    return (gv_kmul<0>(y) & 0x00C000C0u) | (y & 0x01000100u) | (gv_kmul<0>(q) & 0x80008000u);
}

// one shared-memory byte at p + O, zero-extended (inline PTX: the compiler would merge a lane's two adjacent scale
// bytes into one 16-bit load and split it with two PRMTs on the integer pipe; O an immediate so the address folds).
// volatile: the compiler does not see the asm read memory, and it must stay between the cp.async.wait_group that
// lands the byte and the cp.async that refills the stage (both volatile asm, kept in order with it).
template <int O> __host__ __device__ __forceinline__ u32 gv_lds_u8(const u8* p) {
#ifdef __CUDA_ARCH__
    u32 v;
    asm volatile("ld.shared.u8 %0, [%1+%2];" : "=r"(v) : "r"((u32)__cvta_generic_to_shared(p)), "n"(O));
    return v;
#else
    return p[O];
#endif
}

struct FragNVFP4 : KMap32 {
    static constexpr int MT = 2, GROUP = 0;
    struct Raw {
        uint4 c;     // 32 e2m1 codes: 4 device-layout words of 8 consecutive k
        u32 b0, b1;  // the two e4m3 block scales (words 0-1, words 2-3)
    };
    struct Prep {
        uint4 c;
        u32 s0, s1;  // bf16x2 of block scale * 2^119 (both halves)
    };
    static constexpr int VECS = 2 * MT + (MT + 1) / 2;  // codes per row, then the rows' scale words (32 lanes x 4 B)
    // per row: its codes and scale word at the split's first tile; tile i is 1024 (codes) / 128 (scales) bytes on
    struct Src {
        const u8* c[2 * MT];
        const u8* s[2 * MT];
    };
    static __host__ __device__ __forceinline__ Src src(const u8* p0, const u8* p1, const u8*, int K,
                                                       const long long (&n)[MT][2], int k0, int t) {
        const long long kp = kpad128(K);
        Src s;
#pragma unroll
        for (int r = 0; r < 2 * MT; ++r) {
            s.c[r] = p0 + nv4_codes(n[r >> 1][r & 1], kp, k0 + 32 * t);
            s.s[r] = p1 + nv4_scales(n[r >> 1][r & 1], kp, k0) + 4 * (t >> 1);
        }
        return s;
    }
    static __host__ __device__ __forceinline__ void copy_next(u8* st, int lane, Src& s, int) {
#pragma unroll
        for (int r = 0; r < 2 * MT; ++r) {
            cp_async<16>(gv_vec(st, r, lane), s.c[r], true);
            // the 4-byte word holding this lane's two scale bytes (a row's 8 scale bytes of a tile are 8-aligned),
            // lane-contiguous per row so the warp's 4-byte accesses hit 32 distinct banks
            cp_async<4>(st + 2 * MT * 512 + (32 * r + lane) * 4, s.s[r], true);
            s.c[r] += 1024, s.s[r] += 128;
        }
    }
    // The bulk-copy ring (gemv_bulk.cuh, GV_BULK): per stage the MT m-tiles' 1 KiB code blocks (the device layout's
    // byte order is the stage's lane order: row g + 8 h, bytes 16 t.. at h * 512 + g * 64 + 16 t), then their
    // 128-byte scale blocks, compact (row g + 8 h's 8 bytes at h * 64 + g * 8). Src's first MT entries then hold
    // each m-tile's 16-row group at the split's first tile (grp: its first row, a multiple of 16).
    static constexpr int BULK = 2 * MT * 512 + MT * 128;
    static __host__ __device__ __forceinline__ Src src_bulk(const u8* p0, const u8* p1, int K,
                                                            const long long (&grp)[MT], int k0) {
        const long long kp = kpad128(K);
        Src s;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) s.c[mt] = p0 + nv4_codes(grp[mt], kp, k0), s.s[mt] = p1 + nv4_scales(grp[mt], kp, k0);
        return s;
    }
    template <typename Copy> static __host__ __device__ __forceinline__ void copy_bulk(u8* st, const Src& s, Copy copy) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            copy(st + mt * 1024, s.c[mt], 1024u);
            copy(st + 2 * MT * 512 + mt * 128, s.s[mt], 128u);
        }
    }
    static __host__ __device__ __forceinline__ void advance_bulk(Src& s) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) s.c[mt] += 1024, s.s[mt] += 128;
    }
    static __host__ __device__ __forceinline__ void read_bulk(const u8* st, int lane, int mt, int r, int t, Raw& raw) {
        raw.c = *reinterpret_cast<const uint4*>(gv_vec(st, 2 * mt + r, lane));
        // bytes 2 t + {0, 1} of row g's 8 scale bytes in row group 2 mt + r (64 bytes each)
        static_assert(MT == 2, "one case per row");
        const u8* b = st + 2 * MT * 512 + (lane >> 2) * 8 + 2 * t;
        switch (2 * mt + r) {
            case 0: raw.b0 = gv_lds_u8<0>(b), raw.b1 = gv_lds_u8<1>(b); break;
            case 1: raw.b0 = gv_lds_u8<64>(b), raw.b1 = gv_lds_u8<65>(b); break;
            case 2: raw.b0 = gv_lds_u8<128>(b), raw.b1 = gv_lds_u8<129>(b); break;
            default: raw.b0 = gv_lds_u8<192>(b), raw.b1 = gv_lds_u8<193>(b); break;
        }
    }
    static __host__ __device__ __forceinline__ void read(const u8* st, int lane, int mt, int r, int t, Raw& raw) {
        raw.c = *reinterpret_cast<const uint4*>(gv_vec(st, 2 * mt + r, lane));
        // bytes 2 (t & 1) + {0, 1} of the lane's scale word of row 2 mt + r, one byte load each (immediate
        // offsets per row; the bytes need no shift or mask on the integer pipe)
        static_assert(MT == 2, "one case per row");
        const u8* b = st + 2 * MT * 512 + lane * 4 + 2 * (t & 1);
        switch (2 * mt + r) {
            case 0: raw.b0 = gv_lds_u8<0>(b), raw.b1 = gv_lds_u8<1>(b); break;
            case 1: raw.b0 = gv_lds_u8<128>(b), raw.b1 = gv_lds_u8<129>(b); break;
            case 2: raw.b0 = gv_lds_u8<256>(b), raw.b1 = gv_lds_u8<257>(b); break;
            default: raw.b0 = gv_lds_u8<384>(b), raw.b1 = gv_lds_u8<385>(b); break;
        }
    }
    // A block scale as bf16x2 of scale * 2^119: the e4m3 bits without the sign placed in a bf16 (value * 2^-120,
    // e4m3 subnormals on bf16 subnormals, as FragFP8), then * 2^120 and * 2^119 (bf16 muls, exact: results
    // <= 448 * 2^119 < 2^128). The scales are nonnegative on the device (nvfp4_layout.py folds a negative scale's
    // sign into its block's codes), so prep places a scale byte b as b * 0x00100010 (bits 4-10 and 20-26, one IMAD;
    // bit 7 is zero) instead of masking it.
    static __host__ __device__ __forceinline__ u32 scale_up(u32 placed) {
        return bf16x2_mul(bf16x2_mul(placed, 0x7B807B80u), 0x7B007B00u);  // * 2^120 * 2^119
    }
    // one scale byte (wdq.cuh's NVFP4 dequantization for the prefill GEMM)
    static __host__ __device__ __forceinline__ u32 scale2(u32 code) {
        return scale_up(((code * 0x00010001u) << 4) & 0x07F007F0u);
    }
    static __host__ __device__ __forceinline__ void prep(const Raw& r, Prep& p) {
        p.c = r.c;
        p.s0 = scale_up(r.b0 * 0x00100010u);
        p.s1 = scale_up(r.b1 * 0x00100010u);
    }
    static __host__ __device__ __forceinline__ u32 pair(const Prep& p, int w, int i) {
        return bf16x2_mul(gv_nv4_pair(word4(p.c, w), i), w < 2 ? p.s0 : p.s1);  // e2m1 * 2^-126 * s * 2^119
    }
    static __host__ __device__ __forceinline__ float gscale(const Prep&, int) { return 1.f; }
    static __host__ __device__ __forceinline__ float row_scale(const u8*, const u8* p2, long long) {
        return 128.f * *reinterpret_cast<const float*>(p2);
    }
};

// NVFP4 with a global scale per row (p2 = f32 [N]; fused projections, ninfer/cuda/fuse.py)
struct FragNVFP4RowG : FragNVFP4 {
    static __host__ __device__ __forceinline__ float row_scale(const u8*, const u8* p2, long long n) {
        return 128.f * reinterpret_cast<const float*>(p2)[n];
    }
};

// Group-int, 64-wide groups: thread t owns k [16t, 16t + 16) of each of the tile's two groups, so steps 0-3 are
// group 0 and steps 4-7 group 1 (GROUP = 4).
template <int BITS>
struct FragQG64 {
    static constexpr int MT = 2, GROUP = 4, H = BITS == 4 ? 0 : (BITS == 5 ? 8 : 16);
    static constexpr int XLANE = GV_QG64_XLANE;  // a mask: 1 codes, 2 scale words, 4 high words across the quad
    static constexpr bool SWZ = GV_QG64_SWZ != 0;
    static_assert(2 * MT == 4, "XLANE 2 and 4: one row set per quad lane");
    // the slot of quad lane j's code piece (XLANE & 1) and of row set rr's high words (XLANE & 4) in the quad of
    // `lane`, and the scale word of row set r that lane L copied in stage st (GV_QG64_SWZ above). Where SWZ is off
    // the callers name the slot they know (`lane` itself, q + 2) instead: NVVM does not fold (lane & ~3) + (lane & 3)
    // back to lane, and the unswizzled default's PTX grew by 9-79 instructions per instance through these functions.
    static __host__ __device__ __forceinline__ int cslot(int lane, int j) {
        return (lane & ~3) + (SWZ ? j ^ ((lane >> 2) & 2) : j);
    }
    static __host__ __device__ __forceinline__ int hslot(int lane, int rr) {
        return (lane & ~3) + (SWZ ? rr ^ ((lane >> 3) & 3) : rr);
    }
    template <typename P> static __host__ __device__ __forceinline__ P* sword(P* st, int L, int r) {
        return SWZ ? st + SV * 512 + (32 * r + L) * 4 : gv_vec(st, SV, L) + 4 * r;
    }
    GV_ROWS_SRC(FragQG64)
    static __host__ __device__ __forceinline__ int kofs(int t, int w) { return 64 * (w >> 1) + 16 * t + 8 * (w & 1); }
    static __host__ __device__ __forceinline__ void chunk(int cc, int& t, int& w) {
        t = (cc & 7) >> 1, w = 2 * (cc >> 3) + (cc & 1);
    }
    struct Raw {
        uint2 base[2];  // per group: 16 codes' low nibbles (2 words)
        u32 high[2];    // per group: Q5 16 high bits, Q6 32 (2 per code)
        u32 sc;         // f16 scales of groups 0 and 1
    };
    struct Prep {
        Raw r;
        float g0, g1;
    };
    // per row: one vector of base codes (groups 0, 1); then HV vectors of high words (Q5 / Q6: 2, 8 bytes per row;
    // Q4 none, GV_Q4_HV above) and one of the rows' scale words (vector SV)
    static constexpr int HV = BITS == 4 ? GV_Q4_HV : 2, SV = 2 * MT + HV, VECS = SV + 1;
    static __host__ __device__ __forceinline__ void copy(u8* st, int lane, const u8* p0, const u8* p1, const u8* p2,
                                                         int K, const long long (&n)[MT][2], int k0, int t) {
#pragma unroll
        for (int r = 0; r < 2 * MT; ++r) {
            const long long grp = n[r >> 1][r & 1] * (kpad128(K) / 64) + k0 / 64;  // k0 % 128 == 0: grp even
            // XLANE & 1: the row's 64 code bytes (groups grp, grp + 1) as 16 bytes per quad lane, 16-byte aligned (grp
            // even, the plane 16-aligned)
            if (XLANE & 1) cp_async<16>(gv_vec(st, r, SWZ ? cslot(lane, t) : lane), p0 + grp * 32 + 16 * t, true);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (!(XLANE & 1)) cp_async<8>(gv_vec(st, r, lane) + 8 * h, p0 + (grp + h) * 32 + 8 * t, true);
                u8* hd = gv_vec(st, 2 * MT + (r >> 1), lane) + 8 * (r & 1) + 4 * h;
                if (BITS == 5 && !(XLANE & 4)) cp_async<4>(hd, p1 + (grp + h) * 8 + 4 * (t >> 1), true);  // its u16
                if (BITS == 6 && !(XLANE & 4)) cp_async<4>(hd, p1 + (grp + h) * 16 + 4 * t, true);
            }
            if ((XLANE & 4) && r == t) {  // row set r's high words (groups grp, grp + 1; 16-aligned: grp even)
                const int hs = SWZ ? hslot(lane, r) : lane;
                if (BITS == 5) cp_async<16>(gv_vec(st, 2 * MT, hs), p1 + grp * 8, true);
                if (BITS == 6) cp_async<16>(gv_vec(st, 2 * MT, hs), p1 + grp * 16, true);
                if (BITS == 6) cp_async<16>(gv_vec(st, 2 * MT + 1, hs), p1 + (grp + 1) * 16, true);
            }
            // the row's scale words of groups grp, grp + 1 (the tiled plane, above; k0 % 128 == 0: an aligned pair)
            const long long sw = qg_scale_word(n[r >> 1][r & 1], kpad128(K) / 64, k0 / 64);
            if (!(XLANE & 2) || r == t) cp_async<4>(sword(st, lane, r), p2 + 2 * sw, true);
        }
    }
    static __host__ __device__ __forceinline__ void read(const u8* st, int lane, int mt, int r, int t, Raw& raw) {
        const int rr = 2 * mt + r;
        if (XLANE & 1) {  // group h's bytes 8 t .. 8 t + 8: quad lane 2 h + t / 2 copied them, at byte 8 (t % 2)
            const int q = cslot(lane, t >> 1), q2 = SWZ ? cslot(lane, 2 + (t >> 1)) : q + 2;
            raw.base[0] = *reinterpret_cast<const uint2*>(gv_vec(st, rr, q) + 8 * (t & 1));
            raw.base[1] = *reinterpret_cast<const uint2*>(gv_vec(st, rr, q2) + 8 * (t & 1));
        } else {
            raw.base[0] = *reinterpret_cast<const uint2*>(gv_vec(st, rr, lane));
            raw.base[1] = *reinterpret_cast<const uint2*>(gv_vec(st, rr, lane) + 8);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (BITS == 4) {  // no high words
                raw.high[h] = 0u;
                continue;
            }
            // XLANE 4: quad lane rr copied row set rr's words (Q5: both groups' 8 bytes in one piece; Q6: 16 bytes
            // per group, in vectors 2 MT and 2 MT + 1)
            const u8* hw = (XLANE & 4) ? gv_vec(st, 2 * MT + (BITS == 6 ? h : 0), hslot(lane, rr)) +
                                             (BITS == 5 ? 8 * h + 4 * (t >> 1) : 4 * t)
                                       : gv_vec(st, 2 * MT + (rr >> 1), lane) + 8 * (rr & 1) + 4 * h;
            const u32 w = *reinterpret_cast<const u32*>(hw);
            raw.high[h] = BITS == 5 ? (w >> (16 * (t & 1))) & 0xffffu : w;
        }
        // XLANE 2: quad lane rr copied row set rr's scale word
        raw.sc = *reinterpret_cast<const u32*>(sword(st, (XLANE & 2) ? (lane & ~3) + rr : lane, rr));
    }
    static __host__ __device__ __forceinline__ void prep(const Raw& r, Prep& p) {
        p.r = r;
        p.g0 = hd_f16_to_f((u16)(r.sc & 0xffffu));
        p.g1 = hd_f16_to_f((u16)(r.sc >> 16));
    }
    static __host__ __device__ __forceinline__ u32 pair(const Prep& p, int w, int i) {
        const int h = w >> 1, half = w & 1;
        const u32 q = half ? p.r.base[h].y : p.r.base[h].x;
        u32 u = (q >> (4 * i)) & 0x000f000fu;
        if (BITS == 5) {
            const u32 hb = (p.r.high[h] >> (8 * half)) & 0xffu;  // bit j: code j of the word
            u |= (((hb >> i) & 1u) << 4) | (((hb >> (i + 4)) & 1u) << 20);
        }
        if (BITS == 6) {
            const u32 hb = (p.r.high[h] >> (16 * half)) & 0xffffu;  // bits 2j, 2j+1: code j of the word
            u |= (((hb >> (2 * i)) & 3u) << 4) | (((hb >> (2 * i + 8)) & 3u) << 20);
        }
        constexpr u32 OFF = 1u << (BITS - 1), MAGIC = 0x4300u | OFF;  // bf16(128 + OFF)
        const u32 v = (u ^ (OFF | (OFF << 16))) | 0x43004300u;        // bf16(128 + code + OFF)
        return bf16x2_fma(v, 0x3f803f80u, (MAGIC | 0x8000u) | ((MAGIC | 0x8000u) << 16));  // - (128 + OFF)
    }
    static __host__ __device__ __forceinline__ float gscale(const Prep& p, int h) { return h ? p.g1 : p.g0; }
    static __host__ __device__ __forceinline__ float row_scale(const u8*, const u8*, long long) { return 1.f; }
};

// W8, 32-wide groups: thread t owns k [8t, 8t + 8) of each of the tile's four groups (word w = group w, GROUP = 2).
struct FragW8G32 : KMapQuad {
    static constexpr int MT = 2, GROUP = 2;
    static constexpr bool XLANE = GV_W8G32_XLANE != 0;
    GV_ROWS_SRC(FragW8G32)
    struct Raw {
        uint2 v[4];
        u32 sc[2];  // f16 scales of the four groups
    };
    struct Prep {
        Raw r;
        float g[4];
    };
    static constexpr int VECS = 4 * MT + MT;  // per row: words 0-1, 2-3; then 8 scale bytes per row
    static __host__ __device__ __forceinline__ void copy(u8* st, int lane, const u8* p0, const u8*, const u8* p2,
                                                         int K, const long long (&n)[MT][2], int k0, int t) {
#pragma unroll
        for (int r = 0; r < 2 * MT; ++r) {
            const long long grp = n[r >> 1][r & 1] * (kpad128(K) / 32) + k0 / 32;  // 4 groups, 8-byte aligned scales
            if (XLANE) {  // group t's 32 code bytes (16-byte aligned: the plane is, and groups are 32 bytes)
                cp_async<16>(gv_vec(st, 2 * r, lane), p0 + (grp + t) * 32, true);
                cp_async<16>(gv_vec(st, 2 * r + 1, lane), p0 + (grp + t) * 32 + 16, true);
            } else {
#pragma unroll
                for (int w = 0; w < 4; ++w)
                    cp_async<8>(gv_vec(st, 2 * r + (w >> 1), lane) + 8 * (w & 1), p0 + (grp + w) * 32 + 8 * t, true);
            }
            cp_async<8>(gv_vec(st, 4 * MT + (r >> 1), lane) + 8 * (r & 1), p2 + grp * 2, true);
        }
    }
    static __host__ __device__ __forceinline__ void read(const u8* st, int lane, int mt, int r, int t, Raw& raw) {
        const int rr = 2 * mt + r;
#pragma unroll
        for (int w = 0; w < 4; ++w) {  // XLANE: group w's bytes 8 t .. 8 t + 8 are quad lane w's, at 8 t of its 32
            const u8* q = XLANE ? gv_vec(st, 2 * rr + (t >> 1), (lane & ~3) + w) + 8 * (t & 1)
                                : gv_vec(st, 2 * rr + (w >> 1), lane) + 8 * (w & 1);
            raw.v[w] = *reinterpret_cast<const uint2*>(q);
        }
        const uint2 sc = *reinterpret_cast<const uint2*>(gv_vec(st, 4 * MT + (rr >> 1), lane) + 8 * (rr & 1));
        raw.sc[0] = sc.x, raw.sc[1] = sc.y;
    }
    static __host__ __device__ __forceinline__ void prep(const Raw& r, Prep& p) {
        p.r = r;
#pragma unroll
        for (int w = 0; w < 4; ++w) p.g[w] = hd_f16_to_f((u16)((r.sc[w >> 1] >> (16 * (w & 1))) & 0xffffu));
        if (GV_W8G32_FCVT) {  // each byte c + 128 (two's complement c): pair's PRMT then places it under 2^23's bits
#pragma unroll
            for (int w = 0; w < 4; ++w) p.r.v[w].x ^= 0x80808080u, p.r.v[w].y ^= 0x80808080u;
        }
    }
    // byte i of a prep'd word (c + 128) as the float c: bits 0x4B0000 << 8 | (c + 128) = 2^23 + c + 128, exact
    static __host__ __device__ __forceinline__ float code_f(u32 q, int i) {
        return f32_from_bits(prmt(q, 0x4B000000u, 0x7540u | (u32)i)) - 8388736.f;  // 2^23 + 128
    }
    static __host__ __device__ __forceinline__ u32 pair(const Prep& p, int w, int i) {
        if (GV_W8G32_FCVT) return pack_bf16x2(code_f(p.r.v[w].x, i), code_f(p.r.v[w].y, i));  // exact
        const int a = (int)(signed char)((p.r.v[w].x >> (8 * i)) & 0xffu);
        const int b = (int)(signed char)((p.r.v[w].y >> (8 * i)) & 0xffu);
        return pack_bf16x2((float)a, (float)b);  // |code| <= 128: exact
    }
    static __host__ __device__ __forceinline__ float gscale(const Prep& p, int h) {
        return h == 0 ? p.g[0] : h == 1 ? p.g[1] : h == 2 ? p.g[2] : p.g[3];
    }
    static __host__ __device__ __forceinline__ float row_scale(const u8*, const u8*, long long) { return 1.f; }
};

// ---- activations -----------------------------------------------------------------------------------------------
// The 8 activations x[0..8) of word w of thread t (one activation row) as the B fragments of steps 2w and 2w+1:
// f[0..1] = step 2w (b0, b1), f[2..3] = step 2w+1; float input is split into hi = bf16(x) and lo = bf16(x - hi)
// (relative error <= 2^-18), bf16 input is exact in hi (lo = 0).
__host__ __device__ __forceinline__ void stage_pairs(const float x[8], u32 hi[4], u32 lo[4]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // q = step-in-word * 2 + b: pairs (0,4) (1,5) (2,6) (3,7)
        const float a = x[q], b = x[q + 4];
        const u32 h = pack_bf16x2(a, b);
        hi[q] = h;
        lo[q] = pack_bf16x2(a - bf16_val(h & 0xffffu), b - bf16_val(h >> 16));
    }
}
