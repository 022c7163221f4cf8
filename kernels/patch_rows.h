// The vision encoder's input rows made where the encoder runs, from a resized RGB8 image: the
// preprocessing's rescale, normalize, temporal repeat and patch flattening (the reference's
// pixel_values rows), so that an image crosses to a device as its bytes (3 per pixel) rather
// than as float rows (4 bytes × temporal repeat per value: 8× more for Qwen2.5-VL).
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/patch_grid.h"

namespace iris::kernels {

// Rows [row_begin, row_end) of the image's patch rows, written at out (row_begin's row first;
// row_length() floats each). Row order (the reference's): merge groups in raster order, the
// merge * merge patches of a group consecutive in raster order; inside a row (channel, frame, y,
// x). Value: table[c * 256 + byte] for channel c's byte (the normalized values, built by
// vision::PixelTable), so the rows are the host preprocessing's bit for bit. rgb (height × width
// × 3 bytes, interleaved), table (768 floats) and out are device memory.
void PatchRows(Device& device, const uint8_t* rgb, const PatchGrid& grid, const float* table, int64_t row_begin,
               int64_t row_end, float* out);

}  // namespace iris::kernels
