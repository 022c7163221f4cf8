// Splits the fused qkv output into head-major, zero-padded q/k/v in one pass over the rows.
#include "kernels/cpu/cpu_ops.h"

#include "kernels/cpu/simd.h"  // first: it sets up the intrinsics headers

#include "core/isa_region.h"

IRIS_AVX512_BEGIN
namespace iris::kernels::cpu::avx512 {
namespace {

using cpu::TailMask;

constexpr int64_t kParallelThreshold = 1 << 14;  // floats written

// dst[0..head_dim) = src, dst[head_dim..padded_dim) = 0.
inline void CopyPadded(const float* src, int head_dim, int padded_dim, float* dst) {
  int i = 0;
  for (; i + 16 <= head_dim; i += 16) _mm512_storeu_ps(dst + i, _mm512_loadu_ps(src + i));
  for (; i < padded_dim; i += 16) {
    // Lanes below head_dim come from src, the rest are zero; lanes past padded_dim untouched.
    const __m512 v = _mm512_maskz_loadu_ps(TailMask(head_dim - i > 0 ? head_dim - i : 0), src + i);
    _mm512_mask_storeu_ps(dst + i, TailMask(padded_dim - i), v);
  }
}

}  // namespace

void PadQkv(CpuDevice& dev, const float* qkv, int64_t rows, int num_heads, int head_dim, int padded_dim,
            float* q, float* k, float* v) {
  float* outs[3] = {q, k, v};
  const int64_t row_stride = 3LL * num_heads * head_dim;
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (rows * row_stride > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = qkv + r * row_stride;
    for (int which = 0; which < 3; ++which) {
      for (int h = 0; h < num_heads; ++h) {
        CopyPadded(src + (static_cast<int64_t>(which) * num_heads + h) * head_dim, head_dim, padded_dim,
                   outs[which] + (h * rows + r) * padded_dim);
      }
    }
  }
}

void PadOneOfQkv(CpuDevice& dev, const float* qkv, int64_t rows, int num_heads, int head_dim, int padded_dim, int which,
                 float* out) {
  const int64_t row_stride = 3LL * num_heads * head_dim;
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (rows * row_stride / 3 > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = qkv + r * row_stride + static_cast<int64_t>(which) * num_heads * head_dim;
    for (int h = 0; h < num_heads; ++h) {
      CopyPadded(src + static_cast<int64_t>(h) * head_dim, head_dim, padded_dim, out + (h * rows + r) * padded_dim);
    }
  }
}

}  // namespace iris::kernels::cpu::avx512
IRIS_AVX512_END
