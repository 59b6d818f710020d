// The decode GEMV (gemv.cu) with its NVFP4 weight ring filled by bulk copies (gemv_bulk.cuh: one lane issues a
// stage's cp.async.bulk copies on a per-stage mbarrier instead of every lane its cp.async copies). An experiment
// behind linear.GV_BULK (off by default): the same bits as gemv.cu (tests/test_gemv_bulk_host.py,
// tests/test_cuda_gemv_bulk.py). NVFP4 instances only; dense launches whose first row, and expert launches whose rows
// per expert, are multiples of 16 (linear.py checks).
#define GV_BULK 1
#include "gemv.cu"
