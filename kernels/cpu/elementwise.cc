// Row-wise and element-wise kernels: AVX-512 inside a row or chunk, OpenMP across them.
#include "kernels/cpu/cpu_ops.h"

#include "kernels/cpu/simd.h"  // first: it sets up the intrinsics headers

#include <algorithm>
#include <cmath>

#include "core/isa_region.h"

IRIS_AVX512_BEGIN
namespace iris::kernels::cpu::avx512 {
namespace {

using cpu::TailMask;

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 15;
// Flat element-wise work is split into chunks of this many floats (multiple of 16).
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

// One row of RmsNorm. (The OpenMP loops below call row functions: see isa_region.h.)
inline void RmsNormRow(const float* xr, const float* weight, int64_t dim, float eps, float* yr) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    const __m512 a = _mm512_loadu_ps(xr + i), b = _mm512_loadu_ps(xr + i + 16);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
    acc1 = _mm512_fmadd_ps(b, b, acc1);
  }
  for (; i < dim; i += 16) {
    const __m512 a = _mm512_maskz_loadu_ps(TailMask(dim - i), xr + i);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
  }
  const float variance = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) / static_cast<float>(dim);
  const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(variance + eps));
  // HF order: (x * rsqrt(var + eps)) * weight, each product rounded.
  for (i = 0; i < dim; i += 16) {
    const __mmask16 m = TailMask(dim - i);
    const __m512 a = _mm512_maskz_loadu_ps(m, xr + i);
    const __m512 w = _mm512_maskz_loadu_ps(m, weight + i);
    _mm512_mask_storeu_ps(yr + i, m, _mm512_mul_ps(w, _mm512_mul_ps(a, inv)));
  }
}

// o[i] = silu(g[i]) * u[i], i < n.
inline void SiluMulRow(const float* g, const float* u, int64_t n, float* o) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 a = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 b = _mm512_maskz_loadu_ps(m, u + i);
    _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(cpu::Silu(a), b));
  }
}

}  // namespace

void RmsNorm(CpuDevice& dev, const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (rows * dim > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) RmsNormRow(x + r * dim, weight, dim, eps, y + r * dim);
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
    for (int64_t i = begin; i < end; i += 16) {
      const __mmask16 m = TailMask(end - i);
      _mm512_mask_storeu_ps(y + i, m, cpu::GeluErf(_mm512_maskz_loadu_ps(m, x + i)));
    }
  });
}

void Add(CpuDevice& dev, const float* a, const float* b, int64_t n, float* y) {
  ForChunks(dev, n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i += 16) {
      const __mmask16 m = TailMask(end - i);
      _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
    }
  });
}

}  // namespace iris::kernels::cpu::avx512
IRIS_AVX512_END
