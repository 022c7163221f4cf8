#include "vision/pixel_table.h"

namespace iris::vision {

std::array<float, kPixelTableSize> PixelTable(const std::array<float, 3>& mean, const std::array<float, 3>& std) {
  std::array<float, kPixelTableSize> table{};
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      const float x = static_cast<float>(static_cast<double>(v) * (1.0 / 255.0));
      table[c * 256 + v] = (x - mean[c]) / std[c];
    }
  }
  return table;
}

}  // namespace iris::vision
