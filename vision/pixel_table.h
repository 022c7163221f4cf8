// What the preprocessing makes of each RGB byte, tabulated: the reference's rescale then normalize,
// float32(double(v) * (1/255)) and then (x - mean[c]) / std[c] in float32, for channel c at
// [c * 256 + v]. The host's patch flattening (patchify.h) and the encoder's (kernels::PatchRows)
// both read it, so their rows are the same bits.
#pragma once

#include <array>

namespace iris::vision {

inline constexpr int kPixelTableSize = 3 * 256;

std::array<float, kPixelTableSize> PixelTable(const std::array<float, 3>& mean, const std::array<float, 3>& std);

}  // namespace iris::vision
