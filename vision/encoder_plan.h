// The per-forward plan of the Qwen2.5-VL vision encoder: window order, sequence boundaries for
// full-attention and window-attention blocks, and the 2-D rotary tables. Built once on the host
// per forward, shared by every layer, and kept while the batch's grid_thw list repeats
// ("cached cu_seqlens").
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "core/tensor.h"

namespace iris::vision {

using GridThw = std::array<int64_t, 3>;

struct EncoderPlan {
  std::vector<GridThw> grid_thw;
  int64_t num_patches = 0;
  int64_t num_merged = 0;
  // window_index[i] = the merged token (processor order) that sits at position i in window order.
  std::vector<int32_t> window_index;
  // Full-attention blocks: one sequence per image frame, in patches.
  std::vector<int32_t> cu_seqlens;
  int max_seqlen = 0;
  // Window-attention blocks: one sequence per window (empty windows removed), in patches. Empty
  // for a tower without windows (Qwen2-VL), whose window_index is the identity.
  std::vector<int32_t> cu_window_seqlens;
  std::vector<int32_t> cu_window_seqlens_raw;  // before removing repeats, as HF builds it
  int max_window_seqlen = 0;
  // Rotary tables in window order: [num_patches, head_dim/2] (HF's cos/sin hold this half twice).
  core::Tensor cos;
  core::Tensor sin;
};

// Validates grid_thw against the config (h, w multiples of the merge size, positive t) and
// builds the plan.
absl::StatusOr<std::shared_ptr<const EncoderPlan>> BuildEncoderPlan(
    const core::VisionConfig& config, std::span<const GridThw> grid_thw);

// Rotary cos/sin for the given plan's patches only (what an unfused path recomputes per layer).
void ComputeRotaryTables(const core::VisionConfig& config, const EncoderPlan& plan, float* cos,
                         float* sin);

// Keeps the last plan and returns it again while the grid_thw list repeats.
class EncoderPlanCache {
 public:
  explicit EncoderPlanCache(const core::VisionConfig& config) : config_(config) {}
  absl::StatusOr<std::shared_ptr<const EncoderPlan>> Get(std::span<const GridThw> grid_thw);
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  core::VisionConfig config_;
  std::shared_ptr<const EncoderPlan> last_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
};

}  // namespace iris::vision
