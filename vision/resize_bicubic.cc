#include "vision/resize_bicubic.h"

// GCC 12 warns about the _mm512_undefined_* idiom inside its own AVX-512 headers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/host_cpu.h"
#include "core/isa_region.h"
#include "core/parallel_for.h"
#include "vision/resize_bicubic_internal.h"

namespace iris::vision {
namespace internal {
namespace {

// Keeps the compiler from fusing a multiply into a following add (GCC's default
// -ffp-contract=fast would otherwise emit FMAs, and the weights must round as Pillow's do).
inline double NoFma(double v) {
  asm("" : "+x"(v));
  return v;
}

// Pillow's bicubic_filter (Keys, a = -0.5), same operation order.
double BicubicFilter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return NoFma(NoFma(NoFma((a + 2.0) * x) - (a + 3.0)) * x * x) + 1;
  if (x < 2.0) return NoFma(NoFma(NoFma(NoFma((x - 5) * x) + 8) * x) - 4) * a;
  return 0.0;
}

inline uint8_t Clip8(int32_t v) {
  if (v >= (1 << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<uint8_t>(v >> kPrecisionBits);
}

IRIS_AVX512_VBMI_BEGIN
// 16 int32 lanes -> 16 bytes: >> 22, clamped to [0, 255].
inline __m128i PackClip(__m512i acc) {
  const __m512i v = _mm512_max_epi32(_mm512_srai_epi32(acc, kPrecisionBits), _mm512_setzero_si512());
  return _mm512_cvtusepi32_epi8(v);
}
IRIS_AVX512_VBMI_END

constexpr int kWindowBytes = 128;  // two zmm registers, addressed by vpermi2b
constexpr int kBlockPixels = 16;   // 48 output bytes = three zmm of int32 accumulators
constexpr int kPlanarWindow = 128; // pixels of one plane, two zmm registers

}  // namespace

AxisCoeffs ComputeAxisCoeffs(int in_size, int out_size) {
  AxisCoeffs c;
  c.in_size = in_size;
  c.out_size = out_size;
  // Pillow: filterscale = scale = (double)(in1 - in0) / outSize, with in0/in1 floats.
  const double scale = static_cast<double>(static_cast<float>(in_size) - 0.0f) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 2.0 * filterscale;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.start.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = 0.0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = BicubicFilter((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[x] /= ww;
    }
    int32_t* out = c.weights.data() + static_cast<size_t>(xx) * c.ksize;
    for (int x = 0; x < xmax; ++x) {
      out[x] = k[x] < 0 ? static_cast<int32_t>(-0.5 + k[x] * (1 << kPrecisionBits))
                        : static_cast<int32_t>(0.5 + k[x] * (1 << kPrecisionBits));
    }
    c.start[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

bool HorizontalPlan::BuildInterleaved() {
  for (int i = 0; i < c_.out_size;) {
    const int s0 = c_.start[i];
    int n = 0;
    int taps = 0;
    while (n < kBlockPixels && i + n < c_.out_size) {
      const int p = i + n;
      if ((c_.start[p] + c_.count[p] - s0) * 3 > kWindowBytes || c_.start[p] < s0) break;
      taps = std::max(taps, c_.count[p]);
      ++n;
    }
    if (n == 0) return false;  // one output's taps span more than the window
    blocks_.push_back({i, n, s0 * 3, taps, weights_.size()});
    for (int j = 0; j < 64; ++j) {
      const int p = i + j / 3;
      index_.push_back(j < 48 && j / 3 < n ? static_cast<uint8_t>((c_.start[p] - s0) * 3 + j % 3)
                                           : 0);
    }
    for (int k = 0; k < taps; ++k) {
      for (int j = 0; j < 48; ++j) {
        const int p = i + j / 3;
        weights_.push_back(j / 3 < n && k < c_.count[p] ? c_.w(p)[k] : 0);
      }
    }
    i += n;
  }
  return true;
}

bool HorizontalPlan::BuildPlanarBlocks() {
  for (int i = 0; i < c_.out_size;) {
    const int s0 = c_.start[i];
    int n = 0;
    int taps = 0;
    while (n < kBlockPixels && i + n < c_.out_size) {
      const int p = i + n;
      if (c_.start[p] + c_.count[p] - s0 > kPlanarWindow || c_.start[p] < s0) break;
      taps = std::max(taps, c_.count[p]);
      ++n;
    }
    if (n == 0) return false;
    blocks_.push_back({i, n, s0, taps, weights_.size()});
    for (int j = 0; j < 64; ++j) {
      index_.push_back(j < n ? static_cast<uint8_t>(c_.start[i + j] - s0) : 0);
    }
    for (int k = 0; k < taps; ++k) {
      for (int j = 0; j < 16; ++j) {
        weights_.push_back(j < n && k < c_.count[i + j] ? c_.w(i + j)[k] : 0);
      }
    }
    i += n;
  }
  return true;
}

void HorizontalPlan::BuildPlanarDot() {
  for (int p = 0; p < c_.out_size; ++p) {
    dot_wofs_.push_back(weights_.size());
    const int chunks = (c_.count[p] + 15) / 16;
    for (int k = 0; k < chunks * 16; ++k) weights_.push_back(k < c_.count[p] ? c_.w(p)[k] : 0);
  }
}

HorizontalPlan::HorizontalPlan(AxisCoeffs coeffs, std::optional<Mode> force) : c_(std::move(coeffs)) {
  auto reset = [&] {
    blocks_.clear();
    index_.clear();
    weights_.clear();
    dot_wofs_.clear();
  };
  auto build = [&](Mode m) -> bool {
    reset();
    switch (m) {
      case Mode::kScalar: return true;
      case Mode::kInterleaved: return BuildInterleaved();
      case Mode::kPlanarBlocks: return BuildPlanarBlocks();
      case Mode::kPlanarDot: BuildPlanarDot(); return true;
    }
    return false;
  };
  if (!core::HostHasAvx512Vbmi()) {  // the vector kernels are AVX-512 (VBMI byte permutes)
    mode_ = Mode::kScalar;
    return;
  }
  if (force.has_value()) {
    mode_ = build(*force) ? *force : Mode::kScalar;
    if (mode_ == Mode::kScalar) reset();
    return;
  }
  // Vector instructions per row, roughly: an interleaved block step covers 16 pixels x 3
  // channels in 12 instructions, a planar one 16 pixels of one channel in 4; splitting the row
  // into planes and merging them back costs about 6 per 16 pixels each.
  const double planes = 6.0 * (c_.in_size + c_.out_size) / 16.0;
  double best = 0;
  Mode best_mode = Mode::kScalar;
  auto consider = [&](Mode m, double cost) {
    if (best_mode == Mode::kScalar || cost < best) {
      best = cost;
      best_mode = m;
    }
  };
  if (build(Mode::kInterleaved)) {
    double cost = 0;
    for (const Block& b : blocks_) cost += 12.0 * b.taps;
    consider(Mode::kInterleaved, cost);
  }
  if (build(Mode::kPlanarBlocks)) {
    double cost = planes;
    for (const Block& b : blocks_) cost += 3 * 4.0 * b.taps;
    consider(Mode::kPlanarBlocks, cost);
  }
  {
    double cost = planes;
    for (int p = 0; p < c_.out_size; ++p) cost += 3 * (4.0 * ((c_.count[p] + 15) / 16) + 8.0);
    consider(Mode::kPlanarDot, cost);
  }
  mode_ = best_mode;
  build(mode_);
}

namespace {

IRIS_AVX512_VBMI_BEGIN
// R input rows through one horizontal plan block.
template <int R>
inline void HorizontalBlock(const uint8_t* const* in_rows, uint8_t* const* out_rows, int64_t row_bytes,
                            int in_byte0, int out_byte0, int npix, int taps, const uint8_t* index,
                            const int32_t* weights) {
  __m512i lo[R], hi[R], acc[R][3];
  const __m512i bias = _mm512_set1_epi32(1 << (kPrecisionBits - 1));
  const int64_t avail = row_bytes - in_byte0;
  if (avail >= kWindowBytes) {
    for (int r = 0; r < R; ++r) {
      lo[r] = _mm512_loadu_si512(in_rows[r] + in_byte0);
      hi[r] = _mm512_loadu_si512(in_rows[r] + in_byte0 + 64);
    }
  } else {  // the row's last blocks: read nothing past its end
    const __mmask64 lo_mask = avail >= 64 ? ~__mmask64{0} : (__mmask64{1} << avail) - 1;
    const __mmask64 hi_mask = avail <= 64 ? 0 : (__mmask64{1} << (avail - 64)) - 1;
    for (int r = 0; r < R; ++r) {
      lo[r] = _mm512_maskz_loadu_epi8(lo_mask, in_rows[r] + in_byte0);
      hi[r] = _mm512_maskz_loadu_epi8(hi_mask, in_rows[r] + in_byte0 + 64);
    }
  }
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = acc[r][2] = bias;
  __m512i idx = _mm512_loadu_si512(index);
  const __m512i three = _mm512_set1_epi8(3);
  for (int k = 0; k < taps; ++k) {
    const __m512i w0 = _mm512_loadu_si512(weights + 48 * k);
    const __m512i w1 = _mm512_loadu_si512(weights + 48 * k + 16);
    const __m512i w2 = _mm512_loadu_si512(weights + 48 * k + 32);
    for (int r = 0; r < R; ++r) {
      const __m512i v = _mm512_permutex2var_epi8(lo[r], idx, hi[r]);
      const __m512i p0 = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(v));
      const __m512i p1 = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 1));
      const __m512i p2 = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 2));
      acc[r][0] = _mm512_add_epi32(acc[r][0], _mm512_mullo_epi32(p0, w0));
      acc[r][1] = _mm512_add_epi32(acc[r][1], _mm512_mullo_epi32(p1, w1));
      acc[r][2] = _mm512_add_epi32(acc[r][2], _mm512_mullo_epi32(p2, w2));
    }
    idx = _mm512_add_epi8(idx, three);
  }
  const int nbytes = npix * 3;
  for (int r = 0; r < R; ++r) {
    uint8_t* dst = out_rows[r] + out_byte0;
    const __m128i b0 = PackClip(acc[r][0]);
    const __m128i b1 = PackClip(acc[r][1]);
    const __m128i b2 = PackClip(acc[r][2]);
    if (nbytes == 48) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), b0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), b1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 32), b2);
    } else {
      auto mask = [&](int part) -> __mmask16 {
        const int n = std::clamp(nbytes - 16 * part, 0, 16);
        return static_cast<__mmask16>((1u << n) - 1);
      };
      _mm_mask_storeu_epi8(dst, mask(0), b0);
      _mm_mask_storeu_epi8(dst + 16, mask(1), b1);
      _mm_mask_storeu_epi8(dst + 32, mask(2), b2);
    }
  }
}

