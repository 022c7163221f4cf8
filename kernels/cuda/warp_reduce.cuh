// Warp-wide reductions shared by iris's CUDA kernels (device code, simt.h: nvcc and the harness).
#pragma once

#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

// The sum of v over the warp, in every lane.
IRIS_DEVICE float WarpSum(float v) {
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
