// The decode MoE fusions of gemv.cu's launches (docs/cuda.md, "Routing inside the expert launch", "The combine and
// the next norm in the down launch", "Routing in the router's tail"): the routing of gemv_mma_rt's slots (GvRoute),
// the combine + RMS norm tail of gemv_mma_cb (GvCombine) and the router product's routing tail (GvRouteTail,
// gemv_mma_rr). gv_kernel takes all three; the other instances pass them empty, which compiles their code away.
#pragma once
#include "common.cuh"
#include "moe_combine.cuh"
#include "route_row.cuh"

// Routed expert launch (gemv_mma_rt, experts == 1): the slots' experts are chosen here from the router's logits
// instead of by a moe_route launch before it. Routed slot z < nrouted is choice z % K of token row xrow[z]
// (route_row.cuh: the selection moe_route makes, the same bits), later slots are the shared expert `shared`. Every
// warp runs the selection itself (no barrier; the logits row is 1 KB of L2); the slot's block (0, 0) stores the
// slot's expert to ids and a routed slot's weight to w, as moe_route would (the down launch and the combine read them).
struct GvRoute {
    const float* lg;  // [rows, ldl] float32 router logits; null: ids is an input (gemv_mma, gemv_mma_pf)
    long long ldl;
    int E, K, nrouted, shared;
    int* ids;
    float* w;
};

__device__ __forceinline__ int gv_route_slot(const GvRoute& rt, int z, long long row, bool writer) {
    if (z >= rt.nrouted) {
        if (writer && threadIdx.x == 0) rt.ids[z] = rt.shared;
        return rt.shared;
    }
    const int j = z % rt.K;
    const RouteSel r = route_row<float, 8>(rt.lg + row * rt.ldl, rt.E, rt.K, threadIdx.x & 31);
    if (writer && threadIdx.x == j) rt.ids[z] = r.id, rt.w[z] = route_weight(r);  // lane j holds choice j
    return __shfl_sync(0xffffffffu, r.id, j);
}

// The router product with the routing in its tail (gemv_mma_rr, dense, float32 rows; linear.gemv(route=...)): the
// moe_route launch after the router GEMV disappears. Each block that finishes a row block (gv_store's result: its
// outputs are stored) arrives on its lane block's counter cnt[z] (thread 0's acq_rel atomic after a barrier, as the
// split sums do); the last of the nbx row blocks stages each of its lanes' E logits through L2 (__ldcg) into shared
// memory and runs moe_route's selection on them (route_row.cuh, warp b % warps for lane b): the same floats and
// the same function, so the same ids and weights bit for bit, written where moe_route writes them (ids[row * K + j],
// w[row * K + j]; shared >= 0: the shared expert's slot ids[rows * K + row]); then it resets the counter.
struct GvRouteTail {
    int* cnt;  // [lane blocks] arrival counters, zero before and after a launch; null: no routing (other instances)
    int E, K;  // experts routed (E <= 256: columns 0 .. E - 1 of each output row), choices per token
    int rows;  // the launch's activation rows (the shared expert's slots follow the rows * K routed ones)
    int shared;
    int* ids;
    float* w;
};

template <int NB>
__device__ __forceinline__ void gv_route_tail(const GvRouteTail& rr, bool fin, int z, int nbx, long long xr0, int nb,
                                              const float* __restrict__ y, long long ldy, u32* sm) {
    if (!fin) return;  // uniform per block
    __syncthreads();   // every store of the block's row block precedes thread 0's release
    volatile int* last = reinterpret_cast<volatile int*>(sm);
    if (threadIdx.x == 0) *last = arrive_acq_rel(rr.cnt + z, 1) == nbx - 1;
    __syncthreads();
    if (!*last) return;
    float* lg = reinterpret_cast<float*>(sm) + 32;  // [nb][E] (the activation buffers hold 2048+ words)
    for (int i = threadIdx.x; i < nb * rr.E; i += blockDim.x) lg[i] = __ldcg(y + (xr0 + i / rr.E) * ldy + i % rr.E);
    __syncthreads();
    const int lane = threadIdx.x & 31;
    for (int b = threadIdx.x >> 5; b < nb; b += blockDim.x >> 5) {
        const long long row = xr0 + b;
        const RouteSel r = route_row<float, 8>(lg + b * rr.E, rr.E, rr.K, lane);
        if (rr.shared >= 0 && lane == 0) rr.ids[(long long)rr.rows * rr.K + row] = rr.shared;
        if (lane < rr.K) {
            rr.ids[row * rr.K + lane] = r.id;
            rr.w[row * rr.K + lane] = route_weight(r);
        }
    }
    if (threadIdx.x == 0) rr.cnt[z] = 0;
}

