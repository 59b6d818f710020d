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
// attention: softmax(q k^T * scale) v, causal by position, GQA (q head h reads kv head h / G), flash-style
//   online fp32 softmax; split over the KV length in fixed chunks of `chunk` positions so a row's result
//   depends only on its own position (never on the batch); attn_combine merges the splits in index order.
#include "common.cuh"
#include "e4m3.cuh"

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

// One block per (query row, kv head, split) of ATT_W x G warps: warp (w, g) handles query head hk*G + g over the
// w-th of ATT_W equal sub-ranges of the split's `chunk` positions; the block then merges its sub-ranges in w order
// (the attn_combine formula), so a split's result depends only on its positions. Lane l holds dims l + 32e.
// Within a warp, ATT_P positions at a time: their K loads and dot-product reductions are independent and overlap,
// then the online-softmax updates run position by position in order (the same arithmetic as one at a time).
// q: [R, HQ, D]; row r belongs to sequence row_seq[r] and sits at position row_pos[r] (attends 0..pos).
// nsplit == 1: o [R, HQ, D] written directly; else partials ws_ml [R, HQ, nsplit, 2], ws_o [R, HQ, nsplit, D].
#define ATT_W 4  // sub-ranges per split (warps per query head); chunk % ATT_W == 0 (checked by the wrapper)
#define ATT_P 2  // positions in flight per warp

template <typename C, int E>
__device__ __forceinline__ void att_step(float s, const C* __restrict__ vrow, float vs, float& m, float& l,
                                         float acc[E], int lane) {
    const float mn = fmaxf(m, s), corr = expf(m - mn), pw = expf(s - mn);
    l = l * corr + pw;
    float pv = pw;  // weight of this position's v row: pw * vs for fp8 (codes times scale)
    if constexpr (kScaled<C>) pv *= vs;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = fmaf(pv, to_f(vrow[lane + 32 * e]), acc[e] * corr);
    m = mn;
}

template <typename T, typename C, int D>
__global__ void __launch_bounds__(1024)
    attention(const T* __restrict__ q, const C* __restrict__ k_cache, const C* __restrict__ v_cache,
              const float* __restrict__ k_scale, const float* __restrict__ v_scale,
              const int* __restrict__ page_table, const int* __restrict__ row_seq, const int* __restrict__ row_pos,
              T* __restrict__ o, float* __restrict__ ws_ml, float* __restrict__ ws_o, int HQ, int HKV,
              int page_size, long long ldpt, int chunk, int nsplit, float scale) {
    constexpr int E = D / 32;
    __shared__ float sh_ml[ATT_W * 8][2];
    __shared__ float sh_o[ATT_W * 8][D];
    const int r = blockIdx.x, hk = blockIdx.y, split = blockIdx.z;
    const int G = HQ / HKV, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = warp % G, w = warp / G, hq = hk * G + g;  // blockDim.x == 32 * G * ATT_W
    const int b = row_seq[r], last = row_pos[r], sub = chunk / ATT_W;
    const int s0 = split * chunk, s1 = min(last + 1, s0 + chunk);
    const int p0 = s0 + w * sub, p1 = min(s1, p0 + sub);
    float qv[E], acc[E];
    const T* qr = q + ((long long)r * HQ + hq) * D;
#pragma unroll
    for (int e = 0; e < E; ++e) qv[e] = to_f(qr[lane + 32 * e]) * scale, acc[e] = 0.f;
    float m = NEG_INF, l = 0.f;
    const int* pt = page_table + b * ldpt;
    int p = p0;
    for (; p + ATT_P <= p1; p += ATT_P) {
        long long srow[ATT_P];
        float s[ATT_P];
#pragma unroll
        for (int j = 0; j < ATT_P; ++j) {
            srow[j] = ((long long)pt[(p + j) / page_size] * page_size + (p + j) % page_size) * HKV + hk;
            s[j] = 0.f;
        }
#pragma unroll
        for (int e = 0; e < E; ++e)
#pragma unroll
            for (int j = 0; j < ATT_P; ++j) s[j] = fmaf(qv[e], to_f(k_cache[srow[j] * D + lane + 32 * e]), s[j]);
#pragma unroll
        for (int j = 0; j < ATT_P; ++j) {
            s[j] = warp_sum(s[j]);
            if constexpr (kScaled<C>) s[j] *= k_scale[srow[j]];  // q . (code * ks) = (q . code) * ks
        }
#pragma unroll
        for (int j = 0; j < ATT_P; ++j)
            att_step<C, E>(s[j], v_cache + srow[j] * D, kScaled<C> ? v_scale[srow[j]] : 1.f, m, l, acc, lane);
    }
    for (; p < p1; ++p) {
        const long long srow = ((long long)pt[p / page_size] * page_size + p % page_size) * HKV + hk;
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) s = fmaf(qv[e], to_f(k_cache[srow * D + lane + 32 * e]), s);
        s = warp_sum(s);
        if constexpr (kScaled<C>) s *= k_scale[srow];
        att_step<C, E>(s, v_cache + srow * D, kScaled<C> ? v_scale[srow] : 1.f, m, l, acc, lane);
    }
    if (lane == 0) sh_ml[warp][0] = m, sh_ml[warp][1] = l;
