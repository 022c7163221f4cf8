// The op's arguments (kernels/paged_attention.h) as the tensor-core prefill kernel takes them
// (kernels/cuda/paged_flash_mma.cuh): one mapping for the dispatch point and the SIMT tests. Host
// code only (C++20: nvcc never includes it).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/paged_attention.h"

namespace iris::kernels::cuda {

// The sequences from args.metadata.prefill_seq_begin on, every row of them, over bf16 pages (the
// prefill kernel), and the rows before them (the decode kernel).
inline PagedPrefillParams PagedPrefillParamsOf(const PagedAttentionArgs& args) {
  const PagedKvLayer& L = args.layer;
  const PagedMetadata& md = args.metadata;
  PagedPrefillParams p;
  p.q = args.q;
  p.q_row_stride = args.q_row_stride;
  p.out = args.out;
  p.out_row_stride = args.out_row_stride;
  p.num_heads = args.num_heads;
  p.num_kv_heads = L.num_kv_heads;
  p.head_dim = L.head_dim;
  p.scale = args.scale;
  p.k_pool = static_cast<const uint16_t*>(L.k);
  p.v_pool = static_cast<const uint16_t*>(L.v);
  p.block_size = L.block_size;
  p.query_start = md.query_start.data();
  p.context_lens = md.context_lens.data();
  p.block_tables = md.block_tables.data();
  p.max_blocks_per_seq = md.max_blocks_per_seq;
  p.seq_begin = std::max(md.prefill_seq_begin, 0);
  p.seq_end = md.num_seqs;
  p.max_query_len = md.max_query_len;
  // The decode rows: those before the first prefill sequence (the engine's order puts them first).
  p.decode_row_begin = md.row_begin;
  p.decode_row_end = std::clamp(md.prefill_row_begin, md.row_begin, md.row_end);
  p.num_seqs = md.num_seqs;
  return p;
}

}  // namespace iris::kernels::cuda
