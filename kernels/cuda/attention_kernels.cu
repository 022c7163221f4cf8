// nvcc's side of attention_kernels.cuh and flash_mma.cuh: the launch configurations.
#include <cuda_runtime.h>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/launch_grid.cuh"
#include "kernels/cuda/flash_mma.cuh"
#include "kernels/cuda/paged_flash_mma.cuh"

namespace iris::kernels::cuda {

namespace {

bool ValidHeads(const FlashVarlenParams& p, int max_head_dim) {
  return p.head_dim > 0 && p.head_dim <= max_head_dim && p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0;
}

}  // namespace

int LaunchFlashVarlen(CUstream_st* stream, const FlashVarlenParams& p) {
  // (bf16 output rows and bf16 inputs: the tensor-core kernel only.)
  if (!ValidHeads(p, kFlashMaxHeadDim) || p.out_bf16 != nullptr || p.q_bf16 != nullptr || p.k_bf16 != nullptr ||
      p.v_bf16 != nullptr) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (p.num_seqs <= 0 || p.max_seqlen <= 0) return 0;
  if ((p.max_seqlen + kFlashRows - 1) / kFlashRows > 65535) return static_cast<int>(cudaErrorInvalidValue);  // grid y
  const dim3 grid(static_cast<unsigned>(p.num_seqs), static_cast<unsigned>((p.max_seqlen + kFlashRows - 1) / kFlashRows),
                  static_cast<unsigned>(p.num_heads));
  FlashVarlenKernel<<<grid, kFlashWarps * kWarpSize, 0, stream>>>(p);
  return LastLaunchError();
}

int LaunchFlashVarlenMma(CUstream_st* stream, const FlashVarlenParams& p) {
  if (!ValidHeads(p, kMmaFlashMaxHeadDim)) return static_cast<int>(cudaErrorInvalidValue);
  if (p.out_bf16 != nullptr && (p.q_end < p.q_begin || p.out_bf16_ld < int64_t{p.num_heads} * p.head_dim)) {
    return static_cast<int>(cudaErrorInvalidValue);  // bf16 rows: a bounded row range, whole rows
  }
  if ((p.q_bf16 != nullptr) != (p.k_bf16 != nullptr) || (p.q_bf16 != nullptr) != (p.v_bf16 != nullptr)) {
    return static_cast<int>(cudaErrorInvalidValue);  // q, k, v all bf16 or all f32
  }
  if (p.heads_per_block != 1 && p.heads_per_block != 2) return static_cast<int>(cudaErrorInvalidValue);
  if (p.num_seqs <= 0 || p.max_seqlen <= 0) return 0;
  const int row_blocks = (p.max_seqlen + kMmaFlashRows - 1) / kMmaFlashRows;
  if (row_blocks > 65535 || p.num_heads > 65535) return static_cast<int>(cudaErrorInvalidValue);  // grid y, z
  const dim3 grid(static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(row_blocks),
                  static_cast<unsigned>(p.num_heads));
  WithMmaFlashDim(p.head_dim, [&](auto dim) {
    constexpr int kDim = decltype(dim)::value;
    const unsigned threads = kMmaFlashWarps * kWarpSize;
    if constexpr (kDim <= kMmaFlashPipelinedMaxHeadDim) {
      if (p.pipeline && threads == kMmaFlashThreads && MmaFlashPipelinedTakes(p)) {
        if (p.heads_per_block == 2) {
          const dim3 pairs(grid.x, grid.y, (grid.z + 1) / 2);
          if (p.out_bf16 != nullptr) {
            FlashVarlenMmaPipelinedHeadsKernel<kDim, true, 2><<<pairs, threads, 0, stream>>>(p);
          } else {
            FlashVarlenMmaPipelinedHeadsKernel<kDim, false, 2><<<pairs, threads, 0, stream>>>(p);
          }
          return;
        }
        if (p.out_bf16 != nullptr) {
          FlashVarlenMmaPipelinedKernel<kDim, true><<<grid, threads, 0, stream>>>(p);
        } else {
          FlashVarlenMmaPipelinedKernel<kDim, false><<<grid, threads, 0, stream>>>(p);
        }
        return;
      }
    }
    if (p.q_bf16 != nullptr) {
      if (p.out_bf16 != nullptr) {
        FlashVarlenMmaKernel<kDim, true, true><<<grid, threads, 0, stream>>>(p);
      } else {
        FlashVarlenMmaKernel<kDim, false, true><<<grid, threads, 0, stream>>>(p);
      }
    } else if (p.out_bf16 != nullptr) {
      FlashVarlenMmaKernel<kDim, true><<<grid, threads, 0, stream>>>(p);
    } else {
      FlashVarlenMmaKernel<kDim><<<grid, threads, 0, stream>>>(p);
    }
  });
  return LastLaunchError();
}

int LaunchPagedPrefillMma(CUstream_st* stream, const PagedPrefillParams& p) {
  if (!PagedPrefillMmaTakes(p.head_dim, p.k_pool, p.v_pool) || p.num_kv_heads <= 0 ||
      p.num_heads % p.num_kv_heads != 0 || p.block_size <= 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (p.seq_end <= p.seq_begin || p.max_query_len <= 0) return 0;
  const int row_blocks = (p.max_query_len + kMmaFlashRows - 1) / kMmaFlashRows;
  if (row_blocks > 65535 || p.num_heads > 65535) return static_cast<int>(cudaErrorInvalidValue);  // grid y, z
  const dim3 grid(static_cast<unsigned>(p.seq_end - p.seq_begin), static_cast<unsigned>(row_blocks),
                  static_cast<unsigned>(p.num_heads));
  static_assert(kMmaFlashMaxHeadDim == 128, "PagedPrefillMmaTakes's limit");
  WithMmaFlashDim(p.head_dim, [&](auto dim) {
    PagedPrefillMmaKernel<decltype(dim)::value><<<grid, kMmaFlashThreads, 0, stream>>>(p);
  });
  return LastLaunchError();
}

int LaunchPagedDecodeMma(CUstream_st* stream, const PagedPrefillParams& p) {
  if (!PagedDecodeMmaTakes(p.num_heads, p.num_kv_heads, p.head_dim, p.k_pool, p.v_pool) || p.block_size <= 0 ||
      p.num_seqs <= 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int64_t rows = p.decode_row_end - p.decode_row_begin;
  if (rows <= 0) return 0;
  const int key_slices = PagedDecodeMmaKeySlices(p.num_heads, p.num_kv_heads);
  const bool rotary = p.rotary.slots != nullptr;
  if (rows > 2147483647 || p.splits < 1 || p.splits > kPagedDecodeMmaMaxSplits || p.num_kv_heads > 65535 ||
      (p.splits > 1 && (p.partials == nullptr || p.split_counters == nullptr)) ||
      (rotary && (key_slices == 1 || p.head_dim % 2 != 0 || p.rotary.k_pool != p.k_pool ||
                  p.rotary.v_pool != p.v_pool))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  static_assert(kMmaFlashRows == 64, "PagedDecodeMmaTakes's limit");
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(p.splits), static_cast<unsigned>(p.num_kv_heads));
  WithPagedDecodeMmaKernel(p.head_dim, key_slices, rotary,
                           [&](auto kernel) { kernel<<<grid, kMmaFlashThreads, 0, stream>>>(p); });
  return LastLaunchError();
}

}  // namespace iris::kernels::cuda
