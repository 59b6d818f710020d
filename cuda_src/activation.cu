// Elementwise activations.
//
// swiglu: out[r, i] = silu(gu[r, i]) * gu[r, I + i] over a fused [gate | up] row of width 2I (the artifact's
//   MLP row order [gate, up] and HF's gate_up_proj order).
// sigmoid_gate: out[r, h*D + d] = x[r, h*D + d] * sigmoid(gate[r*gsr + h*gsh + d]); the gate is read in place
//   from the q_proj output, where each head holds [query D | gate D] (gsh = 2D, gate pointer offset by D).
#include "common.cuh"

template <typename T>
__global__ void swiglu(const T* __restrict__ gu, T* __restrict__ out, int rows, int I, long long ldg,
                       long long ldo) {
    pdl_trigger();
    const long long n = (long long)rows * I;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / I, i = e % I;
        const float g = to_f(gu[r * ldg + i]), u = to_f(gu[r * ldg + I + i]);
        out[r * ldo + i] = from_f<T>(siluf_(g) * u);
    }
}

template <typename T>
__global__ void sigmoid_gate(const T* __restrict__ x, const T* __restrict__ gate, T* __restrict__ out, int rows,
                             int heads, int D, long long ldx, long long gsr, long long gsh, long long ldo) {
    pdl_trigger();
    const long long width = (long long)heads * D, n = rows * width;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / width, c = e % width, h = c / D, d = c % D;
        out[r * ldo + c] = from_f<T>(to_f(x[r * ldx + c]) * sigmoidf_(to_f(gate[r * gsr + h * gsh + d])));
    }
}
