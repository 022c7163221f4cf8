// The dispatch point of these ops: the one place that picks each one's implementation for a device.
#include "kernels/memory_bandwidth.h"

#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels {

double MeasureMemoryReadBandwidth(Device& device, int64_t bytes, int repeats) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::avx512::MeasureMemoryReadBandwidth(cpu::AsCpu(device), bytes, repeats);
  }
  return 0;
}

}  // namespace iris::kernels
