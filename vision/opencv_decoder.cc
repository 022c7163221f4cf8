#include "vision/opencv_decoder.h"

#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "absl/strings/str_cat.h"
#include "vision/exif_orientation.h"
#include "vision/image_header.h"
#include "vision/opencv_plugin_loader.h"

namespace iris::vision::detail {
namespace {

uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

// Pillow reads a WebP's EXIF chunk through WebPDemux, which keeps chunks of extended (VP8X)
// files only: the first "EXIF" chunk is info["exif"].
int WebpOrientation(std::span<const uint8_t> b) {
  if (b.size() < 20 || std::memcmp(&b[12], "VP8X", 4) != 0) return 1;
  size_t pos = 12;
  while (pos + 8 <= b.size()) {
    const uint32_t size = Le32(&b[pos + 4]);
    if (size > b.size() - pos - 8) break;
    if (std::memcmp(&b[pos], "EXIF", 4) == 0) return ReadExifOrientation(b.subspan(pos + 8, size)).value;
    pos += 8 + size + (size & 1);
  }
  return 1;
}

// Pillow 9.4 applies a TIFF's orientation twice in load_image: TiffImageFile.load_end
// transposes the pixels, then exif_transpose (reading the same tag) transposes them again (net:
// a half turn for 6 and 8, nothing for the others). OpenCV's TIFF reader applies the tag once
// itself, whatever the IMREAD flags say, so the second application is what is left to do.
int TiffOrientation(std::span<const uint8_t> b) { return ReadTiffOrientation(b).value; }

absl::StatusOr<HeaderDims> Dims(std::span<const uint8_t> b, ImageFormat format) {
  switch (format) {
    case ImageFormat::kWebp: return ReadWebpDims(b);
    case ImageFormat::kBmp: return ReadBmpDims(b);
    case ImageFormat::kTiff: return ReadTiffDims(b);
    default: return absl::InternalError("DecodeWithOpenCv: not a WebP/BMP/TIFF");
  }
}

void BgrToRgbInPlace(RgbImage& im) {
  uint8_t* p = im.pixels.data();
  const size_t n = static_cast<size_t>(im.width) * im.height;
  for (size_t i = 0; i < n; ++i, p += 3) std::swap(p[0], p[2]);
}

// The plugin's imdecode into *pixels (sized for the expected image: decoded in place when the
// file agrees), its error as INVALID_ARGUMENT naming the format.
absl::Status Imdecode(std::span<const uint8_t> bytes, opencv_plugin::Samples samples, opencv_plugin::Decoded* pixels,
                      const char* name) {
  absl::StatusOr<opencv_plugin::ImdecodeFn> imdecode = OpenCvImdecode();
  if (!imdecode.ok()) return imdecode.status();
  (*imdecode)(bytes.data(), bytes.size(), samples, pixels);
  if (!pixels->error.empty()) return absl::InvalidArgumentError(absl::StrCat("invalid ", name, " data (", pixels->error, ")"));
  return absl::OkStatus();
}

// Pillow opens a 16-bit grayscale TIFF as mode I;16, and convert("RGB") clips it at 255; OpenCV's
// 8-bit conversion would keep the high byte instead, so read the 16-bit samples and clip.
absl::StatusOr<RgbImage> DecodeGray16Tiff(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  opencv_plugin::Decoded gray;
  if (absl::Status s = Imdecode(bytes, opencv_plugin::Samples::kGray16, &gray, "TIFF"); !s.ok()) return s;
  if (absl::Status s = CheckDimensions(ImageFormat::kTiff, gray.width, gray.height, limits); !s.ok()) return s;
  RgbImage image;
  image.width = gray.width;
  image.height = gray.height;
  image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
  for (int y = 0; y < image.height; ++y) {
    const uint8_t* in = gray.data.data() + static_cast<size_t>(y) * image.width * 2;
    uint8_t* out = image.row(y);
    for (int x = 0; x < image.width; ++x, out += 3) {
      uint16_t v;
      std::memcpy(&v, in + 2 * x, sizeof(v));
      out[0] = out[1] = out[2] = v > 255 ? 255 : static_cast<uint8_t>(v);
    }
  }
  return image;
}

}  // namespace

absl::StatusOr<RgbImage> DecodeWithOpenCv(std::span<const uint8_t> bytes, ImageFormat format,
                                          const DecodeLimits& limits, int* orientation) {
  *orientation = 1;
  const char* name = ImageFormatName(format);
  absl::StatusOr<HeaderDims> dims = Dims(bytes, format);
  if (!dims.ok()) return dims.status();
  if (absl::Status s = CheckDimensions(format, dims->width, dims->height, limits); !s.ok()) return s;

  if (format == ImageFormat::kWebp && IsAnimatedWebp(bytes)) {
    return absl::InvalidArgumentError("unsupported image: animated WebP (only still WebP images are supported)");
  }
  if (format == ImageFormat::kTiff) {
    const absl::StatusOr<TiffInfo> info = ReadTiffInfo(bytes);
    if (info.ok() && info->samples_per_pixel == 1 && info->bits_per_sample == 16 && info->photometric == 1) {
      *orientation = TiffOrientation(bytes);
      try {
        return DecodeGray16Tiff(bytes, limits);
      } catch (const std::bad_alloc&) {
        return absl::ResourceExhaustedError("out of memory for a 16-bit TIFF");
      }
    }
  }

  opencv_plugin::Decoded pixels;
  try {
    pixels.width = static_cast<int>(dims->width);
    pixels.height = static_cast<int>(dims->height);
    pixels.data.resize(static_cast<size_t>(pixels.width) * pixels.height * 3);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory for a ", pixels.width, "x", pixels.height, " ", name));
  }
  // The plugin decodes into pixels.data when the size agrees with the header's; OpenCV's own
  // EXIF rotation is off: the orientation Pillow would apply is worked out below.
  if (absl::Status s = Imdecode(bytes, opencv_plugin::Samples::kBgr8, &pixels, name); !s.ok()) return s;
  // The decoder's size may differ from our header reading.
  if (absl::Status s = CheckDimensions(format, pixels.width, pixels.height, limits); !s.ok()) return s;
  RgbImage image;
  image.width = pixels.width;
  image.height = pixels.height;
  image.pixels = std::move(pixels.data);
  BgrToRgbInPlace(image);

  if (format == ImageFormat::kWebp) *orientation = WebpOrientation(bytes);
  if (format == ImageFormat::kTiff) *orientation = TiffOrientation(bytes);
  return image;
}

}  // namespace iris::vision::detail
