// RmsNorm, SiluMulRows, SiluMul, GeluErf and Add against double-precision references on odd sizes
// (vector tails, single rows, and sizes large enough to run in parallel), including aliasing.
#include "kernels/elementwise.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace iris::kernels {
namespace {

Device& dev = DefaultCpuDevice();

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  return testing::RandomFloats(n, seed, lo, hi);
}

// Every element within rel * |ref| + abs of the reference.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& ref, double rel, double abs) {
  ASSERT_EQ(got.size(), ref.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - ref[i]) <= rel * std::fabs(ref[i]) + abs)) {
      if (++bad <= 5) ADD_FAILURE() << "at " << i << ": got " << got[i] << " want " << ref[i];
    }
  }
  EXPECT_EQ(bad, 0);
}

double Silu(double x) { return x / (1.0 + std::exp(-x)); }
double Gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

TEST(RmsNormTest, MatchesReference) {
  const int64_t shapes[][2] = {{1, 13}, {7, 80}, {33, 1280}, {129, 17}, {3, 16}, {2, 2048}, {64, 1176}};
  uint32_t seed = 1;
  for (const auto& sh : shapes) {
    const int64_t rows = sh[0], dim = sh[1];
    SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
    const std::vector<float> x = Random(rows * dim, seed++, -3.f, 3.f);
    const std::vector<float> w = Random(dim, seed++, 0.5f, 1.5f);
    const float eps = 1e-6f;
    std::vector<double> ref(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + eps);
      for (int64_t i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * inv * w[i];
    }
    std::vector<float> y(rows * dim, std::numeric_limits<float>::quiet_NaN());
    RmsNorm(dev, x.data(), w.data(), rows, dim, eps, y.data());
    ExpectClose(y, ref, 2e-6, 1e-7);
    std::vector<float> inplace = x;  // y aliases x
    RmsNorm(dev, inplace.data(), w.data(), rows, dim, eps, inplace.data());
    EXPECT_EQ(inplace, y);
  }
}

TEST(RmsNormTest, EpsDominatesZeroRow) {
  const std::vector<float> x(20, 0.f), w(20, 1.f);
  std::vector<float> y(20, 1.f);
  RmsNorm(dev, x.data(), w.data(), 1, 20, 1e-6f, y.data());
  for (float v : y) EXPECT_EQ(v, 0.f);
}

// Qwen2-VL's tower: LayerNorm with bias (torch's biased variance) and QuickGELU.
TEST(LayerNormTest, MatchesReference) {
  const int64_t shapes[][2] = {{1, 13}, {7, 80}, {33, 1280}, {129, 17}, {64, 64}};
  uint32_t seed = 40;
  for (const auto& sh : shapes) {
    const int64_t rows = sh[0], dim = sh[1];
    SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
    const std::vector<float> x = Random(rows * dim, seed++, -3.f, 5.f);  // a non-zero mean
    const std::vector<float> w = Random(dim, seed++, 0.5f, 1.5f);
    const std::vector<float> b = Random(dim, seed++, -0.1f, 0.1f);
    const float eps = 1e-6f;
    std::vector<double> ref(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < dim; ++i) mean += x[r * dim + i];
      mean /= dim;
      for (int64_t i = 0; i < dim; ++i) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
      const double inv = 1.0 / std::sqrt(var / dim + eps);
      for (int64_t i = 0; i < dim; ++i) ref[r * dim + i] = (x[r * dim + i] - mean) * inv * w[i] + b[i];
    }
    std::vector<float> y(rows * dim, std::numeric_limits<float>::quiet_NaN());
    LayerNorm(dev, x.data(), w.data(), b.data(), rows, dim, eps, y.data());
    ExpectClose(y, ref, 2e-6, 1e-6);
    std::vector<float> inplace = x;  // y aliases x
    LayerNorm(dev, inplace.data(), w.data(), b.data(), rows, dim, eps, inplace.data());
    EXPECT_EQ(inplace, y);
  }
}