IRIS_AVX512_VBMI_END

void HorizontalRowScalar(const AxisCoeffs& c, const uint8_t* in, uint8_t* out) {
  for (int xx = 0; xx < c.out_size; ++xx) {
    const int xmin = c.start[xx];
    const int n = c.count[xx];
    const int32_t* k = c.w(xx);
    int32_t ss0 = 1 << (kPrecisionBits - 1), ss1 = ss0, ss2 = ss0;
    for (int x = 0; x < n; ++x) {
      const uint8_t* px = in + (x + xmin) * 3;
      ss0 += px[0] * k[x];
      ss1 += px[1] * k[x];
      ss2 += px[2] * k[x];
    }
    out[xx * 3 + 0] = Clip8(ss0);
    out[xx * 3 + 1] = Clip8(ss1);
    out[xx * 3 + 2] = Clip8(ss2);
  }
}

}  // namespace

IRIS_AVX512_VBMI_BEGIN
void HorizontalPlan::RunInterleaved(const uint8_t* const* in_rows, uint8_t* const* out_rows,
                                    int n) const {
  const int64_t row_bytes = static_cast<int64_t>(c_.in_size) * 3;
  constexpr int kRows = 4;
  int i = 0;
  for (; i + kRows <= n; i += kRows) {
    for (size_t b = 0; b < blocks_.size(); ++b) {
      const Block& blk = blocks_[b];
      HorizontalBlock<kRows>(in_rows + i, out_rows + i, row_bytes, blk.in0, blk.out0 * 3,
                             blk.npix, blk.taps, index_.data() + 64 * b, weights_.data() + blk.wofs);
    }
  }
  for (; i < n; ++i) {
    for (size_t b = 0; b < blocks_.size(); ++b) {
      const Block& blk = blocks_[b];
      HorizontalBlock<1>(in_rows + i, out_rows + i, row_bytes, blk.in0, blk.out0 * 3,
                         blk.npix, blk.taps, index_.data() + 64 * b, weights_.data() + blk.wofs);
    }
  }
}

