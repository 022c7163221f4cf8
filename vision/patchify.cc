#include "vision/patchify.h"

// GCC 12 warns about the _mm512_undefined_* idiom inside its own AVX-512 headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace iris::vision::internal {

Patchifier::Patchifier(int patch, int temporal, int merge, const std::array<float, 3>& mean,
                       const std::array<float, 3>& std)
    : patch_(patch), temporal_(temporal), merge_(merge) {
  // The reference: x = float32(double(u8) * (1/255)); then (x - mean) / std in float32.
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      const float x = static_cast<float>(static_cast<double>(v) * (1.0 / 255.0));
      lut_[c][v] = (x - mean[c]) / std[c];
    }
  }
}

// Output row order (reference: reshape [.., H/(mP), m, P, W/(mP), m, P] and transpose): merge
// groups in raster order, the m*m patches of a group consecutive in raster order; inside a row
// (channel, t, y, x).
void Patchifier::StripScalar(const uint8_t* const* rows, int width, float* out) const {
  const int P = patch_, T = temporal_, M = merge_;
  const int groups = width / (P * M);
  const int64_t row_len = row_length();
  for (int gx = 0; gx < groups; ++gx) {
    for (int dy = 0; dy < M; ++dy) {
      for (int dx = 0; dx < M; ++dx) {
        float* dst = out + ((static_cast<int64_t>(gx) * M + dy) * M + dx) * row_len;
        const int x0 = (gx * M + dx) * P;
        for (int c = 0; c < 3; ++c) {
          for (int t = 0; t < T; ++t) {
            float* d = dst + (static_cast<int64_t>(c) * T + t) * P * P;
            for (int y = 0; y < P; ++y) {
              const uint8_t* src = rows[dy * P + y] + x0 * 3 + c;
              for (int x = 0; x < P; ++x) d[y * P + x] = lut_[c][src[x * 3]];
            }
          }
        }
      }
    }
  }
}

void Patchifier::Strip(const uint8_t* const* rows, int width, float* out) const {
  const int P = patch_, T = temporal_, M = merge_;
  if (P > 16) {
    StripScalar(rows, width, out);
    return;
  }
  const int groups = width / (P * M);
  const int64_t row_len = row_length();
  const int64_t plane = static_cast<int64_t>(P) * P;
  // Deinterleave P RGB pixels: channel c's bytes go to 16-byte lane c.
  alignas(64) uint8_t perm[64] = {};
  for (int c = 0; c < 3; ++c) {
    for (int x = 0; x < 16; ++x) perm[c * 16 + x] = static_cast<uint8_t>(x < P ? x * 3 + c : 0);
  }
  const __m512i perm_v = _mm512_load_si512(perm);
  const __mmask64 load_mask = (__mmask64{1} << (3 * P)) - 1;
  const __m512 zero = _mm512_setzero_ps();
  const __mmask16 all = 0xFFFF;
  const __mmask16 store_mask = static_cast<__mmask16>((1u << P) - 1);
  for (int gx = 0; gx < groups; ++gx) {
    for (int dy = 0; dy < M; ++dy) {
      for (int dx = 0; dx < M; ++dx) {
        float* dst = out + ((static_cast<int64_t>(gx) * M + dy) * M + dx) * row_len;
        const int64_t x0 = static_cast<int64_t>(gx * M + dx) * P * 3;
        for (int y = 0; y < P; ++y) {
          const __m512i px = _mm512_maskz_loadu_epi8(load_mask, rows[dy * P + y] + x0);
          const __m512i planar = _mm512_permutexvar_epi8(perm_v, px);
          const __m512i i0 = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(planar));
          const __m512i i1 = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(planar, 1));
          const __m512i i2 = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(planar, 2));
          const __m512 v0 = _mm512_mask_i32gather_ps(zero, all, i0, lut_[0], 4);
          const __m512 v1 = _mm512_mask_i32gather_ps(zero, all, i1, lut_[1], 4);
          const __m512 v2 = _mm512_mask_i32gather_ps(zero, all, i2, lut_[2], 4);
          float* d = dst + y * P;
          for (int t = 0; t < T; ++t) {
            _mm512_mask_storeu_ps(d + (0 * T + t) * plane, store_mask, v0);
            _mm512_mask_storeu_ps(d + (1 * T + t) * plane, store_mask, v1);
            _mm512_mask_storeu_ps(d + (2 * T + t) * plane, store_mask, v2);
          }
        }
      }
    }
  }
}

}  // namespace iris::vision::internal
