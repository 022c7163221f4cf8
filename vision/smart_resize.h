// The reference's smart_resize: the target size, in multiples of `factor` (28), within
// [min_pixels, max_pixels]; round-half-to-even; all in double precision.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace iris::vision {

struct ResizedSize {
  int height = 0;
  int width = 0;
};

// Errors (InvalidArgument): a side below `factor`; aspect ratio above 200; min/max invalid.
absl::StatusOr<ResizedSize> SmartResize(int height, int width, int factor, int64_t min_pixels,
                                        int64_t max_pixels);

}  // namespace iris::vision
