#include "vision/image_transpose.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace iris::vision::detail {
namespace {

inline void SwapPixel(uint8_t* a, uint8_t* b) {
  std::swap(a[0], b[0]);
  std::swap(a[1], b[1]);
  std::swap(a[2], b[2]);
}

void FlipLeftRight(RgbImage& im) {
  for (int y = 0; y < im.height; ++y) {
    uint8_t* row = im.row(y);
    for (int l = 0, r = im.width - 1; l < r; ++l, --r) SwapPixel(row + 3 * l, row + 3 * r);
  }
}

void FlipTopBottom(RgbImage& im) {
  const size_t stride = static_cast<size_t>(im.width) * 3;
  for (int t = 0, b = im.height - 1; t < b; ++t, --b) std::swap_ranges(im.row(t), im.row(t) + stride, im.row(b));
}

void Rotate180(RgbImage& im) {
  uint8_t* p = im.pixels.data();
  const size_t n = static_cast<size_t>(im.width) * im.height;
  for (size_t l = 0; l < n / 2; ++l) SwapPixel(p + 3 * l, p + 3 * (n - 1 - l));
}

// Orientations 5..8 swap the axes: out(r, c) = in(flip_y ? H-1-c : c, flip_x ? W-1-r : r).
// Done in tiles so that both images are walked within cache-sized blocks.
RgbImage Transposed(const RgbImage& in, bool flip_y, bool flip_x) {
  RgbImage out;
  out.width = in.height;
  out.height = in.width;
  out.pixels.resize(in.pixels.size());
  constexpr int kTile = 32;
  const int W = in.width, H = in.height;
  for (int r0 = 0; r0 < out.height; r0 += kTile) {
    const int r1 = std::min(r0 + kTile, out.height);
    for (int c0 = 0; c0 < out.width; c0 += kTile) {
      const int c1 = std::min(c0 + kTile, out.width);
      for (int r = r0; r < r1; ++r) {
        const int x = flip_x ? W - 1 - r : r;
        uint8_t* dst = out.row(r) + 3 * c0;
        for (int c = c0; c < c1; ++c, dst += 3) {
          const uint8_t* src = in.row(flip_y ? H - 1 - c : c) + 3 * x;
          dst[0] = src[0];
          dst[1] = src[1];
          dst[2] = src[2];
        }
      }
    }
  }
  return out;
}

}  // namespace

RgbImage ApplyOrientation(RgbImage image, int orientation) {
  switch (orientation) {
    case 2: FlipLeftRight(image); return image;        // FLIP_LEFT_RIGHT
    case 3: Rotate180(image); return image;            // ROTATE_180
    case 4: FlipTopBottom(image); return image;        // FLIP_TOP_BOTTOM
    case 5: return Transposed(image, false, false);    // TRANSPOSE
    case 6: return Transposed(image, true, false);     // ROTATE_270 (90 degrees clockwise)
    case 7: return Transposed(image, true, true);      // TRANSVERSE
    case 8: return Transposed(image, false, true);     // ROTATE_90 (counter-clockwise)
    default: return image;
  }
}

}  // namespace iris::vision::detail
