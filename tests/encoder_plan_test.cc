// The encoder plan (window order, cu_seqlens, rotary tables) against the reference's values.
#include "vision/encoder_plan.h"

#include <string>

#include "core/model_config.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace iris::vision {
namespace {

core::VisionConfig TinyVision() {
  auto c = core::LoadModelConfig(testing::DataPath("tiny-qwen2.5-vl"));
  EXPECT_TRUE(c.ok()) << c.status();
  return c->vision;
}

std::vector<GridThw> Grids(const core::Tensor& t) {
  std::vector<GridThw> g(t.dim(0));
  for (int64_t i = 0; i < t.dim(0); ++i) {
    for (int j = 0; j < 3; ++j) g[i][j] = t.data<int64_t>()[i * 3 + j];
  }
  return g;
}

template <typename T>
void ExpectSameInts(const std::vector<T>& ours, const core::Tensor& golden, const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(ours.size()), golden.numel()) << what;
  for (int64_t i = 0; i < golden.numel(); ++i) {
    ASSERT_EQ(ours[i], golden.data<int64_t>()[i]) << what << " at " << i;
  }
}

class PlanGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(PlanGolden, MatchesTheReference) {
  const std::string file = "vision/" + GetParam() + ".safetensors";
  const core::VisionConfig config = TinyVision();  // window/merge/patch as in the 3B tower
  const auto grids = Grids(testing::LoadGolden(file, "image_grid_thw"));
  auto plan = BuildEncoderPlan(config, grids);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectSameInts((*plan)->window_index, testing::LoadGolden(file, "window_index"), "window_index");
  ExpectSameInts((*plan)->cu_seqlens, testing::LoadGolden(file, "cu_seqlens"), "cu_seqlens");
  ExpectSameInts((*plan)->cu_window_seqlens, testing::LoadGolden(file, "cu_window_seqlens"), "cu_window_seqlens");
  ExpectSameInts((*plan)->cu_window_seqlens_raw, testing::LoadGolden(file, "cu_window_seqlens_raw"),
                 "cu_window_seqlens_raw");
}

INSTANTIATE_TEST_SUITE_P(Cases, PlanGolden,
                         ::testing::Values("tiny-single_448x448", "tiny-batch_300x200_640x480",
                                           "tiny-single_1000x667", "vision3b-single_448x448",
                                           "vision3b-batch_300x200_640x480", "vision3b-single_1000x667"));

TEST(EncoderPlan, RotaryTablesMatchTheReference) {
  const std::string file = "vision/tiny-single_448x448.safetensors";
  const core::VisionConfig config = TinyVision();
  auto plan = BuildEncoderPlan(config, Grids(testing::LoadGolden(file, "image_grid_thw")));
  ASSERT_TRUE(plan.ok());
  const core::Tensor cos = testing::LoadGolden(file, "rope_cos");  // [n, head_dim] = half twice
  const core::Tensor sin = testing::LoadGolden(file, "rope_sin");
  const int d = config.head_dim(), half = d / 2;
  double worst = 0;
  for (int64_t r = 0; r < (*plan)->num_patches; ++r) {
    for (int j = 0; j < d; ++j) {
      worst = std::max(worst, std::fabs(double{(*plan)->cos.data<float>()[r * half + j % half]} - cos.data<float>()[r * d + j]));
      worst = std::max(worst, std::fabs(double{(*plan)->sin.data<float>()[r * half + j % half]} - sin.data<float>()[r * d + j]));
    }
  }
  EXPECT_LT(worst, 1e-6);
}

TEST(EncoderPlan, CacheReusesThePlanWhileGridsRepeat) {
  EncoderPlanCache cache(TinyVision());
  const std::vector<GridThw> a = {{1, 14, 22}, {1, 34, 46}}, b = {{1, 32, 32}};
  auto p1 = cache.Get(a);
  auto p2 = cache.Get(a);
  ASSERT_TRUE(p1.ok() && p2.ok());
  EXPECT_EQ(p1->get(), p2->get());
  auto p3 = cache.Get(b);
  ASSERT_TRUE(p3.ok());
  EXPECT_NE(p1->get(), p3->get());
  EXPECT_EQ((*p3)->num_patches, 1024);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 2);
}

TEST(EncoderPlan, RejectsBadGrids) {
  const core::VisionConfig config = TinyVision();
  EXPECT_FALSE(BuildEncoderPlan(config, std::vector<GridThw>{}).ok());
  auto odd = BuildEncoderPlan(config, std::vector<GridThw>{{1, 3, 4}});
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("grid_thw[0]"), std::string::npos);
  EXPECT_FALSE(BuildEncoderPlan(config, std::vector<GridThw>{{0, 4, 4}}).ok());
}

}  // namespace
}  // namespace iris::vision
