// iris-encode: image files in, Qwen2.5-VL image embeddings out (one varlen encoder forward).
//   iris-encode --model DIR --image FILE [--image FILE...] [--dtype f32|bf16]
//               [--min-pixels N] [--max-pixels N] --out OUT.safetensors
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/command_line.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "vision/image_decode.h"
#include "vision/pixel_bounds.h"
#include "vision/preprocess.h"
#include "vision/vision_encoder.h"

ABSL_FLAG(std::string, model, "", "model folder (config.json, preprocessor_config.json, *.safetensors)");
ABSL_FLAG(std::string, image, "", "image file; repeat --image for several images, encoded together");
ABSL_FLAG(std::string, dtype, "f32", "compute mode: f32 (matches the reference to ~1e-6) or bf16 (about 2x faster, ~3e-3)");
ABSL_FLAG(int64_t, min_pixels, -1, "per-image minimum pixels after resize (default: the checkpoint's)");
ABSL_FLAG(int64_t, max_pixels, -1, "per-image maximum pixels after resize (default: the checkpoint's)");
ABSL_FLAG(std::string, out, "", "output .safetensors: pixel_values, image_grid_thw, image_embeds");
ABSL_FLAG(std::string, device, "cpu", "where the model runs: cpu, or cuda / cuda:N (a GPU, in a build with the CUDA backend)");
ABSL_FLAG(std::string, attention, "flash", "with --device cuda and --dtype bf16: the varlen attention, flash (iris's "
          "tensor-core kernel) or cudnn (cuDNN's SDPA operation, cuDNN 9.15 or later)");
ABSL_FLAG(bool, flash_pipeline, true,
          "with --device cuda and --dtype bf16: the flash attention runs its pipelined kernel (the next K/V tile "
          "copied to shared memory while the warps compute; same result; 6-15% faster encodes on an H200)");
ABSL_FLAG(bool, matmul_tuning, false,
          "with --device cuda: the matmuls run the fastest of cuBLASLt's candidates, timed on the first forward of "
          "each shape (not yet timed on a GPU)");
ABSL_FLAG(std::string, hopper_gemm, "off",
          "with --device cuda on an H100/H200 (compute capability 9.0) and --dtype bf16: which matmuls run iris's own "
          "Hopper GEMM instead of cuBLASLt: off, swiglu (the gated MLP's gate_up with the SiLU·mul fused) or all "
          "(also every other matmul without a GELU); not yet timed on a GPU");
ABSL_FLAG(bool, fused_rotary, true, "encoder technique: fused rotary q/k");
ABSL_FLAG(bool, parallel_qkv_padding, true, "encoder technique: parallel q/k/v padding");
ABSL_FLAG(bool, cached_cu_seqlens, true, "encoder technique: cached cu_seqlens / encoder plan");

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

