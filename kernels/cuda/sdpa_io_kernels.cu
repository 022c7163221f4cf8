// nvcc's side of sdpa_io_kernels.cuh: the launch configurations.
#include "kernels/cuda/sdpa_io_kernels.h"

#include <cuda_runtime.h>

#include "kernels/cuda/launch_grid.cuh"
#include "kernels/cuda/sdpa_io_kernels.cuh"

namespace iris::kernels::cuda {
namespace {

SdpaSource SourceOf(const SdpaSourceArgs& a) { return SdpaSource{a.data, a.row_stride, a.head_stride}; }

}  // namespace

int LaunchSdpaMeta(CUstream_st* stream, const int32_t* cu_seqlens, int num_seqs, int32_t q_row, int32_t kv_row,
                   int32_t* seq_len, int32_t* q_offsets, int32_t* kv_offsets) {
  if (num_seqs < 0) return static_cast<int>(cudaErrorInvalidValue);
  const int blocks = (num_seqs + 1 + kLaunchThreads - 1) / kLaunchThreads;
  SdpaMetaKernel<<<static_cast<unsigned>(blocks < 64 ? blocks : 64), kLaunchThreads, 0, stream>>>(
      cu_seqlens, num_seqs, q_row, kv_row, seq_len, q_offsets, kv_offsets);
  return LastLaunchError();
}

int LaunchSdpaPack(CUstream_st* stream, const SdpaSourceArgs& q, const SdpaSourceArgs& k, const SdpaSourceArgs& v,
                   int64_t rows, int q_heads, int kv_heads, int head_dim, uint16_t* q_out, uint16_t* k_out,
                   uint16_t* v_out) {
  const int64_t cols = (static_cast<int64_t>(q_heads) + 2 * kv_heads) * head_dim;
  if (rows * cols == 0) return 0;
  SdpaPackKernel<<<RowsGrid(rows, cols), kLaunchThreads, 0, stream>>>(SourceOf(q), SourceOf(k), SourceOf(v), rows, q_heads,
                                                               kv_heads, head_dim, q_out, k_out, v_out);
  return LastLaunchError();
}

int LaunchSdpaUnpack(CUstream_st* stream, const uint16_t* o, int64_t rows, int64_t cols, float* out,
                     int64_t out_row_stride) {
  if (rows * cols == 0) return 0;
  if (out_row_stride < cols) return static_cast<int>(cudaErrorInvalidValue);
  SdpaUnpackKernel<<<RowsGrid(rows, cols), kLaunchThreads, 0, stream>>>(o, rows, cols, out, out_row_stride);
  return LastLaunchError();
}

}  // namespace iris::kernels::cuda
