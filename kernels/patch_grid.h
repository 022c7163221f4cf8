// One resized image's patch layout, as kernels::PatchRows reads it: a plain header that the CPU op
// and the CUDA kernel (kernels.cuh) both include, so that both walk the rows the same way.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace iris::kernels {

struct PatchGrid {
  int patch = 14;      // pixels per patch side
  int temporal = 2;    // frames per patch (an image is repeated this many times)
  int merge = 2;       // patches per merge-group side
  int64_t height = 0;  // pixels, a multiple of patch * merge
  int64_t width = 0;   // pixels, a multiple of patch * merge

  IRIS_HD_FN int64_t row_length() const { return int64_t{3} * temporal * patch * patch; }
  IRIS_HD_FN int64_t rows() const { return (height / patch) * (width / patch); }
  // The first byte of patch row `row`'s top-left pixel. The reference's row order: merge groups in
  // raster order, the merge * merge patches of a group consecutive in raster order.
  IRIS_HD_FN int64_t PatchOrigin(int64_t row) const {
    const int64_t group_rows = int64_t{merge} * merge, groups_across = width / (int64_t{patch} * merge);
    const int64_t group = row / group_rows, in_group = row % group_rows;
    const int64_t py = (group / groups_across) * merge + in_group / merge;
    const int64_t px = (group % groups_across) * merge + in_group % merge;
    return (py * patch * width + px * patch) * 3;
  }
};

}  // namespace iris::kernels
