// The dispatch point of these ops: the one place that picks each one's implementation for a device.
#include "kernels/elementwise.h"

#include "kernels/cpu/cpu_ops.h"

namespace iris::kernels {

void RmsNorm(Device& device, const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::avx512::RmsNorm(cpu::AsCpu(device), x, weight, rows, dim, eps, y);
  }
}

void SiluMulRows(Device& device, const float* gu, int64_t rows, int64_t inter, float* out) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::avx512::SiluMulRows(cpu::AsCpu(device), gu, rows, inter, out);
  }
}

void SiluMul(Device& device, const float* gate, const float* up, int64_t n, float* out) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::avx512::SiluMul(cpu::AsCpu(device), gate, up, n, out);
  }
}

void GeluErf(Device& device, const float* x, int64_t n, float* y) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::avx512::GeluErf(cpu::AsCpu(device), x, n, y);
  }
}

void Add(Device& device, const float* a, const float* b, int64_t n, float* y) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::avx512::Add(cpu::AsCpu(device), a, b, n, y);
  }
}

}  // namespace iris::kernels
