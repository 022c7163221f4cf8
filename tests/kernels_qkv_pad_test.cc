// PadQkv against a scalar reference: head-major outputs, zero padding, and equality with three
// PadOneOfQkv calls.
#include "kernels/qkv_pad.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace iris::kernels {
namespace {

Device& dev = DefaultCpuDevice();

struct PadCase {
  int64_t rows;
  int heads;
  int head_dim;
  int padded;
};

class PadQkvTest : public ::testing::TestWithParam<PadCase> {};

TEST_P(PadQkvTest, MatchesReferenceAndUnfused) {
  const PadCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.rows * 1000 + c.padded));
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> qkv(c.rows * 3 * c.heads * c.head_dim);
  for (auto& x : qkv) x = dist(rng);
  const size_t out_size = static_cast<size_t>(c.heads) * c.rows * c.padded;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Outputs start as NaN so that unwritten padding shows up.
  std::vector<float> fused[3], single[3];
  for (int w = 0; w < 3; ++w) {
    fused[w].assign(out_size + 7, nan);
    single[w].assign(out_size + 7, nan);
  }
  PadQkv(dev, qkv.data(), c.rows, c.heads, c.head_dim, c.padded, fused[0].data(), fused[1].data(), fused[2].data());
  for (int w = 0; w < 3; ++w) PadOneOfQkv(dev, qkv.data(), c.rows, c.heads, c.head_dim, c.padded, w, single[w].data());
  for (int w = 0; w < 3; ++w) {
    SCOPED_TRACE(w);
    for (int h = 0; h < c.heads; ++h) {
      for (int64_t r = 0; r < c.rows; ++r) {
        for (int d = 0; d < c.padded; ++d) {
          const float want = d < c.head_dim ? qkv[((r * 3 + w) * c.heads + h) * c.head_dim + d] : 0.f;
          const size_t at = (static_cast<size_t>(h) * c.rows + r) * c.padded + d;
          ASSERT_EQ(fused[w][at], want) << "h=" << h << " r=" << r << " d=" << d;
          ASSERT_EQ(std::signbit(fused[w][at]), std::signbit(want));
        }
      }
    }
    EXPECT_EQ(std::memcmp(fused[w].data(), single[w].data(), out_size * 4), 0);
    for (size_t i = out_size; i < out_size + 7; ++i) EXPECT_TRUE(std::isnan(fused[w][i])) << "wrote past the end";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PadQkvTest,
                         ::testing::Values(PadCase{1, 1, 16, 16}, PadCase{7, 16, 80, 96}, PadCase{33, 16, 80, 128},
                                           PadCase{129, 3, 80, 80}, PadCase{5, 2, 13, 32}, PadCase{64, 4, 16, 17},
                                           PadCase{300, 16, 80, 96}, PadCase{2, 2, 40, 41}));

}  // namespace
}  // namespace iris::kernels
