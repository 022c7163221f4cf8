// ResizeBicubic against Pillow 9.4 (the golden resized images) and against a scalar
// transcription of Pillow's resampler over many scales and sizes.
#include "vision/resize_bicubic.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/host_cpu.h"
#include "core/model_config.h"
#include "core/sha256.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "vision/resize_bicubic_internal.h"

namespace iris::vision {
namespace {

// "... at (y,x)=[84, 134]" in a crop's description -> its top-left corner.
bool CropOrigin(const std::string& desc, int* y0, int* x0) {
  const size_t at = desc.find("(y,x)=[");
  return at != std::string::npos && std::sscanf(desc.c_str() + at, "(y,x)=[%d, %d]", y0, x0) == 2;
}

RgbImage RandomImage(int width, int height, uint32_t seed) {
  std::mt19937 rng(seed);
  RgbImage img{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  // Mix smooth gradients with noise and saturated pixels so that clamping is exercised.
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < 3; ++c) {
        const uint32_t r = rng();
        uint8_t v;
        switch (r % 4) {
          case 0: v = static_cast<uint8_t>(r >> 8); break;
          case 1: v = (r >> 8) & 1 ? 255 : 0; break;
          default: v = static_cast<uint8_t>((x * 7 + y * 3 + c * 50) & 255); break;
        }
        img.row(y)[x * 3 + c] = v;
      }
    }
  }
  return img;
}

int CountDiff(const RgbImage& a, const RgbImage& b) {
  if (a.width != b.width || a.height != b.height || a.pixels.size() != b.pixels.size()) return -1;
  int n = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) n += a.pixels[i] != b.pixels[i];
  return n;
}

TEST(ResizeBicubic, CoefficientsFollowPillow) {
  // Upscale 300 -> 308: support 2, 5 taps stored, weights sum to 2^22 (+- rounding).
  const auto c = internal::ComputeAxisCoeffs(300, 308);
  EXPECT_EQ(c.ksize, 5);
  for (int i = 0; i < c.out_size; ++i) {
    int64_t sum = 0;
    for (int k = 0; k < c.count[i]; ++k) sum += c.w(i)[k];
    EXPECT_NEAR(sum, 1 << 22, 4) << i;
    EXPECT_GE(c.start[i], 0);
    EXPECT_LE(c.start[i] + c.count[i], 300);
  }
  // Downscale by 2: support 4, 9 taps stored.
  EXPECT_EQ(internal::ComputeAxisCoeffs(200, 100).ksize, 9);
}

TEST(ResizeBicubic, UnchangedSizeIsACopy) {
  const RgbImage img = RandomImage(37, 29, 1);
  const RgbImage out = ResizeBicubic(img, 29, 37);
  EXPECT_EQ(CountDiff(out, img), 0);
}

TEST(ResizeBicubic, MatchesScalarPillowTranscription) {
  struct Size { int w, h, ow, oh; };
  std::vector<Size> sizes = {
      {300, 200, 308, 196}, {640, 480, 644, 476}, {1000, 667, 1008, 672}, {350, 70, 336, 56},
      {64, 64, 56, 56},     {3000, 100, 2996, 112}, {2048, 1536, 1148, 840}, {28, 28, 56, 56},
      {1, 1, 5, 7},         {5, 3, 1, 1},          {100, 100, 100, 37},     {100, 100, 37, 100},
      {97, 41, 16, 15},     {777, 13, 61, 200},    {450, 30, 30, 450},      {45, 45, 44, 46},
      {130, 20, 13, 2},     {500, 9, 12, 9},       {17, 600, 17, 29},       {16, 16, 49, 17},
  };
  std::mt19937 rng(123);
  for (int i = 0; i < 40; ++i) {
    std::uniform_int_distribution<int> d(1, 400);
    sizes.push_back({d(rng), d(rng), d(rng), d(rng)});
  }
  for (const auto& s : sizes) {
    SCOPED_TRACE(::testing::Message() << s.w << "x" << s.h << " -> " << s.ow << "x" << s.oh);
    const RgbImage img = RandomImage(s.w, s.h, s.w * 1000 + s.h);
    const RgbImage got = ResizeBicubic(img, s.oh, s.ow);
    const RgbImage want = internal::ResizeBicubicReference(img, s.oh, s.ow);
    ASSERT_EQ(got.width, s.ow);
    ASSERT_EQ(got.height, s.oh);
    EXPECT_EQ(CountDiff(got, want), 0);
  }
}

