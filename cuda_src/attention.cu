// Gated full attention over a paged KV cache (docs/model-math.md §3).
//
// Paged cache, per layer: k_cache, v_cache [num_pages, page_size, HKV, D] (type C); a token at position p of
// sequence b lives in page page_table[b * ldpt + p / page_size], offset p % page_size.
// C = e4m3 (fp8 cache): codes plus k_scale, v_scale [num_pages, page_size, HKV] float32, one per (token, KV head);
// the stored value is e4m3(code) * scale, exactly the reference runner's PagedKVStore._encode/_decode:
// scale = amax|row| / 448 (IEEE fp32 divide), code = e4m3(x / (scale > 0 ? scale : 1)). For float/bf16 caches the
// scale pointers are never read (the wrapper passes any array).
//
// qk_norm_rope_kv_write: q = RMSNormOff(q_raw, q_norm), k = RMSNormOff(k_raw, k_norm), partial NeoX rotation of
//   dims [0, rot) with interleaved MRoPE axes, q to q_out, k and the raw v to the cache slots slot[t].
// attention: softmax(q k^T * scale) v, causal by position, GQA (q head h reads kv head h / G), flash decoding on
//   tensor cores (attn_frag.cuh): split over the KV length in fixed chunks of `chunk` positions, partials merged in
//   a fixed order inside the same launch, so a row's result depends only on its own position (never on the batch).
#include "common.cuh"
#include "e4m3.cuh"
#include "attn_frag.cuh"

template <typename C> constexpr bool kScaled = false;  // the cache carries per-row scales
template <> constexpr bool kScaled<e4m3> = true;

// max of |x| that propagates NaN (NumPy's max does; fmaxf would drop it), compared as bit patterns: for
// non-negative floats the integer order is the float order, NaN magnitudes sort above inf, and subnormals are
// kept (fp32 compares would flush them under CuPy's -ftz=true). Works on |x| bit patterns (u32).
__device__ __forceinline__ u32 absmax_bits(u32 m, float x) {
    const u32 a = __float_as_uint(x) & 0x7fffffffu;
    return a > m ? a : m;
}

__device__ __forceinline__ u32 warp_absmax_bits(u32 m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u32 n = __shfl_xor_sync(0xffffffffu, m, o);
        m = n > m ? n : m;
    }
    return m;
}

// Writes the row x[0..D) (lane l holds dims l + 32r) of (token slot, head) `srow`: widened values to a float/bf16
// cache, or scale + codes to an fp8 cache (lane 0 stores the scale).
template <typename C, int D>
__device__ __forceinline__ void store_row(const float (&x)[(D + 31) / 32], C* __restrict__ cache,
                                          float* __restrict__ scales, long long srow, int lane) {
    constexpr int R = (D + 31) / 32;
    float div = 1.f;
    if constexpr (kScaled<C>) {
        u32 m = 0u;
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (lane + 32 * r < D) m = absmax_bits(m, x[r]);
        const float sc = div_keep_denorm(__uint_as_float(warp_absmax_bits(m)), 448.f);
        if (lane == 0) scales[srow] = sc;
        const u32 sb = __float_as_uint(sc);
        div = (sb != 0u && sb <= 0x7f800000u) ? sc : 1.f;  // sc > 0, false for NaN, as NumPy's where(scale > 0)
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = lane + 32 * r;
        if (i >= D) continue;
        float y = x[r];
        if constexpr (kScaled<C>) y = div_keep_denorm(y, div);  // IEEE divide, subnormals kept
        cache[srow * D + i] = from_f<C>(y);
    }
}

