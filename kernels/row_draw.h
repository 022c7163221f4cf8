// What a sampled pick needs to be drawn where its logits are (kernels/sample_rows.h): the
// request's settings and the uniform its generator drew for this pick (host and device code: a
// plain struct the CPU op reads and the CUDA kernel reads from device memory).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"


namespace iris::kernels {

struct RowDraw {
  float temperature = 0.f;  // 0: greedy (the row's argmax; top_k, top_p and uniform unused)
  int32_t top_k = 0;        // 0 = off; 1 = greedy
  float top_p = 1.f;        // 1 = off
  int32_t unused = 0;       // keeps `uniform` 8-byte aligned in an array
  double uniform = 0.0;     // in [0, 1): the draw's u (llm::Sampler's (rng() >> 11) * 2^-53)

  // The lowest id of the largest value (llm::SamplingParams::greedy's rule).
  IRIS_HD_FN bool greedy() const { return temperature == 0.f || top_k == 1; }
};

// Top-p compares a cumulative mass with (top_p - kTopPSlack) * total. Both come from float
// logits, so a nucleus that is exactly top_p on paper (0.5 + 0.3 for top_p 0.8) may sum to
// 0.79999995; the slack keeps such a boundary token out, as the exact arithmetic would.
constexpr double kTopPSlack = 1e-6;

// The mass top-p's nucleus must reach, of candidates whose mass is `total`: at least a little, so
// that a top_p below the slack keeps the most likely token rather than nothing.
IRIS_HD_FN double NucleusNeed(float top_p, double total) {
  const double need = (static_cast<double>(top_p) - kTopPSlack) * total;
  return need > 0x1p-1022 ? need : 0x1p-1022;
}

}  // namespace iris::kernels
