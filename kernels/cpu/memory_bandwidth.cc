// Memory read bandwidth: every thread streams through its own contiguous slice with aligned
// 64-byte loads into 8 independent accumulators (so the adds never wait on each other and the
// loads are the only limit); the hardware prefetchers see one sequential stream per thread.
#include "kernels/cpu/cpu_ops.h"

#include "kernels/cpu/simd.h"  // first: it sets up the intrinsics headers

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "core/tensor.h"
#include "core/isa_region.h"

IRIS_AVX512_BEGIN
namespace iris::kernels::cpu::avx512 {
namespace {

constexpr int64_t kLine = 64;             // bytes per zmm load
constexpr int64_t kUnroll = 8;            // zmm loads per iteration (independent accumulators)
constexpr int64_t kStep = kLine * kUnroll;  // 512 bytes

// Sums n floats from p (n a multiple of 128) into 16 lanes stored to out. (Called from an OpenMP
// region, which holds no vector values: see isa_region.h.)
void SumSlice(const float* p, int64_t n, float* out) {
  __m512 acc[kUnroll];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kStep / 4) {
#pragma GCC unroll 8
    for (int u = 0; u < kUnroll; ++u) acc[u] = _mm512_add_ps(acc[u], _mm512_load_ps(p + i + u * 16));
  }
  for (int u = 1; u < kUnroll; ++u) acc[0] = _mm512_add_ps(acc[0], acc[u]);
  _mm512_storeu_ps(out, acc[0]);
}

}  // namespace

double MeasureMemoryReadBandwidth(CpuDevice& dev, int64_t bytes, int repeats) {
  const int threads = dev.threads();
  // Each thread's slice is a whole number of 512-byte steps (and so 64-byte aligned).
  const int64_t steps_per_thread = std::max<int64_t>(1, bytes / kStep / threads);
  const int64_t slice = steps_per_thread * kStep / 4;  // floats
  const int64_t total = slice * threads;
  auto buffer = core::AllocateAligned(static_cast<size_t>(total) * sizeof(float));
  float* data = static_cast<float*>(buffer.get());
  float partial[256 * 16] = {};  // per-thread results (up to 256 threads are kept)

  // First touch by the thread that will read the slice (its pages then sit on its NUMA node).
  // Small nonzero values: the sums stay finite and nothing is denormal.
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    float* p = data + t * slice;
    for (int64_t i = 0; i < slice; ++i) p[i] = 1.0f / static_cast<float>(1 + (i & 1023));
  }

  double best = std::numeric_limits<double>::infinity();
  float sink = 0.f;
  for (int r = 0; r <= std::max(1, repeats); ++r) {  // pass 0 is the warm-up
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      float s[16];
      SumSlice(data + t * slice, slice, s);
      if (t < 256) std::memcpy(partial + t * 16, s, sizeof(s));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
    for (int t = 0; t < std::min(threads, 256); ++t) sink += partial[t * 16];
  }
  // The sums are used, so no pass can be optimised away.
  [[maybe_unused]] static volatile float g_sink;
  g_sink = sink;
  return static_cast<double>(total) * sizeof(float) / best;
}

}  // namespace iris::kernels::cpu::avx512
IRIS_AVX512_END