// One warp per (token, head) row; heads [0, HQ) are query heads, [HQ, HQ + HKV) key heads (value copied).
// pos: [3, T] int32 (T/H/W axes; text uses one position for all three). Shared row buffer: 8 warps x D.
template <typename T, typename C, int D>
__global__ void __launch_bounds__(256)
    qk_norm_rope_kv_write(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const float* __restrict__ qw, const float* __restrict__ kw, const int* __restrict__ pos,
                          const long long* __restrict__ slot, T* __restrict__ q_out, C* __restrict__ k_cache,
                          C* __restrict__ v_cache, float* __restrict__ k_scale, float* __restrict__ v_scale,
                          int T_, int HQ, int HKV, int rot, int sec1, int sec2, int interleaved, float theta,
                          float eps, long long ldq, long long ldqh, long long ldk, long long ldv) {
    pdl_trigger();
    pdl_wait();  // launched with PDL inside decode graphs (ninfer/cuda/attention.py): nothing read before
    __shared__ float buf[8][D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long rowid = (long long)blockIdx.x * 8 + warp;
    if (rowid >= (long long)T_ * (HQ + HKV)) return;
    const int t = (int)(rowid / (HQ + HKV)), h = (int)(rowid % (HQ + HKV));
    const bool isq = h < HQ;
    const int hk = h - HQ;
    const T* src = isq ? q + t * ldq + h * ldqh : k + t * ldk + (long long)hk * D;
    const float* w = isq ? qw : kw;
    float ss = 0.f;
    for (int i = lane; i < D; i += 32) {
        const float x = to_f(src[i]);
        buf[warp][i] = x;
        ss = fmaf(x, x, ss);
    }
    const float inv = 1.f / sqrtf(warp_sum(ss) / (float)D + eps);
    for (int i = lane; i < D; i += 32) buf[warp][i] = buf[warp][i] * inv * (1.f + w[i]);
    __syncwarp();
    const int half = rot / 2;
    float outv[(D + 31) / 32];
#pragma unroll
    for (int r = 0; r < (D + 31) / 32; ++r) {
        const int i = lane + 32 * r;
        if (i >= D) continue;
        float x = buf[warp][i];
        if (i < rot) {
            const int f = i < half ? i : i - half;  // frequency pair index
            int axis;
            if (interleaved) axis = (f % 3 == 1 && f < 3 * sec1) ? 1 : ((f % 3 == 2 && f < 3 * sec2) ? 2 : 0);
            else axis = f < half - sec1 - sec2 ? 0 : (f < half - sec2 ? 1 : 2);
            const float inv_freq = 1.f / powf(theta, (float)(2 * f) / (float)rot);
            const float ang = (float)pos[axis * T_ + t] * inv_freq;
            const float c = cosf(ang), s = sinf(ang);
            x = i < half ? x * c - buf[warp][i + half] * s : x * c + buf[warp][i - half] * s;
        }
        outv[r] = x;
    }
    if (isq) {
        T* dst = q_out + ((long long)t * HQ + h) * D;
#pragma unroll
        for (int r = 0; r < (D + 31) / 32; ++r)
            if (lane + 32 * r < D) dst[lane + 32 * r] = from_f<T>(outv[r]);
    } else {
        const long long srow = slot[t] * HKV + hk;
        const T* vs = v + t * ldv + (long long)hk * D;
        float vv[(D + 31) / 32];
#pragma unroll
        for (int r = 0; r < (D + 31) / 32; ++r) vv[r] = lane + 32 * r < D ? to_f(vs[lane + 32 * r]) : 0.f;
        store_row<C, D>(outv, k_cache, k_scale, srow, lane);
        store_row<C, D>(vv, v_cache, v_scale, srow, lane);
    }
}

// ---- split-KV attention (flash decoding) -------------------------------------------------------------------------
// Row r's KV length is split in fixed chunks by absolute position: split s covers [s*chunk, +chunk) up to the row's
// own position `last` (causal), so the row has ns = last/chunk + 1 splits. Block (kv head hk, row r, z) computes
// splits z, z + gridDim.z, ... < ns for the G = HQ/HKV query heads of hk (one K/V read for G heads); gridDim.z
// only spreads the work (the wrapper sizes it to fill the GPU, whatever max_len): a split's arithmetic does not
// depend on which block computes it. A chunk is a whole number of 16-position tiles; warp w of the NW warps takes
// tiles w, w + NW, ... of the split. Per tile: S = Q K^T for 16 positions (mma, attn_frag.cuh), one online-softmax
// update (fp32, base 2: qk_scale = scale * log2 e), O^T += V^T P^T (mma). The K and V rows of the warp's next tile
// (in this or its next split) are in flight while the current tile computes: 16 B per lane, 8 KB of K and 8 KB of V
// per tile and warp for bf16 at D = 256.
// Pipelines (template P, docs/cuda.md "Decode attention"): P = 0 issues the next tile's K after S and its V after
// PV, each behind a page-table read (a dependent round trip the warp waits for). P = 1 reads the page table two
// tiles ahead (lane l holds the page of position base + l % 16, shuffled to the lanes that need it), issues the
// next tile's K chunk u right after the current tile's chunk u went into its mma (and V unit j after PV unit j), and
// sums S in two independent mma chains (even and odd 16-dim steps, added at the end); P = 2 is P = 1 with the
// one-level merge below. None of this changes which positions a warp takes; P and NW are fixed per (shapes,
// variant), never per launch.
// Merges, every one by att_merge in a fixed order: the block's warps (w order, shared memory); then the row's splits
// in two levels: groups of gs = att_group(ns) consecutive splits, merged by the block that completes the group (an
// arrival counter per group), then the groups, merged by the block that completes the last group. ns == 1 writes
// the output directly, ng == 1 after the first level. P = 2 merges in one level (gs = ns: the block that completes
// the row merges all its splits, batches of NW/2 partials double-buffered in shared memory). Every decision depends only on the row's own position and
// chunk (never on the batch, max_len, gridDim or timing), so a row's output is bitwise independent of the other
// rows of the launch. The counters are zero between launches (each last arrival resets its own).
// Workspaces (fp32): ws [R, HKV, nsplit] partials (G x D o, G x (m, l)), wg [R, HKV, ngmax] group partials; cnt
// [R * HKV * ngmax] group counters then [R * HKV] row counters. q: [R, HQ, D]; o: [R, HQ, D].
__device__ __forceinline__ int att_group(int ns) {  // smallest power of two gs with gs^2 >= ns (host: group_size)
    int gs = 1;
    while (gs * gs < ns) gs <<= 1;
    return gs;
}

// All threads: true in the block that brought counter c to n (it resets c). As a grid barrier does: the block's
// stores are ordered before thread 0's fence by the first barrier (fences are cumulative), and the last block reads
// after its fence and the second barrier. The first barrier also ends every thread's reads of shared memory.
__device__ __forceinline__ bool att_arrive(int* c, int n, int* flag) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const int last = atomicAdd(c, 1) == n - 1;
        if (last) *c = 0, __threadfence();
        *flag = last;
    }
    __syncthreads();
    return *flag != 0;
}

