// WebP, BMP and TIFF -> RGB8 through OpenCV's imdecode (its own EXIF handling off), in iris's
// OpenCV plugin loaded on first use (opencv_plugin_loader.h), with the orientation Pillow 9.4's
// load_image would apply worked out from the file's metadata.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "vision/image.h"
#include "vision/image_decode.h"

namespace iris::vision::detail {

// `format` is kWebp, kBmp or kTiff, and the header's dimensions have already been checked
// against `limits`. *orientation receives the transpose (1..8) still to apply.
absl::StatusOr<RgbImage> DecodeWithOpenCv(std::span<const uint8_t> bytes, ImageFormat format,
                                          const DecodeLimits& limits, int* orientation);

}  // namespace iris::vision::detail
