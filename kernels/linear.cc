// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier).
#include "kernels/linear.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/elementwise.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_linear.h"
#endif

namespace iris::kernels {

absl::StatusOr<std::unique_ptr<Linear>> Linear::Create(Device& device, const core::Tensor& weight,
                                                       const core::Tensor* bias, ComputeType compute) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      // The matmul is oneDNN's (it picks its own ISA); iris rounds bf16 inputs itself.
      const cpu::RowToBf16Fn to_bf16 = cpu.native_bf16()                ? cpu::avx512::RowToBf16Native
                                       : cpu.isa() >= cpu::CpuIsa::kAvx512 ? cpu::avx512::RowToBf16
                                                                           : cpu::portable::RowToBf16;
      return cpu::CreateLinear(cpu, weight, bias, compute, to_bf16);
    }
    case DeviceKind::kCuda:
#ifdef IRIS_HAVE_CUDA
      // cuBLASLt GEMMs (bf16 or f32 inputs, f32 accumulation), bias and residual add fused.
      return cuda::CreateLinear(cuda::AsCuda(device), weight, bias, compute);
#else
      break;
#endif
  }
  return absl::UnimplementedError(absl::StrCat("Linear: no implementation on ", device.Describe()));
}

bool Linear::ForwardFolded(const LinearInput&, int64_t, float*, Epilogue) const { return false; }

int64_t Linear::PrefetchWeight(int64_t) const { return 0; }

void PrefetchWeights(Device& device, int64_t m, std::initializer_list<const Linear*> linears) {
#ifdef IRIS_HAVE_CUDA
  if (device.kind() != DeviceKind::kCuda) return;
  const cuda::CudaDevice& gpu = cuda::AsCuda(device);
  int64_t budget = gpu.weight_prefetch_bytes();
  if (budget <= 0 || m < 1 || m > gpu.gemv_max_rows()) return;
  for (const Linear* linear : linears) {
    if (budget <= 0) break;
    budget -= linear->PrefetchWeight(budget);
  }
#else
  (void)device, (void)m, (void)linears;
#endif
}

void LinearForward(Device& device, const Linear& linear, const LinearInput& in, int64_t m, float* y,
                   Epilogue epilogue) {
  if (in.op == LinearInput::Op::kNone) {
    linear.Forward(in.x, m, y, epilogue);
    return;
  }
  if (linear.ForwardFolded(in, m, y, epilogue)) return;
  const int64_t k = linear.in_features();
  if (in.op == LinearInput::Op::kRmsNorm) {
    RmsNorm(device, in.x, in.norm_weight, m, k, in.eps, in.staging);
  } else {
    SiluMulRows(device, in.x, m, k, in.staging);
  }
  linear.Forward(in.staging, m, y, epilogue);
}

bool MatmulRowsSplitInvariant(const Device& device) {
  return device.kind() == DeviceKind::kCpu && cpu::OneDnnUsesBrgemm();
}

double MeasureMatmulPeakFlops(Device& device, ComputeType compute, int64_t size, int repeats) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::MeasureMatmulPeakFlops(cpu::AsCpu(device), compute, size, repeats);
    case DeviceKind::kCuda:
#ifdef IRIS_HAVE_CUDA
      return cuda::MeasureMatmulPeakFlops(cuda::AsCuda(device), compute, size, repeats);
#else
      break;
#endif
  }
  return 0;
}

}  // namespace iris::kernels
