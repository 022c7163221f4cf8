#include "vision/patchify.h"

// GCC 12 warns about the _mm512_undefined_* idiom inside its own AVX-512 headers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstring>
#include <memory>
#include <new>

#include "core/host_cpu.h"
#include "core/isa_region.h"
#include "vision/pixel_table.h"

namespace iris::vision::internal {

Patchifier::Patchifier(int patch, int temporal, int merge, const std::array<float, 3>& mean,
                       const std::array<float, 3>& std)
    : patch_(patch), temporal_(temporal), merge_(merge), mean_(mean), std_(std) {
  const std::array<float, kPixelTableSize> table = PixelTable(mean, std);
  std::memcpy(lut_, table.data(), sizeof(lut_));
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

namespace {

struct AlignedFree {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
};

}  // namespace

void Patchifier::Strip(const uint8_t* const* rows, int width, int64_t readable, float* out) const {
  if (patch_ > 16 || !core::HostHasAvx512Vbmi()) {
    StripScalar(rows, width, out);
    return;
  }
  StripAvx512(rows, width, readable, out);
}

IRIS_AVX512_VBMI_BEGIN
namespace {

// 16 bytes of one channel -> 16 normalized floats, with the reference's roundings:
// float32(double(u8) * (1/255)), then (x - mean) / std in float32.
inline __m512 Normalize(__m128i bytes, __m512 mean, __m512 std) {
  const __m512i i = _mm512_cvtepu8_epi32(bytes);
  const __m512d inv255 = _mm512_set1_pd(1.0 / 255.0);
  const __m512d lo = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(i)), inv255);
  const __m512d hi = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(i, 1)), inv255);
  const __m512 x = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);
  return _mm512_div_ps(_mm512_sub_ps(x, mean), std);
}

}  // namespace

// One merge group (m*m output rows) is assembled in an L1-resident buffer with masked stores,
// then written out whole: with 64-byte aligned groups (the usual case: 4 * 1176 floats), as
// non-temporal stores, which skip reading the destination lines.
void Patchifier::StripAvx512(const uint8_t* const* rows, int width, int64_t readable, float* out) const {
  const int P = patch_, T = temporal_, M = merge_;
  const int groups = width / (P * M);
  const int64_t row_len = row_length();
  const int64_t group_len = row_len * M * M;
  const int64_t plane = static_cast<int64_t>(P) * P;
  const bool stream = (group_len * sizeof(float)) % 64 == 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0;
  std::unique_ptr<float[], AlignedFree> buf(
      static_cast<float*>(::operator new[]((group_len + 16) * sizeof(float), std::align_val_t(64))));
  // Deinterleave P RGB pixels: channel c's bytes go to 16-byte lane c.
  alignas(64) uint8_t perm[64] = {};
  for (int c = 0; c < 3; ++c) {
    for (int x = 0; x < 16; ++x) perm[c * 16 + x] = static_cast<uint8_t>(x < P ? x * 3 + c : 0);
  }
  const __m512i perm_v = _mm512_load_si512(perm);
  const __mmask64 load_mask = (__mmask64{1} << (3 * P)) - 1;
  const __mmask16 store_mask = static_cast<__mmask16>((1u << P) - 1);
  __m512 mean[3], std[3];
  for (int c = 0; c < 3; ++c) {
    mean[c] = _mm512_set1_ps(mean_[c]);
    std[c] = _mm512_set1_ps(std_[c]);
  }
  for (int gx = 0; gx < groups; ++gx) {
    for (int dy = 0; dy < M; ++dy) {
      for (int dx = 0; dx < M; ++dx) {
        float* dst = buf.get() + (dy * M + dx) * row_len;
        const int64_t x0 = static_cast<int64_t>(gx * M + dx) * P * 3;
        const bool full_load = x0 + 64 <= readable;
        for (int y = 0; y < P; ++y) {
          const uint8_t* src = rows[dy * P + y] + x0;
          const __m512i px = full_load ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(load_mask, src);
          const __m512i planar = _mm512_permutexvar_epi8(perm_v, px);
          const __m512 v0 = Normalize(_mm512_castsi512_si128(planar), mean[0], std[0]);
          const __m512 v1 = Normalize(_mm512_extracti32x4_epi32(planar, 1), mean[1], std[1]);
          const __m512 v2 = Normalize(_mm512_extracti32x4_epi32(planar, 2), mean[2], std[2]);
          float* d = dst + y * P;
          for (int t = 0; t < T; ++t) {
            _mm512_mask_storeu_ps(d + (0 * T + t) * plane, store_mask, v0);
            _mm512_mask_storeu_ps(d + (1 * T + t) * plane, store_mask, v1);
            _mm512_mask_storeu_ps(d + (2 * T + t) * plane, store_mask, v2);
          }
        }
      }
    }
    float* gout = out + gx * group_len;
    if (stream) {
      for (int64_t i = 0; i < group_len; i += 16) _mm512_stream_ps(gout + i, _mm512_load_ps(buf.get() + i));
    } else {
      std::memcpy(gout, buf.get(), group_len * sizeof(float));
    }
  }
  if (stream) _mm_sfence();
}
IRIS_AVX512_VBMI_END

}  // namespace iris::vision::internal
