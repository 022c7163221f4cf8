#include "vision/encoder_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/parallel_for.h"

namespace iris::vision {
namespace {

// HF's VisionRotaryEmbedding(head_dim/2): inv_freq[i] = 1 / 10000^(2i / (head_dim/2)), float32.
std::vector<float> VisionInvFreq(int head_dim) {
  const int dim = head_dim / 2;
  std::vector<float> inv(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.0f / std::pow(10000.0f, exponent);
  }
  return inv;
}

// (row, col) of every patch in processor order (2x2 merge groups in raster order).
void PatchPositions(const GridThw& g, int merge, std::vector<int32_t>* rows, std::vector<int32_t>* cols) {
  const int64_t h = g[1], w = g[2];
  for (int64_t t = 0; t < g[0]; ++t) {
    for (int64_t bh = 0; bh < h / merge; ++bh) {
      for (int64_t bw = 0; bw < w / merge; ++bw) {
        for (int i = 0; i < merge; ++i) {
          for (int j = 0; j < merge; ++j) {
            rows->push_back(static_cast<int32_t>(bh * merge + i));
            cols->push_back(static_cast<int32_t>(bw * merge + j));
          }
        }
      }
    }
  }
}

}  // namespace

void ComputeRotaryTables(const core::VisionConfig& config, const EncoderPlan& plan, float* cos,
                         float* sin) {
  const int merge = config.spatial_merge_size;
  const int unit = merge * merge;
  const int half = config.head_dim() / 2;  // table width
  const int quarter = half / 2;            // frequencies per axis
  const std::vector<float> inv = VisionInvFreq(config.head_dim());
  std::vector<int32_t> rows, cols;
  rows.reserve(plan.num_patches);
  cols.reserve(plan.num_patches);
  for (const auto& g : plan.grid_thw) PatchPositions(g, merge, &rows, &cols);
  // Host work on the host helpers, in slices of merged tokens.
  constexpr int64_t kSlice = 256;
  const int slices = static_cast<int>((plan.num_merged + kSlice - 1) / kSlice);
  core::ParallelFor(slices, [&](int slice, int) {
  for (int64_t m = slice * kSlice; m < std::min(plan.num_merged, (slice + 1) * kSlice); ++m) {
    const int64_t src_group = plan.window_index[m];
    for (int j = 0; j < unit; ++j) {
      const int64_t src = src_group * unit + j;
      const int64_t dst = m * unit + j;
      float* c = cos + dst * half;
      float* s = sin + dst * half;
      for (int f = 0; f < quarter; ++f) {
        // float32 products, as torch.outer(seq, inv_freq) computes them.
        const float a = static_cast<float>(rows[src]) * inv[f];
        const float b = static_cast<float>(cols[src]) * inv[f];
        c[f] = std::cos(a);
        s[f] = std::sin(a);
        c[quarter + f] = std::cos(b);
        s[quarter + f] = std::sin(b);
      }
    }
  }
  });
}

absl::StatusOr<std::shared_ptr<const EncoderPlan>> BuildEncoderPlan(
    const core::VisionConfig& config, std::span<const GridThw> grid_thw) {
  if (grid_thw.empty()) return absl::InvalidArgumentError("grid_thw: no images to encode");
  const int merge = config.spatial_merge_size;
  const int unit = merge * merge;
  auto plan = std::make_shared<EncoderPlan>();
  plan->grid_thw.assign(grid_thw.begin(), grid_thw.end());
  for (size_t i = 0; i < grid_thw.size(); ++i) {
    const auto& g = grid_thw[i];
    if (g[0] < 1 || g[1] < merge || g[2] < merge || g[1] % merge != 0 || g[2] % merge != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grid_thw[", i, "] = (", g[0], ", ", g[1], ", ", g[2], "): t must be >= 1 and h, w positive multiples of ", merge));
    }
    plan->num_patches += g[0] * g[1] * g[2];
  }
  if (plan->num_patches > (int64_t{1} << 30)) return absl::InvalidArgumentError("grid_thw: too many patches");
  plan->num_merged = plan->num_patches / unit;

  if (!config.windowed) {
    // Qwen2-VL: every block attends to its whole frame; the order stays the processor's (the
    // index is the identity) and there are no window boundaries.
    plan->window_index.resize(plan->num_merged);
    for (int64_t i = 0; i < plan->num_merged; ++i) plan->window_index[i] = static_cast<int32_t>(i);
  } else {
    // Window order and window boundaries (HF get_window_index), including the empty windows HF
    // pads when a side is a multiple of the window size; cu_window_seqlens drops the repeats.
    const int vws = config.window_size / merge / config.patch_size;  // window side in merged tokens
    plan->window_index.reserve(plan->num_merged);
    plan->cu_window_seqlens_raw.push_back(0);
    int64_t base = 0;
    for (const auto& g : grid_thw) {
      const int64_t lh = g[1] / merge, lw = g[2] / merge;
      const int64_t pad_h = vws - lh % vws, pad_w = vws - lw % vws;
      const int64_t nwh = (lh + pad_h) / vws, nww = (lw + pad_w) / vws;
      for (int64_t t = 0; t < g[0]; ++t) {
        for (int64_t wh = 0; wh < nwh; ++wh) {
          for (int64_t ww = 0; ww < nww; ++ww) {
            int64_t count = 0;
            for (int64_t y = wh * vws; y < std::min((wh + 1) * vws, lh); ++y) {
              for (int64_t x = ww * vws; x < std::min((ww + 1) * vws, lw); ++x) {
                plan->window_index.push_back(static_cast<int32_t>(base + t * lh * lw + y * lw + x));
                ++count;
              }
            }
            plan->cu_window_seqlens_raw.push_back(
                static_cast<int32_t>(plan->cu_window_seqlens_raw.back() + count * unit));
          }
        }
      }
      base += g[0] * lh * lw;
    }
    for (int32_t v : plan->cu_window_seqlens_raw) {
      if (plan->cu_window_seqlens.empty() || plan->cu_window_seqlens.back() != v) {
        plan->cu_window_seqlens.push_back(v);
      }
    }
    for (size_t i = 1; i < plan->cu_window_seqlens.size(); ++i) {
      plan->max_window_seqlen = std::max(plan->max_window_seqlen,
                                         plan->cu_window_seqlens[i] - plan->cu_window_seqlens[i - 1]);
    }
  }
  // Full attention: one sequence per frame; window order keeps each frame's tokens together.
  plan->cu_seqlens.push_back(0);
  for (const auto& g : grid_thw) {
    for (int64_t t = 0; t < g[0]; ++t) {
      plan->cu_seqlens.push_back(static_cast<int32_t>(plan->cu_seqlens.back() + g[1] * g[2]));
      plan->max_seqlen = std::max<int>(plan->max_seqlen, static_cast<int>(g[1] * g[2]));
    }
  }
  const int half = config.head_dim() / 2;
  plan->cos = core::Tensor::Empty(core::DType::kF32, {plan->num_patches, half});
  plan->sin = core::Tensor::Empty(core::DType::kF32, {plan->num_patches, half});
  ComputeRotaryTables(config, *plan, plan->cos.data<float>(), plan->sin.data<float>());
  return std::shared_ptr<const EncoderPlan>(std::move(plan));
}

absl::StatusOr<std::shared_ptr<const EncoderPlan>> EncoderPlanCache::Get(
    std::span<const GridThw> grid_thw) {
  if (last_ != nullptr && std::equal(grid_thw.begin(), grid_thw.end(), last_->grid_thw.begin(),
                                     last_->grid_thw.end())) {
    ++hits_;
    return last_;
  }
  ++misses_;
  auto plan = BuildEncoderPlan(config_, grid_thw);
  if (!plan.ok()) return plan.status();
  last_ = *plan;
  return last_;
}

}  // namespace iris::vision
