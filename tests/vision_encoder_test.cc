// The ViT encoder against the reference's outputs (tiny and the 3B vision tower, f32 and bf16),
// and its properties: batched = sequential, every technique switch gives the same result.
#include "vision/vision_encoder.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "core/model_config.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "gtest/gtest.h"
#include "kernels/linear.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "vision/image_decode.h"
#include "vision/preprocess.h"

namespace iris::vision {
namespace {

using core::Tensor;
using kernels::ComputeType;

// One batch of images both ways the encoder takes them: the reference's pixel_values rows (made
// on the host), and the resized images' bytes packed back to back (what the engine hands over).
struct Inputs {
  Tensor pixel_values;
  Tensor rgb;
  PixelNormalization normalization;
  std::vector<GridThw> grids;
};

Inputs Prepare(const std::vector<std::string>& images, const core::PreprocessorConfig& pp) {
  Inputs in;
  in.normalization = {pp.image_mean, pp.image_std};
  std::vector<Tensor> parts;
  std::vector<Tensor> bytes;
  int64_t rows = 0, total_bytes = 0;
  for (const auto& name : images) {
    auto rgb = DecodeImageFile(testing::DataPath(name));
    EXPECT_TRUE(rgb.ok()) << name << ": " << rgb.status();
    auto p = Preprocess(*rgb, pp);
    EXPECT_TRUE(p.ok()) << name << ": " << p.status();
    auto values = PixelValues(*p, pp);
    EXPECT_TRUE(values.ok()) << name << ": " << values.status();
    rows += values->dim(0);
    total_bytes += p->rgb.nbytes();
    in.grids.push_back(p->grid_thw);
    parts.push_back(*values);
    bytes.push_back(p->rgb);
  }
  in.pixel_values = Tensor::Empty(core::DType::kF32, {rows, parts[0].dim(1)});
  int64_t at = 0;
  for (const auto& t : parts) {
    std::memcpy(in.pixel_values.data<float>() + at * t.dim(1), t.data<float>(), t.nbytes());
    at += t.dim(0);
  }
  in.rgb = Tensor::Empty(core::DType::kU8, {total_bytes});
  at = 0;
  for (const auto& t : bytes) {
    std::memcpy(in.rgb.data<uint8_t>() + at, t.data<uint8_t>(), t.nbytes());
    at += t.nbytes();
  }
  return in;
}


struct Model {
  core::ModelConfig config;
  core::PreprocessorConfig pp;
  std::unique_ptr<VisionEncoder> encoder;
};

std::unique_ptr<Model> LoadModel(const std::string& dir, ComputeType compute, EncoderOptions options = {}) {
  auto m = std::make_unique<Model>();
  auto config = core::LoadModelConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  auto pp = core::LoadPreprocessorConfig(dir);
  EXPECT_TRUE(pp.ok()) << pp.status();
  auto ckpt = core::Checkpoint::Open(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  if (!config.ok() || !pp.ok() || !ckpt.ok()) return nullptr;
  m->config = *config;
  m->pp = *pp;
  options.compute = compute;
  auto enc = VisionEncoder::Load(kernels::DefaultCpuDevice(), *ckpt, config->vision, options);
  EXPECT_TRUE(enc.ok()) << enc.status();
  if (!enc.ok()) return nullptr;
  m->encoder = std::move(*enc);
  return m;
}

std::vector<std::string> ImagesOf(const nlohmann::json& c) {
  std::vector<std::string> images;
  for (const auto& i : c["images"]) images.push_back(i.get<std::string>());
  return images;
}

// Compares one golden case; returns the relative L2 error of the output.
double CheckCase(Model& m, const nlohmann::json& c, bool f32) {
  const std::string file = c["arrays"]["file"].get<std::string>();
  Inputs in = Prepare(ImagesOf(c), m.pp);
  EXPECT_EQ(core::Sha256Hex(in.pixel_values.raw(), in.pixel_values.nbytes()),
            c["pixel_values"]["float32_sha256"].get<std::string>())
      << "pixel_values differ from the reference's";
  const Tensor grid = testing::LoadGolden(file, "image_grid_thw");
  for (size_t i = 0; i < in.grids.size(); ++i) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(in.grids[i][j], grid.data<int64_t>()[i * 3 + j]);
  }
  // Block outputs the fixture holds (window order): full for tiny, sampled rows for 3b.
  auto file_handle = core::SafetensorsFile::Open(testing::DataPath(file));
  EXPECT_TRUE(file_handle.ok());
  std::map<int, double> block_err;
  m.encoder->set_block_observer([&](int block, const float* hidden, int64_t rows) {
    const int64_t hv = m.config.vision.hidden_size;
    const std::string full = "block" + std::to_string(block) + "_out";
    if ((*file_handle)->Find(full) != nullptr) {
      const Tensor g = testing::LoadGolden(file, full);
      block_err[block] = testing::RelativeL2(hidden, g.data<float>(), rows * hv);
    } else if ((*file_handle)->Find(full + "_row_sums") != nullptr) {
      const Tensor sums = testing::LoadGolden(file, full + "_row_sums");
      double num = 0, den = 0;
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (int64_t j = 0; j < hv; ++j) s += hidden[r * hv + j];
        num += (s - sums.data<double>()[r]) * (s - sums.data<double>()[r]);
        den += sums.data<double>()[r] * sums.data<double>()[r];
      }
      block_err[block] = std::sqrt(num / den);
    }
  });
  // From the images' bytes, as the engine encodes them (the pixel values made by the encoder).
  auto out = m.encoder->ForwardRgb(in.rgb, in.grids, in.normalization);
  m.encoder->set_block_observer(nullptr);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return 1.0;
  const double block_tol = f32 ? 1e-4 : 3e-2;
  for (auto [b, e] : block_err) EXPECT_LT(e, block_tol) << "block " << b << " output";
  const int64_t dim = out->dim(1);
  EXPECT_EQ(out->dim(0), c["output_shape"][0].get<int64_t>());
  EXPECT_EQ(dim, c["output_shape"][1].get<int64_t>());
  if ((*file_handle)->Find("output") != nullptr) {
    const Tensor g = testing::LoadGolden(file, "output");
    std::printf("  %s: max abs diff %.3g\n", c["case"].get<std::string>().c_str(),
                testing::MaxAbsDiff(out->data<float>(), g.data<float>(), g.numel()));
    return testing::RelativeL2(out->data<float>(), g.data<float>(), g.numel());
  }
  // Reduced fixture: sampled rows, plus row sums / L2 norms / column sums of all rows.
  const Tensor rows = testing::LoadGolden(file, "output_rows");
  const Tensor index = testing::LoadGolden(file, "output_row_index");
  const Tensor row_l2 = testing::LoadGolden(file, "output_row_l2");
  const Tensor col_sums = testing::LoadGolden(file, "output_col_sums");
  std::vector<float> picked(rows.numel());
  for (int64_t i = 0; i < index.numel(); ++i) {
    std::memcpy(picked.data() + i * dim, out->data<float>() + index.data<int64_t>()[i] * dim, dim * sizeof(float));
  }
  for (int64_t r = 0; r < out->dim(0); ++r) {
    double l2 = 0;
    for (int64_t j = 0; j < dim; ++j) l2 += double{out->data<float>()[r * dim + j]} * out->data<float>()[r * dim + j];
    EXPECT_NEAR(std::sqrt(l2), row_l2.data<double>()[r], (f32 ? 1e-4 : 2e-2) * row_l2.data<double>()[r]) << "row " << r;
  }
  std::vector<float> ours_cols(dim, 0.f), ref_cols(dim);
  for (int64_t j = 0; j < dim; ++j) {
    double s = 0;
    for (int64_t r = 0; r < out->dim(0); ++r) s += out->data<float>()[r * dim + j];
    ours_cols[j] = static_cast<float>(s);
    ref_cols[j] = static_cast<float>(col_sums.data<double>()[j]);
  }
  EXPECT_LT(testing::RelativeL2(ours_cols.data(), ref_cols.data(), dim), f32 ? 1e-4 : 2e-2) << "column sums";
  return testing::RelativeL2(picked.data(), rows.data<float>(), rows.numel());
}

class TinyEncoder : public ::testing::TestWithParam<ComputeType> {};

TEST_P(TinyEncoder, MatchesEveryGoldenCase) {
  const bool f32 = GetParam() == ComputeType::kF32;
  auto m = LoadModel(testing::ModelPath("tiny"), GetParam());
  ASSERT_NE(m, nullptr);
  const nlohmann::json manifest = testing::LoadDataJson("vision/manifest_tiny.json");
  ASSERT_EQ(manifest["cases"].size(), 3u);
  for (const auto& c : manifest["cases"]) {
    const double err = CheckCase(*m, c, f32);
    std::printf("  %s %s: relative L2 %.3g\n", c["case"].get<std::string>().c_str(), f32 ? "f32" : "bf16", err);
    EXPECT_LE(err, f32 ? 1e-4 : 2e-2) << c["case"];
  }
}

INSTANTIATE_TEST_SUITE_P(Compute, TinyEncoder, ::testing::Values(ComputeType::kF32, ComputeType::kBF16),
                         [](const auto& info) { return info.param == ComputeType::kF32 ? "f32" : "bf16"; });

// Qwen2-VL's tower (LayerNorm, fc1/fc2 QuickGELU, full attention in every block, LayerNorm ln_q)
// through the same encoder: every case and block output (raster order: no windows).
class Qwen2VLEncoder : public ::testing::TestWithParam<ComputeType> {};

TEST_P(Qwen2VLEncoder, MatchesEveryGoldenCase) {
  const bool f32 = GetParam() == ComputeType::kF32;
  auto m = LoadModel(testing::ModelPath("tiny-qwen2-vl"), GetParam());
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->config.vision.norm, core::VisionNorm::kLayerNorm);
  EXPECT_EQ(m->config.vision.mlp, core::VisionMlp::kQuickGelu);
  EXPECT_FALSE(m->config.vision.windowed);
  const nlohmann::json manifest = testing::LoadDataJson("vision/manifest_qwen2vl.json");
  ASSERT_EQ(manifest["cases"].size(), 3u);
  for (const auto& c : manifest["cases"]) {
    const double err = CheckCase(*m, c, f32);
    std::printf("  %s %s: relative L2 %.3g\n", c["case"].get<std::string>().c_str(), f32 ? "f32" : "bf16", err);
    EXPECT_LE(err, f32 ? 1e-4 : 2e-2) << c["case"];
    // One cu_seqlens set (per image) and no window boundaries in the plan.
    auto plan = BuildEncoderPlan(m->config.vision, Prepare(ImagesOf(c), m->pp).grids);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::string file = c["arrays"]["file"].get<std::string>();
    const std::vector<int64_t> cu = testing::Int64Values(testing::LoadGolden(file, "cu_seqlens"));
    EXPECT_EQ(std::vector<int64_t>((*plan)->cu_seqlens.begin(), (*plan)->cu_seqlens.end()), cu);
    EXPECT_TRUE((*plan)->cu_window_seqlens.empty());
    if (f32) {  // elementwise |a - b| <= 1e-4 + 1e-4 |b| on the output
      const Inputs in = Prepare(ImagesOf(c), m->pp);
      auto out = m->encoder->Forward(in.pixel_values, in.grids);
      ASSERT_TRUE(out.ok()) << out.status();
      const Tensor g = testing::LoadGolden(file, "output");
      int64_t bad = 0;
      for (int64_t i = 0; i < g.numel(); ++i) {
        const float a = out->data<float>()[i], b = g.data<float>()[i];
        if (!(std::fabs(a - b) <= 1e-4f + 1e-4f * std::fabs(b))) ++bad;
      }
      EXPECT_EQ(bad, 0) << c["case"];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Compute, Qwen2VLEncoder, ::testing::Values(ComputeType::kF32, ComputeType::kBF16),
                         [](const auto& info) { return info.param == ComputeType::kF32 ? "f32" : "bf16"; });

class Vision3bEncoder : public ::testing::TestWithParam<ComputeType> {};

TEST_P(Vision3bEncoder, MatchesEveryGoldenCase) {
  const bool f32 = GetParam() == ComputeType::kF32;
  auto m = LoadModel(testing::ModelPath("vision-3b"), GetParam());
  ASSERT_NE(m, nullptr);
  const nlohmann::json manifest = testing::LoadDataJson("vision/manifest_vision3b.json");
  ASSERT_EQ(manifest["cases"].size(), 3u);
  for (const auto& c : manifest["cases"]) {
    const double err = CheckCase(*m, c, f32);
    std::printf("  %s %s: relative L2 %.3g\n", c["case"].get<std::string>().c_str(), f32 ? "f32" : "bf16", err);
    EXPECT_LE(err, f32 ? 1e-4 : 2e-2) << c["case"];
  }
}

INSTANTIATE_TEST_SUITE_P(Compute, Vision3bEncoder, ::testing::Values(ComputeType::kF32, ComputeType::kBF16),
                         [](const auto& info) { return info.param == ComputeType::kF32 ? "f32" : "bf16"; });

// Configuration `off` of four: 0, 1, 2 switch off one technique each (fused rotary, parallel
// q/k/v padding, cached cu_seqlens), 3 all three.
EncoderTechniques TechniqueConfiguration(int off) {
  EncoderTechniques t;
  t.fused_rotary = off != 0 && off != 3;
  t.parallel_qkv_padding = off != 1 && off != 3;
  t.cached_cu_seqlens = off != 2 && off != 3;
  return t;
}

// Several images in one varlen forward give each image's rows exactly as encoding it alone
// (images never attend to each other), and every technique switch leaves the output unchanged.
TEST(VisionEncoderProperties, BatchedEqualsSequentialAndSwitchesAgree) {
  auto m = LoadModel(testing::ModelPath("tiny"), ComputeType::kF32);
  ASSERT_NE(m, nullptr);
  const std::vector<std::string> images = {"images/rgb_300x200.png", "images/gray_56x56.png",
                                           "images/jpeg444_q90_640x480.jpg"};
  Inputs all = Prepare(images, m->pp);
  auto batched = m->encoder->Forward(all.pixel_values, all.grids);
  ASSERT_TRUE(batched.ok()) << batched.status();
  int64_t row = 0;
  for (const auto& image : images) {
    Inputs one = Prepare({image}, m->pp);
    auto alone = m->encoder->Forward(one.pixel_values, one.grids);
    ASSERT_TRUE(alone.ok());
    const int64_t n = alone->numel();
    EXPECT_LT(testing::MaxAbsDiff(batched->data<float>() + row * alone->dim(1), alone->data<float>(), n), 1e-5)
        << image;
    row += alone->dim(0);
  }
  EXPECT_EQ(row, batched->dim(0));

  for (int off = 0; off < 4; ++off) {
    m->encoder->set_techniques(TechniqueConfiguration(off));
    auto out = m->encoder->Forward(all.pixel_values, all.grids);
    ASSERT_TRUE(out.ok());
    EXPECT_LT(testing::MaxAbsDiff(out->data<float>(), batched->data<float>(), out->numel()), 1e-5)
        << "technique configuration " << off;
  }
}

// The resumable forward (Begin, Advance in pieces, Finish) gives Forward's output bit for bit
// (where the matmuls are split-invariant; else to rounding), however small the pieces, in both compute modes and with every technique switch; the FLOPs the
// pieces report add up to what remained at Begin, and a small allowance really runs one piece.
TEST(VisionEncoderProperties, ResumableForwardIsBitIdentical) {
  for (const ComputeType compute : {ComputeType::kF32, ComputeType::kBF16}) {
    auto m = LoadModel(testing::ModelPath("tiny"), compute);
    ASSERT_NE(m, nullptr);
    Inputs in = Prepare({"images/jpeg444_q90_640x480.jpg", "images/rgb_300x200.png"}, m->pp);
    for (int off = 0; off < 4; ++off) {
      m->encoder->set_techniques(TechniqueConfiguration(off));
      auto whole = m->encoder->Forward(in.pixel_values, in.grids);
      ASSERT_TRUE(whole.ok()) << whole.status();
      for (const double parts : {1e12, 7.0, 1.0}) {
        // From the pixel values, and from the bytes (the patch rows made piece by piece, pieces
        // crossing from one image to the next).
        const bool from_bytes = parts != 7.0;
        ASSERT_TRUE((from_bytes ? m->encoder->BeginRgb(in.rgb, in.grids, in.normalization)
                                : m->encoder->Begin(in.pixel_values, in.grids))
                        .ok());
        EXPECT_FALSE(m->encoder->Begin(in.pixel_values, in.grids).ok()) << "a second forward while one runs";
        EXPECT_FALSE(m->encoder->BeginRgb(in.rgb, in.grids, in.normalization).ok());
        const double total = m->encoder->remaining_flops();
        ASSERT_GT(total, 0);
        double ran = 0;
        int calls = 0;
        while (!m->encoder->done()) {
          auto r = m->encoder->Advance(total / parts);
          ASSERT_TRUE(r.ok()) << r.status();
          ran += *r;
          ++calls;
          ASSERT_LT(calls, 100000);
        }
        EXPECT_NEAR(ran, total, 1e-9 * total);
        EXPECT_EQ(m->encoder->remaining_flops(), 0);
        // At a FLOP of allowance every call runs one piece: 64 rows of a stage (or one pad).
        const int64_t granules = in.pixel_values.dim(0) / 64;
        if (parts >= 1e12) {
          EXPECT_GE(calls, m->config.vision.depth * 2 * granules);
        }
        auto out = m->encoder->Finish();
        ASSERT_TRUE(out.ok()) << out.status();
        EXPECT_FALSE(m->encoder->in_progress());
        ASSERT_EQ(out->numel(), whole->numel());
        EXPECT_TRUE(testing::SameUnderRowSplits(out->data<float>(), whole->data<float>(), out->numel(),
                                                kernels::MatmulRowsSplitInvariant(kernels::DefaultCpuDevice()),
                                                compute == ComputeType::kF32 ? 1e-5 : 1e-2))
            << "compute " << (compute == ComputeType::kF32 ? "f32" : "bf16") << ", technique configuration " << off
            << ", allowance 1/" << parts << " of the forward, from " << (from_bytes ? "bytes" : "pixel values");
      }
    }
  }
  // Advance needs a forward in progress; Finish before done is refused and ends it.
  auto m = LoadModel(testing::ModelPath("tiny"), ComputeType::kF32);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->encoder->Advance(1).status().code(), absl::StatusCode::kFailedPrecondition);
  Inputs in = Prepare({"images/rgb_300x200.png"}, m->pp);
  ASSERT_TRUE(m->encoder->Begin(in.pixel_values, in.grids).ok());
  ASSERT_TRUE(m->encoder->Advance(1).ok());
  EXPECT_EQ(m->encoder->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(m->encoder->in_progress());
}

TEST(VisionEncoderProperties, PlanIsCachedWhileGridsRepeat) {
  auto m = LoadModel(testing::ModelPath("tiny"), ComputeType::kBF16);
  ASSERT_NE(m, nullptr);
  Inputs in = Prepare({"images/rgb_448x448.png"}, m->pp);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(m->encoder->Forward(in.pixel_values, in.grids).ok());
  EXPECT_EQ(m->encoder->stats().forwards, 3);
  EXPECT_EQ(m->encoder->stats().plan_cache_misses, 1);
  EXPECT_EQ(m->encoder->stats().plan_cache_hits, 2);
}

TEST(VisionEncoderProperties, RejectsMismatchedInputs) {
  auto m = LoadModel(testing::ModelPath("tiny"), ComputeType::kF32);
  ASSERT_NE(m, nullptr);
  Tensor px = Tensor::Zeros(core::DType::kF32, {16, 1176});
  std::vector<GridThw> grids = {{1, 4, 8}};  // 32 patches, not 16
  auto r = m->encoder->Forward(px, grids);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("32 patches"), std::string::npos) << r.status();
  Tensor wrong = Tensor::Zeros(core::DType::kF32, {32, 1000});
  EXPECT_FALSE(m->encoder->Forward(wrong, grids).ok());
}

// The activations are allocated for a patch capacity: a forward over it is refused (never grown),
// one within it runs.
TEST(VisionEncoderProperties, RefusesForwardsOverItsCapacity) {
  auto m = LoadModel(testing::ModelPath("tiny"), ComputeType::kF32);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->encoder->ReserveActivations(16).ok());
  Tensor px = Tensor::Zeros(core::DType::kF32, {32, 1176});
  std::vector<GridThw> grids = {{1, 4, 8}};
  auto r = m->encoder->Forward(px, grids);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("max_patches"), std::string::npos) << r.status();
  ASSERT_TRUE(m->encoder->ReserveActivations(32).ok());
  EXPECT_TRUE(m->encoder->Forward(px, grids).ok());
  EXPECT_FALSE(m->encoder->ReserveActivations(3).ok());  // not one merged token
}