#pragma unroll
    for (int e = 0; e < E; ++e) sh_o[warp][lane + 32 * e] = acc[e];
    __syncthreads();
    if (w != 0) return;
    // merge the ATT_W sub-ranges of query head g in w order (empty sub-ranges have m = -inf)
    float mm = NEG_INF;
    for (int u = 0; u < ATT_W; ++u) mm = fmaxf(mm, sh_ml[u * G + g][0]);
    float lt = 0.f, at[E];
#pragma unroll
    for (int e = 0; e < E; ++e) at[e] = 0.f;
    for (int u = 0; u < ATT_W; ++u) {
        const float mu = sh_ml[u * G + g][0];
        if (mu == NEG_INF) continue;
        const float c = expf(mu - mm);
        lt = fmaf(sh_ml[u * G + g][1], c, lt);
#pragma unroll
        for (int e = 0; e < E; ++e) at[e] = fmaf(sh_o[u * G + g][lane + 32 * e], c, at[e]);
    }
    const long long orow = (long long)r * HQ + hq;
    if (nsplit == 1) {
        const float il = lt > 0.f ? 1.f / lt : 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) o[orow * D + lane + 32 * e] = from_f<T>(at[e] * il);
    } else {
        const long long wi = orow * nsplit + split;
        if (lane == 0) ws_ml[2 * wi] = mm, ws_ml[2 * wi + 1] = lt;
#pragma unroll
        for (int e = 0; e < E; ++e) ws_o[wi * D + lane + 32 * e] = at[e];
    }
}

// Merge the nsplit partials of each (row, head) in split order. One warp per (row, head).
template <typename T, int D>
__global__ void attn_combine(const float* __restrict__ ws_ml, const float* __restrict__ ws_o, T* __restrict__ o,
                             int rows_heads, int nsplit) {
    constexpr int E = D / 32;
    const long long rh = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (rh >= rows_heads) return;
    float m = NEG_INF;
    for (int s = 0; s < nsplit; ++s) m = fmaxf(m, ws_ml[2 * (rh * nsplit + s)]);
    float l = 0.f, acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.f;
    for (int s = 0; s < nsplit; ++s) {
        const long long w = rh * nsplit + s;
        const float ms = ws_ml[2 * w];
        if (ms == NEG_INF) continue;  // empty split (beyond this row's position)
        const float c = expf(ms - m);
        l = fmaf(ws_ml[2 * w + 1], c, l);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(ws_o[w * D + lane + 32 * e], c, acc[e]);
    }
    const float il = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) o[rh * D + lane + 32 * e] = from_f<T>(acc[e] * il);
}