// Every horizontal kernel, forced, against the scalar transcription, over scales from 1/4 to
// 60 (where the kernels' windows fill up or no longer fit) and odd widths.
TEST(ResizeBicubic, EveryHorizontalKernelMatchesTheScalarOne) {
  if (!core::HostHasAvx512Vbmi()) GTEST_SKIP() << "the vector kernels need AVX-512 VBMI; this run uses the scalar path";
  using Mode = internal::HorizontalPlan::Mode;
  const std::vector<std::pair<int, int>> widths = {
      {2048, 2044}, {1000, 1008}, {300, 308},  {640, 644},  {64, 56},   {4032, 1148}, {2048, 1148},
      {3000, 2996}, {8192, 980},  {4000, 100}, {1000, 61},  {64, 192},  {100, 25},   {1, 7},
      {7, 1},       {17, 16},     {16, 17},    {250, 33},   {6000, 100}, {333, 111},  {129, 43},
  };
  std::map<Mode, int> taken;
  for (const auto& [in_w, out_w] : widths) {
    const RgbImage img = RandomImage(in_w, 7, in_w * 31 + out_w);
    std::vector<const uint8_t*> in_rows;
    for (int y = 0; y < img.height; ++y) in_rows.push_back(img.row(y));
    const RgbImage want = internal::ResizeBicubicReference(img, img.height, out_w);
    for (Mode mode : {Mode::kInterleaved, Mode::kPlanarBlocks, Mode::kPlanarDot}) {
      const internal::HorizontalPlan plan(internal::ComputeAxisCoeffs(in_w, out_w), mode);
      ++taken[plan.mode()];
      // Rows 1..6 into an image whose rows are exactly out_w*3 bytes apart: any write past a
      // row's end shows up in the next row.
      RgbImage out{out_w, 6, std::vector<uint8_t>(static_cast<size_t>(out_w) * 6 * 3, 0xAB)};
      std::vector<uint8_t*> out_rows;
      for (int y = 0; y < out.height; ++y) out_rows.push_back(out.row(y));
      plan.Run(in_rows.data() + 1, out_rows.data(), 6);
      int bad = 0;
      for (int y = 0; y < 6; ++y) bad += std::memcmp(out.row(y), want.row(y + 1), out_w * 3) != 0;
      EXPECT_EQ(bad, 0) << in_w << " -> " << out_w << " mode " << static_cast<int>(plan.mode())
                        << " (forced " << static_cast<int>(mode) << ")";
    }
  }
  // Only the widest downscales are beyond the block kernels.
  EXPECT_GE(taken[Mode::kInterleaved], 15);
  EXPECT_GE(taken[Mode::kPlanarBlocks], 18);
  EXPECT_EQ(taken[Mode::kPlanarDot], static_cast<int>(widths.size()));
}

TEST(ResizeBicubic, ChoosesAKernelByCost) {
  if (!core::HostHasAvx512Vbmi()) GTEST_SKIP() << "the vector kernels need AVX-512 VBMI; this run uses the scalar path";
  using Mode = internal::HorizontalPlan::Mode;
  EXPECT_EQ(internal::HorizontalPlan(internal::ComputeAxisCoeffs(2048, 2044)).mode(), Mode::kInterleaved);
  EXPECT_EQ(internal::HorizontalPlan(internal::ComputeAxisCoeffs(4032, 1148)).mode(), Mode::kPlanarBlocks);
  EXPECT_EQ(internal::HorizontalPlan(internal::ComputeAxisCoeffs(8192, 112)).mode(), Mode::kPlanarDot);
}

// The golden cases whose decoded image is stored in full: resize it and compare with the stored
// resized image (full or crops) and its SHA-256.
TEST(ResizeBicubic, MatchesPillowGoldens) {
  auto manifest = core::ReadJsonFile(testing::DataPath("preprocess/manifest.json"));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  int checked = 0, crops = 0;
  for (const auto& c : (*manifest)["cases"]) {
    if (!c["expected"]["ok"].get<bool>()) continue;
    const auto& tensors = c["arrays"]["tensors"];
    const std::string file = c["arrays"]["file"].get<std::string>();
    SCOPED_TRACE(c["case"].get<std::string>());
    // Images stored in full: the decoded one (when it is) and the resized one (when it is).
    RgbImage resized_full;
    if (tensors.contains("resized_rgb")) resized_full = testing::ImageFromTensor(testing::LoadGolden(file, "resized_rgb"));
    if (!tensors.contains("decoded_rgb")) continue;
    const RgbImage decoded = testing::ImageFromTensor(testing::LoadGolden(file, "decoded_rgb"));
    const int oh = c["expected"]["resized_hw"][0].get<int>();
    const int ow = c["expected"]["resized_hw"][1].get<int>();
    const RgbImage got = ResizeBicubic(decoded, oh, ow);
    ASSERT_EQ(got.height, oh);
    ASSERT_EQ(got.width, ow);
    EXPECT_EQ(core::Sha256Hex(got.pixels.data(), got.pixels.size()),
              c["expected"]["resized_rgb_uint8_sha256"].get<std::string>());
    if (!resized_full.pixels.empty()) {
      EXPECT_EQ(CountDiff(got, resized_full), 0);
    }
    for (const auto& [name, info] : tensors.items()) {
      if (name.rfind("resized_rgb_crop_", 0) != 0) continue;
      const std::string desc = info["desc"].get<std::string>();
      int y0 = 0, x0 = 0;
      ASSERT_TRUE(CropOrigin(desc, &y0, &x0)) << desc;
      ++crops;
      const RgbImage crop = testing::ImageFromTensor(testing::LoadGolden(file, name));
      for (int y = 0; y < crop.height; ++y) {
        EXPECT_EQ(std::memcmp(crop.row(y), got.row(y0 + y) + x0 * 3, crop.width * 3), 0) << name << " row " << y;
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 6);
  EXPECT_EQ(crops, 3);  // exif6_640x480 stores its resized image as crops
}

}  // namespace
}  // namespace iris::vision
