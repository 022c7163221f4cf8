// The query rows one block of a varlen attention kernel owns (device code, simt.h): blockIdx.x is
// the sequence, blockIdx.y the block's slice of `rows_per_block` rows of it. Shared by the f32
// flash kernel (attention_kernels.cuh) and the tensor-core one (flash_mma.cuh).
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

struct VarlenBlockRows {
  int64_t start = 0;  // the sequence's first token row
  int n = 0;          // its length
  int row0 = 0;       // the block's first row, relative to the sequence
  int lo = 0, hi = 0; // the rows it computes, relative to the sequence: none when lo >= hi
};

// The rows asked for ([q_begin, q_end), absolute) clipped to this block's sequence, then to the block.
IRIS_DEVICE VarlenBlockRows BlockRowsOf(const FlashVarlenParams& p, int rows_per_block) {
  VarlenBlockRows b;
  const int s = static_cast<int>(blockIdx.x);
  b.start = p.cu_seqlens[s];
  b.n = p.cu_seqlens[s + 1] - p.cu_seqlens[s];
  b.row0 = static_cast<int>(blockIdx.y) * rows_per_block;
  const int64_t n = b.n, start = b.start;
  const int64_t q_end = p.q_end < 0 ? start + n : p.q_end;
  const int64_t lo = p.q_begin - start < 0 ? 0 : (p.q_begin - start > n ? n : p.q_begin - start);
  const int64_t hi = q_end - start < 0 ? 0 : (q_end - start > n ? n : q_end - start);
  b.lo = static_cast<int>(lo > b.row0 ? lo : b.row0);
  b.hi = static_cast<int>(hi < b.row0 + rows_per_block ? hi : b.row0 + rows_per_block);
  return b;
}

}  // namespace iris::kernels::cuda
