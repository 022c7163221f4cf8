// Launches of the CUDA Linear's small kernels and the read-bandwidth probe (linear_kernels.cuh)
// on a stream. Pointers are device memory; each call only enqueues and returns the launch's
// cudaError_t value (0: cudaSuccess), so that this header needs no CUDA header.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace iris::kernels::cuda {

// out[r * ld + c] = bf16 bits of x[r * cols + c] (core::FloatToBf16's rounding); ld >= cols.
int LaunchToBf16Rows(CUstream_st* stream, const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out);
// y[r, c] = gelu_erf(y[r, c] + bias[c]) in place; bias may be null.
int LaunchBiasGeluErf(CUstream_st* stream, float* y, int64_t rows, int64_t cols, const float* bias);
// partials[b] for b < blocks: block b's share of the sum of x[0, n) (x 16-byte aligned, n a
// multiple of 4), 256 threads a block.
int LaunchReadSum(CUstream_st* stream, const float* x, int64_t n, int blocks, float* partials);

}  // namespace iris::kernels::cuda
