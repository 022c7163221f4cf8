// iris-encode end to end, as a user runs it: a subprocess on the tiny model, its output file
// checked against the reference, and its errors checked for a message and a non-zero exit.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "core/safetensors.h"
#include "core/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace iris {
namespace {

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

Result RunEncode(const std::string& args) {
  Result r;
  const std::string cmd = std::string(IRIS_ENCODE_BIN) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string TempFile(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("iris_encode_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(IrisEncode, WritesWhatTheReferenceComputes) {
  const std::string out = TempFile("batch.safetensors");
  const Result r = RunEncode("--model " + testing::ModelPath("tiny") + " --dtype f32 --image " +
                       testing::DataPath("images/rgb_300x200.png") + " --image " +
                       testing::DataPath("images/jpeg444_q90_640x480.jpg") + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("encoded 2 image(s) grid_thw=[1x14x22, 1x34x46]"), std::string::npos) << r.output;
  auto file = core::SafetensorsFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string golden = "vision/tiny-batch_300x200_640x480.safetensors";
  auto grid = (*file)->Get("image_grid_thw");
  ASSERT_TRUE(grid.ok());
  const core::Tensor ref_grid = testing::LoadGolden(golden, "image_grid_thw");
  ASSERT_EQ(grid->shape(), ref_grid.shape());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(grid->data<int64_t>()[i], ref_grid.data<int64_t>()[i]);
  auto px = (*file)->Get("pixel_values");
  ASSERT_TRUE(px.ok());
  EXPECT_EQ(px->shape(), (std::vector<int64_t>{1872, 1176}));
  // The SHA-256 of the reference's pixel_values for this batch (vision/manifest_tiny.json).
  EXPECT_EQ(core::Sha256Hex(px->raw(), px->nbytes()),
            "80fc8f6149738376e55dbba9860452306e32ab2d98c5510da135dda795b69592");
  auto embeds = (*file)->Get("image_embeds");
  ASSERT_TRUE(embeds.ok());
  const core::Tensor ref = testing::LoadGolden(golden, "output");
  ASSERT_EQ(embeds->shape(), ref.shape());
  EXPECT_LT(testing::RelativeL2(embeds->data<float>(), ref.data<float>(), ref.numel()), 1e-4);
  std::filesystem::remove(out);
}

TEST(IrisEncode, HonoursPixelBounds) {
  const std::string out = TempFile("bounded.safetensors");
  const Result r = RunEncode("--model " + testing::ModelPath("tiny") + " --image " +
                       testing::DataPath("images/jpeg420_q90_2048x1536.jpg") + " --max-pixels 1003520 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The reference's class_default case: 2048x1536 with max_pixels 1003520 -> 1148x840.
  EXPECT_NE(r.output.find("grid_thw=[1x60x82]"), std::string::npos) << r.output;
  std::filesystem::remove(out);
  const Result too_big = RunEncode("--model " + testing::ModelPath("tiny") + " --image " +
                             testing::DataPath("images/rgb_300x200.png") + " --max-pixels 99999999999 --out " + out);
  EXPECT_NE(too_big.exit_code, 0);
  EXPECT_NE(too_big.output.find("max_pixels 99999999999 is outside the allowed range [3136, 12845056]"),
            std::string::npos) << too_big.output;
}

TEST(IrisEncode, ReportsBadInputsAndExitsNonZero) {
  const std::string out = TempFile("never.safetensors");
  const std::string model = "--model " + testing::ModelPath("tiny");
  struct Case {
    std::string args, message;
  };
  const std::string garbage = TempFile("garbage.jpg");
  {
    FILE* f = std::fopen(garbage.c_str(), "wb");
    std::fputs("this is not an image at all", f);
    std::fclose(f);
  }
  const std::vector<Case> cases = {
      {model + " --image " + testing::DataPath("images/rgb_1x1.png") + " --out " + out, "below the minimum 28"},
      {model + " --image " + testing::DataPath("images/rgb_20x300.png") + " --out " + out, "below the minimum 28"},
      {model + " --image " + garbage + " --out " + out, "unsupported image format"},
      {model + " --image /nonexistent/cat.jpg --out " + out, "/nonexistent/cat.jpg"},
      {model + " --out " + out, "at least one --image"},
      {model + " --image " + testing::DataPath("images/rgb_300x200.png"), "--out is required"},
      {model + " --dtype f16 --image " + testing::DataPath("images/rgb_300x200.png") + " --out " + out, "--dtype"},
      {model + " --hopper_gemm=swiglu --image " + testing::DataPath("images/rgb_300x200.png") + " --out " + out,
       "is for a CUDA device"},
      {model + " --hopper_gemm=on --image " + testing::DataPath("images/rgb_300x200.png") + " --out " + out,
       "not one of: off, swiglu, all"},
      {"--model /nonexistent --image " + testing::DataPath("images/rgb_300x200.png") + " --out " + out, "config.json"},
      {"--model " + testing::DataPath("tiny-qwen2-text") + " --image " + testing::DataPath("images/rgb_300x200.png") +
           " --out " + out,
       "a text-only model (model_type qwen2) has no vision tower"},
  };
  for (const auto& c : cases) {
    const Result r = RunEncode(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("Aborted"), std::string::npos) << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  std::filesystem::remove(garbage);
}

}  // namespace
}  // namespace iris
