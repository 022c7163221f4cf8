// Rotary (rotate-half) on strided heads against a scalar reference; the fused RotaryQK equals
// Rotary(dev, q) then Rotary(dev, k) bit for bit and leaves everything else (v, row padding) untouched.
#include "kernels/rotary.h"

#include <cmath>
#include <cstring>
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

// Half tables as the models build them: angle = pos * theta^(-2i/d).
void MakeTables(int64_t rows, int head_dim, std::vector<float>* cos, std::vector<float>* sin) {
  const int half = head_dim / 2;
  cos->resize(rows * half);
  sin->resize(rows * half);
  for (int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < half; ++i) {
      const double a = (r * 7 % 97) * std::pow(10000.0, -2.0 * i / head_dim);
      (*cos)[r * half + i] = static_cast<float>(std::cos(a));
      (*sin)[r * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

// x' = x*cos + rotate_half(x)*sin with the full tables cat(c, c), cat(s, s).
void RotaryRef(float* data, int64_t row_stride, int heads, int64_t rows, int head_dim, const float* cos,
               const float* sin) {
  const int half = head_dim / 2;
  std::vector<double> tmp(head_dim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      float* x = data + r * row_stride + h * head_dim;
      for (int i = 0; i < head_dim; ++i) {
        const double c = cos[r * half + i % half], s = sin[r * half + i % half];
        const double rot = i < half ? -static_cast<double>(x[i + half]) : x[i - half];
        tmp[i] = x[i] * c + rot * s;
      }
      for (int i = 0; i < head_dim; ++i) x[i] = static_cast<float>(tmp[i]);
    }
  }
}

struct Layout {
  int64_t rows;
  int heads;
  int head_dim;
};

class RotaryTest : public ::testing::TestWithParam<Layout> {};

TEST_P(RotaryTest, FusedEqualsSeparateAndReference) {
  const Layout L = GetParam();
  // A qkv projection output [rows, 3, heads, head_dim] plus 3 floats of row padding.
  const int64_t stride = 3LL * L.heads * L.head_dim + 3;
  const std::vector<float> qkv = Random(L.rows * stride, static_cast<uint32_t>(L.rows * 131 + L.head_dim), -2.f, 2.f);
  std::vector<float> cos, sin;
  MakeTables(L.rows, L.head_dim, &cos, &sin);
  const int64_t k_off = static_cast<int64_t>(L.heads) * L.head_dim;

  std::vector<float> fused = qkv;
  RotaryQK(dev, {fused.data(), stride, L.heads}, {fused.data() + k_off, stride, L.heads}, L.rows, L.head_dim,
           cos.data(), sin.data());
  std::vector<float> separate = qkv;
  Rotary(dev, {separate.data(), stride, L.heads}, L.rows, L.head_dim, cos.data(), sin.data());
  Rotary(dev, {separate.data() + k_off, stride, L.heads}, L.rows, L.head_dim, cos.data(), sin.data());
  EXPECT_EQ(std::memcmp(fused.data(), separate.data(), fused.size() * 4), 0);

  std::vector<float> ref = qkv;
  RotaryRef(ref.data(), stride, 2 * L.heads, L.rows, L.head_dim, cos.data(), sin.data());  // q and k adjacent
  double max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, static_cast<double>(std::fabs(fused[i] - ref[i])));
  EXPECT_LT(max_err, 2e-6);
  // v and the row padding are untouched.
  for (int64_t r = 0; r < L.rows; ++r)
    for (int64_t i = 2 * k_off; i < stride; ++i) ASSERT_EQ(fused[r * stride + i], qkv[r * stride + i]);
}

INSTANTIATE_TEST_SUITE_P(Shapes, RotaryTest,
                         ::testing::Values(Layout{1, 1, 16}, Layout{7, 3, 16}, Layout{33, 16, 80}, Layout{129, 2, 80},
                                           Layout{5, 2, 34}, Layout{300, 16, 80}, Layout{3, 4, 128}, Layout{9, 1, 2}));

TEST(RotaryTest, DifferentHeadCountsForQAndK) {
  // GQA: 4 q heads, 1 k head in a [rows, q | k | v] row.
  const int64_t rows = 11;
  const int hd = 80;
  const int64_t stride = (4 + 1 + 1) * hd;
  const std::vector<float> x = Random(rows * stride, 5);
  std::vector<float> cos, sin;
  MakeTables(rows, hd, &cos, &sin);
  std::vector<float> fused = x, ref = x;
  RotaryQK(dev, {fused.data(), stride, 4}, {fused.data() + 4 * hd, stride, 1}, rows, hd, cos.data(), sin.data());
  RotaryRef(ref.data(), stride, 5, rows, hd, cos.data(), sin.data());
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(fused[i], ref[i], 2e-6) << i;
}

}  // namespace
}  // namespace iris::kernels
