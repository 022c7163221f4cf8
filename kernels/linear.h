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
// bf16: bf16 weights and activations, f32 accumulation and f32 output (AVX512-BF16/AMX; on a
// CPU without a bf16 matmul, bf16 weights and bf16-rounded inputs on f32 arithmetic: the same
// products).
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
// bf16 on a CPU without a bf16 matmul: the f32 matmul's rate (what bf16 compute runs on there).
double MeasureMatmulPeakFlops(Device& device, ComputeType compute, int64_t size = 2048, int repeats = 5);

// Whether a Linear's output rows are bit-identical however its input rows are split between
// calls (one call of M rows, or pieces of them). oneDNN 2.6 on the CPU: yes from AVX-512 on (its
// brgemm matmuls fix the K order per kernel), no below (the AVX2 gemm picks its K blocking by M:
// rows then differ in the last bits). No on a GPU (cuBLASLt picks algorithms by shape). The
// resumable encoder and chunked prefill equal the unsplit forward bit for bit where this holds,
// and to rounding elsewhere.
bool MatmulRowsSplitInvariant(const Device& device);

}  // namespace iris::kernels
