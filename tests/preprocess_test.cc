// Preprocess against the reference's goldens (tests/data/preprocess): grids, resized images,
// pixel_values rows, the SHA-256 of the full float32 buffer and its sums.
#include "vision/preprocess.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/model_config.h"
#include "core/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/patch_rows.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "vision/image_decode.h"
#include "vision/patchify.h"
#include "vision/pixel_table.h"
#include "vision/resize_bicubic.h"
#include "vision/resize_bicubic_internal.h"
#include "vision/smart_resize.h"

namespace iris::vision {
namespace {

// "... at (y,x)=[84, 134]" in a crop's description -> its top-left corner.
bool CropOrigin(const std::string& desc, int* y0, int* x0) {
  const size_t at = desc.find("(y,x)=[");
  return at != std::string::npos && std::sscanf(desc.c_str() + at, "(y,x)=[%d, %d]", y0, x0) == 2;
}

using ::testing::HasSubstr;

const nlohmann::json& Manifest() {
  static const nlohmann::json* m = [] {
    auto j = core::ReadJsonFile(testing::DataPath("preprocess/manifest.json"));
    if (!j.ok()) {
      ADD_FAILURE() << j.status();
      return new nlohmann::json(nlohmann::json::object({{"cases", nlohmann::json::array()}}));
    }
    return new nlohmann::json(*std::move(j));
  }();
  return *m;
}

bool Has(const nlohmann::json& c, const char* tensor) {
  return c.contains("arrays") && c["arrays"]["tensors"].contains(tensor);
}

// Names of the cases that are expected to succeed (or fail), optionally only those storing
// `tensor` in full.
std::vector<std::string> CaseNames(bool ok, const char* tensor = nullptr) {
  std::vector<std::string> names;
  for (const auto& c : Manifest()["cases"]) {
    if (c["expected"]["ok"].get<bool>() != ok) continue;
    if (tensor != nullptr && !Has(c, tensor)) continue;
    names.push_back(c["case"].get<std::string>());
  }
  return names;
}

std::vector<std::string> AllCaseNames() {
  std::vector<std::string> names = CaseNames(true);
  for (const auto& n : CaseNames(false)) names.push_back(n);
  return names;
}

std::string TestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

const nlohmann::json& Case(const std::string& name) {
  for (const auto& c : Manifest()["cases"]) {
    if (c["case"] == name) return c;
  }
  static const nlohmann::json none;
  ADD_FAILURE() << "no case " << name;
  return none;
}

core::PreprocessorConfig CheckpointConfig() {
  auto p = core::LoadPreprocessorConfig(testing::DataPath("tiny-qwen2.5-vl"));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : core::PreprocessorConfig{};
}

PixelBounds BoundsOf(const nlohmann::json& c) {
  PixelBounds b;
  b.min_pixels = c["settings"]["min_pixels"].get<int64_t>();
  b.max_pixels = c["settings"]["max_pixels"].get<int64_t>();
  return b;
}

std::string FileOf(const nlohmann::json& c) { return c["arrays"]["file"].get<std::string>(); }

// Everything the golden records about pixel_values and the grid.
void ExpectMatchesGolden(const nlohmann::json& c, const PreprocessedImage& got) {
  const auto& e = c["expected"];
  const std::string file = FileOf(c);
  EXPECT_EQ(got.grid_thw[0], e["image_grid_thw"][0].get<int64_t>());
  EXPECT_EQ(got.grid_thw[1], e["image_grid_thw"][1].get<int64_t>());
  EXPECT_EQ(got.grid_thw[2], e["image_grid_thw"][2].get<int64_t>());
  const core::Tensor grid = testing::LoadGolden(file, "image_grid_thw");
  ASSERT_EQ(grid.numel(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got.grid_thw[i], grid.data<int64_t>()[i]);
  EXPECT_EQ(got.resized_height, e["resized_hw"][0].get<int>());
  EXPECT_EQ(got.resized_width, e["resized_hw"][1].get<int>());

  ASSERT_EQ(got.rgb.dtype(), core::DType::kU8);
  EXPECT_EQ(got.rgb.shape(), (std::vector<int64_t>{got.resized_height, got.resized_width, 3}));
  EXPECT_EQ(core::Sha256Hex(got.rgb.raw(), got.rgb.nbytes()), e["resized_rgb_uint8_sha256"].get<std::string>());
  absl::StatusOr<core::Tensor> values = PixelValues(got, CheckpointConfig());
  ASSERT_TRUE(values.ok()) << values.status();
  const core::Tensor& pv = *values;
  ASSERT_EQ(pv.dtype(), core::DType::kF32);
  ASSERT_EQ(pv.rank(), 2);
  EXPECT_EQ(pv.dim(0), e["pixel_values_shape"][0].get<int64_t>());
  ASSERT_EQ(pv.dim(1), e["pixel_values_shape"][1].get<int64_t>());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pv.raw()) % 64, 0u);
  const int64_t row_len = pv.dim(1);

