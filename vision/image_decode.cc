#include "vision/image_decode.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "vision/image_header.h"
#include "vision/image_transpose.h"
#include "vision/jpeg_decoder.h"
#include "vision/opencv_decoder.h"
#include "vision/png_decoder.h"

namespace iris::vision {

const char* ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kWebp: return "WebP";
    case ImageFormat::kBmp: return "BMP";
    case ImageFormat::kTiff: return "TIFF";
    case ImageFormat::kUnknown: break;
  }
  return "unknown";
}

absl::StatusOr<ImageHeader> ProbeImage(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return absl::InvalidArgumentError("image is 0 bytes");
  ImageHeader header;
  header.format = detail::SniffFormat(bytes);
  absl::StatusOr<detail::HeaderDims> dims;
  switch (header.format) {
    case ImageFormat::kJpeg: dims = detail::ReadJpegDims(bytes); break;
    case ImageFormat::kPng: {
      absl::StatusOr<detail::PngIhdr> ihdr = detail::ReadPngIhdr(bytes);
      if (!ihdr.ok()) return ihdr.status();
      dims = detail::HeaderDims{ihdr->width, ihdr->height};
      break;
    }
    case ImageFormat::kWebp: dims = detail::ReadWebpDims(bytes); break;
    case ImageFormat::kBmp: dims = detail::ReadBmpDims(bytes); break;
    case ImageFormat::kTiff: dims = detail::ReadTiffDims(bytes); break;
    case ImageFormat::kUnknown: return detail::UnsupportedFormatError(bytes);
  }
  if (!dims.ok()) return dims.status();
  constexpr int64_t kIntMax = 0x7FFFFFFF;
  if (dims->width > kIntMax || dims->height > kIntMax) {
    return absl::InvalidArgumentError(absl::StrCat(ImageFormatName(header.format), " header declares ",
                                                   dims->width, "x", dims->height, ", too large"));
  }
  header.width = static_cast<int>(dims->width);
  header.height = static_cast<int>(dims->height);
  return header;
}

absl::StatusOr<RgbImage> DecodeImage(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  if (bytes.empty()) return absl::InvalidArgumentError("image is 0 bytes");
  if (static_cast<uint64_t>(bytes.size()) > static_cast<uint64_t>(std::max<int64_t>(limits.max_bytes, 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("image is ", bytes.size(), " bytes, limit is ", limits.max_bytes));
  }
  absl::StatusOr<ImageHeader> header = ProbeImage(bytes);
  if (!header.ok()) return header.status();
  if (absl::Status s = detail::CheckDimensions(header->format, header->width, header->height, limits); !s.ok()) {
    return s;
  }
  int orientation = 1;
  absl::StatusOr<RgbImage> image;
  switch (header->format) {
    case ImageFormat::kJpeg: image = detail::DecodeJpeg(bytes, limits, &orientation); break;
    case ImageFormat::kPng: image = detail::DecodePng(bytes, limits, &orientation); break;
    default: image = detail::DecodeWithOpenCv(bytes, header->format, limits, &orientation); break;
  }
  if (!image.ok() || orientation == 1) return image;
  try {
    return detail::ApplyOrientation(*std::move(image), orientation);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while applying the EXIF orientation");
  }
}

absl::StatusOr<RgbImage> DecodeImageFile(const std::string& path, const DecodeLimits& limits) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    const std::string msg = absl::StrCat("cannot open image file ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
  }
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  if (std::fseek(f, 0, SEEK_END) != 0) return absl::InvalidArgumentError(absl::StrCat("cannot seek in ", path));
  const long size = std::ftell(f);
  if (size < 0) return absl::InvalidArgumentError(absl::StrCat("cannot size ", path));
  if (size > limits.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("image file ", path, " is ", size, " bytes, limit is ", limits.max_bytes));
  }
  std::rewind(f);
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory reading ", path));
  }
  if (size > 0 && std::fread(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("short read from ", path));
  }
  return DecodeImage(bytes, limits);
}

}  // namespace iris::vision