// The MoE combine and the next RMS norm in the down projection's launch (gemv_mma_cb, experts == 1 with one K split):
// each block, after storing its slot's rows, arrives on its token's counter; the last of the token's blocks (row
// blocks x slots) runs norm.cu's moe_combine_rmsnorm for the token's row: resid += sum_j ew[j] * dn[where[j]] +
// sigmoid(sg) * sh, then y = rmsnorm(resid) * (1 + w | w). The same float operations in the same order as that
// kernel's one block of RMS_NT = 256 threads (H <= 8 * 256, one chunk of 8 per thread, the host checks): each of the
// block's 128 threads plays threads tid and tid + 128 (their warp sums are the same butterflies; the 8 warp sums
// are added in warp order), so every output keeps the standalone kernel's bits. Other blocks' rows are read through
// L2 (__ldcg) after the acquire. The counter is reset for the next launch.
struct GvCombine {
    int* cnt;        // [T] per-token arrival counters, zero before and after a launch; null: no combine
    int arrivals;    // blocks per token
    int k, nrouted;  // routed slot z: token z / k (z < nrouted); later slots (the shared expert's): token z - nrouted
    const int* where;
    const float* ew;  // [T, k] each
    const float* sh;  // the shared expert's row of token t at sh + t * ldsh
    long long ldsh;
    const float* sg;  // its gate logit at sg + t * ldsg
    long long ldsg;
    float* resid;  // [T, ldr] float32 residual, updated in place
    long long ldr;
    const float* w;  // [H] norm weight
    float* out;      // [T, ldo] the normed rows
    long long ldo;
    float eps;
    int offset;  // (1 + w) rather than w
};

__device__ __forceinline__ void gv_ld8cg(const float* p, float (&v)[8]) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(p)), b = __ldcg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// Token tok's combine + norm by the last of its blocks (see GvCombine): dn the launch's output rows (row stride H).
// The routed experts' rows through moe_combine.cuh, as norm.cu's combine8: the same operations in the same order.
__device__ __forceinline__ void gv_combine_row(const GvCombine& cb, int tok, const float* dn, int H, float* scratch) {
    const int* wh = cb.where + (long long)tok * cb.k;
    const float* er = cb.ew + (long long)tok * cb.k;
    const float* shr = cb.sh + tok * cb.ldsh;
    float* rr = cb.resid + tok * cb.ldr;
    float* yr = cb.out + tok * cb.ldo;
    const float gate = sigmoidf_(__ldcg(cb.sg + tok * cb.ldsg));
    const int nch = H / 8;
    float v[2][8], ss[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // the standalone block's threads tid and tid + 128 (chunk = thread)
        const int c = threadIdx.x + 128 * i;
        ss[i] = 0.f;
        if (c >= nch) continue;
        float r[8], d[8], acc[8];
        gv_ld8cg(rr + 8 * c, r);
        gv_ld8cg(shr + 8 * c, d);
        moe_combine_experts(
            [&](int j, float(&x)[8]) {
                gv_ld8cg(dn + (long long)__ldcg(wh + j) * H + 8 * c, x);
                return __ldcg(er + j);
            },
            cb.k, acc);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            v[i][e] = fmaf(gate, d[e], acc[e]) + r[e];  // combine8's last fmaf, then x + r
            ss[i] = fmaf(v[i][e], v[i][e], ss[i]);
        }
        reinterpret_cast<float4*>(rr + 8 * c)[0] = make_float4(v[i][0], v[i][1], v[i][2], v[i][3]);
        reinterpret_cast<float4*>(rr + 8 * c)[1] = make_float4(v[i][4], v[i][5], v[i][6], v[i][7]);
    }
    const int warp = threadIdx.x >> 5;
    const float a = warp_sum(ss[0]), b = warp_sum(ss[1]);
    if ((threadIdx.x & 31) == 0) scratch[warp] = a, scratch[warp + 4] = b;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < 8; ++i) t += scratch[i];  // block_sum's order: warps 0 .. 7
    const float inv = 1.f / sqrtf(t / (float)H + cb.eps);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int c = threadIdx.x + 128 * i;
        if (c >= nch) continue;
        const float4 g0 = reinterpret_cast<const float4*>(cb.w + 8 * c)[0], g1 = reinterpret_cast<const float4*>(cb.w + 8 * c)[1];
        const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
        float o[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = v[i][e] * inv * (cb.offset ? 1.f + g[e] : g[e]);  // rms_y
        reinterpret_cast<float4*>(yr + 8 * c)[0] = make_float4(o[0], o[1], o[2], o[3]);
        reinterpret_cast<float4*>(yr + 8 * c)[1] = make_float4(o[4], o[5], o[6], o[7]);
    }
}

// The block's arrival on its token's counter after its rows are stored; the token's last block combines.
__device__ __forceinline__ void gv_combine_tail(const GvCombine& cb, int z, const float* dn, int H, u32* sm) {
    const int tok = z < cb.nrouted ? z / cb.k : z - cb.nrouted;
    __syncthreads();  // every thread's stores of this block's rows before thread 0's release
    volatile int* last = reinterpret_cast<volatile int*>(sm);  // the activation buffers are free by now
    if (threadIdx.x == 0) *last = arrive_acq_rel(cb.cnt + tok, 1) == cb.arrivals - 1;
    __syncthreads();
    if (!*last) return;
    gv_combine_row(cb, tok, dn, H, reinterpret_cast<float*>(sm) + 32);
    if (threadIdx.x == 0) cb.cnt[tok] = 0;
}