  double max_diff = 0;
  int64_t rows_checked = 0;
  if (Has(c, "pixel_values")) {
    const core::Tensor want = testing::LoadGolden(file, "pixel_values");
    ASSERT_EQ(want.numel(), pv.numel());
    max_diff = testing::MaxAbsDiff(pv.data<float>(), want.data<float>(), pv.numel());
    EXPECT_EQ(std::memcmp(pv.raw(), want.raw(), pv.nbytes()), 0);
    rows_checked = pv.dim(0);
  } else {
    const core::Tensor rows = testing::LoadGolden(file, "pixel_values_rows");
    const core::Tensor index = testing::LoadGolden(file, "pixel_values_row_index");
    ASSERT_EQ(rows.dim(0), index.numel());
    for (int64_t i = 0; i < index.numel(); ++i) {
      const int64_t r = index.data<int64_t>()[i];
      ASSERT_LT(r, pv.dim(0));
      const float* a = pv.data<float>() + r * row_len;
      const float* b = rows.data<float>() + i * row_len;
      max_diff = std::max(max_diff, testing::MaxAbsDiff(a, b, row_len));
      EXPECT_EQ(std::memcmp(a, b, row_len * sizeof(float)), 0) << "row " << r;
    }
    rows_checked = index.numel();
  }
  EXPECT_EQ(core::Sha256Hex(pv.raw(), pv.nbytes()), e["pixel_values_float32_sha256"].get<std::string>());
  double sum = 0, abs_sum = 0;
  for (int64_t i = 0; i < pv.numel(); ++i) {
    sum += pv.data<float>()[i];
    abs_sum += std::fabs(pv.data<float>()[i]);
  }
  const double want_sum = e["pixel_values_sum_f64"].get<double>();
  const double want_abs = e["pixel_values_abs_sum_f64"].get<double>();
  // Summation order differs from numpy's pairwise sum: equal up to double rounding.
  EXPECT_NEAR(sum, want_sum, 1e-9 * want_abs);
  EXPECT_NEAR(abs_sum, want_abs, 1e-9 * want_abs);
  std::printf("[ %-40s ] %lld rows checked, max abs diff %g\n", c["case"].get<std::string>().c_str(),
              static_cast<long long>(rows_checked), max_diff);
}

// The whole path a request takes, from the image file: decode (load_image), then Preprocess.
// Also checks the resized image (ResizeBicubic of the decoded image) against the stored one,
// full or crops, and its SHA-256.
class PreprocessFromFile : public ::testing::TestWithParam<std::string> {};
TEST_P(PreprocessFromFile, MatchesGolden) {
  const auto& c = Case(GetParam());
  auto decoded = DecodeImageFile(testing::DataPath(c["image"].get<std::string>()));
  if (!c["expected"]["ok"].get<bool>()) {
    // The decoder accepts these images; Preprocess must reject them.
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    auto r = Preprocess(*decoded, CheckpointConfig(), BoundsOf(c));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("is below the minimum 28"));
    return;
  }
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(core::Sha256Hex(decoded->pixels.data(), decoded->pixels.size()),
            c["load_image"]["rgb_uint8_sha256"].get<std::string>())
      << "the decoded image differs from load_image's";

