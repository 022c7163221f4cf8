// Variable-length multi-head attention over packed sequences (cu_seqlens), flash-style: keys are
// visited in blocks with an online softmax, so memory is linear in sequence length.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/device.h"

namespace iris::kernels {

// Head h of token r is at data[r * row_stride + h * head_stride .. + head_dim).
struct AttentionInput {
  const float* data;
  int64_t row_stride;
  int64_t head_stride;
  // Instead of data (null then): bf16 values at the same offsets, the vision blocks' qkv rows
  // where the device holds them in bf16 (kernels/qkv_bf16.h). Only a device whose
  // KeepsQkvInBf16 said so takes them, for q, k and v together, with `bf16` set below.
  const uint16_t* bf16 = nullptr;
};

struct AttentionArgs {
  AttentionInput q, k, v;
  // out[r * out_row_stride + h * head_dim + d]
  float* out = nullptr;
  int64_t out_row_stride = 0;
  int num_heads = 0;
  int num_kv_heads = 0;  // grouped-query attention: q head h reads kv head h / (num_heads / num_kv_heads)
  int head_dim = 0;
  float scale = 0.f;     // usually 1/sqrt(head_dim)
  // Sequence s spans tokens [cu_seqlens[s], cu_seqlens[s+1]); tokens never attend across sequences.
  // In device memory (a copy the device holds); max_seqlen is a host integer.
  std::span<const int32_t> cu_seqlens;
  int max_seqlen = 0;
  bool causal = false;
  // Only query rows [q_begin, q_end) (absolute token rows; q_end < 0: to the end) are computed;
  // keys and values stay whole sequences. Lets a forward run attention in row pieces whose
  // results equal the one-call result row for row (the encoder's resumable forward).
  int64_t q_begin = 0;
  int64_t q_end = -1;
  // The packed tokens' count (cu_seqlens' last value) as a host integer, when the caller knows it
  // (-1: unknown): lets a device size its launches without reading cu_seqlens back.
  int64_t num_rows = -1;
  // q·kᵀ and p·v from bf16-rounded q, k, v and p (AVX512-BF16 dot products); softmax and all
  // accumulation stay f32. About 2^-9 relative error per input: for the bf16 compute mode only.
  // Ignored (f32 path) on a CPU device without AVX512-BF16.
  bool bf16 = false;
};

void VarlenAttention(Device& device, const AttentionArgs& args);

}  // namespace iris::kernels