template <typename T, typename C, int D, int NW, int P>
__global__ void __launch_bounds__(32 * NW, NW <= 4 ? 2 : 1)
    attention(const T* __restrict__ q, const C* __restrict__ k_cache, const C* __restrict__ v_cache,
              const float* __restrict__ k_scale, const float* __restrict__ v_scale,
              const int* __restrict__ page_table, const int* __restrict__ row_seq, const int* __restrict__ row_pos,
              T* __restrict__ o, float* ws_o, float* ws_ml, float* wg_o, float* wg_ml, int* cnt, int HQ, int HKV,
              int page_size, int page_shift, long long ldpt, int chunk, int nsplit, int ngmax, float qk_scale) {
    pdl_trigger();
    pdl_wait();  // as qk_norm_rope_kv_write
    constexpr int NT = 32 * NW, NP = D / 16, NU = D / 32, U = D >= 64 ? 8 : 4, NJ = D / (8 * U);
    constexpr bool QSPLIT = sizeof(T) == 4, VSPLIT = sizeof(C) == 4, PRE = sizeof(C) <= 2;  // PRE: prefetch
    extern __shared__ uint4 att_smem[];  // attention.py smem_bytes mirrors this layout
    uint4* sq = att_smem;                                      // [NP][32] Q fragments (hi x, y; lo z, w)
    float* so = reinterpret_cast<float*>(att_smem + NP * 32);  // [NW][8 heads][D] warp o (unnormalised)
    float* sml = so + NW * 8 * D;                              // [NW][8][2] warp (m, l)
    int* sflag = reinterpret_cast<int*>(sml + NW * 16);
    const int hk = blockIdx.x, r = blockIdx.y;
    const int G = HQ / HKV, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int last = row_pos[r], ns = last < 0 ? 1 : last / chunk + 1;
    if ((int)blockIdx.z >= ns) return;  // no split of this row for this block (the wrapper keeps these few)
    const int* pt = page_table + (long long)row_seq[r] * ldpt;
    const long long orow = (long long)r * HQ + (long long)hk * G, rh = (long long)r * HKV + hk;
    auto ntile = [&](int sp) {  // tiles of split sp up to the row's position (>= 1 for sp < ns, 0 when last < 0)
        const int s0 = sp * chunk, pend = min(last + 1, s0 + chunk);
        return pend > s0 ? (pend - s0 + ATT_TILE - 1) / ATT_TILE : 0;
    };
    auto next_base = [&](int sp, int k) {  // the warp's tile after tile k of split sp: its first position, or -1
        if (k + NW < ntile(sp)) return sp * chunk + ATT_TILE * (k + NW);
        const int sn = sp + (int)gridDim.z;
        return sn < ns && warp < ntile(sn) ? sn * chunk + ATT_TILE * warp : -1;
    };
    auto next_base2 = [&](int sp, int k) {  // the tile after next_base(sp, k), or -1
        if (k + NW < ntile(sp)) return next_base(sp, k + NW);
        const int sn = sp + (int)gridDim.z;
        return sn < ns && warp < ntile(sn) ? next_base(sn, warp) : -1;
    };
    auto pidx = [&](int p) { return page_shift >= 0 ? p >> page_shift : p / page_size; };
    auto poff = [&](int p) { return page_shift >= 0 ? (p & (page_size - 1)) : p % page_size; };
    auto kv_row = [&](int p) {  // (slot * HKV + hk) of position min(p, last): masked positions read valid rows
        p = min(p, last);
        return ((long long)pt[pidx(p)] * page_size + poff(p)) * HKV + hk;
    };
    // P = 1: lane l's page of position min(base + l % 16, last) (base <= last: a tile with positions)
    auto tile_page = [&](int base) { return pt[pidx(min(base + (lane & 15), last))]; };
    auto tile_row = [&](int pgl, int base, int p) {  // row of position p of the tile at base; all lanes (shuffle)
        p = min(p, last);
        const int pg = __shfl_sync(0xffffffffu, pgl, p - base);
        return ((long long)pg * page_size + poff(p)) * HKV + hk;
    };
    // ---- tile registers: K rows base+g, base+8+g (chunks 4u+t); V rows base+2t+{0,1,8,9} (units g+8j) ----
    AttRaw<C, 8> kr[PRE ? 2 : 1][PRE ? NU : 1];
    AttRaw<C, U> vr[PRE ? 4 : 1][PRE ? NJ : 1];
    const C* kp[2];
    const C* vp[4];
    float ksc[4], vsc[4];
    auto load_k = [&](int base) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            kp[j] = k_cache + kv_row(base + g + 8 * j) * D + 8 * t;
            if constexpr (PRE)
#pragma unroll
                for (int u = 0; u < NU; ++u) att_load(kp[j] + 32 * u, kr[j][u]);
        }
    };
    auto load_v = [&](int base) {
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const long long row = kv_row(base + 2 * t + (a & 1) + 8 * (a >> 1));
            vp[a] = v_cache + row * D + U * g;
            if constexpr (kScaled<C>) ksc[a] = k_scale[row], vsc[a] = v_scale[row];
            if constexpr (PRE)
#pragma unroll
                for (int j = 0; j < NJ; ++j) att_load(vp[a] + 8 * U * j, vr[a][j]);
        }
    };
    // P = 1 state: the next tile's K/V pointers (nkp, nvp) and scales (nks, nvs), the page after that (pgn)
    const C* nkp[2];
    const C* nvp[4];
    float nks[4], nvs[4];
    int pgn = 0;
    auto next_rows = [&](int base) {  // from pgn (the pages of the tile at base): nkp, nvp, nks, nvs
#pragma unroll
        for (int j = 0; j < 2; ++j) nkp[j] = k_cache + tile_row(pgn, base, base + g + 8 * j) * D + 8 * t;
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const long long row = tile_row(pgn, base, base + 2 * t + (a & 1) + 8 * (a >> 1));
            nvp[a] = v_cache + row * D + U * g;
            if constexpr (kScaled<C>) nks[a] = k_scale[row], nvs[a] = v_scale[row];
        }
    };
    const int z0 = blockIdx.z;
    if (warp < ntile(z0)) {  // the first tile's K and V before Q (and, P = 1, the second tile's pages)
        const int b0 = z0 * chunk + ATT_TILE * warp;
        if constexpr (P == 0) {
            load_k(b0), load_v(b0);
        } else {
            pgn = tile_page(b0);
            next_rows(b0);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                kp[j] = nkp[j];
                if constexpr (PRE)
#pragma unroll
                    for (int u = 0; u < NU; ++u) att_load(kp[j] + 32 * u, kr[j][u]);
            }
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                vp[a] = nvp[a];
                if constexpr (kScaled<C>) ksc[a] = nks[a], vsc[a] = nvs[a];
                if constexpr (PRE)
#pragma unroll
                    for (int j = 0; j < NJ; ++j) att_load(vp[a] + 8 * U * j, vr[a][j]);
            }
            const int b1 = next_base(z0, warp);
            if (b1 >= 0) pgn = tile_page(b1);
        }
    }
    // ---- Q fragments of the G heads (rows >= G zero), in the K chunk order ----
    for (int e = tid; e < NP * 32; e += NT) {
        const int s = e >> 5, gg = (e >> 2) & 7, dd = 8 * (4 * (s >> 1) + (e & 3)) + 4 * (s & 1);
        uint4 f;
        f.x = f.y = f.z = f.w = 0u;
        if (gg < G) {
            const T* qp = q + (orow + gg) * D + dd;
            const float x0 = to_f(qp[0]), x1 = to_f(qp[1]), x2 = to_f(qp[2]), x3 = to_f(qp[3]);
            att_split(x0, x1, f.x, f.z);  // bf16 q: exact in hi, lo = 0 (never used)
            att_split(x2, x3, f.y, f.w);
        }
        sq[e] = f;
    }
    __syncthreads();
    for (int split = z0; split < ns; split += gridDim.z) {
        float acc[NP][4], m = NEG_INF, l = 0.f;  // O^T: m-tile i = dims of unit i/(U/2), heads 2t, 2t+1
#pragma unroll
        for (int i = 0; i < NP; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
        for (int k = warp; k < ntile(split); k += NW) {
            const int base = split * chunk + ATT_TILE * k, nxt = next_base(split, k);
            if constexpr (P >= 1)
                if (nxt >= 0) {  // the next tile's rows from its pages (read a tile ago); the pages after it
                    next_rows(nxt);
                    const int b2 = next_base2(split, k);
                    if (b2 >= 0) pgn = tile_page(b2);
                }
            float sa[P >= 1 ? 2 : 1][2][4];  // P = 1: two chains (16-dim steps of even / odd h)
#pragma unroll
            for (int c = 0; c < (P >= 1 ? 2 : 1); ++c)
#pragma unroll
                for (int j = 0; j < 2; ++j) sa[c][j][0] = sa[c][j][1] = sa[c][j][2] = sa[c][j][3] = 0.f;
#pragma unroll
            for (int u = 0; u < NU; ++u) {
                AttPairs<C, 8> kx[2];
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    AttRaw<C, 8> raw;
                    if constexpr (PRE) raw = kr[j][u];
                    else att_load(kp[j] + 32 * u, raw);
                    att_pairs(raw, kx[j]);
                }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint4 qf = sq[(2 * u + h) * 32 + lane];
                    float (&s0)[4] = sa[P >= 1 ? h : 0][0];
                    float (&s1)[4] = sa[P >= 1 ? h : 0][1];
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        float (&s)[4] = j ? s1 : s0;
                        att_mma(s, qf.x, 0u, qf.y, 0u, kx[j].hi[2 * h], kx[j].hi[2 * h + 1]);
                        if constexpr (QSPLIT) att_mma(s, qf.z, 0u, qf.w, 0u, kx[j].hi[2 * h], kx[j].hi[2 * h + 1]);
                        if constexpr (VSPLIT) att_mma(s, qf.x, 0u, qf.y, 0u, kx[j].lo[2 * h], kx[j].lo[2 * h + 1]);
                    }
                }
                if constexpr (P >= 1 && PRE) {
                    if (nxt >= 0) {  // the next tile's chunk u into the registers chunk u just left
#pragma unroll
                        for (int j = 0; j < 2; ++j) att_load(nkp[j] + 32 * u, kr[j][u]);
                    }
                }
            }
            if constexpr (P == 0)
                if (PRE && nxt >= 0) load_k(nxt);  // next tile's K, in flight during softmax and PV
            // online softmax, one update per tile: lane (g, t) holds head g at positions base + 2t + {0, 1, 8, 9}
            float sc[4], mx = NEG_INF;
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                const int j = a >> 1, e = a & 1;
                sc[a] = P >= 1 ? sa[0][j][e] + sa[P >= 1 ? 1 : 0][j][e] : sa[0][j][e];
            }
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                if constexpr (kScaled<C>) sc[a] *= ksc[a];  // q . (code * ks) = (q . code) * ks
                sc[a] = base + 2 * t + (a & 1) + 8 * (a >> 1) > last ? NEG_INF : sc[a] * qk_scale;
                mx = fmaxf(mx, sc[a]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m, mx), mb = mn == NEG_INF ? 0.f : mn, corr = exp2f(m - mb);
            float p[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) p[a] = exp2f(sc[a] - mb);
            l = fmaf(l, corr, (p[0] + p[1]) + (p[2] + p[3]));
            m = mn;
            if constexpr (kScaled<C>)
