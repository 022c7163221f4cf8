#include "vision/pixel_bounds.h"

#include "absl/strings/str_cat.h"

namespace iris::vision {

absl::StatusOr<ResolvedPixelBounds> ResolvePixelBounds(const core::PreprocessorConfig& limits,
                                                       std::optional<int64_t> min_pixels,
                                                       std::optional<int64_t> max_pixels) {
  ResolvedPixelBounds b{limits.min_pixels, limits.max_pixels};
  if (min_pixels.has_value()) {
    if (*min_pixels < limits.min_pixels || *min_pixels > limits.max_pixels) {
      return absl::InvalidArgumentError(absl::StrCat("min_pixels ", *min_pixels, " is outside the allowed range [",
                                                     limits.min_pixels, ", ", limits.max_pixels, "]"));
    }
    b.min_pixels = *min_pixels;
  }
  if (max_pixels.has_value()) {
    if (*max_pixels < limits.min_pixels || *max_pixels > limits.max_pixels) {
      return absl::InvalidArgumentError(absl::StrCat("max_pixels ", *max_pixels, " is outside the allowed range [",
                                                     limits.min_pixels, ", ", limits.max_pixels, "]"));
    }
    b.max_pixels = *max_pixels;
  }
  if (b.min_pixels > b.max_pixels) {
    return absl::InvalidArgumentError(absl::StrCat("min_pixels ", b.min_pixels, " exceeds max_pixels ", b.max_pixels));
  }
  return b;
}

}  // namespace iris::vision
