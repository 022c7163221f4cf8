// What cuDNN's SDPA operation (cudnn_sdpa.cc) needs around it, as device code written against
// simt.h (nvcc compiles it, sdpa_io_kernels.cu launches it; the host compiler runs the same source
// on the SIMT harness in CI, tests/simt_sdpa_io_kernels_test.cc):
//   - the step's sequence metadata from cu_seqlens, on the device (no host read, so a forward
//     stays capturable): each sequence's length and the ragged element offsets of its first row
//     in the packed q, k/v and output tensors;
//   - q, k and v gathered from the encoder's f32 rows (any row and head strides: in place in the
//     qkv projection's output) into packed bf16 [rows, heads, head_dim] tensors, rounded as
//     core::FloatToBf16 rounds (the bf16 compute mode's numerics);
//   - the packed bf16 output widened back into the op's f32 output rows.
#pragma once

#include <cstdint>

#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

// One thread per s in [0, num_seqs]: offsets[s] = cu_seqlens[s] * row elements (q and output:
// q_row; k and v: kv_row), and for s < num_seqs seq_len[s] = cu_seqlens[s + 1] - cu_seqlens[s].
IRIS_GLOBAL void SdpaMetaKernel(const int32_t* cu_seqlens, int num_seqs, int32_t q_row, int32_t kv_row,
                                int32_t* seq_len, int32_t* q_offsets, int32_t* kv_offsets) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s <= num_seqs; s += stride) {
    const int32_t begin = cu_seqlens[s];
    q_offsets[s] = begin * q_row;
    kv_offsets[s] = begin * kv_row;
    if (s < num_seqs) seq_len[s] = cu_seqlens[s + 1] - begin;
  }
}

// One f32 source tensor: head h of row r at data[r * row_stride + h * head_stride .. + head_dim).
struct SdpaSource {
  const float* data;
  int64_t row_stride;
  int64_t head_stride;
};

// out[r * heads * head_dim + h * head_dim + i] = bf16(src(r, h, i)) for r < rows, over the three
// tensors in one launch: q (q_heads) into q_out, k and v (kv_heads) into k_out and v_out. Rows
// strided over blockIdx.y, a row's (q_heads + 2 kv_heads) * head_dim columns over the x threads.
IRIS_GLOBAL void SdpaPackKernel(SdpaSource q, SdpaSource k, SdpaSource v, int64_t rows, int q_heads, int kv_heads,
                                int head_dim, uint16_t* q_out, uint16_t* k_out, uint16_t* v_out) {
  const int64_t q_cols = static_cast<int64_t>(q_heads) * head_dim, kv_cols = static_cast<int64_t>(kv_heads) * head_dim;
  const int64_t cols = q_cols + 2 * kv_cols;
  const int64_t col_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += col_stride) {
      const SdpaSource* src = &q;
      uint16_t* dst = q_out + r * q_cols;
      int64_t j = c;
      if (j >= q_cols) {
        j -= q_cols;
        src = j < kv_cols ? &k : &v;
        dst = (j < kv_cols ? k_out : v_out) + r * kv_cols;
        if (j >= kv_cols) j -= kv_cols;
      }
      const int64_t h = j / head_dim, i = j - h * head_dim;
      dst[j] = FloatToBf16(src->data[r * src->row_stride + h * src->head_stride + i]);
    }
  }
}

// out[r * out_row_stride + c] = float(o[r * cols + c]) for r < rows, c < cols (cols = heads *
// head_dim). Strided as SdpaPackKernel.
IRIS_GLOBAL void SdpaUnpackKernel(const uint16_t* o, int64_t rows, int64_t cols, float* out, int64_t out_row_stride) {
  const int64_t col_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += col_stride) {
      out[r * out_row_stride + c] = Bf16ToFloat(o[r * cols + c]);
    }
  }
}

}  // namespace iris::kernels::cuda
