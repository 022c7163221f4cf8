// f32 -> bf16 rows for Linear's bf16 inputs, in plain C++ (core::FloatToBf16's rounding, which
// the compiler vectorises).
#include "core/bf16.h"
#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels::cpu::portable {

void RowToBf16(const float* x, int64_t n, uint16_t* y) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = core::FloatToBf16(x[i]);
}

}  // namespace iris::kernels::cpu::portable
