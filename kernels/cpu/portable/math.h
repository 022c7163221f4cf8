// Scalar exp, silu and the erf form of GELU for the portable kernels, written without branches or
// library calls so that loops over them vectorise (AVX2 at the x86-64-v3 baseline). Same
// formulas as simd.h's AVX-512 versions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace iris::kernels::cpu::portable {

// e^x, about 1 ulp (Cephes expf polynomial after Cody-Waite reduction). +inf above ~88.72,
// exactly 0 below -88, NaN for NaN.
inline float Exp(float x) {
  float xc = x < 88.8f ? x : 88.8f;  // (NaN goes to 88.8 here and is put back at the end)
  xc = xc > -88.0f ? xc : -88.0f;
  // Round to nearest even: adding and subtracting 1.5 * 2^23 (exact for |v| < 2^22).
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = std::fma(-n, 0.693359375f, xc);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  // p * 2^n for n in [-127, 128], as two normal powers of two.
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni / 2, n2 = ni - n1;
  const float y = p * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((n2 + 127) << 23);
  return x != x ? x : (x < -88.0f ? 0.0f : y);
}

// silu(x) = x / (1 + e^-x), with a true division as torch does.
inline float Silu(float x) { return x / (1.0f + Exp(-x)); }

// gelu(x) = 0.5 * x * erfc(-x / sqrt(2)), with erfc from the Chebyshev fit of Numerical Recipes'
// erfcc (relative error < 1.2e-7): erfc(z) = t * exp(-z^2 + P(t)), t = 1 / (1 + |z| / 2).
inline float GeluErf(float x) {
  const float half_x = 0.5f * x;
  const float az = std::fabs(x) * 0.70710678118654752f;
  const float t = 1.0f / std::fma(0.5f, az, 1.0f);
  float p = 0.17087277f;
  p = std::fma(p, t, -0.82215223f);
  p = std::fma(p, t, 1.48851587f);
  p = std::fma(p, t, -1.13520398f);
  p = std::fma(p, t, 0.27886807f);
  p = std::fma(p, t, -0.18628806f);
  p = std::fma(p, t, 0.09678418f);
  p = std::fma(p, t, 0.37409196f);
  p = std::fma(p, t, 1.00002368f);
  p = std::fma(p, t, -1.26551223f);
  const float e = t * Exp(std::fma(-half_x, x, p));  // erfc(|z|)
  return half_x * (x > 0.0f ? 2.0f - e : e);
}

}  // namespace iris::kernels::cpu::portable
