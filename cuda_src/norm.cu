// RMS norms, fp32 math, rounded once on store (docs/model-math.md §2).
//
// rmsnorm: optionally fused with the residual add (resid <- resid + x, in place, fp32), then
//   y = r * rsqrt(mean(r^2) + eps) * (OFFSET ? 1 + w : w)
// One block of RMS_NT threads per row. The row is cut into 8-element chunks; thread i owns chunks i, i + RMS_NT,
// i + 2 RMS_NT, ... and sums the squares of its chunks' elements in order, then block_sum adds the thread sums in
// a fixed order: a row's result never depends on the other rows. Rows of up to RMS_NV * 8 * RMS_NT = 8192
// elements stay in registers between the sum of squares and the output (x and the residual are read once, every
// load issued before the first use); longer rows are re-read for the output in the same order (same result).
// VEC reads and writes whole chunks with 16-byte accesses (the wrapper checks alignment and H % 8 == 0); the
// scalar instance visits the same elements in the same order, so both give the same bits.
// Measured before (H200, graph-replayed decode of the 27B): the scalar two-pass kernel took 18 us per 5120 row.
//
// moe_combine_rmsnorm: the MoE combine (weighted expert rows + gated shared expert) fused in front of rmsnorm<RESID>.
//
// gated_rmsnorm (GDN output norm, plain weight): per head of width D,
//   y = (o * rsqrt(mean(o^2) + eps)) * w * silu(z); one warp per (token, head) row (gated_norm.cuh).
#include "f16row.cuh"
#include "gated_norm.cuh"
#include "moe_combine.cuh"

constexpr int RMS_NT = 256, RMS_NV = 4;

// 8 elements of a chunk starting at p (n of them inside the row; VEC: all 8, 16-byte aligned) as floats.
template <bool VEC> __device__ __forceinline__ void ld8(const float* p, int n, float (&v)[8]) {
    if (VEC) {
        const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = e < n ? p[e] : 0.f;
    }
}
template <bool VEC> __device__ __forceinline__ void ld8(const bf16* p, int n, float (&v)[8]) {
    if (VEC) {
        const uint4 u = *reinterpret_cast<const uint4*>(p);
        const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            v[2 * e] = __uint_as_float(w[e] << 16);
            v[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = e < n ? to_f(p[e]) : 0.f;
    }
}
template <bool VEC> __device__ __forceinline__ void st8(float* p, int n, const float (&v)[8]) {
    if (VEC) {
        reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (e < n) p[e] = v[e];
    }
}
template <bool VEC> __device__ __forceinline__ void st8(bf16* p, int n, const float (&v)[8]) {
    if (VEC) {
        u32 w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = (u32)f_to_bf16_bits(v[2 * e]) | ((u32)f_to_bf16_bits(v[2 * e + 1]) << 16);
        *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (e < n) p[e] = from_f<bf16>(v[e]);
    }
}

// r = x (+ resid, stored back) for the chunks u of round `base` owned by this thread; returns their sum of squares
// added to ss in chunk order. Every load of the round is issued before the first add.
template <typename T, bool RESID, bool VEC>
__device__ __forceinline__ float rms_round(const T* xr, float* rr, int H, int nch, int base, float (&v)[RMS_NV][8],
                                           float ss) {
    float r[RMS_NV][8];
#pragma unroll
    for (int u = 0; u < RMS_NV; ++u) {
        const int c = base + threadIdx.x + u * RMS_NT;
        if (c < nch) ld8<VEC>(xr + 8 * c, H - 8 * c, v[u]);
    }
    if (RESID) {
#pragma unroll
        for (int u = 0; u < RMS_NV; ++u) {
            const int c = base + threadIdx.x + u * RMS_NT;
            if (c < nch) ld8<VEC>(rr + 8 * c, H - 8 * c, r[u]);
        }
    }
#pragma unroll
    for (int u = 0; u < RMS_NV; ++u) {
        const int c = base + threadIdx.x + u * RMS_NT;
        if (c >= nch) continue;
        if (RESID) {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[u][e] += r[u][e];
            st8<VEC>(rr + 8 * c, H - 8 * c, v[u]);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) ss = fmaf(v[u][e], v[u][e], ss);  // zeros past H leave ss unchanged
    }
    return ss;
}

// one normed element: r * (1 / rms) * (1 + w) (OFFSET) or * w, left to right (rms_out and rms_out_f16 both)
template <bool OFFSET> __device__ __forceinline__ float rms_y(float r, float inv, float w) {
    return r * inv * (OFFSET ? 1.f + w : w);
}

template <typename T, bool OFFSET, bool VEC>
__device__ __forceinline__ void rms_out(T* yr, const float* w, int H, int nch, int base, const float (&v)[RMS_NV][8],
                                        float inv) {
#pragma unroll
    for (int u = 0; u < RMS_NV; ++u) {
        const int c = base + threadIdx.x + u * RMS_NT;
        if (c >= nch) continue;
        float g[8], o[8];
        ld8<VEC>(w + 8 * c, H - 8 * c, g);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = rms_y<OFFSET>(v[u][e], inv, g[e]);
        st8<VEC>(yr + 8 * c, H - 8 * c, o);
    }
}

template <typename T, bool OFFSET, bool RESID, bool VEC>
__global__ void __launch_bounds__(RMS_NT)
    rmsnorm(const T* __restrict__ x, float* resid, const float* __restrict__ w, T* __restrict__ y,
            int H, float eps, long long ldx, long long ldr, long long ldy) {
    pdl_trigger();
    pdl_wait();  // launched with PDL inside decode graphs: resident before the kernel ahead ends, nothing read before
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const T* xr = x + row * ldx;
    float* rr = resid + row * ldr;
    T* yr = y + row * ldy;
    const int nch = (H + 7) / 8, step = RMS_NV * RMS_NT;
    float v[RMS_NV][8], ss = 0.f;
    for (int base = 0; base < nch; base += step) ss = rms_round<T, RESID, VEC>(xr, rr, H, nch, base, v, ss);
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)H + eps);
    if (nch <= step) {  // one round: the row is still in registers
        rms_out<T, OFFSET, VEC>(yr, w, H, nch, 0, v, inv);
        return;
    }
    for (int base = 0; base < nch; base += step) {  // re-read r (x, or the residual already holding x + r)
#pragma unroll
        for (int u = 0; u < RMS_NV; ++u) {
            const int c = base + threadIdx.x + u * RMS_NT;
            if (c >= nch) continue;
            if (RESID)
                ld8<VEC>(rr + 8 * c, H - 8 * c, v[u]);
            else
                ld8<VEC>(xr + 8 * c, H - 8 * c, v[u]);
        }
        rms_out<T, OFFSET, VEC>(yr, w, H, nch, base, v, inv);
    }
}