  const int oh = c["expected"]["resized_hw"][0].get<int>();
  const int ow = c["expected"]["resized_hw"][1].get<int>();
  const RgbImage resized = ResizeBicubic(*decoded, oh, ow);
  EXPECT_EQ(core::Sha256Hex(resized.pixels.data(), resized.pixels.size()),
            c["expected"]["resized_rgb_uint8_sha256"].get<std::string>());
  const std::string file = FileOf(c);
  if (Has(c, "resized_rgb")) {
    const RgbImage want = testing::ImageFromTensor(testing::LoadGolden(file, "resized_rgb"));
    EXPECT_TRUE(want.pixels == resized.pixels);
  }
  for (const auto& [name, info] : c["arrays"]["tensors"].items()) {
    if (name.rfind("resized_rgb_crop_", 0) != 0) continue;
    const std::string desc = info["desc"].get<std::string>();
    int y0 = 0, x0 = 0;
    ASSERT_TRUE(CropOrigin(desc, &y0, &x0)) << desc;
    const RgbImage crop = testing::ImageFromTensor(testing::LoadGolden(file, name));
    for (int y = 0; y < crop.height; ++y) {
      EXPECT_EQ(std::memcmp(crop.row(y), resized.row(y0 + y) + x0 * 3, crop.width * 3), 0) << name << " row " << y;
    }
  }

  auto r = Preprocess(*decoded, CheckpointConfig(), BoundsOf(c));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectMatchesGolden(c, *r);
}
INSTANTIATE_TEST_SUITE_P(Golden, PreprocessFromFile, ::testing::ValuesIn(AllCaseNames()), TestName);

// class_default through the configuration instead of per-request bounds: the processor's
// constructor default max_pixels 28*28*1280 takes the floor path (2048x1536 -> 1148x840).
TEST(Preprocess, ClassDefaultThroughTheConfig) {
  const auto& c = Case("pp-jpeg420_q90_2048x1536-class_default");
  auto decoded = DecodeImageFile(testing::DataPath(c["image"].get<std::string>()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  core::PreprocessorConfig cfg = CheckpointConfig();
  cfg.max_pixels = 28 * 28 * 1280;
  ASSERT_EQ(cfg.max_pixels, c["settings"]["max_pixels"].get<int64_t>());
  auto r = Preprocess(*decoded, cfg);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectMatchesGolden(c, *r);
}

// Expected errors: the reference rejects images under 28 px (the 1x1 one with its
// channels-first quirk, which changes only the message).
class PreprocessErrorCase : public ::testing::TestWithParam<std::string> {};
TEST_P(PreprocessErrorCase, IsRejected) {
  const auto& c = Case(GetParam());
  const int h = c["load_image"]["rgb_shape_hwc"][0].get<int>();
  const int w = c["load_image"]["rgb_shape_hwc"][1].get<int>();
  const RgbImage img{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3, 128)};
  auto r = Preprocess(img, CheckpointConfig(), BoundsOf(c));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("is below the minimum 28 (patch 14 x merge 2)"));
}
INSTANTIATE_TEST_SUITE_P(Golden, PreprocessErrorCase, ::testing::ValuesIn(CaseNames(false)), TestName);

// The full pipeline from the stored decoded image, where it is stored in full.
class PreprocessFromDecoded : public ::testing::TestWithParam<std::string> {};
TEST_P(PreprocessFromDecoded, MatchesGolden) {
  const auto& c = Case(GetParam());
  const RgbImage img = testing::ImageFromTensor(testing::LoadGolden(FileOf(c), "decoded_rgb"));
  auto r = Preprocess(img, CheckpointConfig(), BoundsOf(c));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectMatchesGolden(c, *r);
}
INSTANTIATE_TEST_SUITE_P(Golden, PreprocessFromDecoded,
                         ::testing::ValuesIn(CaseNames(true, "decoded_rgb")), TestName);

