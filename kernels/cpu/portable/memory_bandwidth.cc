// Memory read bandwidth in plain C++: as the AVX-512 version (every thread streams its own
// contiguous slice into independent accumulators), with the loads the compiler vectorises.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/tensor.h"
#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels::cpu::portable {
namespace {

constexpr int64_t kStep = 512;  // bytes per step; slices are whole steps

// Sums n floats (a multiple of 64) into 64 partial sums: 8 independent vector additions per step
// (with 256-bit vectors), so that the loads are the only limit.
float SumSlice(const float* p, int64_t n) {
  float acc[64] = {};
  for (int64_t i = 0; i < n; i += 64) {
#pragma omp simd
    for (int u = 0; u < 64; ++u) acc[u] += p[i + u];
  }
  float sum = 0.f;
  for (float a : acc) sum += a;
  return sum;
}

}  // namespace

double MeasureMemoryReadBandwidth(CpuDevice& dev, int64_t bytes, int repeats) {
  const int threads = dev.threads();
  const int64_t steps_per_thread = std::max<int64_t>(1, bytes / kStep / threads);
  const int64_t slice = steps_per_thread * kStep / 4;  // floats
  const int64_t total = slice * threads;
  auto buffer = core::AllocateAligned(static_cast<size_t>(total) * sizeof(float));
  float* data = static_cast<float*>(buffer.get());

  // First touch by the thread that will read the slice; small nonzero values (no denormals).
#pragma omp parallel num_threads(threads)
  {
    float* p = data + omp_get_thread_num() * slice;
    for (int64_t i = 0; i < slice; ++i) p[i] = 1.0f / static_cast<float>(1 + (i & 1023));
  }

  double best = std::numeric_limits<double>::infinity();
  float sink = 0.f;
  for (int r = 0; r <= std::max(1, repeats); ++r) {  // pass 0 is the warm-up
    float total_sum = 0.f;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total_sum)
    total_sum += SumSlice(data + omp_get_thread_num() * slice, slice);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
    sink += total_sum;
  }
  // The sums are used, so no pass can be optimised away.
  [[maybe_unused]] static volatile float g_sink;
  g_sink = sink;
  return static_cast<double>(total) * sizeof(float) / best;
}

}  // namespace iris::kernels::cpu::portable
