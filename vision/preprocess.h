// Qwen2.5-VL image preprocessing: smart_resize, bicubic resize, rescale 1/255, CLIP normalize,
// temporal repeat and patch flattening into rows of C*T*P*P (1176) in merge-window order.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "core/tensor.h"
#include "vision/image.h"

namespace iris::vision {

// Per-request pixel bounds; unset means the checkpoint's preprocessor_config value. A request
// may only tighten the configured bounds (checked by the caller that owns the limits).
struct PixelBounds {
  std::optional<int64_t> min_pixels;
  std::optional<int64_t> max_pixels;
};

struct PreprocessedImage {
  core::Tensor pixel_values;           // F32 [grid_h * grid_w, C*T*P*P]
  std::array<int64_t, 3> grid_thw{};   // (t, h, w) in patches
  int resized_height = 0;
  int resized_width = 0;
};

absl::StatusOr<PreprocessedImage> Preprocess(const RgbImage& image,
                                             const core::PreprocessorConfig& config,
                                             const PixelBounds& bounds = {});

}  // namespace iris::vision
