// Pillow's 8-bit BICUBIC resize (Image.resize(size, BICUBIC)), bit-exact: separable, horizontal
// pass then vertical, uint8 intermediate, Keys cubic a=-0.5 with antialiasing support, 22-bit
// fixed-point weights. Multi-threaded over output rows.
#pragma once

#include "vision/image.h"

namespace iris::vision {

RgbImage ResizeBicubic(const RgbImage& in, int out_height, int out_width);

}  // namespace iris::vision
