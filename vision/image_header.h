// Image headers without decoding: which format the magic bytes say, the dimensions each format's
// header declares, and the check of those dimensions against DecodeLimits (done before any pixel
// buffer is allocated).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vision/image_decode.h"

namespace iris::vision::detail {

// The format named by the leading magic bytes (kUnknown if none of ours).
ImageFormat SniffFormat(std::span<const uint8_t> bytes);

// "unsupported image format (first bytes 47 49 46 38: GIF)"
absl::Status UnsupportedFormatError(std::span<const uint8_t> bytes);

// Dimensions as the header stores them (64-bit: some headers can declare more than int holds).
struct HeaderDims {
  int64_t width = 0;
  int64_t height = 0;
};

// The PNG IHDR fields iris needs.
struct PngIhdr {
  int64_t width = 0;
  int64_t height = 0;
  int bit_depth = 0;
  int color_type = 0;
  bool interlaced = false;
};

absl::StatusOr<HeaderDims> ReadJpegDims(std::span<const uint8_t> bytes);
absl::StatusOr<PngIhdr> ReadPngIhdr(std::span<const uint8_t> bytes);
absl::StatusOr<HeaderDims> ReadWebpDims(std::span<const uint8_t> bytes);
absl::StatusOr<HeaderDims> ReadBmpDims(std::span<const uint8_t> bytes);
absl::StatusOr<HeaderDims> ReadTiffDims(std::span<const uint8_t> bytes);

// A TIFF's first IFD, as far as choosing how to decode it goes.
struct TiffInfo {
  int64_t width = 0;
  int64_t height = 0;
  int bits_per_sample = 1;    // the first sample's
  int samples_per_pixel = 1;
  int photometric = -1;       // -1: tag absent
};
absl::StatusOr<TiffInfo> ReadTiffInfo(std::span<const uint8_t> bytes);

// True for a VP8X WebP whose flags say it is animated.
bool IsAnimatedWebp(std::span<const uint8_t> bytes);

// Fails with InvalidArgument ("PNG header declares 100000x100000 = 10000000000 pixels, limit is
// 67108864") when a side is zero, width*height is over max_pixels, or a side is over max_side.
absl::Status CheckDimensions(ImageFormat format, int64_t width, int64_t height,
                             const DecodeLimits& limits);

}  // namespace iris::vision::detail