// The forward from the images' bytes is the forward of their pixel values, bit for bit: the patch
// rows the encoder makes (kernels::PatchRows) are the host's (PixelValues) in every row.
TEST(VisionEncoderProperties, ForwardFromBytesIsTheForwardOfItsPixelValues) {
  for (const ComputeType compute : {ComputeType::kF32, ComputeType::kBF16}) {
    auto m = LoadModel(testing::ModelPath("tiny"), compute);
    ASSERT_NE(m, nullptr);
    const Inputs in = Prepare({"images/rgb_300x200.png", "images/gray_56x56.png", "images/jpeg444_q90_640x480.jpg"},
                              m->pp);
    auto from_values = m->encoder->Forward(in.pixel_values, in.grids);
    auto from_bytes = m->encoder->ForwardRgb(in.rgb, in.grids, in.normalization);
    ASSERT_TRUE(from_values.ok()) << from_values.status();
    ASSERT_TRUE(from_bytes.ok()) << from_bytes.status();
    ASSERT_EQ(from_bytes->shape(), from_values->shape());
    EXPECT_EQ(std::memcmp(from_bytes->raw(), from_values->raw(), from_values->nbytes()), 0);
    // Another normalization gives other pixel values (the table follows it), and back.
    PixelNormalization other = in.normalization;
    other.mean[1] += 0.25f;
    auto shifted = m->encoder->ForwardRgb(in.rgb, in.grids, other);
    ASSERT_TRUE(shifted.ok()) << shifted.status();
    EXPECT_NE(std::memcmp(shifted->raw(), from_values->raw(), from_values->nbytes()), 0);
    auto again = m->encoder->ForwardRgb(in.rgb, in.grids, in.normalization);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(std::memcmp(again->raw(), from_values->raw(), from_values->nbytes()), 0);
    // FinishImages: the same rows, a tensor per image (a quarter of its patches each).
    ASSERT_TRUE(m->encoder->BeginRgb(in.rgb, in.grids, in.normalization).ok());
    while (!m->encoder->done()) ASSERT_TRUE(m->encoder->Advance(1e18).ok());
    auto images = m->encoder->FinishImages();
    ASSERT_TRUE(images.ok()) << images.status();
    EXPECT_FALSE(m->encoder->in_progress());
    ASSERT_EQ(images->size(), in.grids.size());
    int64_t row = 0;
    for (size_t i = 0; i < images->size(); ++i) {
      const Tensor& image = (*images)[i];
      ASSERT_EQ(image.shape(), (std::vector<int64_t>{in.grids[i][1] * in.grids[i][2] / 4, from_values->dim(1)}));
      EXPECT_EQ(std::memcmp(image.raw(), from_values->data<float>() + row * from_values->dim(1), image.nbytes()), 0)
          << "image " << i;
      row += image.dim(0);
    }
    EXPECT_EQ(row, from_values->dim(0));
  }
}

