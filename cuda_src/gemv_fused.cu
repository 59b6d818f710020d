// The decode GEMV (gemv.cu) instances with a fused epilogue that are experiments behind switches, off by default
// and measured no faster (docs/cuda.md): gemv_mma_gu (the gate | up product with the SwiGLU in its epilogue,
// CudaQwen36.gemv_swiglu_out) and gemv_mma_rr (the router product with the MoE routing in its tail,
// CudaQwen36.moe_route_router). A family of their own so that warm-up compiles them beside gemv.cu, not inside its
// module (the largest family decides a cold start: ninfer.cuda.warmup compiles families in parallel).
#include "gemv.cu"
