// The tiny model on a GPU (label gpu) against the Hugging Face goldens and the CPU: the vision
// encoder's output for every golden case (f32 rel L2 <= 1e-4, bf16 <= 2e-2), the decoder's
// last-position logits of every golden prompt (same bounds), and greedy decoding on the GPU
// giving the CPU's tokens; the encoder's layer loop captured whole in a CUDA graph (no host sync). (Data and models come from IRIS_TEST_DATA / IRIS_TEST_MODELS when those
// are set: scripts/gpu_check.sh makes the tiny model on the GPU machine.)
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/model_config.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#endif
#include "llm/decoder.h"
#include "llm/kv_cache.h"
#include "nlohmann/json.hpp"
#include "tests/decode_graph_cases.h"
#include "tests/kernel_cases.h"
#include "tests/test_util.h"
#include "vision/preprocess.h"
#include "vision/vision_encoder.h"

namespace iris {
namespace {

#ifdef IRIS_HAVE_CUDA

using kernels::ComputeType;
using testing::Int64Values;
using testing::LoadGolden;
using testing::RelativeL2;


// The golden case's images both ways the encoder takes them, preprocessed from the reference's
// resized images (the preprocess goldens' resized_rgb: resizing them again to their own size
// changes nothing): their bytes packed (what the engine hands over), and the pixel values made on
// the host, checked against the reference's pixel_values hash. Decoding the original files would
// link OpenCV's codecs, which the GPU bundle leaves out.
struct GoldenImages {
  core::Tensor pixels;
  core::Tensor rgb;
};
GoldenImages ImagesOf(const nlohmann::json& c, const core::PreprocessorConfig& pp,
                      std::vector<vision::GridThw>* grids) {
  std::vector<core::Tensor> parts, bytes;
  int64_t rows = 0, total_bytes = 0;
  for (const auto& name : c["preprocess_cases"]) {
    const core::Tensor resized = LoadGolden("preprocess/" + name.get<std::string>() + ".safetensors", "resized_rgb");
    auto p = vision::Preprocess(testing::ImageFromTensor(resized), pp);
    EXPECT_TRUE(p.ok()) << p.status();
    auto values = vision::PixelValues(*p, pp);
    EXPECT_TRUE(values.ok()) << values.status();
    rows += values->dim(0);
    total_bytes += p->rgb.nbytes();
    grids->push_back(p->grid_thw);
    parts.push_back(*values);
    bytes.push_back(p->rgb);
  }
  GoldenImages in{core::Tensor::Empty(core::DType::kF32, {rows, parts[0].dim(1)}),
                  core::Tensor::Empty(core::DType::kU8, {total_bytes})};
  int64_t at = 0;
  for (const auto& t : parts) {
    std::memcpy(in.pixels.data<float>() + at * t.dim(1), t.data<float>(), t.nbytes());
    at += t.dim(0);
  }
  at = 0;
  for (const auto& t : bytes) {
    std::memcpy(in.rgb.data<uint8_t>() + at, t.data<uint8_t>(), t.nbytes());
    at += t.nbytes();
  }
  EXPECT_EQ(core::Sha256Hex(in.pixels.raw(), in.pixels.nbytes()), c["pixel_values"]["float32_sha256"].get<std::string>())
      << "pixel_values differ from the reference's";
  return in;
}

// The tiny encoder on a GPU in the suite's compute type, and the golden cases.
class CudaTinyEncoder : public ::testing::TestWithParam<ComputeType> {
 protected:
  void SetUp() override {
    gpu_ = testing::MakeGpuDevice();
    ASSERT_NE(gpu_, nullptr);
    const std::string dir = testing::ModelPath("tiny");
    auto config = core::LoadModelConfig(dir);
    auto pp = core::LoadPreprocessorConfig(dir);
    auto ckpt = core::Checkpoint::Open(dir);
    ASSERT_TRUE(config.ok() && pp.ok() && ckpt.ok());
    pp_ = *pp;
    vision::EncoderOptions options;
    options.compute = GetParam();
    auto encoder = vision::VisionEncoder::Load(*gpu_, *ckpt, config->vision, options);
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    encoder_ = std::move(*encoder);
    manifest_ = testing::LoadDataJson("vision/manifest_tiny.json");
  }

  // The case's golden output against `out` (f32 rel L2 <= 1e-4, bf16 <= 2e-2), printed as `how`.
  void ExpectGolden(const nlohmann::json& c, const core::Tensor& out, const char* how) {
    const bool f32 = GetParam() == ComputeType::kF32;
    const core::Tensor golden = LoadGolden(c["arrays"]["file"].get<std::string>(), "output");
    ASSERT_EQ(out.numel(), golden.numel());
    const double err = RelativeL2(out.data<float>(), golden.data<float>(), golden.numel());
    std::printf("  %s %s %s: relative L2 %.3g\n", c["case"].get<std::string>().c_str(), f32 ? "f32" : "bf16", how,
                err);
    EXPECT_LE(err, f32 ? 1e-4 : 2e-2) << c["case"];
  }

