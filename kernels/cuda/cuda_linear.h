// The CUDA Linear: cuBLASLt GEMMs (bf16 x bf16 or f32 x f32, f32 accumulation and output) on the
// device's stream, with the bias and the residual add fused into the matmul and an erf GELU of
// iris's own after it; and the GEMM rate measured the same way (kernels/linear.h).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/linear.h"

namespace iris::kernels::cuda {

// weight: [out, in] F32/BF16/F16 and bias: [out] (or null), host memory, as HF stores them:
// converted on the host once (bf16 for kBF16, f32 for kF32) and uploaded. INVALID_ARGUMENT on a
// rank/shape/dtype mismatch, RESOURCE_EXHAUSTED when the GPU has no room for them.
absl::StatusOr<std::unique_ptr<Linear>> CreateLinear(CudaDevice& dev, const core::Tensor& weight,
                                                     const core::Tensor* bias, ComputeType compute);

// FLOP/s of a size x size x size cuBLASLt GEMM in the compute type (bf16 inputs or f32, f32
// accumulation), best of `repeats` timed with CUDA events after a warm-up; 0 when it cannot run.
double MeasureMatmulPeakFlops(CudaDevice& dev, ComputeType compute, int64_t size, int repeats);

}  // namespace iris::kernels::cuda
