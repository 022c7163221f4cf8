// The CPU implementations behind the op API (kernels/*.h). Only the dispatch points
// (kernels/*.cc) call these, choosing by the device's tier (CpuDevice::isa()): avx512:: from
// kAvx512 on, portable:: below. The arguments mean what the op headers say.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/linear.h"
#include "kernels/packed_logit_edits.h"
#include "kernels/paged_attention.h"
#include "kernels/patch_rows.h"
#include "kernels/rotary.h"
#include "kernels/row_draw.h"

namespace iris::kernels::cpu {

// Converts n floats to bf16 (round to nearest even): Linear's bf16 inputs, one row at a time.
using RowToBf16Fn = void (*)(const float* x, int64_t n, uint16_t* y);

// oneDNN matmul (any ISA: oneDNN dispatches itself); to_bf16 rounds the inputs of bf16 compute.
absl::StatusOr<std::unique_ptr<Linear>> CreateLinear(CpuDevice& dev, const core::Tensor& weight,
                                                     const core::Tensor* bias, ComputeType compute,
                                                     RowToBf16Fn to_bf16);
double MeasureMatmulPeakFlops(CpuDevice& dev, ComputeType compute, int64_t size, int repeats);
// bf16 compute where oneDNN has no bf16 matmul: bf16 weights, read directly for a few rows and
// widened in panels for oneDNN's f32 matmul otherwise (bf16_weight_linear.cc). Arguments checked.
absl::StatusOr<std::unique_ptr<Linear>> CreateBf16WeightLinear(CpuDevice& dev, const core::Tensor& weight,
                                                               const core::Tensor* bias, RowToBf16Fn to_bf16);
// Whether oneDNN has a bf16 matmul on this processor (2.6: from AVX-512 on); asked once.
bool HasBf16Matmul();
// Whether oneDNN's matmuls run on its brgemm kernels here (its effective ISA is AVX-512 or newer).
bool OneDnnUsesBrgemm();

// Plain C++, any ISA: row copies (the paged KV cache's writes among them) and the embedding lookup.
void GatherRows(CpuDevice& dev, const float* src, int64_t width, std::span<const int32_t> index, float* dst);
void ArgmaxRows(CpuDevice& dev, const float* logits, int64_t rows, int64_t vocab, int32_t* out);
// kernels::EditLogitRows (kernels/logit_edits.h) on host memory.
void EditLogitRows(float* logits, int64_t rows, int64_t vocab, const PackedLogitEdits& edits);
// kernels::SampleRows (kernels/sample_rows.h) on host memory: the draw's definition written out
// plainly (a sort for top-p), the reference a device's kernel is checked against.
void SampleRows(CpuDevice& dev, float* logits, int64_t rows, int64_t vocab, const RowDraw* draws, int32_t* out);
void ScatterRows(CpuDevice& dev, const float* src, int64_t width, std::span<const int32_t> index, float* dst);
// kernels::PatchRows (kernels/patch_rows.h) on host memory.
void PatchRows(CpuDevice& dev, const uint8_t* rgb, const PatchGrid& grid, const float* table, int64_t row_begin,
               int64_t row_end, float* out);
void EmbeddingLookup(CpuDevice& dev, const core::Tensor& table, std::span<const int32_t> ids, float* out);
void UnpadHeads(CpuDevice& dev, const float* padded, int64_t rows, int num_heads, int head_dim, int padded_dim,
                float* out);
void WritePagedKv(CpuDevice& dev, const PagedKvLayer& layer, const float* k, int64_t k_row_stride, const float* v,
                  int64_t v_row_stride, std::span<const int64_t> slot_mapping);

}  // namespace iris::kernels::cpu

// Hand-written AVX-512 kernels (kernels/cpu/*.cc, compiled for AVX-512 in isa_region.h regions):
// for tier kAvx512 and up.
namespace iris::kernels::cpu::avx512 {

void RmsNorm(CpuDevice& dev, const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y);
void SiluMulRows(CpuDevice& dev, const float* gu, int64_t rows, int64_t inter, float* out);
void SiluMul(CpuDevice& dev, const float* gate, const float* up, int64_t n, float* out);
void GeluErf(CpuDevice& dev, const float* x, int64_t n, float* y);
void Add(CpuDevice& dev, const float* a, const float* b, int64_t n, float* y);

void RotaryQK(CpuDevice& dev, HeadsView q, HeadsView k, int64_t rows, int head_dim, const float* cos,
              const float* sin);
void Rotary(CpuDevice& dev, HeadsView x, int64_t rows, int head_dim, const float* cos, const float* sin);

void PadQkv(CpuDevice& dev, const float* qkv, int64_t rows, int num_heads, int head_dim, int padded_dim, float* q,
            float* k, float* v);
void PadOneOfQkv(CpuDevice& dev, const float* qkv, int64_t rows, int num_heads, int head_dim, int padded_dim,
                 int which, float* out);

void VarlenAttention(CpuDevice& dev, const AttentionArgs& args);
void PagedAttention(CpuDevice& dev, const PagedAttentionArgs& args);

double MeasureMemoryReadBandwidth(CpuDevice& dev, int64_t bytes, int repeats);

// Software rounding; the Native one is AVX512-BF16's (tier kAvx512Bf16 only; the same result except
// that it flushes denormals to zero).
void RowToBf16(const float* x, int64_t n, uint16_t* y);
void RowToBf16Native(const float* x, int64_t n, uint16_t* y);

}  // namespace iris::kernels::cpu::avx512

// The same ops in plain C++ that the compiler vectorises for the build's baseline
// (kernels/cpu/portable/*.cc): tier kAvx2.
namespace iris::kernels::cpu::portable {

void RmsNorm(CpuDevice& dev, const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y);
// Qwen2-VL's tower only (LayerNorm with bias, QuickGELU): every tier runs these portable ones.
void LayerNorm(CpuDevice& dev, const float* x, const float* weight, const float* bias, int64_t rows, int64_t dim,
               float eps, float* y);
void QuickGelu(CpuDevice& dev, const float* x, int64_t n, float* y);
void SiluMulRows(CpuDevice& dev, const float* gu, int64_t rows, int64_t inter, float* out);
void SiluMul(CpuDevice& dev, const float* gate, const float* up, int64_t n, float* out);
void GeluErf(CpuDevice& dev, const float* x, int64_t n, float* y);
void Add(CpuDevice& dev, const float* a, const float* b, int64_t n, float* y);

void RotaryQK(CpuDevice& dev, HeadsView q, HeadsView k, int64_t rows, int head_dim, const float* cos,
              const float* sin);
void Rotary(CpuDevice& dev, HeadsView x, int64_t rows, int head_dim, const float* cos, const float* sin);

void PadQkv(CpuDevice& dev, const float* qkv, int64_t rows, int num_heads, int head_dim, int padded_dim, float* q,
            float* k, float* v);
void PadOneOfQkv(CpuDevice& dev, const float* qkv, int64_t rows, int num_heads, int head_dim, int padded_dim,
                 int which, float* out);

// f32 only: the bf16 flag is ignored.
void VarlenAttention(CpuDevice& dev, const AttentionArgs& args);
void PagedAttention(CpuDevice& dev, const PagedAttentionArgs& args);

double MeasureMemoryReadBandwidth(CpuDevice& dev, int64_t bytes, int repeats);

void RowToBf16(const float* x, int64_t n, uint16_t* y);

}  // namespace iris::kernels::cpu::portable