  std::unique_ptr<kernels::Device> gpu_;
  core::PreprocessorConfig pp_;
  std::unique_ptr<vision::VisionEncoder> encoder_;
  nlohmann::json manifest_;
};

// From the pixel values and from the images' bytes (the pixel values made on the GPU by
// kernels::PatchRows): both meet the goldens, and are the same bits.
TEST_P(CudaTinyEncoder, MatchesEveryGoldenCase) {
  for (const auto& c : manifest_["cases"]) {
    std::vector<vision::GridThw> grids;
    const GoldenImages in = ImagesOf(c, pp_, &grids);
    auto out = encoder_->Forward(in.pixels, grids);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->device(), core::Device::kCpu) << "the encoder returns host memory";
    ExpectGolden(c, *out, "on the GPU");
    auto from_bytes = encoder_->ForwardRgb(in.rgb, grids, {pp_.image_mean, pp_.image_std});
    ASSERT_TRUE(from_bytes.ok()) << from_bytes.status();
    ExpectGolden(c, *from_bytes, "on the GPU, from the images' bytes");
    ASSERT_EQ(from_bytes->shape(), out->shape());
    EXPECT_EQ(0, std::memcmp(from_bytes->raw(), out->raw(), out->nbytes())) << "bytes and pixel values differ";
    // A tensor per image (what the engine keeps), the same rows.
    ASSERT_TRUE(encoder_->BeginRgb(in.rgb, grids, {pp_.image_mean, pp_.image_std}).ok());
    while (!encoder_->done()) ASSERT_TRUE(encoder_->Advance(std::numeric_limits<double>::infinity()).ok());
    auto images = encoder_->FinishImages();
    ASSERT_TRUE(images.ok()) << images.status();
    ASSERT_EQ(images->size(), grids.size());
    int64_t row = 0;
    for (const core::Tensor& image : *images) {
      ASSERT_EQ(image.device(), core::Device::kCpu);
      ASSERT_LE(row + image.dim(0), out->dim(0));
      EXPECT_EQ(0, std::memcmp(image.raw(), out->data<float>() + row * out->dim(1), image.nbytes())) << "row " << row;
      row += image.dim(0);
    }
    EXPECT_EQ(row, out->dim(0));
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// The layer loop issues stream work only: no device-to-host copy or synchronisation, no host
// read of device memory. Proven by capturing every piece of a forward (window and full-attention
// blocks, two images) in one CUDA graph, which any host synchronisation would break, then
// replaying it and checking the result against the golden. BeginRgb (the bytes' upload) and Finish
// (the copy back) stay outside, the pixel values made from the bytes inside; the plan is cached by
// a first, ordinary forward.
TEST_P(CudaTinyEncoder, EveryLayerIsCapturedInOneGraphWithoutHostSync) {
  const nlohmann::json* batch = nullptr;
  for (const auto& c : manifest_["cases"]) {
    if (c["preprocess_cases"].size() > 1) batch = &c;
  }
  ASSERT_NE(batch, nullptr) << "no golden case with two images";
  std::vector<vision::GridThw> grids;
  const GoldenImages in = ImagesOf(*batch, pp_, &grids);
  const vision::PixelNormalization norm{pp_.image_mean, pp_.image_std};
  ASSERT_TRUE(encoder_->ForwardRgb(in.rgb, grids, norm).ok());  // warm-up: plan and table cached, buffers sized

  ASSERT_TRUE(encoder_->BeginRgb(in.rgb, grids, norm).ok());
  gpu_->Synchronize();
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  int pieces = 0;
  while (!encoder_->done()) {
    absl::StatusOr<double> ran = encoder_->Advance(std::numeric_limits<double>::infinity());
    ASSERT_TRUE(ran.ok()) << ran.status();
    ++pieces;
  }
  absl::StatusOr<std::unique_ptr<kernels::DeviceGraph>> graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status() << " (a host synchronisation inside the layer loop breaks the capture)";
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  EXPECT_GE(pieces, 1);
  ASSERT_TRUE((*graph)->Replay().ok());
  auto out = encoder_->Finish();
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectGolden(*batch, *out, "replayed from one graph");
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// Forwards from bytes replayed from graphs (VisionEncoder::EnableGraphs): a grid list's first two
// forwards run directly (the second then recorded), the later ones replay; every output is the
// direct forward's, bit for bit — with another normalization too (the graph reads the table); a
// second grid list gets a graph of its own; set_techniques and ReserveActivations drop them.
TEST_P(CudaTinyEncoder, GraphsReplayAGridListsForwardBitForBit) {
  std::vector<std::pair<std::vector<vision::GridThw>, GoldenImages>> inputs;
  for (const auto& c : manifest_["cases"]) {
    std::vector<vision::GridThw> grids;
    GoldenImages in = ImagesOf(c, pp_, &grids);
    inputs.emplace_back(std::move(grids), std::move(in));
    if (inputs.size() == 2) break;
  }
  ASSERT_EQ(inputs.size(), 2u);
  const vision::PixelNormalization norm{pp_.image_mean, pp_.image_std};
  vision::PixelNormalization other = norm;
  other.std[2] *= 1.5f;
  std::vector<core::Tensor> direct, direct_other;
  for (const auto& [grids, in] : inputs) {
    auto a = encoder_->ForwardRgb(in.rgb, grids, norm);
    auto b = encoder_->ForwardRgb(in.rgb, grids, other);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    direct.push_back(*a);
    direct_other.push_back(*b);
  }
  auto same = [](const core::Tensor& a, const core::Tensor& b) {
    return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  ASSERT_TRUE(encoder_->EnableGraphs(4).ok());
  int64_t plans_built = 0;
  for (int round = 0; round < 4; ++round) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const bool shifted = round == 3;
      auto out = encoder_->ForwardRgb(inputs[i].second.rgb, inputs[i].first, shifted ? other : norm);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_TRUE(same(*out, shifted ? direct_other[i] : direct[i])) << "round " << round << ", input " << i;
    }
    EXPECT_EQ(encoder_->graphs(), round >= 1 ? 2 : 0) << "round " << round;
    EXPECT_EQ(encoder_->graph_replays(), round >= 2 ? 2 * (round - 1) : 0) << "round " << round;
    // The two lists alternate, so the last forward's plan never fits: once recorded, a list's
    // forward takes the plan its graph holds, and no plan is built or uploaded again.
    if (round == 1) plans_built = encoder_->stats().plan_cache_misses;
    if (round >= 2) {
      EXPECT_EQ(encoder_->stats().plan_cache_misses, plans_built) << "round " << round;
    }
  }
  encoder_->set_techniques(encoder_->options().techniques);
  EXPECT_EQ(encoder_->graphs(), 0);
  for (int round = 0; round < 3; ++round) {
    auto out = encoder_->ForwardRgb(inputs[0].second.rgb, inputs[0].first, norm);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(same(*out, direct[0]));
  }
  EXPECT_EQ(encoder_->graphs(), 1);
  ASSERT_TRUE(encoder_->ReserveActivations(encoder_->max_patches()).ok());
  EXPECT_EQ(encoder_->graphs(), 0);
  for (int round = 0; round < 3; ++round) {
    auto out = encoder_->ForwardRgb(inputs[1].second.rgb, inputs[1].first, norm);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(same(*out, direct[1])) << "after ReserveActivations, round " << round;
  }
  EXPECT_EQ(encoder_->graphs(), 1);
  encoder_->DisableGraphs();
  EXPECT_EQ(encoder_->graphs(), 0);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// The bf16 hand-offs, the qkv chain in bf16 among them (kernels/qkv_bf16.h: q, k, v kept as bf16
// rows from the qkv matmul to the attention, on by default): the forward run in pieces of one
// 64-row granule a call (every stage's last piece shorter: some the GEMVs take) meets the goldens;
// with the hand-offs off it meets them too; and the two differ (the hand-offs ran).
TEST_P(CudaTinyEncoder, Bf16HandoffsMeetTheGoldensInPiecesAndSwitchedOff) {
  if (GetParam() != ComputeType::kBF16) GTEST_SKIP() << "the hand-offs are bf16 only";
  kernels::cuda::CudaDevice& cuda = kernels::cuda::AsCuda(*gpu_);
  ASSERT_TRUE(cuda.bf16_handoff()) << "on by default";
  for (const auto& c : manifest_["cases"]) {
    std::vector<vision::GridThw> grids;
    const GoldenImages in = ImagesOf(c, pp_, &grids);
    // From the bytes: the pieces' patch rows cross from one image to the next.
    ASSERT_TRUE(encoder_->BeginRgb(in.rgb, grids, {pp_.image_mean, pp_.image_std}).ok());
    while (!encoder_->done()) {
      absl::StatusOr<double> ran = encoder_->Advance(1.0);  // one granule (or a stage's rest) a call
      ASSERT_TRUE(ran.ok()) << ran.status();
    }
    auto on = encoder_->Finish();
    ASSERT_TRUE(on.ok()) << on.status();
    ExpectGolden(c, *on, "hand-offs on, in pieces");
    cuda.SetBf16Handoff(false);
    auto off = encoder_->Forward(in.pixels, grids);
    cuda.SetBf16Handoff(true);
    ASSERT_TRUE(off.ok()) << off.status();
    ExpectGolden(c, *off, "hand-offs off");
    EXPECT_NE(0, std::memcmp(on->raw(), off->raw(), on->nbytes())) << "the hand-offs changed nothing";
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

INSTANTIATE_TEST_SUITE_P(Compute, CudaTinyEncoder, ::testing::Values(ComputeType::kF32, ComputeType::kBF16),
                         [](const auto& info) { return info.param == ComputeType::kF32 ? "f32" : "bf16"; });

// The 3b vision tower (hidden 1280, 16 heads of 80: the shapes iris's Hopper GEMM and its rotary
// epilogue are for; the tiny model's rows and heads never reach them) on the GPU in bf16, against
// its goldens with the Hopper GEMM off, fused into the gated MLPs, and everywhere (the qkv rotary
// in its epilogue, the RMSNorms handed on between the GEMMs, persistent, ping-pong at 128,
// cooperative at 256; and at 128 with the norm kernel instead of the hand-off). From pixel values: that path
// records no CUDA graph, so each setting runs its own kernels. Skipped where the model was not
// made (gpu_check.sh makes it: iris-make-model --preset 3b --vision-only) or, for the Hopper GEMM's
// settings, on a GPU other than compute capability 9.0.
TEST(CudaVision3bEncoder, HopperGemmPathsMeetTheGoldens) {
  const std::string dir = testing::ModelPath("vision-3b");
  auto config = core::LoadModelConfig(dir);
  auto pp = core::LoadPreprocessorConfig(dir);
  auto ckpt = core::Checkpoint::Open(dir);
  if (!config.ok() || !pp.ok() || !ckpt.ok()) GTEST_SKIP() << "no vision-3b model at " << dir;
  std::unique_ptr<kernels::Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  kernels::cuda::CudaDevice& cuda = kernels::cuda::AsCuda(*gpu);
  vision::EncoderOptions options;
  options.compute = ComputeType::kBF16;
  auto encoder = vision::VisionEncoder::Load(*gpu, *ckpt, config->vision, options);
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  const nlohmann::json manifest = testing::LoadDataJson("vision/manifest_vision3b.json");
  using Use = kernels::cuda::CudaDevice::HopperGemmUse;
  struct Setting {
    Use use;
    int tile_n;
    const char* name;
    bool norm_handoff = true;
  };
  // (Under kAll the RMSNorms are handed on between the GEMMs unless switched off: the last
  // setting tells a fault of the hand-off from one of the GEMM.)
  const Setting settings[] = {{Use::kOff, 128, "cuBLASLt"},
                              {Use::kSwiGlu, 128, "Hopper SwiGLU"},
                              {Use::kAll, 128, "Hopper all, 128 ping-pong"},
                              {Use::kAll, 256, "Hopper all, 256"},
                              {Use::kAll, 128, "Hopper all, 128, the norm kernel (hand-off off)", false}};
  for (const auto& c : manifest["cases"]) {
    std::vector<vision::GridThw> grids;
    const GoldenImages in = ImagesOf(c, *pp, &grids);
    const core::Tensor golden = LoadGolden(c["arrays"]["file"].get<std::string>(), "output");
    std::vector<core::Tensor> outs;
    for (const Setting& s : settings) {
      if (!cuda.SetHopperGemm(s.use).ok()) {
        std::printf("  %s: %s skipped (not a compute capability 9.0 GPU)\n", c["case"].get<std::string>().c_str(),
                    s.name);
        continue;
      }
      ASSERT_TRUE(cuda.SetHopperGemmTileN(s.tile_n).ok());
      cuda.SetRmsNormHandoff(s.norm_handoff);
      auto out = (*encoder)->Forward(in.pixels, grids);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->numel(), golden.numel());
      const double err = RelativeL2(out->data<float>(), golden.data<float>(), golden.numel());
      std::printf("  %s bf16, %s: relative L2 %.3g\n", c["case"].get<std::string>().c_str(), s.name, err);
      EXPECT_LE(err, 2e-2) << c["case"] << " " << s.name;
      outs.push_back(std::move(*out));
    }
    if (outs.size() == 5) {
      EXPECT_NE(0, std::memcmp(outs[0].raw(), outs[2].raw(), outs[0].nbytes())) << "the Hopper GEMM changed nothing";
      EXPECT_NE(0, std::memcmp(outs[2].raw(), outs[4].raw(), outs[0].nbytes())) << "the norm hand-off changed nothing";
    }
  }
  cuda.SetRmsNormHandoff(true);
  ASSERT_TRUE(cuda.SetHopperGemm(Use::kOff).ok());
  ASSERT_TRUE(cuda.SetHopperGemmTileN(128).ok());
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

constexpr const char* kPrompts[] = {"text_only", "one_image", "two_images"};
std::string GoldenFile(const std::string& c) { return "model/tiny-" + c + ".safetensors"; }

// The tiny decoder on `device` with a cache of its own.
struct DecoderOn {
  DecoderOn(kernels::Device& device, ComputeType compute) {
    auto config = core::LoadModelConfig(testing::ModelPath("tiny"));
    auto ckpt = core::Checkpoint::Open(testing::ModelPath("tiny"));
    EXPECT_TRUE(config.ok() && ckpt.ok());
    auto d = llm::Decoder::Load(device, *ckpt, config->text, llm::DecoderOptions{compute});
    EXPECT_TRUE(d.ok()) << d.status();
    decoder = std::move(*d);
    auto c = llm::KvCache::Create(decoder->CacheShape(64, 16), device);
    EXPECT_TRUE(c.ok()) << c.status();
    cache = std::make_unique<llm::KvCache>(std::move(*c));
  }
  // One step of `n` rows of one sequence; rows given as embeddings (prefill) or ids (decode).
  std::vector<float> Step(int64_t n, const float* embeds, const std::vector<int32_t>& ids,
                          const std::vector<int64_t>& positions_axis_major) {
    auto logits = Forward(n, embeds, ids, positions_axis_major, /*picks_only=*/false);
    if (!logits.ok()) return {};
    return std::vector<float>(logits->data<float>(), logits->data<float>() + logits->numel());
  }
  // The same step with the greedy pick made on the decoder's device (DecoderBatch::picks_only).
  int32_t PickStep(int64_t n, const float* embeds, const std::vector<int32_t>& ids,
                   const std::vector<int64_t>& positions_axis_major) {
    auto picks = Forward(n, embeds, ids, positions_axis_major, /*picks_only=*/true);
    if (!picks.ok()) return -1;
    EXPECT_EQ(picks->dtype(), core::DType::kI32);
    EXPECT_EQ(picks->numel(), 1);
    return picks->data<int32_t>()[0];
  }
  absl::StatusOr<core::Tensor> Forward(int64_t n, const float* embeds, const std::vector<int32_t>& ids,
                                       const std::vector<int64_t>& positions_axis_major, bool picks_only) {
    EXPECT_TRUE(cache->Reserve(&table, table.num_tokens + n).ok());
    llm::DecoderBatch batch;
    batch.Clear(static_cast<int>(table.blocks.size()));
    batch.picks_only = picks_only;
    EXPECT_TRUE(batch.AddSequence(table, cache->shape().block_size, n, true).ok());
    batch.token_ids = ids.empty() ? std::vector<int32_t>(n, 0) : ids;
    for (int a = 0; a < 3; ++a) {
      batch.positions[a].assign(positions_axis_major.begin() + a * n, positions_axis_major.begin() + (a + 1) * n);
    }
    if (embeds != nullptr) {
      for (int64_t r = 0; r < n; ++r) batch.embed_rows.push_back(static_cast<int32_t>(r));
      batch.embeds.assign(embeds, embeds + n * decoder->hidden_size());
    }
    auto out = decoder->Forward(batch, cache.get());
    EXPECT_TRUE(out.ok()) << out.status();
    if (out.ok()) {
      EXPECT_EQ(out->device(), core::Device::kCpu);
    }
    return out;
  }
  std::unique_ptr<llm::Decoder> decoder;
  std::unique_ptr<llm::KvCache> cache;
  llm::BlockTable table;
};

TEST(CudaTinyDecoder, PrefillLogitsMatchTheGoldensAndGreedyTokensTheCpus) {
  std::unique_ptr<kernels::Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  for (const ComputeType compute : {ComputeType::kF32, ComputeType::kBF16}) {
    const bool f32 = compute == ComputeType::kF32;
    for (const char* c : kPrompts) {
      const core::Tensor embeds = LoadGolden(GoldenFile(c), "inputs_embeds");
      const std::vector<int64_t> positions = Int64Values(LoadGolden(GoldenFile(c), "position_ids"));
      const core::Tensor golden = LoadGolden(GoldenFile(c), "logits_last");
      const int64_t L = embeds.dim(0);
      DecoderOn on_gpu(*gpu, compute), on_cpu(kernels::DefaultCpuDevice(), compute);
      std::vector<float> logits = on_gpu.Step(L, embeds.data<float>(), {}, positions);
      std::vector<float> cpu_logits = on_cpu.Step(L, embeds.data<float>(), {}, positions);
      ASSERT_EQ(static_cast<int64_t>(logits.size()), golden.numel());
      const double err = RelativeL2(logits.data(), golden.data<float>(), golden.numel());
      std::printf("  %s %s prefill on the GPU: logits relative L2 %.3g\n", c, f32 ? "f32" : "bf16", err);
      EXPECT_LE(err, f32 ? 1e-4 : 2e-2) << c;
      // Greedy decoding: 12 steps, each fed its own argmax, on both devices (f32: the same tokens;
      // bf16 may part where two logits tie within its rounding, so it is compared for f32 only).
      int64_t pos = 0;
      for (int64_t v : positions) pos = std::max(pos, v + 1);
      for (int step = 0; step < 12; ++step) {
        const int64_t vocab = on_gpu.decoder->vocab_size();
        const int32_t token = testing::CpuGreedyToken(logits.data(), vocab);
        const int32_t cpu_token = testing::CpuGreedyToken(cpu_logits.data(), vocab);
        if (f32) {
          ASSERT_EQ(token, cpu_token) << c << " step " << step;
        }
        logits = on_gpu.Step(1, nullptr, {token}, {pos, pos, pos});
        cpu_logits = on_cpu.Step(1, nullptr, {cpu_token}, {pos, pos, pos});
        ++pos;
      }
    }
  }
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

// Greedy picks made on the GPU (only the ids come back) against the host's argmax of the same
// GPU's logits, step after step from each golden prompt's prefill.
TEST(CudaTinyDecoder, GreedyPicksOnTheDeviceAreTheArgmaxOfItsLogits) {
  std::unique_ptr<kernels::Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  for (const ComputeType compute : {ComputeType::kF32, ComputeType::kBF16}) {
    for (const char* c : kPrompts) {
      const core::Tensor embeds = LoadGolden(GoldenFile(c), "inputs_embeds");
      const std::vector<int64_t> positions = Int64Values(LoadGolden(GoldenFile(c), "position_ids"));
      const int64_t L = embeds.dim(0);
      DecoderOn with_logits(*gpu, compute), picking(*gpu, compute);
      std::vector<float> logits = with_logits.Step(L, embeds.data<float>(), {}, positions);
      int32_t pick = picking.PickStep(L, embeds.data<float>(), {}, positions);
      int64_t pos = 0;
      for (int64_t v : positions) pos = std::max(pos, v + 1);
      for (int step = 0; step < 12; ++step, ++pos) {
        const int32_t token = testing::CpuGreedyToken(logits.data(), with_logits.decoder->vocab_size());
        ASSERT_EQ(pick, token) << c << " step " << step;
        logits = with_logits.Step(1, nullptr, {token}, {pos, pos, pos});
        pick = picking.PickStep(1, nullptr, {pick}, {pos, pos, pos});
      }
    }
  }
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

// Decode graphs on the GPU, on the shared workload (tests/decode_graph_cases.h): every decode
// step that qualifies is recorded once per size and replayed. Replays are bit-equal to the same
// padded steps issued directly (the same launches), and within rounding of the steps as given
// (other matmul shapes), with the same cache entries: padding rows write nothing.
TEST(CudaTinyDecoder, DecodeGraphReplaysEqualTheStepsTheyRecord) {
  std::unique_ptr<kernels::Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  for (const ComputeType compute : {ComputeType::kF32, ComputeType::kBF16}) {
    const bool bf16 = compute == ComputeType::kBF16;
    const core::DType kv = bf16 ? core::DType::kBF16 : core::DType::kF32;
    DecoderOn plain(*gpu, compute), direct(*gpu, compute), graphs(*gpu, compute);
    ASSERT_TRUE(direct.decoder->EnableDecodeGraphs(testing::WorkloadGraphOptions(/*capture=*/false)).ok());
    ASSERT_TRUE(graphs.decoder->EnableDecodeGraphs(testing::WorkloadGraphOptions(/*capture=*/true)).ok());
    const testing::DecodeRun want = testing::RunDecodeWorkload(*plain.decoder, *gpu, kv);
    const testing::DecodeRun padded = testing::RunDecodeWorkload(*direct.decoder, *gpu, kv);
    const testing::DecodeRun replayed = testing::RunDecodeWorkload(*graphs.decoder, *gpu, kv);
    ASSERT_TRUE(gpu->status().ok()) << gpu->status();
    EXPECT_EQ(graphs.decoder->decode_graph_steps(), testing::kWorkloadGraphSteps);
    EXPECT_EQ(graphs.decoder->decode_graphs(), 4) << "sizes 1, 2, 4 and 8 each recorded once";
    testing::ExpectSameRun(replayed, padded, 0.f, bf16 ? "bf16 replayed vs direct" : "f32 replayed vs direct");
    testing::ExpectSameRun(replayed, want, bf16 ? 1e-3f : 1e-5f, bf16 ? "bf16 replayed vs as given" : "f32 replayed vs as given");
  }
}

// CaptureDecodeGraphs records every size up front from padding-only steps, which leave the cache
// as it was; a cache whose pools are elsewhere gets its own recordings on first use.
TEST(CudaTinyDecoder, DecodeGraphsRecordedAtStartServeTheirCache) {
  std::unique_ptr<kernels::Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  DecoderOn plain(*gpu, ComputeType::kBF16), graphs(*gpu, ComputeType::kBF16);
  llm::DecodeGraphOptions options = testing::WorkloadGraphOptions(/*capture=*/true);
  options.max_blocks_per_seq = 64;  // the whole cache: every decode step of the prompt below qualifies
  ASSERT_TRUE(graphs.decoder->EnableDecodeGraphs(options).ok());
  ASSERT_TRUE(graphs.decoder->CaptureDecodeGraphs(graphs.cache.get()).ok());
  EXPECT_EQ(graphs.decoder->decode_graphs(), 4);
  EXPECT_EQ(graphs.decoder->decode_graph_steps(), 0);
  // A prompt prefilled, then 12 greedy steps through the graphs of size 1: the tokens of the
  // decoder without graphs.
  const core::Tensor embeds = LoadGolden(GoldenFile("one_image"), "inputs_embeds");
  const std::vector<int64_t> positions = Int64Values(LoadGolden(GoldenFile("one_image"), "position_ids"));
  const int64_t L = embeds.dim(0);
  int32_t want = plain.PickStep(L, embeds.data<float>(), {}, positions);
  int32_t got = graphs.PickStep(L, embeds.data<float>(), {}, positions);
  int64_t pos = 0;
  for (int64_t v : positions) pos = std::max(pos, v + 1);
  for (int step = 0; step < 12; ++step, ++pos) {
    ASSERT_EQ(got, want) << "step " << step;
    want = plain.PickStep(1, nullptr, {want}, {pos, pos, pos});
    got = graphs.PickStep(1, nullptr, {got}, {pos, pos, pos});
  }
  EXPECT_EQ(graphs.decoder->decode_graph_steps(), 12);
  EXPECT_EQ(graphs.decoder->decode_graphs(), 4) << "the cache recorded for: no new recording";
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

// The weight prefetch (o and gate_up asked into the L2 while each layer's attention runs) is a
// hint: on the shared decode workload, steps issued directly and steps replayed from graphs
// recorded with it give what they give without it, bit for bit, with the same cache entries.
// The prefetch launch sits between the rotary + KV write and the attention, both started early:
// a wrong wait in it would let the attention read q and keys before they are written.
TEST(CudaTinyDecoder, WeightPrefetchChangesNoValue) {
  std::unique_ptr<kernels::Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  kernels::cuda::CudaDevice& cuda = kernels::cuda::AsCuda(*gpu);
  if (!cuda.SetWeightPrefetchBytes(cuda.l2_bytes() / 2).ok()) GTEST_SKIP() << "below sm_90";
  for (const ComputeType compute : {ComputeType::kF32, ComputeType::kBF16}) {
    const core::DType kv = compute == ComputeType::kBF16 ? core::DType::kBF16 : core::DType::kF32;
    testing::DecodeRun want[2], got[2];  // [0]: direct, [1]: graphs
    for (const bool prefetch : {false, true}) {
      ASSERT_TRUE(cuda.SetWeightPrefetchBytes(prefetch ? cuda.l2_bytes() / 2 : 0).ok());
      DecoderOn direct(*gpu, compute), graphs(*gpu, compute);
      ASSERT_TRUE(graphs.decoder->EnableDecodeGraphs(testing::WorkloadGraphOptions(/*capture=*/true)).ok());
      (prefetch ? got : want)[0] = testing::RunDecodeWorkload(*direct.decoder, *gpu, kv);
      (prefetch ? got : want)[1] = testing::RunDecodeWorkload(*graphs.decoder, *gpu, kv);
      ASSERT_TRUE(gpu->status().ok()) << gpu->status();
    }
    testing::ExpectSameRun(got[0], want[0], 0.f, "direct, prefetch vs none");
    testing::ExpectSameRun(got[1], want[1], 0.f, "graphs, prefetch vs none");
  }
  const char* unaligned = reinterpret_cast<const char*>(cuda.paged_split_counters()) + 4;
  EXPECT_NE(kernels::cuda::LaunchPrefetchL2(cuda.stream(), unaligned, 64, false), 0) << "an unaligned start";
  ASSERT_TRUE(cuda.SetWeightPrefetchBytes(0).ok());
  EXPECT_FALSE(cuda.SetWeightPrefetchBytes(cuda.l2_bytes() + 1).ok());
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

// The launch repeat behind decode_bench's step breakdown: the paged attention issued twice gives
// the same steps bit for bit (it writes its output whole, and its split counters end at zero), on
// the shared workload, directly and from graphs; the decode rotary issued twice rotates q and k
// twice, so the steps differ: the repeat runs.
TEST(CudaTinyDecoder, RepeatedAttentionLaunchesChangeNoValueRepeatedRotariesDo) {
  std::unique_ptr<kernels::Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  kernels::cuda::CudaDevice& cuda = kernels::cuda::AsCuda(*gpu);
  using Repeat = kernels::cuda::CudaDevice::LaunchRepeat;
  using Op = kernels::cuda::CudaDevice::RepeatedOp;
  const core::DType kv = core::DType::kBF16;
  testing::DecodeRun runs[3][2];  // [plain, attention twice, rotary twice][direct, graphs]
  const Repeat repeats[3] = {Repeat{}, Repeat{Op::kPagedAttention, 0, 0, 2}, Repeat{Op::kDecodeRotary, 0, 0, 2}};
  for (int r = 0; r < 3; ++r) {
    cuda.SetLaunchRepeat(repeats[r]);
    DecoderOn direct(*gpu, ComputeType::kBF16), graphs(*gpu, ComputeType::kBF16);
    ASSERT_TRUE(graphs.decoder->EnableDecodeGraphs(testing::WorkloadGraphOptions(/*capture=*/true)).ok());
    runs[r][0] = testing::RunDecodeWorkload(*direct.decoder, *gpu, kv);
    runs[r][1] = testing::RunDecodeWorkload(*graphs.decoder, *gpu, kv);
    ASSERT_TRUE(gpu->status().ok()) << gpu->status();
  }
  cuda.SetLaunchRepeat(Repeat{});
  testing::ExpectSameRun(runs[1][0], runs[0][0], 0.f, "direct, attention twice");
  testing::ExpectSameRun(runs[1][1], runs[0][1], 0.f, "graphs, attention twice");
  EXPECT_NE(runs[2][0].logits, runs[0][0].logits) << "the rotary issued twice changed nothing";
  EXPECT_EQ(cuda.LaunchesOf(Op::kPagedAttention), 1);
  cuda.SetLaunchRepeat(Repeat{Op::kGemv, 64, 32, 3});
  EXPECT_EQ(cuda.LaunchesOf(Op::kGemv, 64, 32), 3);
  EXPECT_EQ(cuda.LaunchesOf(Op::kGemv, 32, 64), 1) << "another weight shape";
  EXPECT_EQ(cuda.LaunchesOf(Op::kPagedAttention), 1);
  cuda.SetLaunchRepeat(Repeat{});
}

// The qkv GEMV with the decode step's rotary and KV write as its epilogue
// (CudaDevice::SetQkvGemvRotary; the tiny model's heads of 16 take it, at the workload's decode
// steps of up to 4 rows) gives the default's steps bit for bit on the shared workload, directly
// and from graphs.
TEST(CudaTinyDecoder, RotaryInTheQkvGemvEqualsTheSeparateLaunchBitForBit) {
  std::unique_ptr<kernels::Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  kernels::cuda::CudaDevice& cuda = kernels::cuda::AsCuda(*gpu);
  const core::DType kv = core::DType::kBF16;
  testing::DecodeRun runs[2][2];  // [separate, in the GEMV][direct, graphs]
  for (int on = 0; on < 2; ++on) {
    cuda.SetQkvGemvRotary(on == 1);
    DecoderOn direct(*gpu, ComputeType::kBF16), graphs(*gpu, ComputeType::kBF16);
    ASSERT_TRUE(graphs.decoder->EnableDecodeGraphs(testing::WorkloadGraphOptions(/*capture=*/true)).ok());
    runs[on][0] = testing::RunDecodeWorkload(*direct.decoder, *gpu, kv);
    runs[on][1] = testing::RunDecodeWorkload(*graphs.decoder, *gpu, kv);
    ASSERT_TRUE(gpu->status().ok()) << gpu->status();
  }
  cuda.SetQkvGemvRotary(false);
  testing::ExpectSameRun(runs[1][0], runs[0][0], 0.f, "direct, rotary in the qkv GEMV");
  testing::ExpectSameRun(runs[1][1], runs[0][1], 0.f, "graphs, rotary in the qkv GEMV");
}

#else
TEST(CudaModelTest, NeedsTheCudaBackend) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif

}  // namespace
}  // namespace iris
