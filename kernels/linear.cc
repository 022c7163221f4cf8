// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier).
#include "kernels/linear.h"

#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels {

absl::StatusOr<std::unique_ptr<Linear>> Linear::Create(Device& device, const core::Tensor& weight,
                                                       const core::Tensor* bias, ComputeType compute) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      // The matmul is oneDNN's (it picks its own ISA); iris rounds bf16 inputs itself.
      const cpu::RowToBf16Fn to_bf16 = cpu.native_bf16()                ? cpu::avx512::RowToBf16Native
                                       : cpu.isa() >= cpu::CpuIsa::kAvx512 ? cpu::avx512::RowToBf16
                                                                           : cpu::portable::RowToBf16;
      return cpu::CreateLinear(cpu, weight, bias, compute, to_bf16);
    }
  }
  return absl::UnimplementedError("Linear: no implementation for this device");
}

double MeasureMatmulPeakFlops(Device& device, ComputeType compute, int64_t size, int repeats) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::MeasureMatmulPeakFlops(cpu::AsCpu(device), compute, size, repeats);
  }
  return 0;
}

}  // namespace iris::kernels
