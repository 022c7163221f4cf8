// The dispatch point of these ops: the one place that picks each one's implementation for a device.
#include "kernels/attention.h"

#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels {

void VarlenAttention(Device& device, const AttentionArgs& args) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::avx512::VarlenAttention(cpu::AsCpu(device), args);
  }
}

}  // namespace iris::kernels
