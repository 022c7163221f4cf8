// The CUDA Linear's own small kernels, and the read-bandwidth probe: device code written against
// simt.h, so that nvcc compiles it (linear_kernels.cu launches it) and the host compiler runs the
// same source on the SIMT harness in CI (tests/simt_linear_kernels_test.cc).
//   - f32 -> bf16 of a Linear's input rows, rounded exactly as the CPU path rounds them
//     (core::FloatToBf16: nearest even on the bit pattern, NaN kept quiet, subnormals rounded
//     rather than flushed);
//   - y = gelu_erf(y + bias) in place after the matmul: cuBLASLt's GELU epilogue is not the erf
//     form (see cuda_linear.cc);
//   - a read-and-sum pass over a large buffer (MeasureMemoryReadBandwidth).
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

// out[r * ld + c] = bf16(x[r * cols + c]) for r < rows, c < cols; out's padding columns
// [cols, ld) are left as they are. Any grid: rows strided over blockIdx.y, columns over the x
// threads (no per-element division).
IRIS_GLOBAL void ToBf16RowsKernel(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  const int64_t col_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += col_stride) {
      out[r * ld + c] = FloatToBf16(x[r * cols + c]);
    }
  }
}

// gelu(v) = v * Phi(v) = 0.5 v erfc(-v / sqrt(2)), the exact (erf) form HF's vision merger uses.
// erfc rather than 1 + erf: for negative v, 1 + erf(v / sqrt 2) cancels and loses the small
// result's digits, erfc keeps them.
IRIS_DEVICE float GeluErfValue(float v) { return 0.5f * v * erfcf(-v * 0.70710678118654752f); }

// y[r, c] = gelu_erf(y[r, c] + bias[c]) in place (bias may be null: no bias). Any grid, strided
// as ToBf16RowsKernel's.
IRIS_GLOBAL void BiasGeluErfKernel(float* y, int64_t rows, int64_t cols, const float* bias) {
  const int64_t col_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += col_stride) {
      const float v = bias != nullptr ? y[r * cols + c] + bias[c] : y[r * cols + c];
      y[r * cols + c] = GeluErfValue(v);
    }
  }
}

constexpr int kReadSumMaxWarps = 32;

// partials[blockIdx.x] = the sum of this block's share of x[0, n4) (grid-stride, 16-byte loads,
// four independent loads in flight per thread). The sums are written so that no read can be
// optimised away; blockDim.x: a multiple of the warp size.
IRIS_GLOBAL void ReadSumKernel(const Float4* x, int64_t n4, float* partials) {
  IRIS_SHARED float warp_sums[kReadSumMaxWarps];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    Float4 v[4];
    for (int u = 0; u < 4; ++u) v[u] = x[i + u * stride];
    for (int u = 0; u < 4; ++u) acc[u] += (v[u].x + v[u].y) + (v[u].z + v[u].w);
  }
  for (; i < n4; i += stride) {
    const Float4 v = x[i];
    acc[0] += (v.x + v.y) + (v.z + v.w);
  }
  float s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (int m = kWarpSize / 2; m > 0; m >>= 1) s += ShflXor(s, m);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) warp_sums[warp] = s;
  SyncThreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.x) / kWarpSize; ++w) total += warp_sums[w];
    partials[blockIdx.x] = total;
  }
}

}  // namespace iris::kernels::cuda
