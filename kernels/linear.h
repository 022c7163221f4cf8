// Linear layer y = x·Wᵀ + b on a device (the CPU: oneDNN). Weights arrive as HF stores them
// ([out, in], F32/BF16/F16, host memory), are converted, reordered and placed on the device once
// at creation; the CPU caches one matmul primitive per row count M.
#pragma once

#include <cstdint>
#include <initializer_list>
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

// The residual stream's next RMSNorm, handed from the op that writes the stream (AttendAndProject,
// GatedMlp: their `next`) to the Linear that reads the norm's output (LinearInput::RmsNorm's
// `handed`), in a device's own form: the CUDA device's Hopper GEMM writes, with the stream's f32
// rows, bf16 rows of the stream times the norm's weight and partial sums of squares a row, and
// the next Hopper GEMM scales its product's rows by the norm's factor from them — no norm launch,
// no f32 pass over the stream. The stream's f32 rows are written either way, so a reader that
// does not take the hand-off normalises them as before (the values differ only in where the bf16
// rounding falls: bf16(x w) r instead of bf16(x r w)). A view for one call: the buffers' rows are
// the call's rows (device memory).
struct RmsNormHandoff {
  const float* weight = nullptr;  // the norm's weight [width] and eps
  float eps = 0.f;
  uint16_t* rows = nullptr;  // [m][ld] bf16
  int64_t ld = 0;
  float* partials = nullptr;  // [m][max_parts]
  int max_parts = 0;
  // Set by the writer: the partials a row it left (0: it made no hand-off; the reader normalises).
  int parts = 0;
};

// A Linear's input rows with an op still to apply on their way into the product: the norm before
// a projection, SiLU·mul before the down projection. A Linear may fold the op into its read of x
// (the CUDA GEMVs normalise as they load; before cuBLASLt the op writes the bf16 rows the matmul
// reads, with no f32 pass); elsewhere LinearForward runs the op first into `staging`. The
// product's result is the same either way (the folded ops compute each value as the op's kernel
// does, with the same rounding).
struct LinearInput {
  enum class Op {
    kNone,     // x: [m, in]
    kRmsNorm,  // x: [m, in], normalised as kernels::RmsNorm with norm_weight [in] and eps
    kSiluMul,  // x: [m, 2 in], gate then up in each row: silu(gate) * up (kernels::SiluMulRows)
  };
  Op op = Op::kNone;
  const float* x = nullptr;
  const float* norm_weight = nullptr;
  float eps = 0.f;
  // [m, in] f32 in the device's memory: the op's output where it runs on its own (kNone: unused).
  // Whether it is written depends on the Linear: nothing may read it afterwards.
  float* staging = nullptr;
  // kRmsNorm: the same norm of the same rows already handed on (RmsNormHandoff::parts > 0), which
  // the Linear may read instead of normalising x; null or not made: none.
  const RmsNormHandoff* handed = nullptr;

  // The three inputs, as the decoder and the vision blocks build them.
  static LinearInput Plain(const float* x) { return {.x = x}; }
  static LinearInput RmsNorm(const float* x, const float* norm_weight, float eps, float* staging,
                             const RmsNormHandoff* handed = nullptr) {
    return {.op = Op::kRmsNorm, .x = x, .norm_weight = norm_weight, .eps = eps, .staging = staging, .handed = handed};
  }
  static LinearInput SiluMul(const float* gate_up, float* staging) {
    return {.op = Op::kSiluMul, .x = gate_up, .staging = staging};
  }
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

  // Forward with `in.op` folded into the product, and true; or false, having done nothing, where
  // this Linear cannot fold it (then LinearForward runs the op on its own). The default folds
  // nothing.
  virtual bool ForwardFolded(const LinearInput& in, int64_t m, float* y, Epilogue epilogue) const;

  // Asks the device to bring up to `max_bytes` of this Linear's weight, from its start, into its
  // cache ahead of a Forward, and returns the bytes asked for. A hint: it changes no value. The
  // default (the CPU's) asks for nothing and returns 0.
  virtual int64_t PrefetchWeight(int64_t max_bytes) const;
};

// Before latency-bound work that leaves memory bandwidth idle (a decode step's attention), asks
// the device to stream the weights of the Linears that come after it into its cache, in order,
// as far as the device's budget goes (CudaDevice::weight_prefetch_bytes; 0 by default, and the
// CPU has none), for steps of at most the rows a GEMV takes (whose Linears read their weights at
// the memory's pace). Changes no value.
void PrefetchWeights(Device& device, int64_t m, std::initializer_list<const Linear*> linears);

// y = op(x)·Wᵀ + b (with the epilogue): the op folded where `linear` can, else run on `device`
// into in.staging first.
void LinearForward(Device& device, const Linear& linear, const LinearInput& in, int64_t m, float* y,
                   Epilogue epilogue = Epilogue::kNone);

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
