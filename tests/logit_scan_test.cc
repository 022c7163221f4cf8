// The sampler's row passes (kernels/logit_scan.h) against libm and plain loops: the exp's error
// bound (the portable CPU kernels' exp, which they share) and edge values, the vector body
// against the scalar tail, the chunk sums and the total; the mass above a threshold and its ties.
#include "kernels/logit_scan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace iris::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// |got - want| in units of want's float ulp.
double Ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const double ulp = std::nextafter(w, kInf) - w;
  return std::abs(static_cast<double>(got) - want) / ulp;
}

TEST(LogitScanTest, ExpIsWithinTwoUlpOverTheSamplersRange) {
  double worst = 0.0;
  float worst_x = 0.f;
  // Every 97th float from -0 down to -87 (~11 million of them).
  for (float x = -0.f; x >= -87.f;) {
    const double u = Ulps(Exp(x), std::exp(static_cast<double>(x)));
    if (u > worst) {
      worst = u;
      worst_x = x;
    }
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    bits += 97;
    std::memcpy(&x, &bits, 4);
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  EXPECT_EQ(Exp(0.f), 1.f);
  EXPECT_EQ(Exp(-0.f), 1.f);
}

TEST(LogitScanTest, ExpOfTheEdgesIsZero) {
  EXPECT_EQ(Exp(-kInf), 0.f);
  EXPECT_EQ(Exp(-88.5f), 0.f);
  EXPECT_EQ(Exp(-1e30f), 0.f);
  EXPECT_GT(Exp(-87.f), 0.f);
  // A NaN logit counts as -inf: ExpShiftedRow gives it 0 (the next test), not Exp's NaN.
  EXPECT_EQ(Exp(NanAsNegInf(kNan)), 0.f);
}

TEST(LogitScanTest, RowMaxSkipsNansAtEveryPosition) {
  for (const int64_t n : {0, 1, 15, 16, 17, 255, 256, 1000}) {
    std::vector<float> x = testing::RandomFloats(n, 3 + static_cast<uint32_t>(n), -50.f, 50.f);
    for (int64_t i = 0; i < n; i += 7) x[i] = kNan;
    float want = -kInf;
    for (const float v : x) want = std::isnan(v) ? want : std::max(want, v);
    EXPECT_EQ(RowMax(x.data(), n), want) << "n " << n;
    if (n > 0) {
      x.back() = 60.f;  // the tail's last value
      EXPECT_EQ(RowMax(x.data(), n), 60.f) << "n " << n;
    }
  }
  const std::vector<float> nans(40, kNan);
  EXPECT_EQ(RowMax(nans.data(), 40), -kInf);
}

TEST(LogitScanTest, ExpShiftedRowMatchesTheScalarExpAndSumsByChunk) {
  // Lengths around the 16-value body and the 256-value chunk, and the 152k vocabulary.
  for (const int64_t n : {1, 7, 16, 33, 255, 256, 257, 1000, 151936}) {
    std::vector<float> logits = testing::RandomFloats(n, 11 + static_cast<uint32_t>(n), -100.f, 20.f);
    for (int64_t i = 3; i < n; i += 101) logits[i] = kNan;
    for (int64_t i = 5; i < n; i += 103) logits[i] = -kInf;
    const float shift = RowMax(logits.data(), n);
    std::vector<float> probs(n);
    std::vector<double> chunk_sums;
    const double total = ExpShiftedRow(logits.data(), n, shift, probs.data(), chunk_sums);
    ASSERT_EQ(static_cast<int64_t>(chunk_sums.size()), (n + kLogitChunk - 1) / kLogitChunk);
    double sum_of_chunks = 0.0;
    for (const double c : chunk_sums) sum_of_chunks += c;
    EXPECT_EQ(total, sum_of_chunks) << "n " << n;  // the same additions in the same order
    double plain = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float want = Exp(NanAsNegInf(logits[i]) - shift);
      // The same float (the vector body, the tail and a device's draw compute one function).
      ASSERT_EQ(probs[i], want) << "n " << n << " i " << i;
      if (std::isnan(logits[i]) || logits[i] == -kInf) {
        ASSERT_EQ(probs[i], 0.f);
      }
      plain += probs[i];
    }
    EXPECT_NEAR(total, plain, plain * 1e-12) << "n " << n;
    for (size_t c = 0; c < chunk_sums.size(); ++c) {
      double s = 0.0;
      for (int64_t i = static_cast<int64_t>(c) * kLogitChunk; i < std::min(n, (static_cast<int64_t>(c) + 1) * kLogitChunk); ++i) s += probs[i];
      ASSERT_NEAR(chunk_sums[c], s, s * 1e-12 + 1e-300) << "n " << n << " chunk " << c;
    }
  }
}

TEST(LogitScanTest, MassAboveSumsByChunkAndCountsTheTies) {
  for (const int64_t n : {1, 9, 256, 300, 151936}) {
    std::vector<float> probs = testing::RandomFloats(n, 17 + static_cast<uint32_t>(n), 0.f, 1.f);
    for (int64_t i = 0; i < n; i += 5) probs[i] = 0.25f;  // ties, in the vector body and the tails
    for (int64_t i = 2; i < n; i += 11) probs[i] = 0.f;
    for (const float threshold : {0.f, 0.25f, 0.9f}) {
      std::vector<double> chunk_sums;
      int64_t ties = -1;
      const double total = MassAbove(probs.data(), n, threshold, chunk_sums, &ties);
      ASSERT_EQ(static_cast<int64_t>(chunk_sums.size()), (n + kLogitChunk - 1) / kLogitChunk);
      int64_t want_ties = 0;
      double want_total = 0.0, sum_of_chunks = 0.0;
      for (size_t c = 0; c < chunk_sums.size(); ++c) {
        double s = 0.0;
        for (int64_t i = static_cast<int64_t>(c) * kLogitChunk; i < std::min(n, (static_cast<int64_t>(c) + 1) * kLogitChunk); ++i) {
          if (probs[i] > threshold) s += probs[i];
          want_ties += probs[i] == threshold ? 1 : 0;
        }
        ASSERT_NEAR(chunk_sums[c], s, s * 1e-12) << "n " << n << " threshold " << threshold << " chunk " << c;
        want_total += s;
        sum_of_chunks += chunk_sums[c];
      }
      EXPECT_EQ(ties, want_ties) << "n " << n << " threshold " << threshold;
      EXPECT_EQ(total, sum_of_chunks);
      EXPECT_NEAR(total, want_total, want_total * 1e-12);
    }
  }
}

}  // namespace
}  // namespace iris::kernels
