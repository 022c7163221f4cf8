// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier: AVX-512 kernels from kAvx512 on, the portable ones below;
// on a GPU, iris's CUDA kernels through kernels/cuda/cuda_kernels.h, launched on the device's stream).
#include "kernels/qkv_pad.h"

#include "kernels/cpu/cpu_ops.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace iris::kernels {

void PadQkv(Device& device, const float* qkv, int64_t rows, int num_heads, int head_dim, int padded_dim,
            float* q, float* k, float* v) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::PadQkv(cpu, qkv, rows, num_heads, head_dim,
          padded_dim, q, k, v);
      return cpu::portable::PadQkv(cpu, qkv, rows, num_heads, head_dim, padded_dim, q, k, v);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchPadQkv(gpu.stream(), qkv, rows, num_heads, head_dim, padded_dim, q, k, v), "PadQkv");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "PadQkv");
}

void PadOneOfQkv(Device& device, const float* qkv, int64_t rows, int num_heads, int head_dim, int padded_dim,
                 int which, float* out) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::PadOneOfQkv(cpu, qkv, rows, num_heads, head_dim,
          padded_dim, which, out);
      return cpu::portable::PadOneOfQkv(cpu, qkv, rows, num_heads, head_dim, padded_dim, which, out);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(
          cuda::LaunchPadOneOfQkv(gpu.stream(), qkv, rows, num_heads, head_dim, padded_dim, which, out),
          "PadOneOfQkv");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "PadOneOfQkv");
}

void UnpadHeads(Device& device, const float* padded, int64_t rows, int num_heads, int head_dim,
                int padded_dim, float* out) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::UnpadHeads(cpu::AsCpu(device), padded, rows, num_heads, head_dim, padded_dim, out);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchUnpadHeads(gpu.stream(), padded, rows, num_heads, head_dim, padded_dim, out),
                       "UnpadHeads");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "UnpadHeads");
}

}  // namespace iris::kernels
