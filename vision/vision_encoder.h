// The Qwen2.5-VL vision transformer on the CPU: patch embed, 2-D rotary, window and
// full-attention blocks, merger, inverse window order. Several images of different sizes go
// through one forward (varlen). Activation buffers are owned by the encoder and reused.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "kernels/linear.h"
#include "vision/encoder_plan.h"

namespace iris::vision {

// The encoder-path techniques, each a runtime switch so that its effect can be measured.
struct EncoderTechniques {
  // cos/sin built once per forward and q, k rotated together in one pass inside the qkv output;
  // off: tables rebuilt for every layer and q, k rotated in two passes.
  bool fused_rotary = true;
  // q/k/v padded (to the attention kernel's head dim) in one pass, and not at all where the kernel
  // takes the head dim as it is (the CPU kernel takes 80 directly); off: three separate passes
  // that split q, k, v into head-major buffers padded to `unfused_padded_head_dim`.
  bool parallel_qkv_padding = true;
  // The plan (window index, cu_seqlens, rotary tables) kept while grid_thw repeats and shared by
  // all layers; off: rebuilt for every layer of every forward.
  bool cached_cu_seqlens = true;
};

struct EncoderOptions {
  kernels::ComputeType compute = kernels::ComputeType::kBF16;
  EncoderTechniques techniques;
  // Head dim the attention kernel is fed when parallel_qkv_padding is off (aligned tiles).
  int unfused_padded_head_dim = 96;
  // Pad the MLP intermediate size up to a multiple of this (zero weights: exact); 0 = never.
  int intermediate_multiple = 64;
};

struct EncoderStats {
  int64_t forwards = 0;
  int64_t plan_cache_hits = 0;
  int64_t plan_cache_misses = 0;
};

class VisionEncoder {
 public:
  // Loads `visual.*` tensors from the checkpoint (HF names) and prepares the kernels.
  static absl::StatusOr<std::unique_ptr<VisionEncoder>> Load(const core::Checkpoint& checkpoint,
                                                             const core::VisionConfig& config,
                                                             const EncoderOptions& options);
  ~VisionEncoder();

  // pixel_values: F32 [patches, C*T*P*P], the images' rows concatenated in order; grid_thw one
  // entry per image. Returns F32 [merged tokens, out_hidden] in each image's raster order.
  absl::StatusOr<core::Tensor> Forward(const core::Tensor& pixel_values,
                                       std::span<const GridThw> grid_thw);

  // Called after each block with the hidden states (window order, [patches, hidden]); for tests.
  using BlockObserver = std::function<void(int block, const float* hidden, int64_t rows)>;
  void set_block_observer(BlockObserver observer) { observer_ = std::move(observer); }

  void set_techniques(const EncoderTechniques& t) { options_.techniques = t; }
  const EncoderOptions& options() const { return options_; }
  const core::VisionConfig& config() const { return config_; }
  const EncoderStats& stats() const { return stats_; }
  // FLOPs of one forward for the given grids (matmuls + attention), for benchmarks.
  double CountFlops(std::span<const GridThw> grid_thw) const;

 private:
  struct Block;
  VisionEncoder(const core::VisionConfig& config, const EncoderOptions& options);
  void Attention(const EncoderPlan& plan, bool full, int64_t n);
  float* Buffer(int slot, int64_t floats);

  core::VisionConfig config_;
  EncoderOptions options_;
  std::unique_ptr<kernels::Linear> patch_embed_;
  std::vector<Block> blocks_;
  core::Tensor merger_norm_;
  std::unique_ptr<kernels::Linear> merger_fc1_;
  std::unique_ptr<kernels::Linear> merger_fc2_;
  int64_t padded_intermediate_ = 0;
  EncoderPlanCache plan_cache_;
  EncoderStats stats_;
  BlockObserver observer_;
  std::vector<core::Tensor> buffers_;  // reused activation buffers, by slot
};

}  // namespace iris::vision
