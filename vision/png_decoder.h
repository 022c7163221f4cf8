// PNG -> RGB8 through libpng, converting as Pillow 9.4 does: alpha and tRNS ignored, 16-bit
// colour reduced to its high byte, 16-bit gray clipped to 255, palette through Pillow's palette
// (entries the PLTE does not set are a gray ramp). CRCs are checked up to the first IDAT, as
// Pillow checks them; the image is complete once every row is decoded (IEND not required).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "vision/image.h"
#include "vision/image_decode.h"

namespace iris::vision::detail {

// Decodes without applying orientation; *orientation receives the transpose (1..8) that
// exif_transpose would apply (eXIf chunk, "Raw profile type exif" text, XMP tiff:Orientation).
absl::StatusOr<RgbImage> DecodePng(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                                   int* orientation);

}  // namespace iris::vision::detail
