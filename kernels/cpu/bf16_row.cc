// f32 -> bf16 rows for Linear's bf16 inputs on AVX-512: simd.h's conversion, with the software
// rounding or AVX512-BF16's.
#include "kernels/cpu/cpu_ops.h"

#include "kernels/cpu/simd.h"  // first: it sets up the intrinsics headers

#include "core/isa_region.h"

IRIS_AVX512_BEGIN
namespace iris::kernels::cpu::avx512 {

void RowToBf16(const float* x, int64_t n, uint16_t* y) { cpu::FloatToBf16Row<false>(x, n, y); }
void RowToBf16Native(const float* x, int64_t n, uint16_t* y) { cpu::FloatToBf16Row<true>(x, n, y); }

}  // namespace iris::kernels::cpu::avx512
IRIS_AVX512_END