namespace {

// Lane c*16 + i of the result is byte 3*i + c of the source (16 RGB pixels -> 3 planes).
inline __m512i DeinterleaveIndex() {
  alignas(64) uint8_t idx[64] = {};
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 16; ++i) idx[c * 16 + i] = static_cast<uint8_t>(3 * i + c);
  }
  return _mm512_load_si512(idx);
}

// Byte 3*i + c of the result is lane c*16 + i of the source (3 planes -> 16 RGB pixels).
inline __m512i InterleaveIndex() {
  alignas(64) uint8_t idx[64] = {};
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 16; ++i) idx[3 * i + c] = static_cast<uint8_t>(c * 16 + i);
  }
  return _mm512_load_si512(idx);
}

void SplitPlanes(const uint8_t* src, int width, uint8_t* p0, uint8_t* p1, uint8_t* p2) {
  const __m512i perm = DeinterleaveIndex();
  const int64_t bytes = static_cast<int64_t>(width) * 3;
  for (int x = 0; x < width; x += 16) {
    const int64_t b = static_cast<int64_t>(x) * 3;
    const __m512i v = b + 64 <= bytes ? _mm512_loadu_si512(src + b)
                                      : _mm512_maskz_loadu_epi8((__mmask64{1} << (bytes - b)) - 1, src + b);
    const __m512i q = _mm512_permutexvar_epi8(perm, v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p0 + x), _mm512_castsi512_si128(q));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p1 + x), _mm512_extracti32x4_epi32(q, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p2 + x), _mm512_extracti32x4_epi32(q, 2));
  }
}

