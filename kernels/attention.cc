// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier: AVX-512 kernels from kAvx512 on, the portable ones below).
#include "kernels/attention.h"

#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels {

void VarlenAttention(Device& device, const AttentionArgs& args) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::VarlenAttention(cpu, args);
      return cpu::portable::VarlenAttention(cpu, args);
    }
    case DeviceKind::kCuda:
      break;
  }
  NoKernelFor(device, "VarlenAttention");
}

}  // namespace iris::kernels