// F16 outputs (rmsnorm_f16, moe_combine_rmsnorm_f16; float rows of H <= RMS_NV * 8 * RMS_NT with H % 8 == 0 and
// 16-byte alignment, the wrapper checks): instead of the normed row y, the fp16 mode's GEMM input rows that
// split_f16row (gemm_sm90.cu) would make of it, xh[row] = y * 2^k rounded to fp16 and rowf[row] = 2^-k. The outputs
// are computed as rms_out computes y, their largest |y| taken over the block (fmaxf: exact in any order), then
// rounded as split_f16row rounds: bitwise the norm followed by split_f16row, without y's store and re-read.
template <bool OFFSET>
__device__ __forceinline__ void rms_out_f16(u16* xr, float* rowf, const float* w, int nch,
                                            const float (&v)[RMS_NV][8], float inv, float* scratch) {
    float o[RMS_NV][8], m = 0.f;
#pragma unroll
    for (int u = 0; u < RMS_NV; ++u) {
        const int c = threadIdx.x + u * RMS_NT;
        if (c >= nch) continue;
        float g[8];
        ld8<true>(w + 8 * c, 8, g);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            o[u][e] = rms_y<OFFSET>(v[u][e], inv, g[e]);  // rms_out's value
            m = fmaxf(m, fabsf(o[u][e]));
        }
    }
    m = block_max(m, scratch);
    float back;
    const float s = f16row_scale(m, back);
    if (threadIdx.x == 0) *rowf = back;
#pragma unroll
    for (int u = 0; u < RMS_NV; ++u) {
        const int c = threadIdx.x + u * RMS_NT;
        if (c >= nch) continue;
        u32 q[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) q[j] = f16_rne_bits(o[u][2 * j] * s) | f16_rne_bits(o[u][2 * j + 1] * s) << 16;
        *reinterpret_cast<uint4*>(xr + 8 * c) = make_uint4(q[0], q[1], q[2], q[3]);
    }
}

