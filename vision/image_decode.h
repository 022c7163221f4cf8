// Image bytes -> RGB8, converting exactly as the reference's load_image does (PIL open,
// exif_transpose, convert("RGB")): JPEG through libjpeg-turbo, PNG through libpng, WebP/BMP/TIFF
// through OpenCV. Dimensions are read from the header and checked against the limits before any
// pixel buffer is allocated.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "vision/image.h"

namespace iris::vision {

enum class ImageFormat { kUnknown, kJpeg, kPng, kWebp, kBmp, kTiff };
const char* ImageFormatName(ImageFormat format);

struct DecodeLimits {
  int64_t max_bytes = 64ll << 20;         // encoded size
  int64_t max_pixels = 64ll * 1024 * 1024; // width * height of the decoded image
  int max_side = 32768;                    // width and height each
};

// What the header says, without decoding pixels (dimensions as stored, before EXIF rotation).
struct ImageHeader {
  ImageFormat format = ImageFormat::kUnknown;
  int width = 0;
  int height = 0;
};

// Identifies the format by its magic bytes and reads the dimensions from the header.
absl::StatusOr<ImageHeader> ProbeImage(std::span<const uint8_t> bytes);

absl::StatusOr<RgbImage> DecodeImage(std::span<const uint8_t> bytes, const DecodeLimits& limits = {});

// Reads the file (refusing files larger than limits.max_bytes) and decodes it.
absl::StatusOr<RgbImage> DecodeImageFile(const std::string& path, const DecodeLimits& limits = {});

}  // namespace iris::vision
