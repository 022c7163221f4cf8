// kernels::PatchRows on host memory: a row at a time, each a table lookup per value.
#include <cstdint>

#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels::cpu {

void PatchRows(CpuDevice& dev, const uint8_t* rgb, const PatchGrid& grid, const float* table, int64_t row_begin,
               int64_t row_end, float* out) {
  const int P = grid.patch, T = grid.temporal;
  const int64_t row_len = grid.row_length(), plane = int64_t{P} * P;
  const int64_t line = grid.width * 3;  // bytes per image row
  // A row is ~5 KB of output (Qwen2.5-VL): a few rows stay on the calling thread.
  const bool parallel = (row_end - row_begin) * row_len * 4 > (int64_t{1} << 16);
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (parallel)
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* origin = rgb + grid.PatchOrigin(r);
    float* dst = out + (r - row_begin) * row_len;
    for (int c = 0; c < 3; ++c) {
      const float* lut = table + c * 256;
      for (int y = 0; y < P; ++y) {
        const uint8_t* src = origin + y * line + c;
        float* d = dst + int64_t{c} * T * plane + int64_t{y} * P;
        for (int x = 0; x < P; ++x) d[x] = lut[src[x * 3]];
        for (int t = 1; t < T; ++t) {
          for (int x = 0; x < P; ++x) d[t * plane + x] = d[x];
        }
      }
    }
  }
}

}  // namespace iris::kernels::cpu
