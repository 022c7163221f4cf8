// nvcc's side of sdpa_io_kernels.cuh: the launch configurations.
#include "kernels/cuda/sdpa_io_kernels.h"

#include <cuda_runtime.h>

#include "kernels/cuda/sdpa_io_kernels.cuh"

namespace iris::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int LastError() { return static_cast<int>(cudaGetLastError()); }

// One thread per element where that fits, capped (the kernels' strided loops take the rest).
dim3 RowsGrid(int64_t rows, int64_t cols) {
  const int64_t across = (cols + kThreads - 1) / kThreads;
  return dim3(static_cast<unsigned>(across < 16 ? across : 16), static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

SdpaSource SourceOf(const SdpaSourceArgs& a) { return SdpaSource{a.data, a.row_stride, a.head_stride}; }

}  // namespace

int LaunchSdpaMeta(CUstream_st* stream, const int32_t* cu_seqlens, int num_seqs, int32_t q_row, int32_t kv_row,
                   int32_t* seq_len, int32_t* q_offsets, int32_t* kv_offsets) {
  if (num_seqs < 0) return static_cast<int>(cudaErrorInvalidValue);
  const int blocks = (num_seqs + 1 + kThreads - 1) / kThreads;
  SdpaMetaKernel<<<static_cast<unsigned>(blocks < 64 ? blocks : 64), kThreads, 0, stream>>>(
      cu_seqlens, num_seqs, q_row, kv_row, seq_len, q_offsets, kv_offsets);
  return LastError();
}

int LaunchSdpaPack(CUstream_st* stream, const SdpaSourceArgs& q, const SdpaSourceArgs& k, const SdpaSourceArgs& v,
                   int64_t rows, int q_heads, int kv_heads, int head_dim, uint16_t* q_out, uint16_t* k_out,
                   uint16_t* v_out) {
  const int64_t cols = (static_cast<int64_t>(q_heads) + 2 * kv_heads) * head_dim;
  if (rows * cols == 0) return 0;
  SdpaPackKernel<<<RowsGrid(rows, cols), kThreads, 0, stream>>>(SourceOf(q), SourceOf(k), SourceOf(v), rows, q_heads,
                                                               kv_heads, head_dim, q_out, k_out, v_out);
  return LastError();
}

int LaunchSdpaUnpack(CUstream_st* stream, const uint16_t* o, int64_t rows, int64_t cols, float* out,
                     int64_t out_row_stride) {
  if (rows * cols == 0) return 0;
  if (out_row_stride < cols) return static_cast<int>(cudaErrorInvalidValue);
  SdpaUnpackKernel<<<RowsGrid(rows, cols), kThreads, 0, stream>>>(o, rows, cols, out, out_row_stride);
  return LastError();
}

}  // namespace iris::kernels::cuda
