// The per-value math of RMSNorm, SiLU·mul and the rotary, and the order RMSNorm's vector kernel
// sums a row in: shared by the norm, activation and rotary kernels (kernels.cuh), the GEMVs that
// fold those ops into their read of x (linear_kernels.cuh) and the paged attentions that do the
// decode rotary themselves, so that a fused value is the op's value bit for bit.
// Device code against simt.h (nvcc and the SIMT harness).
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

constexpr int kMaxWarpsPerBlock = 32;

// One rotate-half pair (x1 at dim i, x2 at i + head_dim / 2) turned by (c, s): the expressions of
// every rotary kernel, in one place, so that each computes the same bits.
IRIS_DEVICE void RotatePair(float x1, float x2, float c, float s, float* y1, float* y2) {
  *y1 = x1 * c - x2 * s;
  *y2 = x2 * c + x1 * s;
}

IRIS_DEVICE float InvSqrt(float v) {
  // rsqrtf is approximate (2 ulp): the exact quotient, as the CPU kernel and HF compute it.
  return 1.0f / sqrtf(v);
}

// silu(x) = x / (1 + e^-x), a true division as torch (and the CPU kernels) compute it.
IRIS_DEVICE float Silu(float x) { return x / (1.0f + expf(-x)); }

// One normalised value of RMSNorm: (x * inv) * w, in this order.
IRIS_DEVICE float RmsNormValue(float x, float inv, float w) { return (x * inv) * w; }

// ss plus the squares of a 16-byte vector, in one fixed expression (every kernel that sums a row
// for RMSNorm's vector path goes through this, so the sums agree bit for bit).
IRIS_DEVICE float AddSquares4(float ss, const Float4& v) { return ss + (v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w); }

// RMSNorm's vector path: a thread t of a block of T threads holds the row's 16-byte vectors
// t, t + T, ... (at most kRmsNormVecs of them), adds their squares in that order, and the block
// sums the threads' partial sums as BlockSum does (a warp sum, then a warp sum of the warps'
// partials, padded with zeros).
constexpr int kRmsNormVecs = 4;

// That block size T for these buffers, or 0 where the vector path does not apply: a row must be
// whole 16-byte vectors (dim % 4 == 0, x, w and y 16-byte aligned) of at most kRmsNormVecs per
// thread for at most kMaxWarpsPerBlock warps. T is ceil(dim / (4 * kRmsNormVecs)) rounded up to a
// warp.
inline int RmsNormVecThreads(const void* x, const void* w, const void* y, int64_t dim) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (dim <= 0 || dim % 4 != 0 || !aligned(x) || !aligned(w) || !aligned(y)) return 0;
  const int64_t per_thread = 4 * int64_t{kRmsNormVecs};
  const int64_t threads = (dim + per_thread - 1) / per_thread;
  if (threads > int64_t{kMaxWarpsPerBlock} * kWarpSize) return 0;
  return static_cast<int>((threads + kWarpSize - 1) / kWarpSize * kWarpSize);
}

}  // namespace iris::kernels::cuda
