// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier: AVX-512 kernels from kAvx512 on, the portable ones below;
// on a GPU, iris's CUDA kernels through kernels/cuda/cuda_kernels.h, launched on the device's stream).
#include "kernels/elementwise.h"

#include "kernels/cpu/cpu_ops.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace iris::kernels {

void RmsNorm(Device& device, const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::RmsNorm(cpu, x, weight, rows, dim, eps, y);
      return cpu::portable::RmsNorm(cpu, x, weight, rows, dim, eps, y);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchRmsNorm(gpu.stream(), x, weight, rows, dim, eps, y), "RmsNorm");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "RmsNorm");
}

void SiluMulRows(Device& device, const float* gu, int64_t rows, int64_t inter, float* out) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::SiluMulRows(cpu, gu, rows, inter, out);
      return cpu::portable::SiluMulRows(cpu, gu, rows, inter, out);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchSiluMulRows(gpu.stream(), gu, rows, inter, out), "SiluMulRows");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "SiluMulRows");
}

void SiluMul(Device& device, const float* gate, const float* up, int64_t n, float* out) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::SiluMul(cpu, gate, up, n, out);
      return cpu::portable::SiluMul(cpu, gate, up, n, out);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchSiluMul(gpu.stream(), gate, up, n, out), "SiluMul");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "SiluMul");
}

void GeluErf(Device& device, const float* x, int64_t n, float* y) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::GeluErf(cpu, x, n, y);
      return cpu::portable::GeluErf(cpu, x, n, y);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchGeluErf(gpu.stream(), x, n, y), "GeluErf");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "GeluErf");
}

void LayerNorm(Device& device, const float* x, const float* weight, const float* bias, int64_t rows, int64_t dim,
               float eps, float* y) {
  switch (device.kind()) {
    case DeviceKind::kCpu: return cpu::portable::LayerNorm(cpu::AsCpu(device), x, weight, bias, rows, dim, eps, y);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchLayerNorm(gpu.stream(), x, weight, bias, rows, dim, eps, y), "LayerNorm");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "LayerNorm");
}

void QuickGelu(Device& device, const float* x, int64_t n, float* y) {
  switch (device.kind()) {
    case DeviceKind::kCpu: return cpu::portable::QuickGelu(cpu::AsCpu(device), x, n, y);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchQuickGelu(gpu.stream(), x, n, y), "QuickGelu");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "QuickGelu");
}

void Add(Device& device, const float* a, const float* b, int64_t n, float* y) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::Add(cpu, a, b, n, y);
      return cpu::portable::Add(cpu, a, b, n, y);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchAdd(gpu.stream(), a, b, n, y), "Add");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "Add");
}

}  // namespace iris::kernels
