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

// Decodes without applying orientation; *orientation receives the EXIF transpose (1..8) that
// exif_transpose would apply.
absl::StatusOr<RgbImage> DecodeJpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                                    int* orientation);

}  // namespace iris::vision::detail