// Graphs need a device that records them (a GPU: cuda_model_test checks their replays); the CPU
// refuses them and its forwards are as before.
TEST(VisionEncoderProperties, GraphsAreRefusedWhereTheDeviceRecordsNone) {
  auto m = LoadModel(testing::ModelPath("tiny"), ComputeType::kF32);
  ASSERT_NE(m, nullptr);
  const absl::Status s = m->encoder->EnableGraphs();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("records no graphs"), std::string::npos) << s;
  EXPECT_EQ(m->encoder->graphs(), 0);
  EXPECT_EQ(m->encoder->graph_replays(), 0);
  const Inputs in = Prepare({"images/rgb_300x200.png"}, m->pp);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(m->encoder->ForwardRgb(in.rgb, in.grids, in.normalization).ok());
  EXPECT_EQ(m->encoder->graph_replays(), 0);
}

TEST(VisionEncoderProperties, RefusesBytesThatAreNotItsImages) {
  auto m = LoadModel(testing::ModelPath("tiny"), ComputeType::kF32);
  ASSERT_NE(m, nullptr);
  const PixelNormalization norm{m->pp.image_mean, m->pp.image_std};
  const std::vector<GridThw> grids = {{1, 4, 8}, {1, 2, 2}};  // 56x112 and 28x28 pixels
  const int64_t bytes = (56 * 112 + 28 * 28) * 3;
  EXPECT_TRUE(m->encoder->ForwardRgb(Tensor::Zeros(core::DType::kU8, {bytes}), grids, norm).ok());
  auto short_by_one = m->encoder->ForwardRgb(Tensor::Zeros(core::DType::kU8, {bytes - 1}), grids, norm);
  ASSERT_FALSE(short_by_one.ok());
  EXPECT_EQ(short_by_one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_by_one.status().message().find("grid_thw implies 21168"), std::string::npos) << short_by_one.status();
  auto floats = m->encoder->ForwardRgb(Tensor::Zeros(core::DType::kF32, {bytes}), grids, norm);
  ASSERT_FALSE(floats.ok());
  EXPECT_NE(floats.status().message().find("rgb must be U8"), std::string::npos) << floats.status();
  const std::vector<GridThw> video = {{2, 4, 8}};
  auto frames = m->encoder->ForwardRgb(Tensor::Zeros(core::DType::kU8, {2 * 56 * 112 * 3}), video, norm);
  ASSERT_FALSE(frames.ok());
  EXPECT_NE(frames.status().message().find("grid_thw[0]: t is 2"), std::string::npos) << frames.status();
  EXPECT_FALSE(m->encoder->in_progress());
}

}  // namespace
}  // namespace iris::vision
