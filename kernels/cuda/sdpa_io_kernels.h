// Launches of the kernels around cuDNN's SDPA operation (sdpa_io_kernels.cuh) on a stream.
// Pointers are device memory; each call only enqueues and returns the launch's cudaError_t value
// (0: cudaSuccess), so that this header needs no CUDA header.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace iris::kernels::cuda {

struct SdpaSourceArgs {
  const float* data = nullptr;
  int64_t row_stride = 0;
  int64_t head_stride = 0;
};

// seq_len [num_seqs], q_offsets and kv_offsets [num_seqs + 1] from cu_seqlens [num_seqs + 1]
// (offsets in elements: q_row and kv_row elements per row).
int LaunchSdpaMeta(CUstream_st* stream, const int32_t* cu_seqlens, int num_seqs, int32_t q_row, int32_t kv_row,
                   int32_t* seq_len, int32_t* q_offsets, int32_t* kv_offsets);
// q, k, v rows [0, rows) into packed bf16 [rows, heads, head_dim] tensors.
int LaunchSdpaPack(CUstream_st* stream, const SdpaSourceArgs& q, const SdpaSourceArgs& k, const SdpaSourceArgs& v,
                   int64_t rows, int q_heads, int kv_heads, int head_dim, uint16_t* q_out, uint16_t* k_out,
                   uint16_t* v_out);
// The packed bf16 output [rows, cols] into f32 rows of out_row_stride.
int LaunchSdpaUnpack(CUstream_st* stream, const uint16_t* o, int64_t rows, int64_t cols, float* out,
                     int64_t out_row_stride);

}  // namespace iris::kernels::cuda
