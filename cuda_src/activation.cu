// Elementwise activations.
//
// swiglu: out[r, i] = silu(gu[r, i]) * gu[r, I + i] over a fused [gate | up] row of width 2I (the artifact's
//   MLP row order [gate, up] and HF's gate_up_proj order).
// sigmoid_gate: out[r, h*D + d] = x[r, h*D + d] * sigmoid(gate[r*gsr + h*gsh + d]); the gate is read in place
//   from the q_proj output, where each head holds [query D | gate D] (gsh = 2D, gate pointer offset by D). The
//   per-element value is common.cuh's sigmoid_gated, which the fp16 GEMM's row split (gemm_sm90.cu
//   split_f16row_gate) applies as well.
#include "common.cuh"

// Layout (both): blockIdx.y walks the rows (grid-stride), blockIdx.x and the threads the row's columns with
// AC_ILP elements per thread in flight (int indexing inside a row). Measured (H200, perf/results/
// profile_prefill_c258d5b.txt): the earlier flat grid-stride loop divided a 64-bit element index per element and
// ran the 27B's 4096-token SwiGLU at about half the copy bandwidth (22 ms of a 460 ms chunk). Same expression per
// element, so the same bits (the GEMV's fused prologues are checked bitwise against these kernels).
#define AC_ILP 4

template <typename T>
__global__ void __launch_bounds__(256) swiglu(const T* __restrict__ gu, T* __restrict__ out, int rows, int I,
                                              long long ldg, long long ldo) {
    pdl_trigger();
    const int span = blockDim.x * AC_ILP, stride = gridDim.x * span;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const T* g = gu + r * ldg;
        T* o = out + r * ldo;
        for (int i0 = blockIdx.x * span + threadIdx.x; i0 < I; i0 += stride) {
            float gv[AC_ILP], uv[AC_ILP];
#pragma unroll
            for (int j = 0; j < AC_ILP; ++j) {
                const int i = i0 + j * blockDim.x;
                gv[j] = i < I ? to_f(g[i]) : 0.f;
                uv[j] = i < I ? to_f(g[I + i]) : 0.f;
            }
#pragma unroll
            for (int j = 0; j < AC_ILP; ++j) {
                const int i = i0 + j * blockDim.x;
                if (i < I) o[i] = from_f<T>(siluf_(gv[j]) * uv[j]);
            }
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(256) sigmoid_gate(const T* __restrict__ x, const T* __restrict__ gate,
                                                    T* __restrict__ out, int rows, int heads, int D, long long ldx,
                                                    long long gsr, long long gsh, long long ldo) {
    pdl_trigger();
    const int width = heads * D, span = blockDim.x * AC_ILP, stride = gridDim.x * span;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const T* xr = x + r * ldx;
        const T* gr = gate + r * gsr;
        T* o = out + r * ldo;
        for (int c0 = blockIdx.x * span + threadIdx.x; c0 < width; c0 += stride) {
            float xv[AC_ILP], gv[AC_ILP];
#pragma unroll
            for (int j = 0; j < AC_ILP; ++j) {
                const int c = c0 + j * blockDim.x, h = c / D;
                xv[j] = c < width ? to_f(xr[c]) : 0.f;
                gv[j] = c < width ? to_f(gr[h * gsh + (c - h * D)]) : 0.f;
            }
#pragma unroll
            for (int j = 0; j < AC_ILP; ++j) {
                const int c = c0 + j * blockDim.x;
                if (c < width) o[c] = from_f<T>(sigmoid_gated(xv[j], gv[j]));
            }
        }
    }
}
