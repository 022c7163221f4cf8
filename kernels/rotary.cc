// The dispatch point of these ops: the one place that picks each one's implementation for a device.
#include "kernels/rotary.h"

#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels {

void RotaryQK(Device& device, HeadsView q, HeadsView k, int64_t rows, int head_dim, const float* cos,
              const float* sin) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::avx512::RotaryQK(cpu::AsCpu(device), q, k, rows, head_dim, cos, sin);
  }
}

void Rotary(Device& device, HeadsView x, int64_t rows, int head_dim, const float* cos, const float* sin) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::avx512::Rotary(cpu::AsCpu(device), x, rows, head_dim, cos, sin);
  }
}

}  // namespace iris::kernels
