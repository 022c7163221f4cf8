// e^x exactly as each lane of the portable CPU kernels' Exp8 (kernels/cpu/portable/vec8.h)
// computes it, as one scalar function compiled for the host and for a GPU: the sampler's
// probabilities are the same floats wherever a row is drawn (llm::Sampler on the host,
// kernels::SampleRows on a device). Every multiply-add is an explicit fmaf and no product feeds a
// plain addition, so no compiler's contraction changes a result.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"


namespace iris::kernels {

IRIS_HD_FN float ExpLane(float x) {
  float xc = x < 88.8f ? x : 88.8f;  // as _mm256_min_ps / _mm256_max_ps (a NaN becomes 88.8)
  xc = xc > -88.0f ? xc : -88.0f;
  // Round to nearest even by adding and subtracting 1.5 * 2^23.
  const float n = fmaf(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
  float r = fmaf(-n, 0.693359375f, xc);
  r = fmaf(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p, r * r, r + 1.0f);
  // p * 2^n as two normal powers of two, split as the vector code splits n (an arithmetic shift).
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const uint32_t b1 = static_cast<uint32_t>(n1 + 127) << 23, b2 = static_cast<uint32_t>(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  const float y = p * s1 * s2;
  return x != x ? x : (x >= -88.0f ? y : 0.0f);
}

}  // namespace iris::kernels
