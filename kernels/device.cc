#include "kernels/device.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/memory_plan.h"
#include "kernels/cpu/cpu_device.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace iris::kernels {

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("device threads must be >= 0, got ", options.threads));
  }
  if (!options.attention.empty() && options.attention != "flash" && options.attention != "cudnn") {
    return absl::InvalidArgumentError(
        absl::StrCat("attention \"", options.attention, "\" is not one of: flash, cudnn"));
  }
  if (!options.prefill_attention.empty() && options.prefill_attention != "tensor-cores" &&
      options.prefill_attention != "cuda-cores") {
    return absl::InvalidArgumentError(absl::StrCat("prefill attention \"", options.prefill_attention,
                                                   "\" is not one of: tensor-cores, cuda-cores"));
  }
  if (!options.decode_attention.empty() && options.decode_attention != "tensor-cores" &&
      options.decode_attention != "tensor-cores-every-batch" && options.decode_attention != "cuda-cores") {
    return absl::InvalidArgumentError(absl::StrCat("decode attention \"", options.decode_attention,
                                                   "\" is not one of: cuda-cores, tensor-cores, tensor-cores-every-batch"));
  }
  if (!options.decode_rotary.empty() && options.decode_rotary != "fused" && options.decode_rotary != "separate" &&
      options.decode_rotary != "gemv") {
    return absl::InvalidArgumentError(
        absl::StrCat("decode rotary \"", options.decode_rotary, "\" is not one of: separate, fused, gemv"));
  }
  if (!options.hopper_gemm.empty() && options.hopper_gemm != "off" && options.hopper_gemm != "swiglu" &&
      options.hopper_gemm != "all") {
    return absl::InvalidArgumentError(
        absl::StrCat("hopper gemm \"", options.hopper_gemm, "\" is not one of: off, swiglu, all"));
  }
  if (options.name == "cpu") {
    if (options.hopper_gemm == "swiglu" || options.hopper_gemm == "all") {
      return absl::InvalidArgumentError(absl::StrCat("hopper gemm \"", options.hopper_gemm,
                                                     "\" is for a CUDA device (sm_90); the CPU runs oneDNN's matmuls"));
    }
    if (options.decode_rotary == "fused" || options.decode_rotary == "gemv") {
      return absl::InvalidArgumentError(absl::StrCat(
          "decode rotary \"", options.decode_rotary,
          "\" is for a CUDA device; the CPU runs the projection, the rotary, the KV write and the attention in turn"));
    }
    if (options.attention == "cudnn") {
      return absl::InvalidArgumentError("attention \"cudnn\" is for a CUDA device; the CPU runs iris's own kernel");
    }
    if (options.prefill_attention == "cuda-cores") {
      return absl::InvalidArgumentError(
          "prefill attention \"cuda-cores\" is for a CUDA device; the CPU runs iris's own kernel");
    }
    if (options.decode_attention == "tensor-cores" || options.decode_attention == "tensor-cores-every-batch") {
      return absl::InvalidArgumentError(absl::StrCat("decode attention \"", options.decode_attention,
                                                     "\" is for a CUDA device; the CPU runs iris's own kernel"));
    }
    if (options.matmul_tuning) {
      return absl::InvalidArgumentError(
          "matmul tuning is for a CUDA device (cuBLASLt); the CPU's oneDNN matmuls choose their own kernels");
    }
    absl::StatusOr<cpu::CpuIsa> isa = cpu::ChooseCpuIsa(options.cpu_isa);
    if (!isa.ok()) return isa.status();
    return std::unique_ptr<Device>(new cpu::CpuDevice(options.threads, *isa));
  }
  if (options.name == "cuda" || options.name.rfind("cuda:", 0) == 0) {
#ifdef IRIS_HAVE_CUDA
    absl::StatusOr<int> ordinal = cuda::ParseCudaOrdinal(options.name);
    if (!ordinal.ok()) return ordinal.status();
    absl::StatusOr<std::unique_ptr<cuda::CudaDevice>> device = cuda::CudaDevice::Create(*ordinal);
    if (!device.ok()) return device.status();
    if (options.attention == "cudnn") {
      if (absl::Status s = (*device)->SetAttention(cuda::CudaDevice::Attention::kCudnn); !s.ok()) return s;
    }
    (*device)->SetPagedPrefillMma(options.prefill_attention != "cuda-cores");
    (*device)->SetFlashPipeline(options.flash_pipeline);
    (*device)->SetMatmulTuning(options.matmul_tuning);
    (*device)->SetFusedDecodeRotary(options.decode_rotary == "fused");
    (*device)->SetQkvGemvRotary(options.decode_rotary == "gemv");
    using HopperGemmUse = cuda::CudaDevice::HopperGemmUse;
    if (absl::Status s = (*device)->SetHopperGemm(options.hopper_gemm == "all"      ? HopperGemmUse::kAll
                                                  : options.hopper_gemm == "swiglu" ? HopperGemmUse::kSwiGlu
                                                                                    : HopperGemmUse::kOff);
        !s.ok()) {
      return s;
    }
    using DecodeAttention = cuda::CudaDevice::DecodeAttention;
    (*device)->SetDecodeAttention(options.decode_attention == "tensor-cores" ? DecodeAttention::kTensorCores
                                  : options.decode_attention == "tensor-cores-every-batch"
                                      ? DecodeAttention::kTensorCoresEveryBatch
                                      : DecodeAttention::kCudaCores);
    return std::unique_ptr<Device>(std::move(*device));
#else
    return absl::UnimplementedError("device \"" + options.name +
                                    "\": this build of iris has no CUDA backend (configure with the CUDA toolkit "
                                    "installed, or -DIRIS_CUDA=ON)");
#endif
  }
#ifdef IRIS_HAVE_CUDA
  return absl::InvalidArgumentError(absl::StrCat("device \"", options.name, "\" is not one of: cpu, cuda, cuda:N"));
#else
  return absl::InvalidArgumentError(absl::StrCat("device \"", options.name, "\" is not one of: cpu"));
#endif
}

absl::StatusOr<DeviceMemory> Device::Memory() const {
  absl::StatusOr<int64_t> available = core::AvailableMemoryBytes();
  if (!available.ok()) return available.status();
  return DeviceMemory{*available, *available};
}

absl::StatusOr<core::Tensor> HostCopy(Device& device, const core::Tensor& t) {
  if (t.device() == core::Device::kCpu) return t;
  absl::StatusOr<core::Tensor> host = device.AllocateStaging(t.dtype(), t.shape());
  if (!host.ok()) return host.status();
  device.CopyToHost(t.data<void>(), host->data<void>(), t.nbytes());
  if (absl::Status s = device.status(); !s.ok()) return s;
  return host;
}

void NoKernelFor(const Device& device, const char* op) {
  std::fprintf(stderr, "iris: %s has no implementation on %s\n", op, device.Describe().c_str());
  std::abort();
}

Device& DefaultCpuDevice() {
  static Device* device = [] {
    absl::StatusOr<std::unique_ptr<Device>> d = CreateDevice(DeviceOptions{});
    if (!d.ok()) {
      // Only a processor below the build's baseline (or a bad IRIS_CPU_ISA) gets here.
      std::fprintf(stderr, "iris: %s\n", d.status().ToString().c_str());
      std::exit(1);
    }
    return d->release();
  }();
  return *device;
}

}  // namespace iris::kernels
