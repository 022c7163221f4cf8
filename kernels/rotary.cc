// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier: AVX-512 kernels from kAvx512 on, the portable ones below;
// on a GPU, iris's CUDA kernels through kernels/cuda/cuda_kernels.h, launched on the device's stream).
#include "kernels/rotary.h"

#include "kernels/cpu/cpu_ops.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace iris::kernels {

void RotaryQK(Device& device, HeadsView q, HeadsView k, int64_t rows, int head_dim, const float* cos,
              const float* sin) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      if (q.bf16 != nullptr || k.bf16 != nullptr) break;  // no bf16 rows here
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::RotaryQK(cpu, q, k, rows, head_dim, cos, sin);
      return cpu::portable::RotaryQK(cpu, q, k, rows, head_dim, cos, sin);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      if ((q.bf16 != nullptr) != (k.bf16 != nullptr)) break;  // q and k in one form
      if (q.bf16 != nullptr) {
        return gpu.Check(cuda::LaunchRotaryQKBf16(gpu.stream(), q.bf16, q.row_stride, q.num_heads, k.bf16,
                                                  k.row_stride, k.num_heads, rows, head_dim, cos, sin),
                         "RotaryQK (bf16 rows)");
      }
      return gpu.Check(cuda::LaunchRotaryQK(gpu.stream(), q.data, q.row_stride, q.num_heads, k.data, k.row_stride,
                                            k.num_heads, rows, head_dim, cos, sin),
                       "RotaryQK");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "RotaryQK");
}

void Rotary(Device& device, HeadsView x, int64_t rows, int head_dim, const float* cos, const float* sin) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      if (x.bf16 != nullptr) break;  // no bf16 rows here
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::Rotary(cpu, x, rows, head_dim, cos, sin);
      return cpu::portable::Rotary(cpu, x, rows, head_dim, cos, sin);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      if (x.bf16 != nullptr) {
        return gpu.Check(cuda::LaunchRotaryQKBf16(gpu.stream(), x.bf16, x.row_stride, x.num_heads, nullptr, 0, 0, rows,
                                                  head_dim, cos, sin),
                         "Rotary (bf16 rows)");
      }
      return gpu.Check(cuda::LaunchRotary(gpu.stream(), x.data, x.row_stride, x.num_heads, rows, head_dim, cos, sin),
                       "Rotary");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "Rotary");
}

}  // namespace iris::kernels