// xh: [rows, H] fp16 words (row stride H), rowf: [rows] (see rms_out_f16); otherwise rmsnorm<float, OFFSET, RESID,
// true>'s arguments and first half
template <bool OFFSET, bool RESID>
__global__ void __launch_bounds__(RMS_NT)
    rmsnorm_f16(const float* __restrict__ x, float* resid, const float* __restrict__ w, u16* __restrict__ xh,
                float* __restrict__ rowf, int H, float eps, long long ldx, long long ldr) {
    pdl_trigger();
    pdl_wait();
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const int nch = H / 8;
    float v[RMS_NV][8];
    const float ss = rms_round<float, RESID, true>(x + row * ldx, resid + row * ldr, H, nch, 0, v, 0.f);
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)H + eps);
    rms_out_f16<OFFSET>(xh + row * H, rowf + row, w, nch, v, inv, scratch);
}

// moe_combine_rmsnorm: the MoE combine fused into the next residual add + RMS norm (one launch, not two; the
// 35B-A3B decode step ran 40 combine launches). Per element, in this order, fp32 fmaf from 0:
//   c = sum_{j < k} ew[t, j] * dn[where[t, j], :]  (routed experts in rank order)  + sigmoid(sg[t]) * sh[t, :]
// rounded to T (what the standalone combine stored), then exactly rmsnorm<RESID = true>(c): the same bits as the
// combine kernel followed by rmsnorm (tests/test_cuda_ops.py checks it bitwise).
// The routed experts' rows in batches, their fmafs in rank order (moe_combine.cuh), then the shared expert's.
template <typename T, bool VEC>
__device__ __forceinline__ void combine8(const T* dn, const int* wh, const float* ew, float gate, const T* shr,
                                         int k, long long H, int c8, int n, float (&v)[8]) {
    float acc[8], s[8];
    ld8<VEC>(shr + c8, n, s);
    moe_combine_experts(
        [&](int j, float(&d)[8]) {
            ld8<VEC>(dn + (long long)wh[j] * H + c8, n, d);
            return ew[j];
        },
        k, acc);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        acc[e] = fmaf(gate, s[e], acc[e]);
        v[e] = to_f(from_f<T>(acc[e]));  // T = float: acc itself
    }
}

// One round of moe_combine_rmsnorm's first pass: the thread's chunks u of round `base`, combined, added to the
// residual (stored back), their squares added to ss in chunk order (returned)
template <typename T, bool VEC>
__device__ __forceinline__ float moe_combine_round(const T* dn, const int* wh, const float* er, float gate,
                                                   const T* shr, int k, float* rr, int H, int nch, int base,
                                                   float (&v)[RMS_NV][8], float ss) {
    float r[RMS_NV][8];
#pragma unroll
    for (int u = 0; u < RMS_NV; ++u) {
        const int c = base + threadIdx.x + u * RMS_NT;
        if (c < nch) ld8<VEC>(rr + 8 * c, H - 8 * c, r[u]);
    }
#pragma unroll
    for (int u = 0; u < RMS_NV; ++u) {
        const int c = base + threadIdx.x + u * RMS_NT;
        if (c >= nch) continue;
        combine8<T, VEC>(dn, wh, er, gate, shr, k, H, 8 * c, H - 8 * c, v[u]);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[u][e] += r[u][e];  // x + r, as rmsnorm<RESID>
        st8<VEC>(rr + 8 * c, H - 8 * c, v[u]);
#pragma unroll
        for (int e = 0; e < 8; ++e) ss = fmaf(v[u][e], v[u][e], ss);
    }
    return ss;
}

