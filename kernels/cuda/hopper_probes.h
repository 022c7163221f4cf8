// The Hopper primitives' probes (hopper_probes.cuh) as host code launches them: device pointers,
// each call enqueues one block and returns its cudaError_t value (0: success). sm_90a only.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace iris::kernels::cuda {

// The copy engine lands the 64-value x 64-row box at (column x, row y) of the bf16 matrix
// (rows x cols, row stride ld values) as the GEMM's tensor maps do; out gets the 8192 bytes of
// shared memory as they landed.
int LaunchTmaBoxProbe(CUstream_st* stream, const uint16_t* m, int64_t rows, int64_t cols, int64_t ld, int32_t x,
                      int32_t y, unsigned char* out);

// One warpgroup MMA: d [64][128] = A[:, 16kk..16kk+15] · B[:, 16kk..16kk+15]ᵀ for A [64][64] and
// B [128][64] bf16, through tiles written in the 128-byte-swizzled layout.
int LaunchWgmmaProbe(CUstream_st* stream, const uint16_t* a, const uint16_t* b, int kk, float* d);

}  // namespace iris::kernels::cuda
