// AVX-512 helpers private to the CPU kernels: exp, erfc-based GELU, silu, masks, bf16 rounding.
// Compiled for AVX-512 inside an isa_region.h region: only for code that runs at tier kAvx512+.
#pragma once

// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined_*()
// (GCC bug 105593); the warnings point into the headers, so this must precede their inclusion.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cstdint>

#include "core/isa_region.h"

IRIS_AVX512_BEGIN
namespace iris::kernels::cpu {

// Mask selecting the first n (0..16) lanes.
inline __mmask16 TailMask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// e^x, about 1 ulp (Cephes expf polynomial after Cody-Waite reduction). Returns +inf above
// ~88.72, exactly 0 below -88 (no denormals), NaN for NaN.
inline __m512 Exp(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
  const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-88.0f), _CMP_LT_OQ);
  __m512 xc = _mm512_min_ps(x, _mm512_set1_ps(88.8f));
  xc = _mm512_max_ps(xc, _mm512_set1_ps(-88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, xc);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  __m512 y = _mm512_scalef_ps(p, n);
  y = _mm512_mask_mov_ps(y, tiny, _mm512_setzero_ps());
  // NaN in, NaN out.
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(y, nan, x);
}

// silu(x) = x / (1 + e^-x), with a true division as torch does.
inline __m512 Silu(__m512 x) {
  const __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// The Chebyshev fit of Numerical Recipes' erfcc: erfc(z) = t * exp(-z^2 + P(t)), t = 1/(1+z/2),
// z >= 0, relative error < 1.2e-7. Returns P(t).
inline __m512 ErfcPoly(__m512 t) {
  __m512 p = _mm512_set1_ps(0.17087277f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.82215223f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.48851587f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.13520398f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.27886807f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.18628806f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.09678418f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.37409196f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.00002368f));
  return _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.26551223f));
}

// gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2))) = 0.5 * x * erfc(-x / sqrt(2)), the erf form,
// evaluated through erfc so that it keeps its relative accuracy for negative x. The exponent
// -z^2 = -x^2/2 is formed with one rounding (fnmadd of 0.5x and x), not from a rounded z.
inline __m512 GeluErf(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 half_x = _mm512_mul_ps(_mm512_set1_ps(0.5f), x);
  const __m512 az = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));  // |z|
  const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.5f), az, one));
  const __m512 arg = _mm512_fnmadd_ps(half_x, x, ErfcPoly(t));
  const __m512 e = _mm512_mul_ps(t, Exp(arg));  // erfc(|z|)
  // z = -x/sqrt(2): erfc(z) = e for x <= 0, 2 - e for x > 0.
  const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
  const __m512 ec = _mm512_mask_sub_ps(e, pos, _mm512_set1_ps(2.0f), e);
  return _mm512_mul_ps(half_x, ec);
}

inline float HorizontalSum(__m512 v) { return _mm512_reduce_add_ps(v); }
inline float HorizontalMax(__m512 v) { return _mm512_reduce_max_ps(v); }

// Rounds f32 lanes to bf16 (round to nearest even; NaN stays a quiet NaN) in software, in the
// low 16 bits of each 32-bit lane.
inline __m512i RoundToBf16Lanes(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
  r = _mm512_srli_epi32(r, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

// 32 floats -> 32 bf16 (round to nearest even), as the checkpoints round: one AVX512-BF16
// instruction (tier kAvx512Bf16 only), else in software with the same result for normal numbers.
template <bool kNativeBf16>
inline __m512i ToBf16x32(__m512 lo, __m512 hi) {
  if constexpr (kNativeBf16) {
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  } else {
    const __m256i l = _mm512_cvtepi32_epi16(RoundToBf16Lanes(lo));
    const __m256i h = _mm512_cvtepi32_epi16(RoundToBf16Lanes(hi));
    return _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
  }
}

// Converts n floats to bf16 (round to nearest even).
template <bool kNativeBf16>
inline void FloatToBf16Row(const float* x, int64_t n, uint16_t* y) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i v = ToBf16x32<kNativeBf16>(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16));
    _mm512_storeu_si512(y + i, v);
  }
  if (i < n) {
    const int64_t rem = n - i;
    const __m512 lo = _mm512_maskz_loadu_ps(TailMask(rem), x + i);
    const __m512 hi = _mm512_maskz_loadu_ps(TailMask(rem - 16 > 0 ? rem - 16 : 0), x + i + 16);
    const __m512i v = ToBf16x32<kNativeBf16>(lo, hi);
    _mm512_mask_storeu_epi16(y + i, static_cast<__mmask32>((rem >= 32) ? 0xFFFFFFFFu : ((1u << rem) - 1u)), v);
  }
}

// prefetcht1 as a volatile asm: GCC's IPA pure-const analysis takes a function that only
// prefetches for side-effect free and deletes its calls (seen with GCC 12).
inline void PrefetchL2(const void* p) { asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p))); }

// In-register transpose of 16 rows of 16 floats.
inline void Transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  // r[4i + k] now holds, in each 128-bit lane L, element k of rows 4i..4i+3 for columns 4L..4L+3.
  for (int i = 0; i < 4; ++i) {
    // Combine across groups of 4 rows: 128-bit lane shuffles.
    const __m512 a = r[i], b = r[4 + i], c = r[8 + i], d = r[12 + i];
    const __m512 ab_lo = _mm512_shuffle_f32x4(a, b, 0x44);  // a.L0 a.L1 b.L0 b.L1
    const __m512 ab_hi = _mm512_shuffle_f32x4(a, b, 0xEE);  // a.L2 a.L3 b.L2 b.L3
    const __m512 cd_lo = _mm512_shuffle_f32x4(c, d, 0x44);
    const __m512 cd_hi = _mm512_shuffle_f32x4(c, d, 0xEE);
    t[i] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0x88);       // a.L0 b.L0 c.L0 d.L0
    t[4 + i] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0xDD);   // a.L1 b.L1 c.L1 d.L1
    t[8 + i] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0x88);   // L2
    t[12 + i] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0xDD);  // L3
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

inline __m512bh AsBh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

}  // namespace iris::kernels::cpu
IRIS_AVX512_END
