// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier: AVX-512 kernels from kAvx512 on, the portable ones below).
#include "kernels/rotary.h"

#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels {

void RotaryQK(Device& device, HeadsView q, HeadsView k, int64_t rows, int head_dim, const float* cos,
              const float* sin) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::RotaryQK(cpu, q, k, rows, head_dim, cos, sin);
      return cpu::portable::RotaryQK(cpu, q, k, rows, head_dim, cos, sin);
    }
    case DeviceKind::kCuda:
      break;
  }
  NoKernelFor(device, "RotaryQK");
}

void Rotary(Device& device, HeadsView x, int64_t rows, int head_dim, const float* cos, const float* sin) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::Rotary(cpu, x, rows, head_dim, cos, sin);
      return cpu::portable::Rotary(cpu, x, rows, head_dim, cos, sin);
    }
    case DeviceKind::kCuda:
      break;
  }
  NoKernelFor(device, "Rotary");
}

}  // namespace iris::kernels
