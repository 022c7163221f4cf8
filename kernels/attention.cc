// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier: AVX-512 kernels from kAvx512 on, the portable ones below).
#include "kernels/attention.h"

#include "kernels/cpu/cpu_ops.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/flash_varlen_args.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cudnn_sdpa.h"
#endif

namespace iris::kernels {

void VarlenAttention(Device& device, const AttentionArgs& args) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      if (args.q.bf16 != nullptr || args.k.bf16 != nullptr || args.v.bf16 != nullptr) break;  // no bf16 inputs here
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::VarlenAttention(cpu, args);
      return cpu::portable::VarlenAttention(cpu, args);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      // iris's flash kernels: on the tensor cores for the bf16 compute mode (bf16-rounded q, k, v and
      // p, as the CPU's bf16 path), f32 products on CUDA cores otherwise.
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      // Or cuDNN's SDPA, where the device is set to it and it takes the call (f32 inputs: the
      // qkv chain in bf16 is never on with it).
      if (gpu.attention() == cuda::CudaDevice::Attention::kCudnn && args.q.bf16 == nullptr &&
          cuda::CudnnSdpa::Takes(args)) {
        return gpu.sdpa()->Run(args);
      }
      cuda::FlashVarlenParams p = cuda::FlashVarlenParamsOf(args);
      p.pipeline = gpu.flash_pipeline();
      p.heads_per_block = gpu.flash_heads_per_block();
      return gpu.Check(args.bf16 ? cuda::LaunchFlashVarlenMma(gpu.stream(), p) : cuda::LaunchFlashVarlen(gpu.stream(), p),
                       "VarlenAttention");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "VarlenAttention");
}

}  // namespace iris::kernels