// Rescale/normalize/patchify alone, from the stored resized image (smart_resize of a size that
// is already a multiple of 28 within the bounds is the identity, so nothing is resized).
class PreprocessFromResized : public ::testing::TestWithParam<std::string> {};
TEST_P(PreprocessFromResized, MatchesGolden) {
  const auto& c = Case(GetParam());
  const RgbImage img = testing::ImageFromTensor(testing::LoadGolden(FileOf(c), "resized_rgb"));
  EXPECT_EQ(core::Sha256Hex(img.pixels.data(), img.pixels.size()),
            c["expected"]["resized_rgb_uint8_sha256"].get<std::string>());
  auto r = Preprocess(img, CheckpointConfig(), BoundsOf(c));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectMatchesGolden(c, *r);
}
INSTANTIATE_TEST_SUITE_P(Golden, PreprocessFromResized,
                         ::testing::ValuesIn(CaseNames(true, "resized_rgb")), TestName);

TEST(Preprocess, ManifestHasEveryCase) {
  EXPECT_EQ(CaseNames(true).size(), 14u);
  EXPECT_EQ(CaseNames(false).size(), 2u);
  EXPECT_EQ(CaseNames(true, "decoded_rgb").size(), 6u);
  EXPECT_EQ(CaseNames(true, "resized_rgb").size(), 9u);
}

TEST(Preprocess, ValuesFollowTheReferenceFormula) {
  const core::PreprocessorConfig cfg;
  const internal::Patchifier p(14, 2, 2, cfg.image_mean, cfg.image_std);
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      const float x = static_cast<float>(static_cast<double>(v) * (1.0 / 255.0));
      const float want = (x - cfg.image_mean[c]) / cfg.image_std[c];
      EXPECT_EQ(p.Value(c, static_cast<uint8_t>(v)), want);
    }
  }
}

