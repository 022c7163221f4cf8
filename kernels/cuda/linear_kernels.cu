// nvcc's side of linear_kernels.cuh: the launch configurations.
#include "kernels/cuda/linear_kernels.h"

#include <cuda_runtime.h>

#include "kernels/cuda/launch_grid.cuh"
#include "kernels/cuda/linear_kernels.cuh"

namespace iris::kernels::cuda {

int LaunchToBf16Rows(CUstream_st* stream, const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  if (ld < cols) return static_cast<int>(cudaErrorInvalidValue);
  if (rows * cols == 0) return 0;
  ToBf16RowsKernel<<<RowsGrid(rows, cols), kLaunchThreads, 0, stream>>>(x, rows, cols, ld, out);
  return LastLaunchError();
}

int LaunchBiasGeluErf(CUstream_st* stream, float* y, int64_t rows, int64_t cols, const float* bias) {
  if (rows * cols == 0) return 0;
  BiasGeluErfKernel<<<RowsGrid(rows, cols), kLaunchThreads, 0, stream>>>(y, rows, cols, bias);
  return LastLaunchError();
}

int LaunchReadSum(CUstream_st* stream, const float* x, int64_t n, int blocks, float* partials) {
  if (n % 4 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 || blocks <= 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  ReadSumKernel<<<static_cast<unsigned>(blocks), kLaunchThreads, 0, stream>>>(reinterpret_cast<const Float4*>(x), n / 4,
                                                                       partials);
  return LastLaunchError();
}

}  // namespace iris::kernels::cuda
