// Image bytes from a client -> decode (JPEG, PNG, WebP, BMP, TIFF; EXIF orientation) -> Qwen2.5-VL
// preprocessing, as a server worker runs them. Properties: the header probe and the decoder agree,
// a decoded image respects the limits and has w*h*3 bytes, and preprocessing yields the grid it
// claims within the pixel bounds.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/model_config.h"
#include "tests/fuzz/fuzz_check.h"
#include "vision/image_decode.h"
#include "vision/preprocess.h"

namespace {

using iris::vision::DecodeLimits;

// Smaller than the server's defaults so that each input costs milliseconds, not seconds; the code
// paths (header checks before allocation, limit errors) are the same.
DecodeLimits FuzzDecodeLimits() {
  DecodeLimits limits;
  limits.max_bytes = 4 << 20;
  limits.max_pixels = 4 << 20;
  limits.max_side = 8192;
  return limits;
}

iris::core::PreprocessorConfig FuzzPreprocessorConfig() {
  iris::core::PreprocessorConfig config;  // the published Qwen2.5-VL values, max_pixels lowered
  config.max_pixels = 256 * 28 * 28;
  return config;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const DecodeLimits limits = FuzzDecodeLimits();
  static const iris::core::PreprocessorConfig config = FuzzPreprocessorConfig();
  const std::span<const uint8_t> bytes(data, size);

  const auto header = iris::vision::ProbeImage(bytes);
  const auto image = iris::vision::DecodeImage(bytes, limits);
  if (!image.ok()) return 0;
  IRIS_FUZZ_CHECK(header.ok(), "decoded an image whose header probe failed: %s",
                  std::string(header.status().message()).c_str());
  IRIS_FUZZ_CHECK(image->width > 0 && image->height > 0, "empty image %dx%d", image->width, image->height);
  IRIS_FUZZ_CHECK(image->width <= limits.max_side && image->height <= limits.max_side &&
                      int64_t{image->width} * image->height <= limits.max_pixels,
                  "%dx%d is over the limits", image->width, image->height);
  IRIS_FUZZ_CHECK(image->pixels.size() == size_t{3} * image->width * image->height,
                  "%zu bytes for %dx%d", image->pixels.size(), image->width, image->height);
  // EXIF orientation may swap the sides; nothing else may change them.
  const bool same = header->width == image->width && header->height == image->height;
  const bool swapped = header->width == image->height && header->height == image->width;
  IRIS_FUZZ_CHECK(same || swapped, "header says %dx%d, decoded %dx%d", header->width, header->height,
                  image->width, image->height);

  const auto pre = iris::vision::Preprocess(*image, config);
  if (!pre.ok()) return 0;  // e.g. an aspect ratio over 200
  const auto& grid = pre->grid_thw;
  const int factor = config.factor();
  IRIS_FUZZ_CHECK(grid[0] == 1 && grid[1] > 0 && grid[2] > 0, "grid (%ld, %ld, %ld)", long(grid[0]),
                  long(grid[1]), long(grid[2]));
  IRIS_FUZZ_CHECK(pre->resized_height % factor == 0 && pre->resized_width % factor == 0 &&
                      pre->resized_height / config.patch_size == grid[1] &&
                      pre->resized_width / config.patch_size == grid[2],
                  "resized %dx%d does not match grid (%ld, %ld)", pre->resized_width, pre->resized_height,
                  long(grid[1]), long(grid[2]));
  const int64_t pixels = int64_t{pre->resized_height} * pre->resized_width;
  IRIS_FUZZ_CHECK(pixels >= config.min_pixels && pixels <= config.max_pixels, "%ld pixels outside [%ld, %ld]",
                  long(pixels), long(config.min_pixels), long(config.max_pixels));
  const auto& shape = pre->rgb.shape();
  IRIS_FUZZ_CHECK(pre->rgb.dtype() == iris::core::DType::kU8 && shape.size() == 3 &&
                      shape[0] == pre->resized_height && shape[1] == pre->resized_width && shape[2] == 3,
                  "the resized image's shape does not match its size");
  return 0;
}