// Layout: rows in raster order of 2x2 merge groups, each group's patches (0,0),(0,1),(1,0),(1,1);
// inside a row (channel, t, y, x); the two temporal copies identical.
void CheckRowLayout(int grid_h, int grid_w, int P, int M, int T) {
  SCOPED_TRACE(::testing::Message() << "patch " << P << " merge " << M << " temporal " << T);
  const int H = grid_h * P, W = grid_w * P;
  RgbImage img{W, H, std::vector<uint8_t>(static_cast<size_t>(W) * H * 3)};
  for (int y = 0; y < H; ++y) {
    for (int x = 0; x < W; ++x) {
      for (int c = 0; c < 3; ++c) img.row(y)[x * 3 + c] = static_cast<uint8_t>((x + 3 * y + 101 * c) % 256);
    }
  }
  core::PreprocessorConfig cfg;
  cfg.patch_size = P;
  cfg.merge_size = M;
  cfg.temporal_patch_size = T;
  cfg.min_pixels = 1;
  auto r = Preprocess(img, cfg);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->resized_height, H);
  ASSERT_EQ(r->resized_width, W);
  EXPECT_EQ(r->grid_thw, (std::array<int64_t, 3>{1, grid_h, grid_w}));
  const int64_t row_len = 3 * T * P * P;
  absl::StatusOr<core::Tensor> values = PixelValues(*r, cfg);
  ASSERT_TRUE(values.ok()) << values.status();
  ASSERT_EQ(values->dim(1), row_len);
  const internal::Patchifier p(P, T, M, cfg.image_mean, cfg.image_std);
  const float* pv = values->data<float>();
  int64_t row = 0;
  for (int gy = 0; gy < grid_h / M; ++gy) {
    for (int gx = 0; gx < grid_w / M; ++gx) {
      for (int dy = 0; dy < M; ++dy) {
        for (int dx = 0; dx < M; ++dx, ++row) {
          for (int c = 0; c < 3; ++c) {
            for (int t = 0; t < T; ++t) {
              for (int y = 0; y < P; ++y) {
                for (int x = 0; x < P; ++x) {
                  const int iy = (gy * M + dy) * P + y, ix = (gx * M + dx) * P + x;
                  const float want = p.Value(c, img.row(iy)[ix * 3 + c]);
                  ASSERT_EQ(pv[row * row_len + ((c * T + t) * P + y) * P + x], want)
                      << row << " " << c << " " << t << " " << y << " " << x;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(row, values->dim(0));

  // The encoder's op (kernels::PatchRows, on the CPU) makes the same rows from the bytes, in
  // ranges that start and end inside merge groups.
  const kernels::PatchGrid grid{P, T, M, H, W};
  const std::array<float, kPixelTableSize> table = PixelTable(cfg.image_mean, cfg.image_std);
  std::vector<float> made(static_cast<size_t>(values->numel()), -1.f);
  const int64_t n = grid.rows(), cuts[] = {0, n / 3 + 1, n - 1, n};
  for (int i = 0; i + 1 < 4; ++i) {
    kernels::PatchRows(kernels::DefaultCpuDevice(), r->rgb.data<uint8_t>(), grid, table.data(), cuts[i], cuts[i + 1],
                       made.data() + cuts[i] * row_len);
  }
  EXPECT_EQ(std::memcmp(made.data(), values->raw(), values->nbytes()), 0);
}

TEST(Preprocess, RowLayout) {
  CheckRowLayout(4, 6, 14, 2, 2);    // Qwen2.5-VL
  CheckRowLayout(4, 6, 16, 2, 2);    // Qwen3-VL's patch 16
  CheckRowLayout(6, 3, 18, 3, 1);    // scalar patchifier, other merge and temporal sizes
  CheckRowLayout(2, 8, 14, 2, 3);    // three temporal copies
  CheckRowLayout(3, 5, 14, 1, 2);    // groups not a multiple of 64 bytes: no streaming stores
}

// The strip-by-strip resize (ring of horizontal rows, strips, threads) against the plain path:
// the scalar Pillow transcription, then Preprocess of an image already at size (which resizes
// nothing).
TEST(Preprocess, StripResizeMatchesTwoStepReference) {
  struct Case { int w, h; int64_t min_pixels, max_pixels; };
  const std::vector<Case> cases = {
      {300, 200, 3136, 12845056},   {1000, 667, 3136, 12845056}, {640, 480, 3136, 12845056},
      {2048, 1536, 3136, 1003520},  {3000, 100, 3136, 12845056}, {336, 100, 3136, 12845056},
      {100, 336, 3136, 12845056},   {56, 300, 3136, 12845056},   {28, 28, 3136, 12845056},
      {29, 5000, 3136, 12845056},   {3000, 3000, 3136, 12544},   {1234, 987, 3136, 200704},
      {4000, 60, 3136, 120000},      {61, 61, 20000, 12845056},
  };
  const core::PreprocessorConfig cfg;
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.w << "x" << c.h << " max_pixels " << c.max_pixels);
    std::mt19937 rng(c.w * 7 + c.h);
    RgbImage img{c.w, c.h, std::vector<uint8_t>(static_cast<size_t>(c.w) * c.h * 3)};
    for (size_t i = 0; i < img.pixels.size(); ++i) {
      img.pixels[i] = (rng() % 3 == 0) ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>((i / 3 + i % 3 * 40) & 255);
    }
    PixelBounds b;
    b.min_pixels = c.min_pixels;
    b.max_pixels = c.max_pixels;
    auto size = SmartResize(c.h, c.w, 28, c.min_pixels, c.max_pixels);
    ASSERT_TRUE(size.ok()) << size.status();
    auto fused = Preprocess(img, cfg, b);
    ASSERT_TRUE(fused.ok()) << fused.status();
    const RgbImage resized = internal::ResizeBicubicReference(img, size->height, size->width);
    auto two_step = Preprocess(resized, cfg, b);
    ASSERT_TRUE(two_step.ok()) << two_step.status();
    ASSERT_EQ(fused->rgb.shape(), two_step->rgb.shape());
    EXPECT_EQ(std::memcmp(fused->rgb.raw(), two_step->rgb.raw(), fused->rgb.nbytes()), 0);
    EXPECT_EQ(std::memcmp(fused->rgb.raw(), resized.pixels.data(), resized.pixels.size()), 0);
    EXPECT_EQ(fused->grid_thw, two_step->grid_thw);
  }
}

// Every byte value through the vectorised normalization equals the reference formula.
TEST(Preprocess, EveryByteValue) {
  RgbImage img{28 * 16, 28, std::vector<uint8_t>(28 * 16 * 28 * 3)};
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>(i * 7 / 3);
  const core::PreprocessorConfig cfg;
  auto r = Preprocess(img, cfg);
  ASSERT_TRUE(r.ok()) << r.status();
  const internal::Patchifier p(14, 2, 2, cfg.image_mean, cfg.image_std);
  std::vector<bool> seen(3 * 256);
  absl::StatusOr<core::Tensor> values = PixelValues(*r, cfg);
  ASSERT_TRUE(values.ok()) << values.status();
  const float* pv = values->data<float>();
  for (int64_t row = 0; row < values->dim(0); ++row) {
    const int gx = static_cast<int>(row / 4), q = static_cast<int>(row % 4);
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 14; ++y) {
        for (int x = 0; x < 14; ++x) {
          const int iy = (q / 2) * 14 + y, ix = (gx * 2 + q % 2) * 14 + x;
          const uint8_t v = img.row(iy)[ix * 3 + c];
          seen[c * 256 + v] = true;
          ASSERT_EQ(pv[row * 1176 + (c * 2 * 14 + y) * 14 + x], p.Value(c, v));
          ASSERT_EQ(pv[row * 1176 + ((c * 2 + 1) * 14 + y) * 14 + x], p.Value(c, v));
        }
      }
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 3 * 256);
}

// Callers on several threads at once (the pool serves one job at a time; the others run on
// their own thread) get the same bytes.
TEST(Preprocess, ConcurrentCallsAgree) {
  std::mt19937 rng(5);
  RgbImage img{1000, 667, std::vector<uint8_t>(1000 * 667 * 3)};
  for (auto& v : img.pixels) v = static_cast<uint8_t>(rng());
  const core::PreprocessorConfig cfg;
  auto want = Preprocess(img, cfg);
  ASSERT_TRUE(want.ok()) << want.status();
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i) {
        auto got = Preprocess(img, cfg);
        if (!got.ok() || std::memcmp(got->rgb.raw(), want->rgb.raw(), want->rgb.nbytes()) != 0) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Preprocess, PixelBoundsOverrideTheConfig) {
  RgbImage img{2048, 1536, std::vector<uint8_t>(2048 * 1536 * 3, 7)};
  const core::PreprocessorConfig cfg;
  PixelBounds b;
  b.max_pixels = 1003520;
  auto r = Preprocess(img, cfg, b);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resized_height, 840);
  EXPECT_EQ(r->resized_width, 1148);
  EXPECT_EQ(r->grid_thw, (std::array<int64_t, 3>{1, 60, 82}));
  EXPECT_EQ(r->rgb.shape(), (std::vector<int64_t>{840, 1148, 3}));
  // The same through the config.
  core::PreprocessorConfig small = cfg;
  small.max_pixels = 1003520;
  auto r2 = Preprocess(img, small);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->resized_width, 1148);
  // A min_pixels override upscales.
  RgbImage tiny{56, 56, std::vector<uint8_t>(56 * 56 * 3, 200)};
  PixelBounds up;
  up.min_pixels = 20000;
  auto r3 = Preprocess(tiny, cfg, up);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ(r3->resized_height, 168);
}

TEST(Preprocess, RejectsBadInput) {
  const core::PreprocessorConfig cfg;
  RgbImage wide{8400, 28, std::vector<uint8_t>(8400 * 28 * 3)};
  auto r = Preprocess(wide, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("aspect ratio 300.0 exceeds the limit 200"));

  RgbImage small{300, 20, std::vector<uint8_t>(300 * 20 * 3)};
  r = Preprocess(small, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("image height 20 is below the minimum 28 (patch 14 x merge 2)"));

  RgbImage truncated{100, 100, std::vector<uint8_t>(10)};
  EXPECT_FALSE(Preprocess(truncated, cfg).ok());

  RgbImage ok{100, 100, std::vector<uint8_t>(100 * 100 * 3)};
  PixelBounds bad;
  bad.min_pixels = 5000;
  bad.max_pixels = 4000;
  r = Preprocess(ok, cfg, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("min_pixels 5000 exceeds max_pixels 4000"));
}

}  // namespace
}  // namespace iris::vision
