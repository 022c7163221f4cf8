// nvcc's side of linear_kernels.cuh: the launch configurations.
#include "kernels/cuda/linear_kernels.h"

#include <cuda_runtime.h>

#include "kernels/cuda/linear_kernels.cuh"

namespace iris::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int LastError() { return static_cast<int>(cudaGetLastError()); }

// A grid for a rows x cols elementwise kernel: one thread per element where that fits, capped
// (the kernels' strided loops take the rest): up to 16 blocks across a row, 65535 rows down.
dim3 RowsGrid(int64_t rows, int64_t cols) {
  const int64_t across = (cols + kThreads - 1) / kThreads;
  return dim3(static_cast<unsigned>(across < 16 ? across : 16), static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

}  // namespace

int LaunchToBf16Rows(CUstream_st* stream, const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  if (ld < cols) return static_cast<int>(cudaErrorInvalidValue);
  if (rows * cols == 0) return 0;
  ToBf16RowsKernel<<<RowsGrid(rows, cols), kThreads, 0, stream>>>(x, rows, cols, ld, out);
  return LastError();
}

int LaunchBiasGeluErf(CUstream_st* stream, float* y, int64_t rows, int64_t cols, const float* bias) {
  if (rows * cols == 0) return 0;
  BiasGeluErfKernel<<<RowsGrid(rows, cols), kThreads, 0, stream>>>(y, rows, cols, bias);
  return LastError();
}

int LaunchReadSum(CUstream_st* stream, const float* x, int64_t n, int blocks, float* partials) {
  if (n % 4 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 || blocks <= 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  ReadSumKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(reinterpret_cast<const Float4*>(x), n / 4,
                                                                       partials);
  return LastError();
}

}  // namespace iris::kernels::cuda
