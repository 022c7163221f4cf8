#include "vision/opencv_decoder.h"

#include <cstring>
#include <limits>
#include <new>
#include <string>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "absl/strings/str_cat.h"
#include "vision/exif_orientation.h"
#include "vision/image_header.h"

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

// cv::imdecode with its exceptions and empty results turned into statuses. OpenCV writes into
// *dst when its size and type already match what the decoder reports.
absl::StatusOr<cv::Mat> Imdecode(std::span<const uint8_t> bytes, int flags, cv::Mat* dst, const char* name) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(name, " data over 2 GiB"));
  }
  cv::Mat decoded;
  std::string error;
  try {
    const cv::Mat buf(1, static_cast<int>(bytes.size()), CV_8UC1, const_cast<uint8_t*>(bytes.data()));
    decoded = cv::imdecode(buf, flags | cv::IMREAD_IGNORE_ORIENTATION, dst);
  } catch (const cv::Exception& e) {
    error = e.what();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat("invalid ", name, " data (OpenCV: ", error, ")"));
  if (decoded.empty()) return absl::InvalidArgumentError(absl::StrCat("invalid ", name, " data (OpenCV could not decode it)"));
  return decoded;
}

// Pillow opens a 16-bit grayscale TIFF as mode I;16, and convert("RGB") clips it at 255; OpenCV's
// 8-bit conversion would keep the high byte instead, so read the 16-bit samples and clip.
absl::StatusOr<RgbImage> DecodeGray16Tiff(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  cv::Mat gray;
  absl::StatusOr<cv::Mat> decoded = Imdecode(bytes, cv::IMREAD_ANYDEPTH | cv::IMREAD_GRAYSCALE, &gray, "TIFF");
  if (!decoded.ok()) return decoded.status();
  if (decoded->type() != CV_16UC1) return absl::InternalError("OpenCV did not return 16-bit samples for a 16-bit TIFF");
  if (absl::Status s = CheckDimensions(ImageFormat::kTiff, decoded->cols, decoded->rows, limits); !s.ok()) return s;
  RgbImage image;
  image.width = decoded->cols;
  image.height = decoded->rows;
  image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
  for (int y = 0; y < image.height; ++y) {
    const uint16_t* in = decoded->ptr<uint16_t>(y);
    uint8_t* out = image.row(y);
    for (int x = 0; x < image.width; ++x, out += 3) out[0] = out[1] = out[2] = in[x] > 255 ? 255 : static_cast<uint8_t>(in[x]);
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

  RgbImage image;
  try {
    image.width = static_cast<int>(dims->width);
    image.height = static_cast<int>(dims->height);
    image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory for a ", image.width, "x", image.height, " ", name));
  }

  // OpenCV decodes into `dst` when the size and type agree with what its decoder reports, so the
  // pixels land in image.pixels directly. Its own EXIF rotation is off: the orientation Pillow
  // would apply is worked out below.
  cv::Mat dst(image.height, image.width, CV_8UC3, image.pixels.data());
  absl::StatusOr<cv::Mat> result = Imdecode(bytes, cv::IMREAD_COLOR, &dst, name);
  if (!result.ok()) return result.status();
  const cv::Mat& decoded = *result;
  if (decoded.type() != CV_8UC3) return absl::InternalError("OpenCV returned a non-8-bit-BGR image");

  if (decoded.data != image.pixels.data()) {
    // The decoder's size differed from our header reading; OpenCV already allocated, so only
    // check and copy.
    if (absl::Status s = CheckDimensions(format, decoded.cols, decoded.rows, limits); !s.ok()) return s;
    image.width = decoded.cols;
    image.height = decoded.rows;
    image.pixels.assign(static_cast<size_t>(image.width) * image.height * 3, 0);
    for (int y = 0; y < image.height; ++y) std::memcpy(image.row(y), decoded.ptr(y), static_cast<size_t>(image.width) * 3);
  }
  BgrToRgbInPlace(image);

  if (format == ImageFormat::kWebp) *orientation = WebpOrientation(bytes);
  if (format == ImageFormat::kTiff) *orientation = TiffOrientation(bytes);
  return image;
}

}  // namespace iris::vision::detail
