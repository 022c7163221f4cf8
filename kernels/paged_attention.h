// Attention over a paged KV cache (the decoder's): keys and values live in fixed-size blocks of a
// shared pool, each sequence names its blocks in a block table. One call serves a whole scheduler
// step: sequences in prefill (several new query rows, causal over the cached prefix and
// themselves) and sequences in decode (one new row) side by side, reading the pages in place.
#pragma once

#include <cstdint>
#include <span>

namespace iris::kernels {

// One layer's K and V pools, each [num_blocks, block_size, num_kv_heads, head_dim] float32:
// token slot s = block * block_size + offset holds k[s * num_kv_heads * head_dim + h * head_dim + d].
struct PagedKvLayer {
  float* k = nullptr;
  float* v = nullptr;
  int64_t num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// Stores `rows` tokens' k and v rows (each num_kv_heads * head_dim floats, head-major, at
// k + r * k_row_stride / v + r * v_row_stride) into the pool slots `slots[r]`
// (block * block_size + offset).
void WritePagedKv(const PagedKvLayer& layer, const float* k, int64_t k_row_stride, const float* v,
                  int64_t v_row_stride, std::span<const int64_t> slots);

// One sequence in a step. Its new tokens are query rows [q_begin, q_begin + q_len) and they are
// the last q_len tokens of its context: query row q_begin + i sits at position
// context_len - q_len + i and attends (causally) to cached tokens 0 .. that position.
// The k/v of the new tokens must already be written to the pool.
struct PagedSequence {
  std::span<const int32_t> block_table;  // block ids, ceil(context_len / block_size) at least
  int64_t context_len = 0;
  int64_t q_begin = 0;
  int64_t q_len = 0;
};

struct PagedAttentionArgs {
  // Head h of query row r: q[r * q_row_stride + h * head_dim .. + head_dim).
  const float* q = nullptr;
  int64_t q_row_stride = 0;
  // out[r * out_row_stride + h * head_dim + d].
  float* out = nullptr;
  int64_t out_row_stride = 0;
  int num_heads = 0;  // a multiple of layer.num_kv_heads (GQA: q head h reads kv head h / group)
  float scale = 0.f;
  PagedKvLayer layer;
  std::span<const PagedSequence> sequences;
  // As AttentionArgs::bf16: bf16-rounded dot products, f32 softmax and accumulation.
  bool bf16 = false;
};

void PagedAttention(const PagedAttentionArgs& args);

}  // namespace iris::kernels
