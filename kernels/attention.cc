// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier: AVX-512 kernels from kAvx512 on, the portable ones below).
#include "kernels/attention.h"

#include "kernels/cpu/cpu_ops.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/cuda_device.h"
#endif

namespace iris::kernels {

void VarlenAttention(Device& device, const AttentionArgs& args) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::VarlenAttention(cpu, args);
      return cpu::portable::VarlenAttention(cpu, args);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      // iris's flash kernel, f32 products (args.bf16 asks for bf16-rounded ones: within its bound).
      cuda::FlashVarlenParams p;
      p.q = args.q.data;
      p.q_row_stride = args.q.row_stride;
      p.q_head_stride = args.q.head_stride;
      p.k = args.k.data;
      p.k_row_stride = args.k.row_stride;
      p.k_head_stride = args.k.head_stride;
      p.v = args.v.data;
      p.v_row_stride = args.v.row_stride;
      p.v_head_stride = args.v.head_stride;
      p.out = args.out;
      p.out_row_stride = args.out_row_stride;
      p.num_heads = args.num_heads;
      p.num_kv_heads = args.num_kv_heads;
      p.head_dim = args.head_dim;
      p.scale = args.scale;
      p.cu_seqlens = args.cu_seqlens.data();
      p.num_seqs = args.cu_seqlens.empty() ? 0 : static_cast<int>(args.cu_seqlens.size()) - 1;
      p.max_seqlen = args.max_seqlen;
      p.causal = args.causal;
      p.q_begin = args.q_begin;
      p.q_end = args.q_end;
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchFlashVarlen(gpu.stream(), p), "VarlenAttention");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "VarlenAttention");
}

}  // namespace iris::kernels