#pragma unroll
                for (int a = 0; a < 4; ++a) p[a] *= vsc[a];  // P (code * vs) = (P * vs) code
            u32 bh0, bl0, bh1, bl1;
            att_split(p[0], p[1], bh0, bl0);
            att_split(p[2], p[3], bh1, bl1);
            const float ca = __shfl_sync(0xffffffffu, corr, 8 * t), cb = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                AttPairs<C, U> vx[4];
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    AttRaw<C, U> raw;
                    if constexpr (PRE) raw = vr[a][j];
                    else att_load(vp[a] + 8 * U * j, raw);
                    att_pairs(raw, vx[a]);
                }
                if constexpr (P >= 1 && PRE) {
                    if (nxt >= 0) {  // the next tile's unit j into the registers unit j just left
#pragma unroll
                        for (int a = 0; a < 4; ++a) att_load(nvp[a] + 8 * U * j, vr[a][j]);
                    }
                }
#pragma unroll
                for (int qq = 0; qq < U / 2; ++qq) {
                    float (&c)[4] = acc[j * (U / 2) + qq];
                    c[0] *= ca, c[1] *= cb, c[2] *= ca, c[3] *= cb;
                    const u32 a0 = att_prmt(vx[0].hi[qq], vx[1].hi[qq], 0x5410u), a1 = att_prmt(vx[0].hi[qq], vx[1].hi[qq], 0x7632u);
                    const u32 a2 = att_prmt(vx[2].hi[qq], vx[3].hi[qq], 0x5410u), a3 = att_prmt(vx[2].hi[qq], vx[3].hi[qq], 0x7632u);
                    att_mma(c, a0, a1, a2, a3, bh0, bh1);
                    att_mma(c, a0, a1, a2, a3, bl0, bl1);
                    if constexpr (VSPLIT)
                        att_mma(c, att_prmt(vx[0].lo[qq], vx[1].lo[qq], 0x5410u), att_prmt(vx[0].lo[qq], vx[1].lo[qq], 0x7632u),
                                att_prmt(vx[2].lo[qq], vx[3].lo[qq], 0x5410u), att_prmt(vx[2].lo[qq], vx[3].lo[qq], 0x7632u),
                                bh0, bh1);
                }
            }
            if constexpr (P == 0) {
                if (nxt >= 0) load_v(nxt);
                if (!PRE && nxt >= 0) load_k(nxt);
            } else if (nxt >= 0) {  // the next tile becomes the current one (its loads are in flight)
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    vp[a] = nvp[a];
                    if constexpr (kScaled<C>) ksc[a] = nks[a], vsc[a] = nvs[a];
                }
                kp[0] = nkp[0], kp[1] = nkp[1];
            }
        }
        // ---- the warp's partial to shared memory: l summed over the quad (all four lanes get the same sum) ----
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (t == 0) sml[(warp * 8 + g) * 2] = m, sml[(warp * 8 + g) * 2 + 1] = l;
        float* wo = so + warp * 8 * D;
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            const int d0 = U * (g + 8 * (i / (U / 2))) + 2 * (i % (U / 2));
            wo[2 * t * D + d0] = acc[i][0], wo[2 * t * D + d0 + 1] = acc[i][2];
            wo[(2 * t + 1) * D + d0] = acc[i][1], wo[(2 * t + 1) * D + d0 + 1] = acc[i][3];
        }
        __syncthreads();
        // ---- merges: this thread's items tid + k NT = (head h, dims d..d+3), set up here (not live across the
        // tile loop: registers) ----
        constexpr int NI = 2 * D > NT ? 2 * D / NT : 1;  // ceil(8 heads * D/4 items / NT)
        const int items = G * (D / 4), GD = G * D;
        int hh[NI], dd[NI];
        bool ok[NI];
