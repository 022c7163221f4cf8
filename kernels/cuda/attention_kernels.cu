// nvcc's side of attention_kernels.cuh: the launch configuration.
#include <cuda_runtime.h>

#include "kernels/cuda/attention_kernels.cuh"

namespace iris::kernels::cuda {

int LaunchFlashVarlen(CUstream_st* stream, const FlashVarlenParams& p) {
  if (p.head_dim <= 0 || p.head_dim > kFlashMaxHeadDim || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (p.num_seqs <= 0 || p.max_seqlen <= 0) return 0;
  if ((p.max_seqlen + kFlashRows - 1) / kFlashRows > 65535) return static_cast<int>(cudaErrorInvalidValue);  // grid y
  const dim3 grid(static_cast<unsigned>(p.num_seqs), static_cast<unsigned>((p.max_seqlen + kFlashRows - 1) / kFlashRows),
                  static_cast<unsigned>(p.num_heads));
  FlashVarlenKernel<<<grid, kFlashWarps * kWarpSize, 0, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace iris::kernels::cuda