TEST(QuickGeluTest, MatchesReference) {
  const std::vector<float> x = Random(100003, 50, -20.f, 20.f);
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) ref[i] = x[i] / (1.0 + std::exp(-1.702 * x[i]));
  std::vector<float> y(x.size());
  QuickGelu(dev, x.data(), static_cast<int64_t>(x.size()), y.data());
  ExpectClose(y, ref, 2e-6, 1e-7);
}

TEST(SiluMulTest, RowsMatchReference) {
  const int64_t shapes[][2] = {{1, 13}, {7, 80}, {33, 3420}, {129, 17}, {5, 16}};
  uint32_t seed = 10;
  for (const auto& sh : shapes) {
    const int64_t rows = sh[0], inter = sh[1];
    const std::vector<float> gu = Random(rows * 2 * inter, seed++, -12.f, 12.f);
    std::vector<double> ref(rows * inter);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < inter; ++j)
        ref[r * inter + j] = Silu(gu[r * 2 * inter + j]) * gu[r * 2 * inter + inter + j];
    std::vector<float> out(rows * inter);
    SiluMulRows(dev, gu.data(), rows, inter, out.data());
    ExpectClose(out, ref, 2e-6, 1e-30);
  }
}

TEST(SiluMulTest, FlatMatchesReferenceAndAliases) {
  for (int64_t n : {1, 15, 16, 17, 4097, 100003}) {
    SCOPED_TRACE(n);
    std::vector<float> gate = Random(n, 20 + n, -90.f, 90.f);
    const std::vector<float> up = Random(n, 21 + n, -2.f, 2.f);
    if (n > 3) {  // edges: zero, large negative (exp overflow) and large positive
      gate[0] = 0.f;
      gate[1] = -100.f;
      gate[2] = 100.f;
    }
    std::vector<double> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = Silu(gate[i]) * up[i];
    std::vector<float> out(n);
    SiluMul(dev, gate.data(), up.data(), n, out.data());
    // Below about -88.7, e^-x overflows f32 (as in torch) and silu is -0 instead of ~1e-37.
    ExpectClose(out, ref, 2e-6, 1e-30);
    SiluMul(dev, gate.data(), up.data(), n, gate.data());  // out aliases gate
    EXPECT_EQ(gate, out);
  }
}

TEST(GeluErfTest, MatchesErfReference) {
  for (int64_t n : {1, 17, 1000, 70001}) {
    SCOPED_TRACE(n);
    std::vector<float> x = Random(n, 30 + n, -10.f, 10.f);
    if (n > 8) {
      const float special[] = {0.f, -0.f, 1e-6f, -1e-6f, 5.5f, -5.5f, 30.f, -30.f};
      for (int i = 0; i < 8; ++i) x[i] = special[i];
    }
    std::vector<double> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = Gelu(x[i]);
    std::vector<float> y(n);
    GeluErf(dev, x.data(), n, y.data());
    ExpectClose(y, ref, 2e-6, 1e-10);  // far left gelu is ~0: relative error there is moot
    GeluErf(dev, x.data(), n, x.data());  // in place
    EXPECT_EQ(x, y);
  }
}

TEST(GeluErfTest, NarrowRangeIsAccurate) {
  // Dense sweep of the region where erf changes fastest.
  const int64_t n = 20001;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -5.f + 10.f * static_cast<float>(i) / (n - 1);
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = Gelu(x[i]);
  std::vector<float> y(n);
  GeluErf(dev, x.data(), n, y.data());
  ExpectClose(y, ref, 2e-6, 1e-12);
}

TEST(AddTest, MatchesAndAliases) {
  for (int64_t n : {1, 31, 32, 33, 50000}) {
    const std::vector<float> a = Random(n, 40 + n), b = Random(n, 41 + n);
    std::vector<float> y(n);
    Add(dev, a.data(), b.data(), n, y.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]) << i;
    std::vector<float> a2 = a, b2 = b;
    Add(dev, a2.data(), b.data(), n, a2.data());
    Add(dev, a.data(), b2.data(), n, b2.data());
    EXPECT_EQ(a2, y);
    EXPECT_EQ(b2, y);
  }
}

}  // namespace
}  // namespace iris::kernels
