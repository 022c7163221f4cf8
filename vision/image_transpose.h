// The eight EXIF orientations applied to an RgbImage the way PIL.ImageOps.exif_transpose does
// (2 flip left-right, 3 rotate 180, 4 flip top-bottom, 5 transpose, 6 rotate 90 clockwise,
// 7 transverse, 8 rotate 90 counter-clockwise), and the strip primitive decoders use to write
// rows straight to their transposed place.
#pragma once

#include <cstddef>
#include <cstdint>

#include "vision/image.h"

namespace iris::vision::detail {

// Orientation 1 (or any value outside 2..8) returns the image unchanged.
RgbImage ApplyOrientation(RgbImage image, int orientation);

// True for 5..8, the orientations that swap width and height.
inline bool SwapsAxes(int orientation) { return orientation >= 5 && orientation <= 8; }

// For orientation 5..8: rows [first_row, first_row + num_rows) of the unrotated image (width
// `in_width`, height `in_height`; row i of the strip at src + i * src_stride) are written to
// their place in `out`, which is already sized in_height x in_width.
void ScatterTransposedRows(const uint8_t* src, size_t src_stride, int first_row, int num_rows, int in_width,
                           int in_height, int orientation, RgbImage* out);

}  // namespace iris::vision::detail
