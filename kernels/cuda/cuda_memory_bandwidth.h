// The GPU's memory read bandwidth, measured (kernels/memory_bandwidth.h on a CudaDevice).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_device.h"

namespace iris::kernels::cuda {

// Bytes per second read from device memory by a read-and-sum kernel over a `bytes` buffer (16-byte
// loads, every SM busy), best of `repeats` passes timed with CUDA events after a warm-up pass.
// The buffer should be much larger than the L2 cache (50 MB on an H100; the default 1 GiB is).
// 0 when the buffer cannot be had.
double MeasureMemoryReadBandwidth(CudaDevice& dev, int64_t bytes, int repeats);

}  // namespace iris::kernels::cuda
