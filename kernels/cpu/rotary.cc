// Rotary embedding (rotate-half), in place on strided heads; AVX-512 over the half dimension.
#include "kernels/cpu/cpu_ops.h"

#include "kernels/cpu/simd.h"  // first: it sets up the intrinsics headers

#include "core/isa_region.h"

IRIS_AVX512_BEGIN
namespace iris::kernels::cpu::avx512 {
namespace {

using cpu::TailMask;

constexpr int64_t kParallelThreshold = 1 << 14;  // floats rotated

// Rotates the `num_heads` heads of one row. cos/sin: this row's half table.
inline void RotateRow(float* row, int num_heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* x = row + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; i += 16) {
      const __mmask16 m = TailMask(half - i);
      const __m512 c = _mm512_maskz_loadu_ps(m, cos + i);
      const __m512 s = _mm512_maskz_loadu_ps(m, sin + i);
      const __m512 x1 = _mm512_maskz_loadu_ps(m, x + i);
      const __m512 x2 = _mm512_maskz_loadu_ps(m, x + half + i);
      // x*cos + rotate_half(x)*sin, rotate_half(x) = (-x2, x1)
      _mm512_mask_storeu_ps(x + i, m, _mm512_sub_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x2, s)));
      _mm512_mask_storeu_ps(x + half + i, m, _mm512_add_ps(_mm512_mul_ps(x2, c), _mm512_mul_ps(x1, s)));
    }
  }
}

}  // namespace

void RotaryQK(CpuDevice& dev, HeadsView q, HeadsView k, int64_t rows, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  const int64_t work = rows * (q.num_heads + k.num_heads) * head_dim;
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (work > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + r * half;
    const float* s = sin + r * half;
    RotateRow(q.data + r * q.row_stride, q.num_heads, head_dim, c, s);
    RotateRow(k.data + r * k.row_stride, k.num_heads, head_dim, c, s);
  }
}

void Rotary(CpuDevice& dev, HeadsView x, int64_t rows, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  const int64_t work = rows * x.num_heads * head_dim;
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (work > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) {
    RotateRow(x.data + r * x.row_stride, x.num_heads, head_dim, cos + r * half, sin + r * half);
  }
}

}  // namespace iris::kernels::cpu::avx512
IRIS_AVX512_END