void MergePlanes(const uint8_t* p0, const uint8_t* p1, const uint8_t* p2, int width, uint8_t* dst) {
  const __m512i perm = InterleaveIndex();
  for (int x = 0; x < width; x += 16) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + x)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + x)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p2 + x)), 2);
    const __m512i q = _mm512_permutexvar_epi8(perm, v);
    const int n = std::min(16, width - x) * 3;
    uint8_t* d = dst + static_cast<int64_t>(x) * 3;
    if (n == 48) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm512_castsi512_si256(q));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 32), _mm512_extracti32x4_epi32(q, 2));
    } else {
      _mm512_mask_storeu_epi8(d, (__mmask64{1} << n) - 1, q);
    }
  }
}

// R plane rows (one channel) through one planar block: 16 output pixels whose taps lie in a
// 128-pixel window.
template <int R>
inline void PlanarBlock(const uint8_t* const* planes, uint8_t* const* outs, int in0, int out0,
                        int taps, const uint8_t* index, const int32_t* weights) {
  __m512i lo[R], hi[R], acc[R];
  const __m512i bias = _mm512_set1_epi32(1 << (kPrecisionBits - 1));
  for (int r = 0; r < R; ++r) {
    lo[r] = _mm512_loadu_si512(planes[r] + in0);
    hi[r] = _mm512_loadu_si512(planes[r] + in0 + 64);
    acc[r] = bias;
  }
  __m512i idx = _mm512_loadu_si512(index);
  const __m512i one = _mm512_set1_epi8(1);
  for (int k = 0; k < taps; ++k) {
    const __m512i w = _mm512_loadu_si512(weights + 16 * k);
    for (int r = 0; r < R; ++r) {
      const __m512i v = _mm512_permutex2var_epi8(lo[r], idx, hi[r]);
      acc[r] = _mm512_add_epi32(acc[r], _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(v)), w));
    }
    idx = _mm512_add_epi8(idx, one);
  }
  for (int r = 0; r < R; ++r) _mm_storeu_si128(reinterpret_cast<__m128i*>(outs[r] + out0), PackClip(acc[r]));
}