template <typename T, bool OFFSET, bool VEC>
__global__ void __launch_bounds__(RMS_NT)
    moe_combine_rmsnorm(const T* __restrict__ dn, const int* __restrict__ where, const float* __restrict__ ew,
                        const T* __restrict__ sh, const float* __restrict__ sg, int k, long long ldsh,
                        long long ldsg, float* resid, const float* __restrict__ w, T* __restrict__ y, int H,
                        float eps, long long ldr, long long ldy) {
    pdl_trigger();
    pdl_wait();  // as rmsnorm
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const int* wh = where + row * k;
    const float* er = ew + row * k;
    const T* shr = sh + row * ldsh;
    float* rr = resid + row * ldr;
    T* yr = y + row * ldy;
    const float gate = sigmoidf_(sg[row * ldsg]);
    const int nch = (H + 7) / 8, step = RMS_NV * RMS_NT;
    float v[RMS_NV][8], ss = 0.f;
    for (int base = 0; base < nch; base += step) ss = moe_combine_round<T, VEC>(dn, wh, er, gate, shr, k, rr, H, nch, base, v, ss);
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)H + eps);
    if (nch <= step) {
        rms_out<T, OFFSET, VEC>(yr, w, H, nch, 0, v, inv);
        return;
    }
    for (int base = 0; base < nch; base += step) {  // re-read the residual, which holds c + r
#pragma unroll
        for (int u = 0; u < RMS_NV; ++u) {
            const int c = base + threadIdx.x + u * RMS_NT;
            if (c < nch) ld8<VEC>(rr + 8 * c, H - 8 * c, v[u]);
        }
        rms_out<T, OFFSET, VEC>(yr, w, H, nch, base, v, inv);
    }
}

// moe_combine_rmsnorm with the F16 outputs (rms_out_f16): float rows, one round
template <bool OFFSET>
__global__ void __launch_bounds__(RMS_NT)
    moe_combine_rmsnorm_f16(const float* __restrict__ dn, const int* __restrict__ where, const float* __restrict__ ew,
                            const float* __restrict__ sh, const float* __restrict__ sg, int k, long long ldsh,
                            long long ldsg, float* resid, const float* __restrict__ w, u16* __restrict__ xh,
                            float* __restrict__ rowf, int H, float eps, long long ldr) {
    pdl_trigger();
    pdl_wait();
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const int* wh = where + row * k;
    const float* er = ew + row * k;
    const float* shr = sh + row * ldsh;
    float* rr = resid + row * ldr;
    const float gate = sigmoidf_(sg[row * ldsg]);
    const int nch = H / 8;
    float v[RMS_NV][8], ss = 0.f;
    ss = moe_combine_round<float, true>(dn, wh, er, gate, shr, k, rr, H, nch, 0, v, ss);
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)H + eps);
    rms_out_f16<OFFSET>(xh + row * H, rowf + row, w, nch, v, inv, scratch);
}

// o, y: [rows, D] with row strides ldo, ldy (rows = tokens * heads, heads contiguous in a token); z: row r is
// head r % zheads of z-row r / zheads ([tokens, zheads * D] with row stride ldz, e.g. a column slice of a fused
// projection; zheads = 1 for [rows, D]).
template <typename T>
__global__ void __launch_bounds__(256)
    gated_rmsnorm(const T* __restrict__ o, const T* __restrict__ z, const float* __restrict__ w,
                  T* __restrict__ y, int rows, int D, float eps, long long ldo, long long ldz, long long ldy,
                  int zheads) {
    pdl_trigger();
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const T* zrow = z + (row / zheads) * ldz + (row % zheads) * D;
    gated_norm_row(o + row * ldo, zrow, w, y + row * ldy, D, eps, threadIdx.x & 31);
}