#pragma unroll
        for (int k = 0; k < NI; ++k) {
            const int it = tid + k * NT;
            ok[k] = it < items, hh[k] = ok[k] ? it / (D / 4) : 0, dd[k] = 4 * (it % (D / 4));
        }
        const float* pml[NI];
        const float* po[NI];
        AttAcc res[NI];
        auto finish = [&]() {  // normalised output of the row's heads
#pragma unroll
            for (int k = 0; k < NI; ++k)
                if (ok[k]) att_store4<T>(o + (orow + hh[k]) * D + dd[k], res[k].a, res[k].l > 0.f ? 1.f / res[k].l : 0.f);
        };
        auto store_part = [&](float* wo_, float* wml) {  // unnormalised partial of this block's level
#pragma unroll
            for (int k = 0; k < NI; ++k) {
                if (!ok[k]) continue;
                float4 v;
                v.x = res[k].a[0], v.y = res[k].a[1], v.z = res[k].a[2], v.w = res[k].a[3];
                *reinterpret_cast<float4*>(wo_ + hh[k] * D + dd[k]) = v;
                if (dd[k] == 0) wml[2 * hh[k]] = res[k].m, wml[2 * hh[k] + 1] = res[k].l;
            }
        };
        // parts in shared memory: (m, l) at sml + 2h, parts mls apart; o at so + h D + d, parts os apart
        auto merge_smem = [&](int n, int mls, int os) {
#pragma unroll
            for (int k = 0; k < NI; ++k) pml[k] = sml + 2 * hh[k], po[k] = so + hh[k] * D + dd[k];
            att_merge<NI>(pml, mls, po, os, ok, n, res);
        };
        // n partials (consecutive in the workspace from go/gml) in batches of NW through shared memory
        auto merge_global = [&](const float* go, const float* gml, int n) {
            att_merge_reset(res);
            for (int b = 0; b < n; b += NW) {
                const int nb = min(NW, n - b);
                att_stage(so, go + (long long)b * GD, nb * GD, sml, gml + 2 * G * b, nb * 2 * G);
                merge_smem(nb, 2 * G, GD);
                __syncthreads();  // the batch is read before the next one (or the next split) overwrites it
            }
        };
        // P = 2: n partials in batches of NW/2 through the two halves of shared memory, the next batch's copies
        // in flight while this one merges (its (m, l): one value per thread, loaded a batch ahead)
        auto merge_stream = [&](const float* go, const float* gml, int n) {
            constexpr int HB = NW / 2;
            static_assert(NT >= HB * 16, "one (m, l) value per thread and batch");
            att_merge_reset(res);
            auto issue = [&](int b) {  // batch b's o into half (b / HB) % 2; returns this thread's (m, l) value
                float v = 0.f;
                if (b < n) {
                    const int nb = min(HB, n - b);
                    float* dst = so + ((b / HB) & 1) * HB * 8 * D;
                    for (int e = 4 * tid; e < nb * GD; e += 4 * NT) cp_async_f4(dst + e, go + (long long)b * GD + e);
                    if (tid < nb * 2 * G) v = __ldcg(gml + 2 * G * b + tid);
                }
                att_cp_commit();  // (an empty group past the end keeps the wait count uniform)
                return v;
            };
            float mv = issue(0);
            for (int b = 0; b < n; b += HB) {
                const float mn = issue(b + HB);
                const int nb = min(HB, n - b), hf = (b / HB) & 1;
                if (tid < nb * 2 * G) sml[hf * HB * 16 + tid] = mv;
                att_cp_wait1();
                __syncthreads();  // batch b in shared memory
#pragma unroll
                for (int k = 0; k < NI; ++k)
                    pml[k] = sml + hf * HB * 16 + 2 * hh[k], po[k] = so + hf * HB * 8 * D + hh[k] * D + dd[k];
                att_merge<NI>(pml, 2 * G, po, GD, ok, nb, res);
                __syncthreads();  // batch b read before batch b + 2 HB overwrites its half
                mv = mn;
            }
        };
        att_merge_reset(res);
        merge_smem(NW, 16, 8 * D);  // the block's warps
        if (ns == 1) {
            finish();
            break;
        }
        const long long part = rh * nsplit + split;
        store_part(ws_o + part * GD, ws_ml + part * 2 * G);
        const int gs = P == 2 ? ns : att_group(ns), grp = split / gs, ng = (ns + gs - 1) / gs;
        const int gn = min(gs, ns - grp * gs);
        if (!att_arrive(cnt + rh * ngmax + grp, gn, sflag)) continue;  // (its barrier ends the smem reads)
        const long long p0 = rh * nsplit + (long long)grp * gs, gpart = rh * ngmax + grp;
        if constexpr (P == 2) merge_stream(ws_o + p0 * GD, ws_ml + p0 * 2 * G, gn);  // all the row's splits
        else merge_global(ws_o + p0 * GD, ws_ml + p0 * 2 * G, gn);                  // the group's splits
        if (ng == 1) {
            finish();
            continue;
        }
        store_part(wg_o + gpart * GD, wg_ml + gpart * 2 * G);
        if (!att_arrive(cnt + (long long)gridDim.y * HKV * ngmax + rh, ng, sflag)) continue;
        merge_global(wg_o + rh * ngmax * GD, wg_ml + rh * ngmax * 2 * G, ng);  // the row's groups
        finish();
    }
}