// R rows x 3 planes, one output pixel: its taps 16 at a time, then a horizontal sum.
template <int R>
inline void PlanarDot(const uint8_t* const* planes, uint8_t* const* outs, int p, int start,
                      int chunks, const int32_t* weights) {
  __m512i acc[R * 3];
  for (int j = 0; j < R * 3; ++j) acc[j] = _mm512_setzero_si512();
  for (int k = 0; k < chunks; ++k) {
    const __m512i w = _mm512_loadu_si512(weights + 16 * k);
    for (int j = 0; j < R * 3; ++j) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(planes[j] + start + 16 * k));
      acc[j] = _mm512_add_epi32(acc[j], _mm512_mullo_epi32(_mm512_cvtepu8_epi32(b), w));
    }
  }
  for (int j = 0; j < R * 3; ++j) outs[j][p] = Clip8((1 << (kPrecisionBits - 1)) + _mm512_reduce_add_epi32(acc[j]));
}

constexpr int kPlanePad = 192;  // readable slack after a plane row (window loads, 16-byte steps)

}  // namespace

void HorizontalPlan::RunPlanar(const uint8_t* const* in_rows, uint8_t* const* out_rows, int n) const {
  constexpr int kRows = 4;
  const size_t in_plane = (static_cast<size_t>(c_.in_size) + kPlanePad + 63) / 64 * 64;
  const size_t out_plane = (static_cast<size_t>(c_.out_size) + 64 + 63) / 64 * 64;
  thread_local std::vector<uint8_t> scratch;
  const size_t need = kRows * 3 * (in_plane + out_plane) + 64;
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  const uint8_t* ip[kRows * 3];  // [row][channel]
  uint8_t* op[kRows * 3];
  uint8_t* ipw[kRows * 3];
  for (int j = 0; j < kRows * 3; ++j) {
    ipw[j] = base + j * in_plane;
    ip[j] = ipw[j];
    op[j] = base + kRows * 3 * in_plane + j * out_plane;
  }
  for (int i = 0; i < n; i += kRows) {
    const int rn = std::min(kRows, n - i);
    for (int r = 0; r < rn; ++r) SplitPlanes(in_rows[i + r], c_.in_size, ipw[r * 3], ipw[r * 3 + 1], ipw[r * 3 + 2]);
    if (mode_ == Mode::kPlanarBlocks) {
      for (int c = 0; c < 3; ++c) {
        const uint8_t* planes[kRows];
        uint8_t* outs[kRows];
        for (int r = 0; r < kRows; ++r) {
          planes[r] = ip[r * 3 + c];
          outs[r] = op[r * 3 + c];
        }
        for (size_t b = 0; b < blocks_.size(); ++b) {
          const Block& blk = blocks_[b];
          if (rn == kRows) {
            PlanarBlock<kRows>(planes, outs, blk.in0, blk.out0, blk.taps, index_.data() + 64 * b, weights_.data() + blk.wofs);
          } else {
            for (int r = 0; r < rn; ++r) {
              PlanarBlock<1>(planes + r, outs + r, blk.in0, blk.out0, blk.taps, index_.data() + 64 * b, weights_.data() + blk.wofs);
            }
          }
        }
      }
    } else {
      for (int p = 0; p < c_.out_size; ++p) {
        const int chunks = (c_.count[p] + 15) / 16;
        const int32_t* w = weights_.data() + dot_wofs_[p];
        if (rn == kRows) {
          PlanarDot<kRows>(ip, op, p, c_.start[p], chunks, w);
        } else {
          for (int r = 0; r < rn; ++r) PlanarDot<1>(ip + r * 3, op + r * 3, p, c_.start[p], chunks, w);
        }
      }
    }
    for (int r = 0; r < rn; ++r) MergePlanes(op[r * 3], op[r * 3 + 1], op[r * 3 + 2], c_.out_size, out_rows[i + r]);
  }
}

