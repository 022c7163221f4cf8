// nvcc's side of kernels.cuh: the launch configurations.
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_runtime.h>

#include "kernels/cuda/kernels.cuh"

namespace iris::kernels::cuda {
namespace {

int LastError() { return static_cast<int>(cudaGetLastError()); }

int BlockFor(int64_t work) { return work >= 256 ? 256 : work > 64 ? 128 : 64; }

}  // namespace

int LaunchRmsNorm(CUstream_st* stream, const float* x, const float* weight, int64_t rows, int dim, float eps,
                  float* y) {
  if (rows == 0) return 0;
  RmsNormKernel<<<static_cast<unsigned>(rows), BlockFor(dim), 0, stream>>>(x, weight, dim, eps, y);
  return LastError();
}

int LaunchSiluMulRows(CUstream_st* stream, const float* gu, int64_t rows, int64_t inter, float* out) {
  const int64_t n = rows * inter;
  if (n == 0) return 0;
  const int64_t blocks = (n + 255) / 256;
  SiluMulRowsKernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(gu, rows, inter, out);
  return LastError();
}

int LaunchRotaryQK(CUstream_st* stream, float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride,
                   int k_heads, int64_t rows, int head_dim, const float* cos, const float* sin) {
  if (rows == 0) return 0;
  RotaryQKKernel<<<static_cast<unsigned>(rows), BlockFor(int64_t{q_heads + k_heads} * head_dim / 2), 0, stream>>>(
      q, q_stride, q_heads, k, k_stride, k_heads, head_dim, cos, sin);
  return LastError();
}

int LaunchPadQkv(CUstream_st* stream, const float* qkv, int64_t rows, int heads, int head_dim, int padded_dim,
                 float* q, float* k, float* v) {
  if (rows == 0) return 0;
  PadQkvKernel<<<dim3(static_cast<unsigned>(rows), 3), BlockFor(int64_t{heads} * padded_dim), 0, stream>>>(
      qkv, rows, heads, head_dim, padded_dim, q, k, v);
  return LastError();
}

int LaunchArgmax(CUstream_st* stream, const float* logits, int64_t rows, int64_t vocab, int32_t* out) {
  if (rows == 0) return 0;
  ArgmaxKernel<<<static_cast<unsigned>(rows), 1024, 0, stream>>>(logits, vocab, out);
  return LastError();
}

int LaunchPagedAttention(CUstream_st* stream, const float* q, int64_t q_row_stride, float* out, int64_t out_row_stride,
                         int num_heads, float scale, const void* k_pool, const void* v_pool, bool bf16_pool,
                         int block_size, int num_kv_heads, int head_dim, const int32_t* query_start,
                         const int32_t* context_lens, const int32_t* block_tables, int max_blocks_per_seq,
                         int num_seqs, int64_t row_begin, int64_t row_end) {
  if (head_dim > kPagedMaxHeadDim || num_kv_heads <= 0 || num_heads % num_kv_heads != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (row_end <= row_begin || num_seqs == 0) return 0;
  const dim3 grid(static_cast<unsigned>(row_end - row_begin), static_cast<unsigned>(num_heads));
  const int threads = kPagedWarps * kWarpSize;
  if (bf16_pool) {
    PagedAttentionKernel<uint16_t><<<grid, threads, 0, stream>>>(
        q, q_row_stride, out, out_row_stride, num_heads, scale, static_cast<const uint16_t*>(k_pool),
        static_cast<const uint16_t*>(v_pool), block_size, num_kv_heads, head_dim, query_start, context_lens,
        block_tables, max_blocks_per_seq, num_seqs, row_begin);
  } else {
    PagedAttentionKernel<float><<<grid, threads, 0, stream>>>(
        q, q_row_stride, out, out_row_stride, num_heads, scale, static_cast<const float*>(k_pool),
        static_cast<const float*>(v_pool), block_size, num_kv_heads, head_dim, query_start, context_lens,
        block_tables, max_blocks_per_seq, num_seqs, row_begin);
  }
  return LastError();
}

}  // namespace iris::kernels::cuda