// gated_rmsnorm with the F16 outputs (rms_out_f16's contract), bitwise gated_rmsnorm<float> followed by
// split_f16row: one block of GN_F16_WARPS warps per token, warp w normalizing heads w, w + GN_F16_WARPS, ... with
// gated_norm_vals's arithmetic (R registers per lane and head: D <= 32 R). o: [T HV, D] rows of stride ldo; z:
// token t's head h at z + t ldz + h D; xh: [T, HV D].
//   HPW > 0 (gated_rmsnorm_f16r, HV <= GN_F16_WARPS HPW): every load of the warp's heads issued first, the values
//       and then the y kept in registers, the token's largest |y| over all heads, the rows stored.
//   HPW = 0 (gated_rmsnorm_f16, any HV): two passes, the first for the largest |y|, the second computing every y
//       again (the same operations on the same values: the same bits; o and z from the L1/L2 the first filled).
// Measured (H200, 94e43ba, perf/bench_gated_norm.py, 27B heads, 4096 tokens): the two-pass kernel with 8 registers
// per lane at D = 128 (half of them computing silu(0)) 284 us, more than gated_rmsnorm + split_f16row (152 + 65
// us) and four times the bytes' copy time (68 us); at 09a749f, with 4 registers per lane at D = 128: the resident
// kernel 92 us, the two-pass one 134 (docs/cuda.md).
constexpr int GN_F16_WARPS = 8;
template <int R, int HPW>
__device__ __forceinline__ void gated_f16_body(const float* __restrict__ o, const float* __restrict__ z,
                                               const float* __restrict__ w, u16* __restrict__ xh,
                                               float* __restrict__ rowf, int HV, int D, float eps, long long ldo,
                                               long long ldz) {
    pdl_trigger();
    __shared__ float scratch[32];
    const long long t = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u16* xr = xh + t * HV * D;
    float m = 0.f, wv[R];
    gated_norm_load<float, R>(w, D, lane, wv);
    if constexpr (HPW > 0) {
        float ov[HPW][R], zv[HPW][R];
#pragma unroll
        for (int k = 0; k < HPW; ++k) {  // heads past HV (warp-uniform) load nothing
            const int h = warp + GN_F16_WARPS * k;
            gated_norm_load<float, R>(o + (t * HV + h) * ldo, h < HV ? D : 0, lane, ov[k]);
            gated_norm_load<float, R>(z + t * ldz + (long long)h * D, h < HV ? D : 0, lane, zv[k]);
        }
#pragma unroll
        for (int k = 0; k < HPW; ++k) {
            if (warp + GN_F16_WARPS * k < HV) {
                gated_norm_of<R>(ov[k], zv[k], wv, D, eps, ov[k]);
#pragma unroll
                for (int r = 0; r < R; ++r)
                    if (lane + 32 * r < D) m = fmaxf(m, fabsf(ov[k][r]));
            }
        }
        m = block_max(m, scratch);
        float back;
        const float s = f16row_scale(m, back);
        if (threadIdx.x == 0) rowf[t] = back;
#pragma unroll
        for (int k = 0; k < HPW; ++k) {
            const int h = warp + GN_F16_WARPS * k;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int i = lane + 32 * r;
                if (h < HV && i < D) xr[h * D + i] = (u16)f16_rne_bits(ov[k][r] * s);
            }
        }
        return;
    }
    float y[R];
    for (int h = warp; h < HV; h += GN_F16_WARPS) {
        gated_norm_vals<float, R>(o + (t * HV + h) * ldo, z + t * ldz + (long long)h * D, w, D, eps, lane, y);
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (lane + 32 * r < D) m = fmaxf(m, fabsf(y[r]));
    }
    m = block_max(m, scratch);
    float back;
    const float s = f16row_scale(m, back);
    if (threadIdx.x == 0) rowf[t] = back;
    for (int h = warp; h < HV; h += GN_F16_WARPS) {
        gated_norm_vals<float, R>(o + (t * HV + h) * ldo, z + t * ldz + (long long)h * D, w, D, eps, lane, y);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int i = lane + 32 * r;
            if (i < D) xr[h * D + i] = (u16)f16_rne_bits(y[r] * s);
        }
    }
}

__global__ void __launch_bounds__(32 * GN_F16_WARPS)
    gated_rmsnorm_f16(const float* __restrict__ o, const float* __restrict__ z, const float* __restrict__ w,
                      u16* __restrict__ xh, float* __restrict__ rowf, int HV, int D, float eps, long long ldo,
                      long long ldz) {
    if (D <= 128) gated_f16_body<4, 0>(o, z, w, xh, rowf, HV, D, eps, ldo, ldz);
    else gated_f16_body<GN_REG, 0>(o, z, w, xh, rowf, HV, D, eps, ldo, ldz);
}

template <int R, int HPW>
__global__ void __launch_bounds__(32 * GN_F16_WARPS)
    gated_rmsnorm_f16r(const float* __restrict__ o, const float* __restrict__ z, const float* __restrict__ w,
                       u16* __restrict__ xh, float* __restrict__ rowf, int HV, int D, float eps, long long ldo,
                       long long ldz) {
    gated_f16_body<R, HPW>(o, z, w, xh, rowf, HV, D, eps, ldo, ldz);
}
