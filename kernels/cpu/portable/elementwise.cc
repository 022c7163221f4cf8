// Row-wise and element-wise kernels in plain C++ for processors without AVX-512: the compiler
// vectorises the loops (AVX2 at the build's baseline), OpenMP splits rows or chunks as in the
// AVX-512 versions.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/portable/math.h"

namespace iris::kernels::cpu::portable {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 15;
// Flat element-wise work is split into chunks of this many floats.
constexpr int64_t kChunk = 4096;

template <typename F>
void ForChunks(CpuDevice& dev, int64_t n, F&& body) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (n > kParallelThreshold)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    body(begin, std::min(n, begin + kChunk));
  }
}

void SiluMulRow(const float* g, const float* u, int64_t n, float* o) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = Silu(g[i]) * u[i];
}

}  // namespace

void RmsNorm(CpuDevice& dev, const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (rows * dim > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    // HF order: (x * rsqrt(var + eps)) * weight, each product rounded.
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv);
  }
}

void SiluMulRows(CpuDevice& dev, const float* gu, int64_t rows, int64_t inter, float* out) {
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (rows * inter > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) SiluMulRow(gu + r * 2 * inter, gu + r * 2 * inter + inter, inter, out + r * inter);
}

void SiluMul(CpuDevice& dev, const float* gate, const float* up, int64_t n, float* out) {
  ForChunks(dev, n,
            [&](int64_t begin, int64_t end) { SiluMulRow(gate + begin, up + begin, end - begin, out + begin); });
}

void GeluErf(CpuDevice& dev, const float* x, int64_t n, float* y) {
  ForChunks(dev, n, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) y[i] = portable::GeluErf(x[i]);
  });
}

void LayerNorm(CpuDevice& dev, const float* x, const float* weight, const float* bias, int64_t rows, int64_t dim,
               float eps, float* y) {
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (rows * dim > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    // Two passes in double for the statistics (torch's CPU LayerNorm is no less exact); the
    // normalisation itself in float32.
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) sum += xr[i];
    const double mean = sum / static_cast<double>(dim);
    double var = 0;
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const float m = static_cast<float>(mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(dim) + eps));
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] - m) * inv * weight[i] + bias[i];
  }
}

void QuickGelu(CpuDevice& dev, const float* x, int64_t n, float* y) {
  ForChunks(dev, n, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) y[i] = x[i] / (1.0f + Exp(-1.702f * x[i]));
  });
}

void Add(CpuDevice& dev, const float* a, const float* b, int64_t n, float* y) {
  ForChunks(dev, n, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) y[i] = a[i] + b[i];
  });
}

}  // namespace iris::kernels::cpu::portable
