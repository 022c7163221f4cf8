// A paged-attention step's sequences, read from the flat metadata and checked once, for both
// tiers' PagedAttention (plain C++, any ISA); and the paged ops' checks that read no device
// memory, which the GPU's dispatch makes too.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/paged_attention.h"

namespace iris::kernels::cpu {

struct PagedSequence {
  std::span<const int32_t> block_table;
  int64_t context_len = 0;
  int64_t q_begin = 0;
  int64_t q_len = 0;
};

constexpr int kPagedMaxHeadDim = 256;

// The step's sequences (none when metadata.num_seqs <= 0). Aborts, naming the problem, on
// metadata arrays shorter than num_seqs, heads that are not a multiple of the kv heads, a
// head_dim outside 1..256, null pointers, q_len outside 0..context_len, or a block table that is
// short or names a block outside the pool (checked for sequences with queries).
std::vector<PagedSequence> CheckedPagedSequences(const PagedAttentionArgs& a);

// The part of those checks that reads no metadata values (the arrays' sizes, the heads, head_dim,
// block size, pointers, dtype): all a GPU can check without reading its memory back. For
// metadata.num_seqs > 0; aborts with the same messages.
void CheckPagedAttentionArgs(const PagedAttentionArgs& a);

// WritePagedKv's checks of the layer (pools, sizes, dtype f32 or bf16): aborts on a bad one.
void CheckWritableKvLayer(const PagedKvLayer& layer);

}  // namespace iris::kernels::cpu