IRIS_AVX512_VBMI_END

void HorizontalPlan::Run(const uint8_t* const* in_rows, uint8_t* const* out_rows, int n) const {
  switch (mode_) {
    case Mode::kScalar:
      for (int i = 0; i < n; ++i) HorizontalRowScalar(c_, in_rows[i], out_rows[i]);
      return;
    case Mode::kInterleaved:
      RunInterleaved(in_rows, out_rows, n);
      return;
    case Mode::kPlanarBlocks:
    case Mode::kPlanarDot:
      RunPlanar(in_rows, out_rows, n);
      return;
  }
}

void VerticalRowScalar(const AxisCoeffs& c, int yy, const uint8_t* const* rows, int64_t bytes, uint8_t* out) {
  const int s = c.start[yy];
  const int32_t* w = c.w(yy);
  for (int64_t x = 0; x < bytes; ++x) {
    int32_t ss = 1 << (kPrecisionBits - 1);
    for (int k = 0; k < c.count[yy]; ++k) ss += rows[s + k][x] * w[k];
    out[x] = Clip8(ss);
  }
}

void VerticalRow(const AxisCoeffs& c, int yy, const uint8_t* const* rows, int64_t bytes, uint8_t* out) {
  if (core::HostHasAvx512Vbmi()) {
    VerticalRowAvx512(c, yy, rows, bytes, out);
  } else {
    VerticalRowScalar(c, yy, rows, bytes, out);
  }
}

IRIS_AVX512_VBMI_BEGIN
void VerticalRowAvx512(const AxisCoeffs& c, int yy, const uint8_t* const* rows, int64_t bytes, uint8_t* out) {
  const int s = c.start[yy];
  const int n = c.count[yy];
  const int32_t* w = c.w(yy);
  const __m512i bias = _mm512_set1_epi32(1 << (kPrecisionBits - 1));
  int64_t x = 0;
  for (; x + 64 <= bytes; x += 64) {
    __m512i a0 = bias, a1 = bias, a2 = bias, a3 = bias;
    for (int k = 0; k < n; ++k) {
      const __m512i wk = _mm512_set1_epi32(w[k]);
      const uint8_t* r = rows[s + k] + x;
      a0 = _mm512_add_epi32(a0, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r))), wk));
      a1 = _mm512_add_epi32(a1, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 16))), wk));
      a2 = _mm512_add_epi32(a2, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 32))), wk));
      a3 = _mm512_add_epi32(a3, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 48))), wk));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + x), PackClip(a0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + x + 16), PackClip(a1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + x + 32), PackClip(a2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + x + 48), PackClip(a3));
  }
  for (; x < bytes; x += 16) {
    const int64_t left = bytes - x;
    const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
    __m512i a = bias;
    for (int k = 0; k < n; ++k) {
      const __m512i wk = _mm512_set1_epi32(w[k]);
      a = _mm512_add_epi32(a, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, rows[s + k] + x)), wk));
    }
    _mm_mask_storeu_epi8(out + x, m, PackClip(a));
  }
}
IRIS_AVX512_VBMI_END

