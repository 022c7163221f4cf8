#include "kernels/cpu/paged_sequences.h"

#include <cstdio>
#include <cstdlib>

namespace iris::kernels::cpu {
namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "iris PagedAttention: %s\n", what);
  std::abort();
}

}  // namespace

void CheckPagedAttentionArgs(const PagedAttentionArgs& a) {
  const PagedKvLayer& L = a.layer;
  const PagedMetadata& md = a.metadata;
  if (static_cast<int64_t>(md.query_start.size()) < md.num_seqs + 1 ||
      static_cast<int64_t>(md.context_lens.size()) < md.num_seqs || md.max_blocks_per_seq < 0 ||
      static_cast<int64_t>(md.block_tables.size()) < int64_t{md.num_seqs} * md.max_blocks_per_seq) {
    Fail("metadata arrays shorter than num_seqs");
  }
  if (L.num_kv_heads <= 0 || a.num_heads <= 0 || a.num_heads % L.num_kv_heads != 0) {
    std::fprintf(stderr, "iris PagedAttention: num_heads %d is not a positive multiple of num_kv_heads %d\n",
                 a.num_heads, L.num_kv_heads);
    std::abort();
  }
  if (L.head_dim <= 0 || L.head_dim > kPagedMaxHeadDim) Fail("head_dim must be in 1..256");
  if (L.block_size <= 0) Fail("block_size must be positive");
  if (L.k == nullptr || L.v == nullptr || a.q == nullptr || a.out == nullptr) Fail("null pointer");
  if (L.dtype != core::DType::kF32 && L.dtype != core::DType::kBF16) Fail("the pools' dtype must be f32 or bf16");
}

void CheckWritableKvLayer(const PagedKvLayer& layer) {
  if (layer.k == nullptr || layer.v == nullptr || layer.block_size <= 0 || layer.num_kv_heads <= 0 ||
      layer.head_dim <= 0 || (layer.dtype != core::DType::kF32 && layer.dtype != core::DType::kBF16)) {
    std::fprintf(stderr, "iris WritePagedKv: bad layer\n");
    std::abort();
  }
}

std::vector<PagedSequence> CheckedPagedSequences(const PagedAttentionArgs& a) {
  const PagedKvLayer& L = a.layer;
  const PagedMetadata& md = a.metadata;
  if (md.num_seqs <= 0) return {};
  CheckPagedAttentionArgs(a);
  std::vector<PagedSequence> seqs(md.num_seqs);
  for (int si = 0; si < md.num_seqs; ++si) {
    PagedSequence& s = seqs[si];
    s.block_table = md.block_tables.subspan(static_cast<size_t>(si) * md.max_blocks_per_seq, md.max_blocks_per_seq);
    s.context_len = md.context_lens[si];
    s.q_begin = md.query_start[si];
    s.q_len = md.query_start[si + 1] - md.query_start[si];
  }
  for (const PagedSequence& s : seqs) {
    if (s.q_len < 0 || s.q_len > s.context_len || s.q_begin < 0) Fail("bad sequence: need 0 <= q_len <= context_len");
    if (s.q_len == 0) continue;
    const int64_t nblocks = (s.context_len + L.block_size - 1) / L.block_size;
    if (static_cast<int64_t>(s.block_table.size()) < nblocks) Fail("block table shorter than the context");
    for (int64_t b = 0; b < nblocks; ++b) {
      if (s.block_table[b] < 0 || s.block_table[b] >= L.num_blocks) Fail("block id out of range");
    }
  }
  return seqs;
}

}  // namespace iris::kernels::cpu
