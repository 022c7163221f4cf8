// The dispatch point of these ops: the one place that picks each one's implementation for a device.
#include "kernels/rows.h"

#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels {

void GatherRows(Device& device, const float* src, int64_t width, std::span<const int32_t> index, float* dst) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::GatherRows(cpu::AsCpu(device), src, width, index, dst);
    case DeviceKind::kCuda:
      break;
  }
  NoKernelFor(device, "GatherRows");
}

void ScatterRows(Device& device, const float* src, int64_t width, std::span<const int32_t> index, float* dst) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::ScatterRows(cpu::AsCpu(device), src, width, index, dst);
    case DeviceKind::kCuda:
      break;
  }
  NoKernelFor(device, "ScatterRows");
}

void EmbeddingLookup(Device& device, const core::Tensor& table, std::span<const int32_t> ids, float* out) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::EmbeddingLookup(cpu::AsCpu(device), table, ids, out);
    case DeviceKind::kCuda:
      break;
  }
  NoKernelFor(device, "EmbeddingLookup");
}

}  // namespace iris::kernels
