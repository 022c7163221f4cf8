// JPEG -> RGB8 through libjpeg-turbo, with Pillow 9.4's settings (islow DCT, fancy upsampling)
// and colour handling (gray -> R=G=B, 4-component data read as Adobe-inverted CMYK then
// Pillow's cmyk2rgb). Truncated data is an error, as it is for Pillow.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "vision/image.h"
#include "vision/image_decode.h"

namespace iris::vision::detail {

// *orientation receives the EXIF transpose (1..8) still to be applied to the result: the
// decoder applies 4..8 itself while decoding (no extra pass), and leaves 2 and 3 to the caller.
absl::StatusOr<RgbImage> DecodeJpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                                    int* orientation);

}  // namespace iris::vision::detail
