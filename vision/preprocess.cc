#include "vision/preprocess.h"

#include <sys/mman.h>

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

// pixel_values is large (75 MB for a 2044x1540 image) and freshly mapped on every call; with
// 4 KiB pages its first touch costs more than computing it. Transparent huge pages (where the
// system leaves them to madvise) cut the page faults 512-fold. Advisory only: errors are ignored.
void AdviseHugePages(void* data, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
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
  AdviseHugePages(out, result.pixel_values.nbytes());

  // Resize fused with normalization and patch flattening, one strip of merge groups (merge *
  // patch image rows) at a time, so the resized image never exists in full.
  const int64_t rows_per_strip = patchifier.rows_per_strip(W);
  const int64_t row_len = patchifier.row_length();
  internal::ResizeStrips(image, H, W, patchifier.strip_rows(), nullptr,
                         [&](int strip, const uint8_t* const* rows, int, int64_t readable) {
                           patchifier.Strip(rows, W, readable, out + strip * rows_per_strip * row_len);
                         });
  return result;
}

}  // namespace iris::vision
