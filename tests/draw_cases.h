// Rows and settings for the sampled draw's tests (llm::Sampler::Sample against kernels::SampleRows
// on the CPU, and the CUDA kernel on the SIMT harness against the CPU op): rows that take each of
// the sampler's paths (a few likely tokens, a flat row, ties at the top-k and top-p edges, NaN
// and -inf), and settings that cover top-k, top-p, both, their edges and greedy.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/row_draw.h"
#include "tests/test_util.h"

namespace iris::testing {

constexpr int kDrawRowKinds = 4;

// Row kind 0: normal (sigma 3) with two dominant tokens; 1: flat (every token near as likely);
// 2: 64 levels, so that many values tie; 3: normal with NaN and -inf sprinkled and one spike.
inline std::vector<float> DrawCaseRow(int kind, int64_t vocab, uint32_t seed) {
  std::vector<float> row;
  switch (kind) {
    case 0:
      row = RandomNormal(vocab, seed, 3.f);
      row[static_cast<size_t>(seed % vocab)] = 14.f;
      row[static_cast<size_t>((seed * 7 + 3) % vocab)] = 13.5f;
      break;
    case 1:
      row = RandomFloats(vocab, seed, -0.5f, 0.5f);
      break;
    case 2:
      row = RandomNormal(vocab, seed, 1.f);
      for (float& v : row) v = std::round(v * 8.f) / 8.f;
      break;
    default:
      row = RandomNormal(vocab, seed, 2.f);
      for (int64_t i = seed % 13; i < vocab; i += 13) row[static_cast<size_t>(i)] = std::numeric_limits<float>::quiet_NaN();
      for (int64_t i = seed % 17; i < vocab; i += 17) row[static_cast<size_t>(i)] = -std::numeric_limits<float>::infinity();
      row[static_cast<size_t>((seed * 5) % vocab)] = 9.f;
      break;
  }
  return row;
}

// temperature, top_k, top_p (the uniform is the test's).
inline std::vector<kernels::RowDraw> DrawCaseSettings() {
  const auto s = [](float t, int32_t k, float p) {
    kernels::RowDraw d;
    d.temperature = t;
    d.top_k = k;
    d.top_p = p;
    return d;
  };
  return {s(1.f, 0, 1.f),     s(0.7f, 0, 0.9f),  s(1.f, 50, 1.f),     s(0.7f, 50, 0.95f),
          s(1.f, 2000, 1.f),  s(1.f, 0, 0.5f),   s(1.3f, 0, 0.99f),   s(1.f, 5, 1e-7f),
          s(0.5f, 0, 0.001f), s(2.f, 3, 0.8f),   s(1.f, 1, 1.f),      s(0.f, 0, 1.f)};
}

}  // namespace iris::testing
