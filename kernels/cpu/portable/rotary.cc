// Rotary embedding (rotate-half), in place on strided heads, in plain C++ (vectorised over the
// half dimension by the compiler).
#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels::cpu::portable {
namespace {

constexpr int64_t kParallelThreshold = 1 << 14;  // floats rotated

// Rotates the `num_heads` heads of one row. cos/sin: this row's half table.
void RotateRow(float* row, int num_heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* x = row + static_cast<int64_t>(h) * head_dim;
    // x*cos + rotate_half(x)*sin, rotate_half(x) = (-x2, x1); the halves do not overlap.
#pragma omp simd
    for (int i = 0; i < half; ++i) {
      const float x1 = x[i], x2 = x[half + i];
      x[i] = x1 * cos[i] - x2 * sin[i];
      x[half + i] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

}  // namespace

void RotaryQK(CpuDevice& dev, HeadsView q, HeadsView k, int64_t rows, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  const int64_t work = rows * (q.num_heads + k.num_heads) * head_dim;
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (work > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) {
    RotateRow(q.data + r * q.row_stride, q.num_heads, head_dim, cos + r * half, sin + r * half);
    RotateRow(k.data + r * k.row_stride, k.num_heads, head_dim, cos + r * half, sin + r * half);
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

}  // namespace iris::kernels::cpu::portable
