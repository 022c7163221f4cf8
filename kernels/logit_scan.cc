#include "kernels/logit_scan.h"

#include <immintrin.h>

#include "kernels/exp_lane.h"
#include "kernels/cpu/portable/vec8.h"

namespace iris::kernels {
namespace {

// Independent accumulators: the loops below keep this many partial results so that the compiler
// can hold them in vector registers (and a sum is not one serial chain of 152k additions).
constexpr int kLanes = 16;

// e^(x - shift) for 8 logits, NaN as -inf.
__m256 Exp8Shifted(__m256 x, __m256 shift) {
  const __m256 ordered = _mm256_cmp_ps(x, x, _CMP_ORD_Q);
  x = _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), x, ordered);
  return cpu::portable::Exp8(_mm256_sub_ps(x, shift));
}

}  // namespace

float Exp(float x) { return ExpLane(x); }

float RowMax(const float* x, int64_t n) {
  float m[kLanes];
  for (float& v : m) v = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];  // NaN: false, m stays
  }
  for (; i < n; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
  float best = m[0];
  for (int j = 1; j < kLanes; ++j) best = m[j] > best ? m[j] : best;
  return best;
}

double ExpShiftedRow(const float* logits, int64_t n, float shift, float* probs, std::vector<double>& chunk_sums) {
  static_assert(kLogitChunk % 16 == 0);
  const int64_t chunks = (n + kLogitChunk - 1) / kLogitChunk;
  chunk_sums.resize(static_cast<size_t>(chunks));
  const __m256 vshift = _mm256_set1_ps(shift);
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kLogitChunk, end = begin + kLogitChunk < n ? begin + kLogitChunk : n;
    // Four accumulators of 4 doubles: 16 partial sums, in a fixed order whatever the machine.
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      const __m256 a = Exp8Shifted(_mm256_loadu_ps(logits + i), vshift);
      const __m256 b = Exp8Shifted(_mm256_loadu_ps(logits + i + 8), vshift);
      _mm256_storeu_ps(probs + i, a);
      _mm256_storeu_ps(probs + i + 8, b);
      s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
      s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
      s2 = _mm256_add_pd(s2, _mm256_cvtps_pd(_mm256_castps256_ps128(b)));
      s3 = _mm256_add_pd(s3, _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1)));
    }
    double lanes[16];
    _mm256_storeu_pd(lanes, s0);
    _mm256_storeu_pd(lanes + 4, s1);
    _mm256_storeu_pd(lanes + 8, s2);
    _mm256_storeu_pd(lanes + 12, s3);
    for (; i < end; ++i) {  // the row's last, partial chunk
      probs[i] = Exp(NanAsNegInf(logits[i]) - shift);
      lanes[0] += probs[i];
    }
    double sum = 0.0;
    for (const double v : lanes) sum += v;
    chunk_sums[static_cast<size_t>(c)] = sum;
    total += sum;
  }
  return total;
}

double MassAbove(const float* probs, int64_t n, float threshold, std::vector<double>& chunk_sums, int64_t* ties) {
  const int64_t chunks = (n + kLogitChunk - 1) / kLogitChunk;
  chunk_sums.resize(static_cast<size_t>(chunks));
  const __m256 vt = _mm256_set1_ps(threshold);
  int64_t equal = 0;
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kLogitChunk, end = begin + kLogitChunk < n ? begin + kLogitChunk : n;
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      const __m256 p = _mm256_loadu_ps(probs + i);
      const __m256 above = _mm256_and_ps(p, _mm256_cmp_ps(p, vt, _CMP_GT_OQ));
      s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(above)));
      s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(above, 1)));
      equal += __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(p, vt, _CMP_EQ_OQ))));
    }
    double lanes[8];
    _mm256_storeu_pd(lanes, s0);
    _mm256_storeu_pd(lanes + 4, s1);
    for (; i < end; ++i) {
      if (probs[i] > threshold) lanes[0] += probs[i];
      if (probs[i] == threshold) ++equal;
    }
    double sum = 0.0;
    for (const double v : lanes) sum += v;
    chunk_sums[static_cast<size_t>(c)] = sum;
    total += sum;
  }
  *ties = equal;
  return total;
}

}  // namespace iris::kernels
