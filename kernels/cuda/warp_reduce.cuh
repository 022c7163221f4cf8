// Warp-wide reductions shared by iris's CUDA kernels (device code, simt.h: nvcc and the harness).
#pragma once

#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

// The sum of v over the warp, in every lane (float, double or an integer; a fixed tree, so the
// same values give the same sum).
template <typename T>
IRIS_DEVICE T WarpSum(T v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v += ShflXor(v, m);
  return v;
}

// The maximum of v over the warp, in every lane (-inf stays -inf; no NaN expected).
IRIS_DEVICE float WarpMax(float v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) {
    const float other = ShflXor(v, m);
    v = other > v ? other : v;
  }
  return v;
}

}  // namespace iris::kernels::cuda
