// bfloat16 <-> float conversions (round-to-nearest-even), the rounding the checkpoints use.
#pragma once

#include <cstdint>
#include <cstring>

namespace iris::core {

inline float Bf16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even on the float32 bit pattern; NaN stays NaN (quiet).
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// IEEE half -> float (for F16 checkpoints).
float F16ToFloat(uint16_t h);

}  // namespace iris::core
