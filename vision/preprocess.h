// Qwen2.5-VL image preprocessing: smart_resize and bicubic resize on the host; the rescale 1/255,
// CLIP normalize, temporal repeat and patch flattening into rows of C*T*P*P (1176) in merge-window
// order where the encoder runs (kernels::PatchRows), or here (PixelValues).
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

// An image as the encoder takes it: resized to its grid, still RGB8. The encoder rescales,
// normalizes and flattens it into the reference's pixel_values rows on its own device
// (VisionEncoder::BeginRgb), so a GPU receives 3 bytes a pixel instead of 4 × temporal repeat
// (8× fewer for Qwen2.5-VL), and a request waiting for its turn holds that much less memory.
struct PreprocessedImage {
  core::Tensor rgb;                    // U8 [resized_height, resized_width, 3], interleaved
  std::array<int64_t, 3> grid_thw{};   // (t, h, w) in patches: (1, resized_height / P, resized_width / P)
  int resized_height = 0;
  int resized_width = 0;
};

// The resize: smart_resize's size from the bounds, then Pillow's bicubic resize (bit-exact).
absl::StatusOr<PreprocessedImage> Preprocess(const RgbImage& image,
                                             const core::PreprocessorConfig& config,
                                             const PixelBounds& bounds = {});

// The reference's pixel_values of a preprocessed image, made on the host: F32 [grid_h * grid_w,
// C*T*P*P], rescaled 1/255, normalized, repeated over the frames and flattened in merge-window
// order. The encoder makes the same rows (bit for bit) from `rgb` itself; this is for the tools
// and tests that compare with the reference, and for VisionEncoder::Forward's float input.
absl::StatusOr<core::Tensor> PixelValues(const PreprocessedImage& image, const core::PreprocessorConfig& config);

}  // namespace iris::vision
