// Per-request min/max pixel bounds, checked against the server's (the checkpoint's) limits: a
// request may only tighten them.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "core/model_config.h"

namespace iris::vision {

struct ResolvedPixelBounds {
  int64_t min_pixels = 0;
  int64_t max_pixels = 0;
};

// InvalidArgument naming the field and the limit when a requested bound is outside
// [limits.min_pixels, limits.max_pixels] or min > max.
absl::StatusOr<ResolvedPixelBounds> ResolvePixelBounds(const core::PreprocessorConfig& limits,
                                                       std::optional<int64_t> min_pixels,
                                                       std::optional<int64_t> max_pixels);

}  // namespace iris::vision
