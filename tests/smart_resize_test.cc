#include "vision/smart_resize.h"

#include <string>

#include "core/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace iris::vision {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMin = 3136;
constexpr int64_t kMax = 12845056;
constexpr int64_t kClassDefaultMax = 1003520;  // 28*28*1280

ResizedSize Ok(int h, int w, int64_t min_pixels = kMin, int64_t max_pixels = kMax) {
  auto r = SmartResize(h, w, 28, min_pixels, max_pixels);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ResizedSize{};
}

std::string Err(int h, int w, int64_t min_pixels = kMin, int64_t max_pixels = kMax) {
  auto r = SmartResize(h, w, 28, min_pixels, max_pixels);
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(SmartResize, ReadmeExamples) {
  // 350 wide x 70 high: 12.5 and 2.5 round half to even (half-up would give 364x84).
  auto r = Ok(70, 350);
  EXPECT_EQ(r.height, 56);
  EXPECT_EQ(r.width, 336);
  // 28x28 is below min_pixels 3136 and takes the ceil path.
  r = Ok(28, 28);
  EXPECT_EQ(r.height, 56);
  EXPECT_EQ(r.width, 56);
  // 2048x1536 (w x h) is only rounded with the checkpoint's max_pixels...
  r = Ok(1536, 2048);
  EXPECT_EQ(r.height, 1540);
  EXPECT_EQ(r.width, 2044);
  // ...and takes the floor path with the class default.
  r = Ok(1536, 2048, kMin, kClassDefaultMax);
  EXPECT_EQ(r.height, 840);
  EXPECT_EQ(r.width, 1148);
}

TEST(SmartResize, RoundsHalfToEven) {
  EXPECT_EQ(Ok(42, 100).height, 56);   // 1.5 -> 2
  EXPECT_EQ(Ok(70, 100).height, 56);   // 2.5 -> 2
  EXPECT_EQ(Ok(98, 100).height, 112);  // 3.5 -> 4
  EXPECT_EQ(Ok(126, 100).height, 112); // 4.5 -> 4
  EXPECT_EQ(Ok(43, 100).height, 56);
  EXPECT_EQ(Ok(69, 100).height, 56);
  EXPECT_EQ(Ok(71, 100).height, 84);
}

TEST(SmartResize, ExactMultiplesAreKept) {
  auto r = Ok(448, 448);
  EXPECT_EQ(r.height, 448);
  EXPECT_EQ(r.width, 448);
  r = Ok(56, 56);
  EXPECT_EQ(r.height, 56);
  EXPECT_EQ(r.width, 56);
}

TEST(SmartResize, MatchesEveryGoldenCase) {
  auto manifest = core::ReadJsonFile(testing::DataPath("preprocess/manifest.json"));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  int cases = 0;
  for (const auto& c : (*manifest)["cases"]) {
    ++cases;
    SCOPED_TRACE(c["case"].get<std::string>());
    const int h = c["load_image"]["rgb_shape_hwc"][0].get<int>();
    const int w = c["load_image"]["rgb_shape_hwc"][1].get<int>();
    auto r = SmartResize(h, w, 28, c["settings"]["min_pixels"].get<int64_t>(),
                         c["settings"]["max_pixels"].get<int64_t>());
    if (!c["expected"]["ok"].get<bool>()) {
      EXPECT_FALSE(r.ok());
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->height, c["expected"]["resized_hw"][0].get<int>());
    EXPECT_EQ(r->width, c["expected"]["resized_hw"][1].get<int>());
    EXPECT_EQ(r->height / 14, c["expected"]["image_grid_thw"][1].get<int>());
    EXPECT_EQ(r->width / 14, c["expected"]["image_grid_thw"][2].get<int>());
  }
  EXPECT_EQ(cases, 16);
}

TEST(SmartResize, StaysWithinBounds) {
  for (int h = 28; h < 3000; h += 37) {
    for (int w = 28; w < 3000; w += 53) {
      if (std::max(h, w) > 200 * std::min(h, w)) continue;
      for (int64_t max_pixels : {kMax, kClassDefaultMax, int64_t{200704}}) {
        auto r = SmartResize(h, w, 28, kMin, max_pixels);
        ASSERT_TRUE(r.ok()) << h << "x" << w << ": " << r.status();
        EXPECT_EQ(r->height % 28, 0);
        EXPECT_EQ(r->width % 28, 0);
        EXPECT_GE(r->height, 28);
        EXPECT_GE(r->width, 28);
        EXPECT_LE(int64_t{r->height} * r->width, max_pixels) << h << "x" << w;
      }
    }
  }
}

TEST(SmartResize, RejectsSmallSides) {
  EXPECT_THAT(Err(20, 300), HasSubstr("height 20 is below the minimum 28"));
  EXPECT_THAT(Err(300, 20), HasSubstr("width 20 is below the minimum 28"));
  EXPECT_THAT(Err(1, 1), HasSubstr("below the minimum 28"));
  EXPECT_THAT(Err(27, 28), HasSubstr("height 27"));
  EXPECT_THAT(Err(0, 100), HasSubstr("height 0"));
  EXPECT_THAT(Err(-5, 100), HasSubstr("height -5"));
}

TEST(SmartResize, RejectsExtremeAspectRatios) {
  EXPECT_THAT(Err(28, 8400), HasSubstr("aspect ratio 300.0"));
  EXPECT_THAT(Err(28, 8400), HasSubstr("exceeds the limit 200"));
  EXPECT_THAT(Err(8400, 28), HasSubstr("aspect ratio 300.0"));
  // Just above the limit prints enough digits to show it.
  EXPECT_THAT(Err(28, 5601), HasSubstr("aspect ratio 200.036"));
  // Exactly 200 is allowed.
  auto r = Ok(28, 5600);
  EXPECT_EQ(r.height, 28);
  EXPECT_EQ(r.width, 5600);
}

TEST(SmartResize, ValidatesPixelBounds) {
  EXPECT_THAT(Err(100, 100, 0, kMax), HasSubstr("min_pixels 0 must be positive"));
  EXPECT_THAT(Err(100, 100, kMin, -1), HasSubstr("max_pixels -1 must be positive"));
  EXPECT_THAT(Err(100, 100, 5000, 4000), HasSubstr("min_pixels 5000 exceeds max_pixels 4000"));
  EXPECT_FALSE(SmartResize(100, 100, 0, kMin, kMax).ok());
}

TEST(SmartResize, RejectsWhenASideWouldVanish) {
  // 28 x 5600 (ratio 200) with max_pixels 100000: beta = 1.25, so the height floors to 0.
  EXPECT_THAT(Err(28, 5600, 784, 100000), HasSubstr("cannot be resized within max_pixels 100000"));
}

TEST(SmartResize, MinPixelsUpscales) {
  // 100x100 -> rounds to 112x112 = 12544 < 20000: beta = sqrt(2), ceil(141.4/28) = 6 -> 168.
  auto r = Ok(100, 100, 20000, kMax);
  EXPECT_EQ(r.height, 168);
  EXPECT_EQ(r.width, 168);
}

}  // namespace
}  // namespace iris::vision
