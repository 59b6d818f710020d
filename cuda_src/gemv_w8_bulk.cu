// gemv_w8.cu (8 warps per block, 5-8 lanes) with the bulk-copy weight ring of gemv_bulk.cu (linear.GV_BULK).
#define GV_BULK 1
#include "gemv_w8.cu"
