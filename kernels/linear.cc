// The dispatch point of these ops: the one place that picks each one's implementation for a device.
#include "kernels/linear.h"

#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels {

absl::StatusOr<std::unique_ptr<Linear>> Linear::Create(Device& device, const core::Tensor& weight,
                                                       const core::Tensor* bias, ComputeType compute) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::CreateLinear(cpu::AsCpu(device), weight, bias, compute);
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