absl::Status Run(const std::vector<std::string>& images) {
  using namespace iris;
  const std::string dir = absl::GetFlag(FLAGS_model);
  const std::string out_path = absl::GetFlag(FLAGS_out);
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  if (out_path.empty()) return absl::InvalidArgumentError("--out is required");
  if (images.empty()) return absl::InvalidArgumentError("at least one --image is required");
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype != "f32" && dtype != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--dtype must be f32 or bf16, got \"", dtype, "\""));
  }
  IRIS_ASSIGN_OR_RETURN(core::ModelConfig config, core::LoadModelConfig(dir));
  if (!config.has_vision()) {
    return absl::InvalidArgumentError(absl::StrCat("--model ", dir, ": a text-only model (model_type ",
                                                   core::FamilyModelType(config.family), ") has no vision tower"));
  }
  IRIS_ASSIGN_OR_RETURN(core::PreprocessorConfig pp, core::LoadPreprocessorConfig(dir));
  std::optional<int64_t> min_px, max_px;
  if (absl::GetFlag(FLAGS_min_pixels) >= 0) min_px = absl::GetFlag(FLAGS_min_pixels);
  if (absl::GetFlag(FLAGS_max_pixels) >= 0) max_px = absl::GetFlag(FLAGS_max_pixels);
  IRIS_ASSIGN_OR_RETURN(vision::ResolvedPixelBounds bounds, vision::ResolvePixelBounds(pp, min_px, max_px));

  const auto t0 = Clock::now();
  std::vector<vision::PreprocessedImage> prepared;
  std::vector<vision::GridThw> grids;
  int64_t rows = 0, bytes = 0;
  for (const std::string& path : images) {
    auto rgb = vision::DecodeImageFile(path);
    if (!rgb.ok()) return absl::Status(rgb.status().code(), absl::StrCat(path, ": ", rgb.status().message()));
    auto p = vision::Preprocess(*rgb, pp, vision::PixelBounds{bounds.min_pixels, bounds.max_pixels});
    if (!p.ok()) return absl::Status(p.status().code(), absl::StrCat(path, ": ", p.status().message()));
    rows += p->grid_thw[1] * p->grid_thw[2];
    bytes += p->rgb.nbytes();
    grids.push_back(p->grid_thw);
    prepared.push_back(std::move(*p));
  }
  // The images' bytes packed, as the server hands them to the encoder.
  core::Tensor packed = core::Tensor::Empty(core::DType::kU8, {bytes});
  int64_t at = 0;
  for (const auto& p : prepared) {
    std::memcpy(packed.data<uint8_t>() + at, p.rgb.data<uint8_t>(), p.rgb.nbytes());
    at += p.rgb.nbytes();
  }
  const auto t1 = Clock::now();

  vision::EncoderOptions options;
  options.compute = dtype == "f32" ? kernels::ComputeType::kF32 : kernels::ComputeType::kBF16;
  options.techniques.fused_rotary = absl::GetFlag(FLAGS_fused_rotary);
  options.techniques.parallel_qkv_padding = absl::GetFlag(FLAGS_parallel_qkv_padding);
  options.techniques.cached_cu_seqlens = absl::GetFlag(FLAGS_cached_cu_seqlens);
  IRIS_ASSIGN_OR_RETURN(core::Checkpoint ckpt, core::Checkpoint::Open(dir));
  options.max_patches = std::max<int64_t>(rows, options.max_patches);
  kernels::DeviceOptions device_options;
  device_options.name = absl::GetFlag(FLAGS_device);
  device_options.attention = absl::GetFlag(FLAGS_attention) == "flash" ? "" : absl::GetFlag(FLAGS_attention);
  device_options.flash_pipeline = absl::GetFlag(FLAGS_flash_pipeline);
  device_options.matmul_tuning = absl::GetFlag(FLAGS_matmul_tuning);
  device_options.hopper_gemm = absl::GetFlag(FLAGS_hopper_gemm) == "off" ? "" : absl::GetFlag(FLAGS_hopper_gemm);
  IRIS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Device> device, kernels::CreateDevice(device_options));
  IRIS_ASSIGN_OR_RETURN(auto encoder, vision::VisionEncoder::Load(*device, ckpt, config.vision, options));
  const auto t2 = Clock::now();
  IRIS_ASSIGN_OR_RETURN(core::Tensor embeds,
                        encoder->ForwardRgb(packed, grids, vision::PixelNormalization{pp.image_mean, pp.image_std}));
  const auto t3 = Clock::now();

  // The pixel values the encoder made, as the reference's rows (made again here, for the file).
  const int64_t cols = encoder->patch_dim();
  core::Tensor pixel_values = core::Tensor::Empty(core::DType::kF32, {rows, cols});
  at = 0;
  for (const auto& p : prepared) {
    IRIS_ASSIGN_OR_RETURN(core::Tensor values, vision::PixelValues(p, pp));
    std::memcpy(pixel_values.data<float>() + at * cols, values.data<float>(), values.nbytes());
    at += values.dim(0);
  }

  core::Tensor grid = core::Tensor::Empty(core::DType::kI64, {static_cast<int64_t>(grids.size()), 3});
  for (size_t i = 0; i < grids.size(); ++i) {
    for (int j = 0; j < 3; ++j) grid.data<int64_t>()[i * 3 + j] = grids[i][j];
  }
  IRIS_RETURN_IF_ERROR(core::WriteSafetensors(
      out_path, {{"pixel_values", pixel_values}, {"image_grid_thw", grid}, {"image_embeds", embeds}},
      {{"format", "np"}}));
  std::vector<std::string> grid_text;
  for (const auto& g : grids) grid_text.push_back(absl::StrCat(g[0], "x", g[1], "x", g[2]));
  std::printf("encoded %zu image(s) grid_thw=[%s] patches=%lld tokens=%lld hidden=%lld dtype=%s\n",
              images.size(), absl::StrJoin(grid_text, ", ").c_str(), static_cast<long long>(rows),
              static_cast<long long>(embeds.dim(0)), static_cast<long long>(embeds.dim(1)), dtype.c_str());
  std::printf("decode+preprocess %.1f ms, load %.1f ms, encoder %.1f ms (%.2f TFLOP/s) -> %s\n", Ms(t0, t1),
              Ms(t1, t2), Ms(t2, t3), encoder->CountFlops(grids) / (Ms(t2, t3) * 1e9), out_path.c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "encodes images with a Qwen2.5-VL vision tower\n"
      "  iris-encode --model DIR --image FILE [--image FILE...] [--dtype f32|bf16]\n"
      "              [--min-pixels N] [--max-pixels N] --out OUT.safetensors");
  std::vector<std::string> images = iris::core::TakeRepeatedFlag(&argc, argv, "image");
  if (absl::Status parsed = iris::core::ParseFlags(argc, argv); !parsed.ok()) {
    std::fprintf(stderr, "iris-encode: %s\n", std::string(parsed.message()).c_str());
    return 2;
  }
  absl::Status status = Run(images);
  if (!status.ok()) {
    std::fprintf(stderr, "iris-encode: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