void ResizeStrips(const RgbImage& in, int out_height, int out_width, int strip_rows, RgbImage* dst,
                  StripFn emit) {
  const bool need_h = out_width != in.width;
  const bool need_v = out_height != in.height;
  const int strips = (out_height + strip_rows - 1) / strip_rows;
  const int64_t out_row_bytes = static_cast<int64_t>(out_width) * 3;
  const int64_t stride = out_row_bytes + kScratchRowPad;

  AxisCoeffs vert;
  if (need_v) vert = ComputeAxisCoeffs(in.height, out_height);
  std::optional<HorizontalPlan> hplan;
  if (need_h) hplan.emplace(ComputeAxisCoeffs(in.width, out_width));
  auto strip_end = [&](int s) { return std::min(out_height, (s + 1) * strip_rows); };
  // Input rows [first, end) that strip s reads.
  auto strip_input = [&](int s) -> std::pair<int, int> {
    if (!need_v) return {s * strip_rows, strip_end(s)};
    const int y0 = s * strip_rows, y1 = strip_end(s) - 1;
    return {vert.start[y0], vert.start[y1] + vert.count[y1]};
  };
  // Horizontal rows go to a ring when a vertical pass follows, else straight to their place.
  const bool ring_needed = need_h && need_v;
  int ring_rows = 0;
  if (ring_needed) {
    for (int s = 0; s < strips; ++s) {
      const auto [a, b] = strip_input(s);
      ring_rows = std::max(ring_rows, b - a);
    }
  }

  // Consecutive strips share input rows: hand them out in runs so that a worker mostly
  // continues where it left off, yet small enough to balance the workers.
  const int workers = core::ParallelWorkers();
  const int run = std::max(1, std::min(8, strips / (4 * workers)));
  const int items = (strips + run - 1) / run;

  struct Scratch {
    std::unique_ptr<uint8_t[]> ring;   // horizontally resampled input rows, by row % ring_rows
    std::unique_ptr<uint8_t[]> strip;  // the strip's output rows (without dst)
    std::vector<const uint8_t*> hrows;  // horizontally resampled rows, by input row
    std::vector<const uint8_t*> rows;
    std::vector<const uint8_t*> in_rows;
    std::vector<uint8_t*> out_rows;
    int have_begin = 0, have_end = 0;  // input rows resampled into the ring
  };
  std::vector<std::unique_ptr<Scratch>> scratch(workers);

  core::ParallelFor(items, [&](int item, int worker) {
    if (scratch[worker] == nullptr) {
      auto sc = std::make_unique<Scratch>();
      if (ring_needed) sc->ring.reset(new uint8_t[static_cast<size_t>(ring_rows) * stride]);
      if ((need_h || need_v) && dst == nullptr) {
        sc->strip.reset(new uint8_t[static_cast<size_t>(strip_rows) * stride]);
      }
      sc->hrows.assign(in.height, nullptr);
      sc->rows.resize(strip_rows);
      scratch[worker] = std::move(sc);
    }
    Scratch& sc = *scratch[worker];
    auto out_row = [&](int s, int i) -> uint8_t* {
      return dst != nullptr ? dst->row(s * strip_rows + i) : sc.strip.get() + static_cast<size_t>(i) * stride;
    };
    const int s_end = std::min(strips, (item + 1) * run);
    for (int s = item * run; s < s_end; ++s) {
      const int count = strip_end(s) - s * strip_rows;
      const auto [a, b] = strip_input(s);
      if (ring_needed) {
        if (a < sc.have_begin || a > sc.have_end) sc.have_begin = sc.have_end = a;
        sc.in_rows.clear();
        sc.out_rows.clear();
        for (int y = std::max(a, sc.have_end); y < b; ++y) {
          uint8_t* slot = sc.ring.get() + static_cast<size_t>(y % ring_rows) * stride;
          sc.in_rows.push_back(in.row(y));
          sc.out_rows.push_back(slot);
          sc.hrows[y] = slot;
        }
        hplan->Run(sc.in_rows.data(), sc.out_rows.data(), static_cast<int>(sc.in_rows.size()));
        sc.have_end = b;
        sc.have_begin = std::max(sc.have_begin, b - ring_rows);
      } else if (need_h) {  // rows map one to one
        sc.in_rows.clear();
        sc.out_rows.clear();
        for (int i = 0; i < count; ++i) {
          sc.in_rows.push_back(in.row(a + i));
          sc.out_rows.push_back(out_row(s, i));
          sc.rows[i] = sc.out_rows.back();
        }
        hplan->Run(sc.in_rows.data(), sc.out_rows.data(), count);
      } else {
        for (int y = a; y < b; ++y) sc.hrows[y] = in.row(y);
      }
      if (need_v) {
        for (int i = 0; i < count; ++i) {
          uint8_t* d = out_row(s, i);
          VerticalRow(vert, s * strip_rows + i, sc.hrows.data(), out_row_bytes, d);
          sc.rows[i] = d;
        }
      } else if (!need_h) {  // no resize at all: the input rows themselves
        for (int i = 0; i < count; ++i) {
          sc.rows[i] = in.row(s * strip_rows + i);
          if (dst != nullptr) std::memcpy(dst->row(s * strip_rows + i), sc.rows[i], out_row_bytes);
        }
      }
      // Scratch rows are padded; image rows are not (the last one ends its buffer).
      const bool scratch_rows = dst == nullptr && (need_h || need_v);
      emit(s, sc.rows.data(), count, scratch_rows ? stride : out_row_bytes);
    }
  });
}

