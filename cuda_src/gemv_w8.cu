// The decode GEMV (gemv.cu) with 8 warps per block for 5-8 activation rows: blocks of twice the rows (256; 128 for
// BF16's one m-tile per warp), 2 resident per SM (the same 16 warps per SM). Each block stages its activations for
// twice the weight rows, halving the activations' L2 -> SM bytes per weight byte, which at 8 lanes are 0.44-0.89x
// the NVFP4 weight bytes with 4-warp blocks (docs/cuda.md, "Eight lanes"). The host keeps the 4-warp plan's split
// counts (linear.py, w8_plan), and gv_fold_ss writes its partial sums of squares per 4-warp row group, so every
// output and every folded norm has the 4-warp kernel's bits (tests/test_gemv_w8_host.py). Float activations only
// (bf16 rows at 8 lanes leave the fold's residual buffer too small).
#define GV_WARPS 8
#define GV_MIN_BLOCKS 2
#include "gemv.cu"
