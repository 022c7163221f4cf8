// Linear layer y = x·Wᵀ + b on a device (the CPU: oneDNN). Weights arrive as HF stores them
// ([out, in], F32/BF16/F16, host memory), are converted, reordered and placed on the device once
// at creation; the CPU caches one matmul primitive per row count M.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/device.h"

namespace iris::kernels {

// f32: weights upcast to float32, f32 math (for checking against the reference).
// bf16: bf16 weights and activations, f32 accumulation and f32 output (AVX512-BF16/AMX; on the
// CPU it needs AVX-512: Linear::Create fails with FAILED_PRECONDITION below).
enum class ComputeType { kF32, kBF16 };

// What happens to the matmul result before it is stored in y.
enum class Epilogue {
  kNone,        // y = x·Wᵀ + b
  kGeluErf,     // y = gelu_erf(x·Wᵀ + b)
  kAccumulate,  // y += x·Wᵀ + b   (residual add fused into the matmul)
};

class Linear {
 public:
  // weight: [out, in]; bias: [out] or nullptr. Fails on rank/shape/dtype mismatch.
  static absl::StatusOr<std::unique_ptr<Linear>> Create(Device& device, const core::Tensor& weight,
                                                        const core::Tensor* bias,
                                                        ComputeType compute);
  virtual ~Linear() = default;

  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  virtual ComputeType compute() const = 0;

  // x: [m, in_features] row-major float32; y: [m, out_features] row-major float32, both in the
  // device's memory; runs on the device it was created on (one thread at a time).
  virtual void Forward(const float* x, int64_t m, float* y, Epilogue epilogue = Epilogue::kNone) const = 0;
};

// Measures this machine's dense matmul rate (FLOP/s) with a large oneDNN matmul of the given
// compute type (M=N=K=`size`), best of `repeats` after a warm-up. Used by benchmarks as the peak.
// 0 where the device has no matmul of that compute type.
double MeasureMatmulPeakFlops(Device& device, ComputeType compute, int64_t size = 2048, int repeats = 5);

}  // namespace iris::kernels
