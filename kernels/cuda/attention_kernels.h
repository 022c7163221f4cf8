// Varlen attention on the GPU with iris's own flash kernel (attention_kernels.cuh): the
// parameters as plain data (no CUDA header needed by callers) and the launch.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/paged_decode_rotary.h"

struct CUstream_st;

namespace iris::kernels::cuda {

// kernels/attention.h's AttentionArgs as the kernel reads them; pointers are device memory.
struct FlashVarlenParams {
  const float* q = nullptr;
  int64_t q_row_stride = 0, q_head_stride = 0;
  const float* k = nullptr;
  int64_t k_row_stride = 0, k_head_stride = 0;
  const float* v = nullptr;
  int64_t v_row_stride = 0, v_head_stride = 0;
  float* out = nullptr;
  int64_t out_row_stride = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.f;
  const int32_t* cu_seqlens = nullptr;  // [num_seqs + 1]
  int num_seqs = 0;
  int max_seqlen = 0;  // sizes the grid: blocks past a sequence's end return at once
  bool causal = false;
  int64_t q_begin = 0;  // absolute query rows [q_begin, q_end) are computed (q_end < 0: to the end)
  int64_t q_end = -1;
  // Tensor-core kernel only: when set, the output goes here instead of `out`, as the bf16 input
  // rows of the projection after the attention (kernels::AttendAndProject's hand-off): query row
  // r at row r - q_begin, stride out_bf16_ld values, head h at h * head_dim (rounded as
  // core::FloatToBf16).
  uint16_t* out_bf16 = nullptr;
  int64_t out_bf16_ld = 0;
  // Tensor-core kernel only: when set (all three), q, k and v are read from these bf16 values
  // (the same strides, in values) instead of q, k, v: the vision blocks' qkv rows held in bf16
  // (kernels/attention.h's AttentionInput::bf16). The result equals the f32 inputs' on the
  // widened values bit for bit (the kernel rounds its inputs to bf16 either way).
  const uint16_t* q_bf16 = nullptr;
  const uint16_t* k_bf16 = nullptr;
  const uint16_t* v_bf16 = nullptr;
  // Tensor-core kernel with bf16 inputs: run the pipelined kernel (flash_mma.cuh: the next K/V
  // tile copied to shared memory while the warps compute on this one) where it takes the call
  // (MmaFlashPipelinedTakes: head dims up to 80 whose K/V rows are whole 16-byte vectors), the
  // same result bit for bit. CudaDevice::flash_pipeline sets it.
  bool pipeline = false;
  // The pipelined kernel only: how many consecutive q heads a block walks (1 or 2; 2: the next
  // head's first K/V tile copied while this head's last computes, for sequences of a tile or two
  // such as the vision tower's windows). The same result bit for bit.
  // CudaDevice::flash_heads_per_block sets it.
  int heads_per_block = 1;
};

// A step's prefill rows against the paged KV cache on the tensor cores (paged_flash_mma.cuh):
// kernels/paged_attention.h's layout and metadata, bf16 pages, q and the output f32 rows with
// head h at h * head_dim. Device pointers, except the host integers.
struct PagedPrefillParams {
  const float* q = nullptr;
  int64_t q_row_stride = 0;
  float* out = nullptr;
  int64_t out_row_stride = 0;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  float scale = 0.f;
  const uint16_t* k_pool = nullptr;  // [slots, num_kv_heads * head_dim] bf16
  const uint16_t* v_pool = nullptr;
  int block_size = 0;
  const int32_t* query_start = nullptr;  // [num_seqs + 1]
  const int32_t* context_lens = nullptr;  // [num_seqs]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  // Host: sequences [seq_begin, seq_end) are computed, every query row of them; max_query_len
  // (of those) sizes the grid.
  int seq_begin = 0, seq_end = 0;
  int max_query_len = 0;
  // Host, for the decode kernel (LaunchPagedDecodeMma): step rows [decode_row_begin,
  // decode_row_end) are computed, a block per (row, kv head); num_seqs (all of the step's) bounds
  // the search for a row's sequence.
  int64_t decode_row_begin = 0, decode_row_end = 0;
  int num_seqs = 0;
  // The decode kernel's splits (PagedDecodeMmaSplits; 1: none, at most kPagedDecodeMmaMaxSplits): each (row, q head, split)'s
  // partial in `partials` (PagedAttentionPartialBytes), and an int per (row, kv head) in
  // `split_counters`, zero before the launch and after it.
  int splits = 1;
  float* partials = nullptr;
  int* split_counters = nullptr;
  // The decode kernel with the step's rotary and KV write (rotary.slots set; every row a decode
  // row, key slices: PagedDecodeMmaKeySlices > 1): q is then before rotary.
  PagedDecodeRotary rotary;
};

// Whether LaunchPagedPrefillMma takes a cache of this shape: head dims up to 128 (the tensor-core
// kernel's kMmaFlashMaxHeadDim) that are a multiple of 8, bf16 pools at 16-byte aligned
// addresses (a row's K and V are then whole 16-byte loads).
inline bool PagedPrefillMmaTakes(int head_dim, const void* k_pool, const void* v_pool) {
  return head_dim > 0 && head_dim <= 128 && head_dim % 8 == 0 && reinterpret_cast<uintptr_t>(k_pool) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(v_pool) % 16 == 0;
}
int LaunchPagedPrefillMma(CUstream_st* stream, const PagedPrefillParams& p);

// Decode rows on the tensor cores with the q heads of a kv head as the rows of one tile
// (paged_flash_mma.cuh's PagedDecodeMmaKernel): each row's keys are read once per kv head, not
// once per q head. The prefill kernel's numerics, and its limits (PagedPrefillMmaTakes), with at
// most kMmaFlashRows q heads per kv head (PagedDecodeMmaTakes).
inline bool PagedDecodeMmaTakes(int num_heads, int num_kv_heads, int head_dim, const void* k_pool,
                                const void* v_pool) {
  return num_kv_heads > 0 && num_heads % num_kv_heads == 0 && num_heads / num_kv_heads <= 64 &&
         PagedPrefillMmaTakes(head_dim, k_pool, v_pool);
}
int LaunchPagedDecodeMma(CUstream_st* stream, const PagedPrefillParams& p);
// How the decode kernel shares a tile among its 4 warps: where a kv head's q heads fit one warp's
// 16 rows (every Qwen2.5 decoder: 8 on the 3b, 7 on the 7b), each warp takes 16 of the tile's 64
// keys for all of them (4 slices); else the warps take 16 rows each over all 64 keys (1).
inline int PagedDecodeMmaKeySlices(int num_heads, int num_kv_heads) {
  return num_kv_heads > 0 && num_heads / num_kv_heads <= 16 ? 4 : 1;
}

// How many blocks the decode kernel splits each (row, kv head)'s keys over: about two blocks an
// SM in all (its occupancy at head dim 128), at most kPagedDecodeMmaMaxSplits; none where the
// pairs fill the GPU already or outnumber the sm_count split counters. Not by context length: a
// decode graph recorded at one context replays at every other (a split past a short row's keys
// only writes an empty partial).
constexpr int kPagedDecodeMmaMaxSplits = 16;
inline int PagedDecodeMmaSplits(int64_t rows, int num_kv_heads, int sm_count) {
  const int64_t pairs = rows * num_kv_heads;
  if (pairs <= 0 || pairs > sm_count) return 1;
  const int64_t want = (2 * int64_t{sm_count} + pairs - 1) / pairs;
  return static_cast<int>(std::clamp<int64_t>(want, 1, kPagedDecodeMmaMaxSplits));
}

// Head dims up to kFlashMaxHeadDim (128); cudaErrorInvalidValue (as int) otherwise.
int LaunchFlashVarlen(CUstream_st* stream, const FlashVarlenParams& p);

// The tensor-core kernel (flash_mma.cuh: bf16-rounded q, k, v and probabilities, f32 softmax and
// sums; AttentionArgs::bf16's numerics). Head dims up to 128; cudaErrorInvalidValue otherwise.
int LaunchFlashVarlenMma(CUstream_st* stream, const FlashVarlenParams& p);

}  // namespace iris::kernels::cuda
