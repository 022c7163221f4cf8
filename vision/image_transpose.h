// The eight EXIF orientations applied to an RgbImage the way PIL.ImageOps.exif_transpose does
// (2 flip left-right, 3 rotate 180, 4 flip top-bottom, 5 transpose, 6 rotate 90 clockwise,
// 7 transverse, 8 rotate 90 counter-clockwise).
#pragma once

#include "vision/image.h"

namespace iris::vision::detail {

// Orientation 1 (or any value outside 2..8) returns the image unchanged.
RgbImage ApplyOrientation(RgbImage image, int orientation);

}  // namespace iris::vision::detail
