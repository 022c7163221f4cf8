// The OpenCV plugin's interface: cv::imdecode in a shared module (libiris_opencv_plugin.so) that
// iris loads on the first WebP, BMP or TIFF image (vision/opencv_plugin_loader.h), so that a
// server, tool or test binary does not load OpenCV's codecs (with GDAL and ~170 libraries behind
// them) at start, and runs where they are not installed. Both sides are built together by the
// same toolchain: the interface is C++ types behind one C symbol.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace iris::vision::opencv_plugin {

enum class Samples : int {
  kBgr8 = 0,    // IMREAD_COLOR: 3 bytes per pixel, B G R
  kGray16 = 1,  // IMREAD_ANYDEPTH | IMREAD_GRAYSCALE: one native-endian uint16 per pixel
};

struct Decoded {
  // In: the size the caller expects, with `data` already sized for it (the pixels are decoded
  // straight into it when the file's size agrees). Out: the decoded size and packed rows.
  int width = 0, height = 0;
  std::vector<uint8_t> data;
  std::string error;  // empty on success; otherwise what OpenCV said (and data is meaningless)
};

using ImdecodeFn = void (*)(const uint8_t* bytes, size_t size, Samples samples, Decoded* out);

inline constexpr const char kImdecodeSymbol[] = "iris_opencv_imdecode";
inline constexpr const char kPluginFileName[] = "libiris_opencv_plugin.so";

}  // namespace iris::vision::opencv_plugin
