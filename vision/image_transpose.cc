#include "vision/image_transpose.h"

#include <algorithm>
#include <cstddef>
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

// Rows of a full image go through ScatterTransposedRows a strip at a time.
RgbImage Transposed(const RgbImage& in, int orientation) {
  RgbImage out;
  out.width = in.height;
  out.height = in.width;
  out.pixels.resize(in.pixels.size());
  constexpr int kStrip = 32;
  const size_t stride = static_cast<size_t>(in.width) * 3;
  for (int y0 = 0; y0 < in.height; y0 += kStrip) {
    ScatterTransposedRows(in.row(y0), stride, y0, std::min(kStrip, in.height - y0), in.width, in.height,
                          orientation, &out);
  }
  return out;
}

}  // namespace

// out(r, c) = in(flip_y ? H-1-c : c, flip_x ? W-1-r : r), with flip_y for 6 and 7 and flip_x for
// 7 and 8. Tile by tile: a tile's input rows are first copied into a small contiguous buffer,
// because walking the input down a column at a large stride thrashes the L1 cache sets; each
// output row then gets the tile's pixels in ascending address order.
void ScatterTransposedRows(const uint8_t* src, size_t src_stride, int first_row, int num_rows, int in_width,
                           int in_height, int orientation, RgbImage* out) {
  const bool flip_y = orientation == 6 || orientation == 7;
  const bool flip_x = orientation == 7 || orientation == 8;
  constexpr int kTile = 32;
  uint8_t tile[kTile][kTile * 3];
  const int W = in_width, H = in_height;
  for (int j0 = 0; j0 < num_rows; j0 += kTile) {
    const int ny = std::min(kTile, num_rows - j0);
    const int y0 = first_row + j0;
    const int c_begin = flip_y ? H - y0 - ny : y0;
    for (int x0 = 0; x0 < W; x0 += kTile) {
      const int nx = std::min(kTile, W - x0);
      for (int j = 0; j < ny; ++j) std::memcpy(tile[j], src + (j0 + j) * src_stride + 3 * x0, static_cast<size_t>(nx) * 3);
      for (int i = 0; i < nx; ++i) {
        const int x = x0 + i;
        uint8_t* d = out->row(flip_x ? W - 1 - x : x) + 3 * c_begin;
        if (flip_y) {
          for (int j = ny - 1; j >= 0; --j, d += 3) std::memcpy(d, &tile[j][3 * i], 3);
        } else {
          for (int j = 0; j < ny; ++j, d += 3) std::memcpy(d, &tile[j][3 * i], 3);
        }
      }
    }
  }
}

RgbImage ApplyOrientation(RgbImage image, int orientation) {
  switch (orientation) {
    case 2: FlipLeftRight(image); return image;        // FLIP_LEFT_RIGHT
    case 3: Rotate180(image); return image;            // ROTATE_180
    case 4: FlipTopBottom(image); return image;        // FLIP_TOP_BOTTOM
    case 5:                                            // TRANSPOSE
    case 6:                                            // ROTATE_270 (90 degrees clockwise)
    case 7:                                            // TRANSVERSE
    case 8: return Transposed(image, orientation);     // ROTATE_90 (counter-clockwise)
    default: return image;
  }
}

}  // namespace iris::vision::detail
