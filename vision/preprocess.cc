#include "vision/preprocess.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
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

  PreprocessedImage result;
  result.grid_thw = {1, H / P, W / P};
  result.resized_height = H;
  result.resized_width = W;
  result.rgb = core::Tensor::Empty(core::DType::kU8, {H, W, 3});
  uint8_t* out = result.rgb.data<uint8_t>();
  const size_t line = static_cast<size_t>(W) * 3;
  // Strips of one merge-group row, on the resize's workers.
  internal::ResizeStrips(image, H, W, factor, nullptr,
                         [&](int strip, const uint8_t* const* rows, int count, int64_t) {
                           for (int i = 0; i < count; ++i) {
                             std::memcpy(out + (static_cast<size_t>(strip) * factor + i) * line, rows[i], line);
                           }
                         });
  return result;
}

absl::StatusOr<core::Tensor> PixelValues(const PreprocessedImage& image, const core::PreprocessorConfig& config) {
  IRIS_RETURN_IF_ERROR(ValidateConfig(config));
  const int P = config.patch_size, M = config.merge_size, H = image.resized_height, W = image.resized_width;
  if (image.rgb.dtype() != core::DType::kU8 || image.rgb.rank() != 3 || image.rgb.dim(0) != H ||
      image.rgb.dim(1) != W || image.rgb.dim(2) != 3 || H % (P * M) != 0 || W % (P * M) != 0 ||
      image.grid_thw[0] != 1 || image.grid_thw[1] != H / P || image.grid_thw[2] != W / P) {
    return absl::InvalidArgumentError(absl::StrCat("PixelValues: rgb must be U8 [", H, ", ", W,
                                                   ", 3] with both sides multiples of ", P * M,
                                                   " and grid (1, H/", P, ", W/", P, "), got ",
                                                   core::DTypeName(image.rgb.dtype()), " ",
                                                   image.rgb.ShapeString()));
  }
  const internal::Patchifier patchifier(P, config.temporal_patch_size, M, config.image_mean, config.image_std);
  const int64_t rows_per_strip = patchifier.rows_per_strip(W), row_len = patchifier.row_length();
  core::Tensor values = core::Tensor::Empty(core::DType::kF32, {(H / P) * (W / P), row_len});
  float* out = values.data<float>();
  AdviseHugePages(out, values.nbytes());
  const uint8_t* rgb = image.rgb.data<uint8_t>();
  const int64_t line = int64_t{W} * 3, total = int64_t{H} * line;
  std::vector<const uint8_t*> rows(patchifier.strip_rows());
  for (int strip = 0; strip < H / patchifier.strip_rows(); ++strip) {
    const int64_t y0 = int64_t{strip} * patchifier.strip_rows();
    for (int i = 0; i < patchifier.strip_rows(); ++i) rows[i] = rgb + (y0 + i) * line;
    // Full-width loads may read up to the image's end (the last row: its own bytes only).
    patchifier.Strip(rows.data(), W, total - (y0 + patchifier.strip_rows() - 1) * line,
                     out + strip * rows_per_strip * row_len);
  }
  return values;
}

}  // namespace iris::vision
