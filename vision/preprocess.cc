#include "vision/preprocess.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "vision/patchify.h"
#include "vision/resize_bicubic_internal.h"
#include "vision/smart_resize.h"

namespace iris::vision {
namespace {

absl::Status ValidateConfig(const core::PreprocessorConfig& c) {
  if (c.patch_size <= 0 || c.merge_size <= 0 || c.temporal_patch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("preprocessor config: patch_size ", c.patch_size, ", merge_size ",
                     c.merge_size, " and temporal_patch_size ", c.temporal_patch_size,
                     " must be positive"));
  }
  for (int i = 0; i < 3; ++i) {
    if (!(c.image_std[i] != 0.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("preprocessor config: image_std[", i, "] must be non-zero"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PreprocessedImage> Preprocess(const RgbImage& image,
                                             const core::PreprocessorConfig& config,
                                             const PixelBounds& bounds) {
  IRIS_RETURN_IF_ERROR(ValidateConfig(config));
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return absl::InvalidArgumentError(absl::StrCat("image ", image.width, "x", image.height,
                                                   " has ", image.pixels.size(),
                                                   " bytes; expected width*height*3"));
  }
  const int P = config.patch_size;
  const int M = config.merge_size;
  const int factor = config.factor();
  if (image.height < factor || image.width < factor) {
    const bool h = image.height < factor;
    return absl::InvalidArgumentError(absl::StrCat(
        "image ", h ? "height " : "width ", h ? image.height : image.width,
        " is below the minimum ", factor, " (patch ", P, " x merge ", M, ")"));
  }
  const int64_t min_pixels = bounds.min_pixels.value_or(config.min_pixels);
  const int64_t max_pixels = bounds.max_pixels.value_or(config.max_pixels);
  IRIS_ASSIGN_OR_RETURN(const ResizedSize size,
                        SmartResize(image.height, image.width, factor, min_pixels, max_pixels));
  const int H = size.height;
  const int W = size.width;

  const internal::Patchifier patchifier(P, config.temporal_patch_size, M, config.image_mean,
                                        config.image_std);
  const int64_t grid_h = H / P;
  const int64_t grid_w = W / P;
  PreprocessedImage result;
  result.grid_thw = {1, grid_h, grid_w};
  result.resized_height = H;
  result.resized_width = W;
  result.pixel_values = core::Tensor::Empty(core::DType::kF32, {grid_h * grid_w, patchifier.row_length()});
  float* out = result.pixel_values.data<float>();

  // Resize (horizontal pass into an intermediate image, then the vertical pass fused with
  // normalization and patch flattening, one strip of merge groups at a time).
  const bool need_h = W != image.width;
  const bool need_v = H != image.height;
  internal::AxisCoeffs vert;
  int ybox_first = 0, ybox_last = image.height;
  if (need_v) {
    vert = internal::ComputeAxisCoeffs(image.height, H);
    ybox_first = vert.start[0];
    ybox_last = vert.start[H - 1] + vert.count[H - 1];
  }
  RgbImage tmp;
  std::vector<const uint8_t*> src_rows(image.height, nullptr);  // by input row
  if (need_h) {
    const internal::HorizontalPlan plan(internal::ComputeAxisCoeffs(image.width, W));
    tmp.width = W;
    tmp.height = ybox_last - ybox_first;
    tmp.pixels.resize(static_cast<size_t>(tmp.width) * tmp.height * 3);
    constexpr int kChunk = 16;
    const int chunks = (tmp.height + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < chunks; ++ch) {
      const int y0 = ybox_first + ch * kChunk;
      const int y1 = std::min(y0 + kChunk, ybox_last);
      plan.Run(image, y0, y1, &tmp, y0 - ybox_first);
    }
    for (int y = ybox_first; y < ybox_last; ++y) src_rows[y] = tmp.row(y - ybox_first);
  } else {
    for (int y = ybox_first; y < ybox_last; ++y) src_rows[y] = image.row(y);
  }

  const int strip_rows = patchifier.strip_rows();
  const int strips = H / strip_rows;
  const int64_t rows_per_strip = patchifier.rows_per_strip(W);
  const int64_t row_len = patchifier.row_length();
  const int64_t row_bytes = static_cast<int64_t>(W) * 3;
#pragma omp parallel
  {
    std::vector<uint8_t> strip_buf(need_v ? static_cast<size_t>(strip_rows) * row_bytes : 0);
    std::vector<const uint8_t*> rows(strip_rows);
#pragma omp for schedule(dynamic, 1)
    for (int s = 0; s < strips; ++s) {
      for (int i = 0; i < strip_rows; ++i) {
        const int yy = s * strip_rows + i;
        if (need_v) {
          uint8_t* dst = strip_buf.data() + static_cast<size_t>(i) * row_bytes;
          internal::VerticalRow(vert, yy, src_rows.data(), row_bytes, dst);
          rows[i] = dst;
        } else {
          rows[i] = src_rows[yy];
        }
      }
      patchifier.Strip(rows.data(), W, out + s * rows_per_strip * row_len);
    }
  }
  return result;
}

}  // namespace iris::vision
