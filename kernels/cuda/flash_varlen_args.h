// The op's arguments (kernels/attention.h) as iris's flash kernel takes them: one mapping for the
// dispatch point and the SIMT tests. Host code only (C++20: nvcc never includes it).
#pragma once

#include "kernels/attention.h"
#include "kernels/cuda/attention_kernels.h"

namespace iris::kernels::cuda {

inline FlashVarlenParams FlashVarlenParamsOf(const AttentionArgs& args) {
  FlashVarlenParams p;
  p.q = args.q.data;
  p.q_row_stride = args.q.row_stride;
  p.q_head_stride = args.q.head_stride;
  p.k = args.k.data;
  p.k_row_stride = args.k.row_stride;
  p.k_head_stride = args.k.head_stride;
  p.v = args.v.data;
  p.v_row_stride = args.v.row_stride;
  p.v_head_stride = args.v.head_stride;
  p.q_bf16 = args.q.bf16;
  p.k_bf16 = args.k.bf16;
  p.v_bf16 = args.v.bf16;
  p.out = args.out;
  p.out_row_stride = args.out_row_stride;
  p.num_heads = args.num_heads;
  p.num_kv_heads = args.num_kv_heads;
  p.head_dim = args.head_dim;
  p.scale = args.scale;
  p.cu_seqlens = args.cu_seqlens.data();
  p.num_seqs = args.cu_seqlens.empty() ? 0 : static_cast<int>(args.cu_seqlens.size()) - 1;
  p.max_seqlen = args.max_seqlen;
  p.causal = args.causal;
  p.q_begin = args.q_begin;
  p.q_end = args.q_end;
  return p;
}

}  // namespace iris::kernels::cuda
