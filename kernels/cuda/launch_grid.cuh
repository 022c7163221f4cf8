// Launch shapes and the launch-error read shared by the .cu files that launch iris's row and
// elementwise kernels (nvcc only: the SIMT harness launches with its own grids).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace iris::kernels::cuda {

// Threads per block of the row-strided and grid-stride kernels.
constexpr int kLaunchThreads = 256;

// The launch just issued: its cudaError_t value (0: success), as the Launch* functions return it.
inline int LastLaunchError() { return static_cast<int>(cudaGetLastError()); }

// A launch on `stream`, with programmatic stream serialization where `early` (simt.h's
// GridDependencyWait: the kernel may start before the one ahead of it ends). Its error is read
// as any launch's (LastLaunchError).
template <typename... Params, typename... Args>
void LaunchMaybeEarly(CUstream_st* stream, dim3 grid, unsigned threads, bool early, void (*kernel)(Params...),
                      Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.stream = stream;
  config.attrs = early ? &attribute : nullptr;
  config.numAttrs = early ? 1 : 0;
  (void)cudaLaunchKernelEx(&config, kernel, args...);
}

// A grid for a rows x cols elementwise kernel: one thread per element where that fits, capped
// (the kernels' strided loops take the rest): up to 16 blocks across a row, 65535 rows down.
inline dim3 RowsGrid(int64_t rows, int64_t cols) {
  const int64_t across = (cols + kLaunchThreads - 1) / kLaunchThreads;
  return dim3(static_cast<unsigned>(across < 16 ? across : 16), static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

}  // namespace iris::kernels::cuda
