// nvcc's side of linear_kernels.cuh: the launch configurations.
#include "kernels/cuda/linear_kernels.h"

#include <cuda_runtime.h>

#include "kernels/cuda/launch_grid.cuh"
#include "kernels/cuda/linear_kernels.cuh"

namespace iris::kernels::cuda {

int LaunchToBf16Rows(CUstream_st* stream, const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  if (ld < cols) return static_cast<int>(cudaErrorInvalidValue);
  if (rows * cols == 0) return 0;
  if (cols % 8 == 0 && ld % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    ToBf16Rows8Kernel<<<RowsGrid(rows, cols / 8), kLaunchThreads, 0, stream>>>(x, rows, cols, ld, out);
    return LastLaunchError();
  }
  ToBf16RowsKernel<<<RowsGrid(rows, cols), kLaunchThreads, 0, stream>>>(x, rows, cols, ld, out);
  return LastLaunchError();
}

int LaunchBiasGeluErf(CUstream_st* stream, float* y, int64_t rows, int64_t cols, const float* bias) {
  if (rows * cols == 0) return 0;
  BiasGeluErfKernel<<<RowsGrid(rows, cols), kLaunchThreads, 0, stream>>>(y, rows, cols, bias);
  return LastLaunchError();
}

namespace {

template <int kRows>
void LaunchGemvSimt(CUstream_st* stream, bool vec_x, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                    const float* x, const float* bias, float beta, float* y) {
  const auto blocks = static_cast<unsigned>((out + kGemvSimtOutPerBlock - 1) / kGemvSimtOutPerBlock);
  if (vec_x) {
    GemvSimtKernel<kRows, true><<<blocks, kGemvSimtThreads, 0, stream>>>(w, ld, in, out, x, bias, beta, y);
  } else {
    GemvSimtKernel<kRows, false><<<blocks, kGemvSimtThreads, 0, stream>>>(w, ld, in, out, x, bias, beta, y);
  }
}

}  // namespace

int LaunchGemvBf16(CUstream_st* stream, GemvKernel kernel, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                   const float* x, int64_t rows, const float* bias, float beta, float* y) {
  static_assert(kGemvMaxRowsPerLaunch == kGemvMaxRows, "linear_kernels.h names the kernels' limit");
  if (rows < 1 || rows > kGemvMaxRows || in < 1 || ld < in || ld % 8 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0 ||
      out < 1) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const bool vec_x = in % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (kernel == GemvKernel::kTensorCores) {
    const auto blocks = static_cast<unsigned>((out + kGemvMmaOutPerBlock - 1) / kGemvMmaOutPerBlock);
    const int r = static_cast<int>(rows);
    if (vec_x) {
      GemvMmaKernel<true><<<blocks, kGemvMmaThreads, 0, stream>>>(w, ld, in, out, x, r, bias, beta, y);
    } else {
      GemvMmaKernel<false><<<blocks, kGemvMmaThreads, 0, stream>>>(w, ld, in, out, x, r, bias, beta, y);
    }
    return LastLaunchError();
  }
  switch (rows) {
    case 1: LaunchGemvSimt<1>(stream, vec_x, w, ld, in, out, x, bias, beta, y); break;
    case 2: LaunchGemvSimt<2>(stream, vec_x, w, ld, in, out, x, bias, beta, y); break;
    case 3: LaunchGemvSimt<3>(stream, vec_x, w, ld, in, out, x, bias, beta, y); break;
    case 4: LaunchGemvSimt<4>(stream, vec_x, w, ld, in, out, x, bias, beta, y); break;
    case 5: LaunchGemvSimt<5>(stream, vec_x, w, ld, in, out, x, bias, beta, y); break;
    case 6: LaunchGemvSimt<6>(stream, vec_x, w, ld, in, out, x, bias, beta, y); break;
    case 7: LaunchGemvSimt<7>(stream, vec_x, w, ld, in, out, x, bias, beta, y); break;
    default: LaunchGemvSimt<8>(stream, vec_x, w, ld, in, out, x, bias, beta, y); break;
  }
  static_assert(kGemvMaxRows == 8, "one case per row count");
  return LastLaunchError();
}

bool PickGemv(int64_t rows, int64_t weight_bytes, int max_rows, GemvKernel* kernel) {
  constexpr int64_t kSmallWeightBytes = int64_t{32} << 20;
  if (rows < 1 || rows > max_rows) return false;
  if (rows == 1) {
    *kernel = GemvKernel::kCudaCores;
    return true;
  }
  if (weight_bytes > kSmallWeightBytes) return false;
  *kernel = rows <= 4 ? GemvKernel::kCudaCores : GemvKernel::kTensorCores;
  return true;
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
