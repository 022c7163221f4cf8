// The machine's memory read bandwidth, measured: what a memory-bound kernel (a decode step reads
// every weight once) can be compared against on this machine.
#pragma once

#include <cstdint>

#include "kernels/device.h"

namespace iris::kernels {

// Bytes per second read from DRAM by all the device's threads together: each thread sums its own slice
// of a `bytes` buffer (first touched by the thread that reads it) with AVX-512 loads. Best of
// `repeats` passes after one warm-up pass. The buffer should be much larger than the last-level
// cache (the default 1 GiB is).
double MeasureMemoryReadBandwidth(Device& device, int64_t bytes = int64_t{1} << 30, int repeats = 5);

}  // namespace iris::kernels
