// A float's bits mapped so that unsigned order is value order (-inf lowest, +inf highest; -0
// below +0), and back: the keys top-k's selections rank logits by, on the host (llm::Sampler's
// radix select) and on a device (kernels/cuda/sample_rows.cuh).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace iris::kernels {

IRIS_HD_FN uint32_t OrderedFloatKey(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  // Negative: every bit flipped; else the sign bit set. Without a branch: the signs of random
  // logits would mispredict half the time.
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

IRIS_HD_FN float FromOrderedFloatKey(uint32_t key) {
  const uint32_t u = (key >> 31) != 0 ? (key & 0x7FFFFFFFu) : ~key;
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

}  // namespace iris::kernels
