// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier: AVX-512 kernels from kAvx512 on, the portable ones below).
#include "kernels/memory_bandwidth.h"

#include "kernels/cpu/cpu_ops.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_memory_bandwidth.h"
#endif

namespace iris::kernels {

double MeasureMemoryReadBandwidth(Device& device, int64_t bytes, int repeats) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::MeasureMemoryReadBandwidth(cpu, bytes, repeats);
      return cpu::portable::MeasureMemoryReadBandwidth(cpu, bytes, repeats);
    }
    case DeviceKind::kCuda:
#ifdef IRIS_HAVE_CUDA
      return cuda::MeasureMemoryReadBandwidth(cuda::AsCuda(device), bytes, repeats);
#else
      break;
#endif
  }
  return 0;
}

}  // namespace iris::kernels
