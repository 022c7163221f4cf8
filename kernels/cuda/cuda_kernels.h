// Launches of iris's own CUDA kernels (kernels.cuh) on a stream. Pointers are device memory;
// each call only enqueues, and returns the launch's cudaError_t value (0: cudaSuccess) so that
// this header and its callers need no CUDA header; CudaDevice turns errors into absl::Status.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace iris::kernels::cuda {

int LaunchRmsNorm(CUstream_st* stream, const float* x, const float* weight, int64_t rows, int dim, float eps,
                  float* y);
int LaunchSiluMulRows(CUstream_st* stream, const float* gu, int64_t rows, int64_t inter, float* out);
// q and k rotated in place in one launch (cos/sin: head_dim / 2 values per row, on the device).
int LaunchRotaryQK(CUstream_st* stream, float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride,
                   int k_heads, int64_t rows, int head_dim, const float* cos, const float* sin);
// q, k and v padded from head_dim to padded_dim in one launch.
int LaunchPadQkv(CUstream_st* stream, const float* qkv, int64_t rows, int heads, int head_dim, int padded_dim,
                 float* q, float* k, float* v);
// Greedy token per row of logits (the CPU sampler's rule), into out[rows] on the device.
int LaunchArgmax(CUstream_st* stream, const float* logits, int64_t rows, int64_t vocab, int32_t* out);

// Paged attention over f32 or bf16 pools (f32 products), kernels/paged_attention.h's layout and
// metadata (device arrays); the step's query rows are [row_begin, row_end). head_dim at most 256
// (cudaErrorInvalidValue otherwise).
int LaunchPagedAttention(CUstream_st* stream, const float* q, int64_t q_row_stride, float* out, int64_t out_row_stride,
                         int num_heads, float scale, const void* k_pool, const void* v_pool, bool bf16_pool,
                         int block_size, int num_kv_heads, int head_dim, const int32_t* query_start,
                         const int32_t* context_lens, const int32_t* block_tables, int max_blocks_per_seq,
                         int num_seqs, int64_t row_begin, int64_t row_end);

}  // namespace iris::kernels::cuda
