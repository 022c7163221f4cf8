// A decoded image: 8-bit RGB, interleaved, row-major (height x width x 3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace iris::vision {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // height * width * 3 bytes

  uint8_t* row(int y) { return pixels.data() + static_cast<size_t>(y) * width * 3; }
  const uint8_t* row(int y) const { return pixels.data() + static_cast<size_t>(y) * width * 3; }
};

}  // namespace iris::vision
