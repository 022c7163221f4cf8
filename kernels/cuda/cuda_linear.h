// The CUDA Linear: cuBLASLt GEMMs (bf16 x bf16 or f32 x f32, f32 accumulation and output) on the
// device's stream, with the bias and the residual add fused into the matmul and an erf GELU of
// iris's own after it; and the GEMM rate measured the same way (kernels/linear.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/linear_kernels.h"
#include "kernels/attention.h"
#include "kernels/linear.h"
#include "kernels/qkv_bf16.h"

namespace iris::kernels::cuda {

// weight: [out, in] F32/BF16/F16 and bias: [out] (or null), host memory, as HF stores them:
// converted on the host once (bf16 for kBF16, f32 for kF32) and uploaded. INVALID_ARGUMENT on a
// rank/shape/dtype mismatch, RESOURCE_EXHAUSTED when the GPU has no room for them.
absl::StatusOr<std::unique_ptr<Linear>> CreateLinear(CudaDevice& dev, const core::Tensor& weight,
                                                     const core::Tensor* bias, ComputeType compute);

// kernels::GatedMlp's bf16 hand-off: y += down(silu(gate) * up) with gate_up's output written by
// cuBLASLt as bf16 rows (row stride: 2 * inter rounded up to 8) into gate_up_out's bytes, the
// SiLU·mul reading them and writing down's bf16 input rows, and down accumulating into y. True
// when it took the call (any error is the device's); false, with nothing enqueued, where it does
// not apply: the hand-off or input folding switched off, f32 compute, rows a GEMV takes, an input
// op other than none or RMSNorm, Linears not of this device. Where cuBLASLt has no bf16-output
// kernel for a shape, gate_up writes f32 rows there instead (the two-Linear path's values).
// A handed-on RMSNorm in `in` (LinearInput::handed) is read by the fused gate_up where the
// Hopper GEMM runs it; `next` is handed on by down where the Hopper GEMM runs it
// (CudaDevice::rms_norm_handoff).
bool GatedMlpBf16Handoff(CudaDevice& dev, const Linear& gate_up, const Linear& down, const LinearInput& in, int64_t m,
                         float* gate_up_out, float* y, RmsNormHandoff* next = nullptr);

// kernels::AttendAndProject's bf16 hand-off: iris's tensor-core flash kernel writes the query
// rows' attention output as proj's bf16 input rows (no f32 output, no conversion launch), and
// proj accumulates into y. True when it took the call; false, with nothing enqueued, where it
// does not apply: the hand-off switched off, f32 attention, cuDNN's attention chosen, rows a GEMV
// takes, a head layout other than proj's input row, a proj not of this device or not bf16.
// `next` is handed on by proj where the Hopper GEMM runs it.
bool AttendAndProjectBf16Handoff(CudaDevice& dev, const AttentionArgs& args, const Linear& proj, float* y,
                                 RmsNormHandoff* next = nullptr);

// kernels::ProjectQkvRotaryWriteKv on this device: y = qkv(in) for m rows (the decoder's qkv
// Linear: q heads, then k heads, then v heads) with rot's rotary and KV write done by the GEMV as its
// epilogue (LaunchGemvBf16RotaryKv). True when it took the call (any error is the device's);
// false, with nothing enqueued, where it does not apply: the device not set to it
// (CudaDevice::qkv_gemv_rotary), rows no CUDA-core GEMV takes, f32 compute, an input op other than
// none or a folded RMSNorm, a layout GemvRotaryKvTakes refuses, a Linear not of this device.
bool QkvGemvRotaryKv(CudaDevice& dev, const Linear& qkv, const LinearInput& in, int64_t m, float* y,
                     const GemvRotaryKv& rot);

// kernels/qkv_bf16.h on this device: q, k, v held in bf16 where the hand-off and input folding are
// on, the attention is bf16 on iris's flash kernel (not cuDNN), and qkv is a bf16 Linear of this
// device.
bool KeepsQkvInBf16(CudaDevice& dev, const Linear& qkv, bool bf16_attention);

// kernels::LinearForwardToBf16: cuBLASLt writes the bf16 rows (a bf16 D, the bias in bf16) after
// the folded op writes its bf16 input rows. Rows a GEMV takes, and shapes cuBLASLt has no
// bf16-output kernel for, get the f32 result in the activation scratch, rounded by a conversion
// launch (the same values as a bf16 D up to the sum's order). A Linear not of this device or not
// bf16, or ldy < out_features, is the device's error (INVALID_ARGUMENT).
void LinearForwardToBf16(CudaDevice& dev, const Linear& linear, const LinearInput& in, int64_t m, uint16_t* y,
                         int64_t ldy);

// kernels::LinearForwardToBf16Rotary in one launch: the Hopper GEMM with the rotary in its
// epilogue, where the device runs every matmul on it (HopperGemmUse::kAll) and it takes the call
// (rows, head_dim kHopperRotaryHeadDim, 2 * heads heads inside the output), reading a handed-on
// RMSNorm in `in` where there is one (LinearInput::handed). False, with nothing
// enqueued, otherwise (the caller runs the two ops); true with the device's error for a Linear
// not of this device or not bf16, or ldy < out_features.
bool LinearForwardToBf16Rotary(CudaDevice& dev, const Linear& linear, const LinearInput& in, int64_t m, uint16_t* y,
                               int64_t ldy, const QkvRotary& rotary);

// FLOP/s of a size x size x size cuBLASLt GEMM in the compute type (bf16 inputs or f32, f32
// accumulation), best of `repeats` timed with CUDA events after a warm-up; 0 when it cannot run.
double MeasureMatmulPeakFlops(CudaDevice& dev, ComputeType compute, int64_t size, int repeats);

// The matmuls the device has tuned (CudaDevice::SetMatmulTuning), as a markdown table: shape,
// row bucket, the candidate kept (cuBLASLt's algo, tile, stages and split-K ids) and its time
// against the heuristic's first pick, measured in the same tuning run. Empty where none.
std::string TunedMatmulTable(const CudaDevice& dev);

}  // namespace iris::kernels::cuda