RgbImage ResizeBicubicReference(const RgbImage& in, int out_height, int out_width) {
  if (out_height == in.height && out_width == in.width) return in;
  RgbImage cur = in;
  if (out_width != in.width) {
    const AxisCoeffs c = ComputeAxisCoeffs(in.width, out_width);
    RgbImage tmp;
    tmp.width = out_width;
    tmp.height = in.height;
    tmp.pixels.resize(static_cast<size_t>(tmp.width) * tmp.height * 3);
    for (int y = 0; y < in.height; ++y) HorizontalRowScalar(c, in.row(y), tmp.row(y));
    cur = std::move(tmp);
  }
  if (out_height != in.height) {
    const AxisCoeffs c = ComputeAxisCoeffs(in.height, out_height);
    RgbImage out;
    out.width = cur.width;
    out.height = out_height;
    out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
    const int bytes = cur.width * 3;
    for (int yy = 0; yy < out_height; ++yy) {
      const int32_t* k = c.w(yy);
      for (int b = 0; b < bytes; ++b) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int y = 0; y < c.count[yy]; ++y) ss += cur.row(c.start[yy] + y)[b] * k[y];
        out.row(yy)[b] = Clip8(ss);
      }
    }
    cur = std::move(out);
  }
  return cur;
}

}  // namespace internal

RgbImage ResizeBicubic(const RgbImage& in, int out_height, int out_width) {
  if (out_height <= 0 || out_width <= 0 || in.width <= 0 || in.height <= 0) {
    return RgbImage{std::max(out_width, 0), std::max(out_height, 0), {}};
  }
  if (out_height == in.height && out_width == in.width) return in;
  RgbImage out{out_width, out_height,
               std::vector<uint8_t>(static_cast<size_t>(out_width) * out_height * 3)};
  internal::ResizeStrips(in, out_height, out_width, 16, &out, [](int, const uint8_t* const*, int, int64_t) {});
  return out;
}

}  // namespace iris::vision
