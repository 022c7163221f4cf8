// iris's own CUDA kernels: device code only, written against simt.h so that the same source is
// compiled by nvcc (cuda_kernels.cu launches it on a stream) and by the host compiler (the SIMT
// harness runs it in CI against the CPU kernels, tests/simt_kernels_test.cc). All f32, row-major,
// with the CPU ops' semantics (kernels/elementwise.h, rotary.h, qkv_pad.h, llm's greedy argmax).
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

constexpr int kMaxWarpsPerBlock = 32;

// The sum of v over the block, in every thread. `partials`: kMaxWarpsPerBlock floats of shared
// storage. blockDim.x: a multiple of the warp size.
IRIS_DEVICE float BlockSum(float v, float* partials) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v += ShflXor(v, m);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) partials[warp] = v;
  SyncThreads();
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  v = lane < warps ? partials[lane] : 0.f;  // every warp reduces the partials: all lanes end with the sum
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v += ShflXor(v, m);
  SyncThreads();  // the partials are read before anyone reuses them
  return v;
}

IRIS_DEVICE float InvSqrt(float v) {
  // rsqrtf is approximate (2 ulp): the exact quotient, as the CPU kernel and HF compute it.
  return 1.0f / sqrtf(v);
}

// y[r, :] = (x[r, :] * 1/sqrt(mean(x[r, :]^2) + eps)) * w. One block per row.
IRIS_GLOBAL void RmsNormKernel(const float* x, const float* w, int dim, float eps, float* y) {
  IRIS_SHARED float partials[kMaxWarpsPerBlock];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  float ss = 0.f;
  for (int i = static_cast<int>(threadIdx.x); i < dim; i += static_cast<int>(blockDim.x)) ss += xr[i] * xr[i];
  const float inv = InvSqrt(BlockSum(ss, partials) / static_cast<float>(dim) + eps);
  for (int i = static_cast<int>(threadIdx.x); i < dim; i += static_cast<int>(blockDim.x)) yr[i] = (xr[i] * inv) * w[i];
}

// out[r, j] = silu(gu[r, j]) * gu[r, inter + j]: gate and up side by side in each row.
IRIS_GLOBAL void SiluMulRowsKernel(const float* gu, int64_t rows, int64_t inter, float* out) {
  const int64_t n = rows * inter;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t r = e / inter, j = e % inter;
    const float g = gu[r * 2 * inter + j];
    out[e] = g / (1.0f + expf(-g)) * gu[r * 2 * inter + inter + j];
  }
}

// The fused rotary: q's and k's heads of row blockIdx.x rotated in place in one launch
// (rotate-half; cos/sin hold head_dim/2 values per row).
IRIS_GLOBAL void RotaryQKKernel(float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride, int k_heads,
                                int head_dim, const float* cos, const float* sin) {
  const int64_t row = blockIdx.x;
  const int half = head_dim / 2;
  const float* c = cos + row * half;
  const float* s = sin + row * half;
  for (int e = static_cast<int>(threadIdx.x); e < (q_heads + k_heads) * half; e += static_cast<int>(blockDim.x)) {
    const int h = e / half, i = e % half;
    float* p = h < q_heads ? q + row * q_stride + static_cast<int64_t>(h) * head_dim
                           : k + row * k_stride + static_cast<int64_t>(h - q_heads) * head_dim;
    const float x1 = p[i], x2 = p[i + half];
    p[i] = x1 * c[i] - x2 * s[i];
    p[i + half] = x2 * c[i] + x1 * s[i];
  }
}

// One launch pads all three of q, k, v: qkv [rows, 3, heads, head_dim] -> each of q, k, v
// [heads, rows, padded_dim], dims past head_dim zero. Grid (rows, 3).
IRIS_GLOBAL void PadQkvKernel(const float* qkv, int64_t rows, int heads, int head_dim, int padded_dim, float* q,
                              float* k, float* v) {
  const int64_t row = blockIdx.x;
  const int which = static_cast<int>(blockIdx.y);
  float* out = which == 0 ? q : which == 1 ? k : v;
  const float* in = qkv + (row * 3 + which) * heads * static_cast<int64_t>(head_dim);
  for (int e = static_cast<int>(threadIdx.x); e < heads * padded_dim; e += static_cast<int>(blockDim.x)) {
    const int h = e / padded_dim, d = e % padded_dim;
    out[(static_cast<int64_t>(h) * rows + row) * padded_dim + d] = d < head_dim ? in[h * head_dim + d] : 0.f;
  }
}

// Greedy argmax per row of logits, as the CPU sampler picks it: the first maximum (lowest id
// wins ties); NaN never wins; a row with no value above -inf gives 0.
struct ArgmaxPair {
  float value;
  int32_t index;
};

IRIS_DEVICE bool Better(float v, int32_t i, float bv, int32_t bi) { return v > bv || (v == bv && i < bi); }

IRIS_GLOBAL void ArgmaxKernel(const float* logits, int64_t vocab, int32_t* out) {
  IRIS_SHARED float part_v[kMaxWarpsPerBlock];
  IRIS_SHARED int32_t part_i[kMaxWarpsPerBlock];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float bv = -INFINITY;
  int32_t bi = INT32_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i] != row[i] ? -INFINITY : row[i];  // NaN as -inf
    if (Better(v, static_cast<int32_t>(i), bv, bi)) {
      bv = v;
      bi = static_cast<int32_t>(i);
    }
  }
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  for (int m = kWarpSize / 2; m > 0; m >>= 1) {
    const float ov = ShflXor(bv, m);
    const int32_t oi = ShflXor(bi, m);
    if (Better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  if (lane == 0) {
    part_v[warp] = bv;
    part_i[warp] = bi;
  }
  SyncThreads();
  if (warp == 0) {
    const int warps = static_cast<int>(blockDim.x) / kWarpSize;
    bv = lane < warps ? part_v[lane] : -INFINITY;
    bi = lane < warps ? part_i[lane] : INT32_MAX;
    for (int m = kWarpSize / 2; m > 0; m >>= 1) {
      const float ov = ShflXor(bv, m);
      const int32_t oi = ShflXor(bi, m);
      if (Better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) out[blockIdx.x] = bi == INT32_MAX || bv == -INFINITY ? 0 : bi;
  }
}

}  // namespace iris::kernels::cuda
