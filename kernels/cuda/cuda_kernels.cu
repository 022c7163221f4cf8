// nvcc's side of kernels.cuh: the launch configurations.
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch_grid.cuh"
#include "kernels/cuda/sample_rows.cuh"

namespace iris::kernels::cuda {
namespace {

// Threads per block for a block's share of `work` items (a multiple of the warp size: the
// reductions shuffle).
int BlockFor(int64_t work) { return work >= 256 ? 256 : work > 64 ? 128 : 64; }

// Flat kernels: 256 threads a block, a block per 256 elements up to 65536 blocks (a grid-stride
// loop covers the rest).
constexpr int kFlatThreads = 256;
unsigned FlatBlocks(int64_t n) {
  const int64_t blocks = (n + kFlatThreads - 1) / kFlatThreads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

template <typename Out>
int LaunchRmsNormTo(CUstream_st* stream, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                    const void* out_base, bool out_vec_ok, Out out) {
  if (rows == 0) return 0;
  if (const int threads = RmsNormVecThreads(x, weight, out_base, dim); threads > 0 && out_vec_ok) {
    RmsNormVecKernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, weight, dim, eps, out);
  } else {
    RmsNormKernel<<<static_cast<unsigned>(rows), BlockFor(dim), 0, stream>>>(x, weight, dim, eps, out);
  }
  return LastLaunchError();
}

// gu_base: the input's first byte; in_vec_ok / out_vec_ok: whether the row strides allow the
// 4-wide kernel's vector loads / stores (the addresses are checked here).
template <typename In, typename Out>
int LaunchSiluMulRowsTo(CUstream_st* stream, In gu, const void* gu_base, bool in_vec_ok, int64_t rows, int64_t inter,
                        const void* out_base, bool out_vec_ok, Out out) {
  const int64_t n = rows * inter;
  if (n == 0) return 0;
  if (inter % 4 == 0 && in_vec_ok && out_vec_ok && reinterpret_cast<uintptr_t>(gu_base) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out_base) % 16 == 0) {
    SiluMulRows4Kernel<<<FlatBlocks(rows * (inter / 4)), kFlatThreads, 0, stream>>>(gu, rows, inter, out);
    return LastLaunchError();
  }
  SiluMulRowsKernel<<<FlatBlocks(n), kFlatThreads, 0, stream>>>(gu, rows, inter, out);
  return LastLaunchError();
}

}  // namespace

int LaunchRmsNorm(CUstream_st* stream, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                  float* y) {
  return LaunchRmsNormTo(stream, x, weight, rows, dim, eps, y, true, F32Rows{y, dim});
}

int LaunchRmsNormBf16(CUstream_st* stream, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                      uint16_t* out, int64_t ld) {
  if (ld < dim) return static_cast<int>(cudaErrorInvalidValue);
  return LaunchRmsNormTo(stream, x, weight, rows, dim, eps, out, ld % 4 == 0, Bf16Rows{out, ld});
}

int LaunchLayerNorm(CUstream_st* stream, const float* x, const float* weight, const float* bias, int64_t rows,
                    int64_t dim, float eps, float* y) {
  if (rows == 0) return 0;
  LayerNormKernel<<<static_cast<unsigned>(rows), BlockFor(dim), 0, stream>>>(x, weight, bias, dim, eps, y);
  return LastLaunchError();
}

int LaunchSiluMulRows(CUstream_st* stream, const float* gu, int64_t rows, int64_t inter, float* out) {
  return LaunchSiluMulRowsTo(stream, F32In{gu, 2 * inter}, gu, true, rows, inter, out, true, F32Rows{out, inter});
}

int LaunchSiluMulRowsBf16(CUstream_st* stream, const float* gu, int64_t rows, int64_t inter, uint16_t* out,
                          int64_t ld) {
  if (ld < inter) return static_cast<int>(cudaErrorInvalidValue);
  return LaunchSiluMulRowsTo(stream, F32In{gu, 2 * inter}, gu, true, rows, inter, out, ld % 4 == 0, Bf16Rows{out, ld});
}

int LaunchSiluMulBf16RowsBf16(CUstream_st* stream, const uint16_t* gu, int64_t gu_ld, int64_t rows, int64_t inter,
                              uint16_t* out, int64_t ld) {
  if (ld < inter || gu_ld < 2 * inter) return static_cast<int>(cudaErrorInvalidValue);
  if (rows > 0 && inter > 0 && SiluMulBf16Rows8Fits(gu, gu_ld, inter, out, ld)) {
    SiluMulBf16Rows8Kernel<<<FlatBlocks(rows * (inter / 8)), kFlatThreads, 0, stream>>>(gu, gu_ld, rows, inter, out, ld);
    return LastLaunchError();
  }
  return LaunchSiluMulRowsTo(stream, Bf16In{gu, gu_ld}, gu, gu_ld % 4 == 0, rows, inter, out, ld % 4 == 0,
                             Bf16Rows{out, ld});
}

int LaunchSiluMul(CUstream_st* stream, const float* gate, const float* up, int64_t n, float* out) {
  if (n == 0) return 0;
  SiluMulKernel<<<FlatBlocks(n), kFlatThreads, 0, stream>>>(gate, up, n, out);
  return LastLaunchError();
}

int LaunchGeluErf(CUstream_st* stream, const float* x, int64_t n, float* y) {
  if (n == 0) return 0;
  GeluErfKernel<<<FlatBlocks(n), kFlatThreads, 0, stream>>>(x, n, y);
  return LastLaunchError();
}

int LaunchQuickGelu(CUstream_st* stream, const float* x, int64_t n, float* y) {
  if (n == 0) return 0;
  QuickGeluKernel<<<FlatBlocks(n), kFlatThreads, 0, stream>>>(x, n, y);
  return LastLaunchError();
}

int LaunchAdd(CUstream_st* stream, const float* a, const float* b, int64_t n, float* y) {
  if (n == 0) return 0;
  AddKernel<<<FlatBlocks(n), kFlatThreads, 0, stream>>>(a, b, n, y);
  return LastLaunchError();
}

// The fused rotary's launch for f32 or bf16 rows (T).
template <typename T>
int LaunchRotaryQKRows(CUstream_st* stream, T* q, int64_t q_stride, int q_heads, T* k, int64_t k_stride, int k_heads,
                       int64_t rows, int head_dim, const float* cos, const float* sin) {
  if (rows == 0) return 0;
  RotaryQKKernel<<<static_cast<unsigned>(rows), BlockFor(int64_t{q_heads + k_heads} * head_dim / 2), 0, stream>>>(
      q, q_stride, q_heads, k, k_stride, k_heads, head_dim, cos, sin);
  return LastLaunchError();
}

int LaunchRotaryQK(CUstream_st* stream, float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride,
                   int k_heads, int64_t rows, int head_dim, const float* cos, const float* sin) {
  return LaunchRotaryQKRows(stream, q, q_stride, q_heads, k, k_stride, k_heads, rows, head_dim, cos, sin);
}

int LaunchRotaryQKBf16(CUstream_st* stream, uint16_t* q, int64_t q_stride, int q_heads, uint16_t* k,
                       int64_t k_stride, int k_heads, int64_t rows, int head_dim, const float* cos, const float* sin) {
  if (rows > 0 && RotaryQKBf16Vec4Fits(q, q_stride, q_heads, k, k_stride, k_heads, head_dim, rows, cos, sin)) {
    RotaryQKBf16Vec4Kernel<<<FlatBlocks(rows * (q_heads + k_heads) * (head_dim / 8)), kFlatThreads, 0, stream>>>(
        q, q_stride, q_heads, k, k_stride, k_heads, head_dim, rows, cos, sin);
    return LastLaunchError();
  }
  return LaunchRotaryQKRows(stream, q, q_stride, q_heads, k, k_stride, k_heads, rows, head_dim, cos, sin);
}

int LaunchRotary(CUstream_st* stream, float* x, int64_t stride, int heads, int64_t rows, int head_dim,
                 const float* cos, const float* sin) {
  return LaunchRotaryQK(stream, x, stride, heads, nullptr, 0, 0, rows, head_dim, cos, sin);
}

int LaunchPadQkv(CUstream_st* stream, const float* qkv, int64_t rows, int heads, int head_dim, int padded_dim,
                 float* q, float* k, float* v) {
  if (rows == 0) return 0;
  PadQkvKernel<<<dim3(static_cast<unsigned>(rows), 3), BlockFor(int64_t{heads} * padded_dim), 0, stream>>>(
      qkv, rows, heads, head_dim, padded_dim, q, k, v);
  return LastLaunchError();
}

int LaunchPadOneOfQkv(CUstream_st* stream, const float* qkv, int64_t rows, int heads, int head_dim, int padded_dim,
                      int which, float* out) {
  if (rows == 0) return 0;
  PadOneOfQkvKernel<<<static_cast<unsigned>(rows), BlockFor(int64_t{heads} * padded_dim), 0, stream>>>(
      qkv, rows, heads, head_dim, padded_dim, which, out);
  return LastLaunchError();
}

int LaunchUnpadHeads(CUstream_st* stream, const float* padded, int64_t rows, int heads, int head_dim, int padded_dim,
                     float* out) {
  const int64_t n = rows * heads * head_dim;
  if (n == 0) return 0;
  UnpadHeadsKernel<<<FlatBlocks(n), kFlatThreads, 0, stream>>>(padded, rows, heads, head_dim, padded_dim, out);
  return LastLaunchError();
}

int LaunchGatherRows(CUstream_st* stream, const float* src, int64_t width, const int32_t* index, int64_t n,
                     float* dst) {
  if (n * width == 0) return 0;
  GatherRowsKernel<<<FlatBlocks(n * width), kFlatThreads, 0, stream>>>(src, width, index, n, dst);
  return LastLaunchError();
}

int LaunchScatterRows(CUstream_st* stream, const float* src, int64_t width, const int32_t* index, int64_t n,
                      float* dst) {
  if (n * width == 0) return 0;
  ScatterRowsKernel<<<FlatBlocks(n * width), kFlatThreads, 0, stream>>>(src, width, index, n, dst);
  return LastLaunchError();
}

int LaunchPatchRows(CUstream_st* stream, const uint8_t* rgb, const PatchGrid& grid, const float* table,
                    int64_t row_begin, int64_t row_end, float* out) {
  const int64_t n = (row_end - row_begin) * grid.row_length();
  if (n <= 0) return 0;
  PatchRowsKernel<<<FlatBlocks(n), kFlatThreads, 0, stream>>>(rgb, grid, table, row_begin, row_end - row_begin, out);
  return LastLaunchError();
}

int LaunchEmbeddingLookup(CUstream_st* stream, const void* table, EmbeddingDType dtype, int64_t vocab, int64_t width,
                          const int32_t* ids, int64_t n, float* out) {
  if (n * width == 0) return 0;
  const unsigned blocks = FlatBlocks(n * width);
  switch (dtype) {
    case EmbeddingDType::kF32:
      EmbeddingLookupKernel<F32Table><<<blocks, kFlatThreads, 0, stream>>>(static_cast<const float*>(table), vocab,
                                                                            width, ids, n, out);
      break;
    case EmbeddingDType::kBf16:
      EmbeddingLookupKernel<Bf16Table><<<blocks, kFlatThreads, 0, stream>>>(static_cast<const uint16_t*>(table),
                                                                             vocab, width, ids, n, out);
      break;
    case EmbeddingDType::kF16:
      EmbeddingLookupKernel<F16Table><<<blocks, kFlatThreads, 0, stream>>>(static_cast<const uint16_t*>(table), vocab,
                                                                            width, ids, n, out);
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return LastLaunchError();
}

int LaunchArgmax(CUstream_st* stream, const float* logits, int64_t rows, int64_t vocab, int32_t* out, int slices,
                 float* part_v, int32_t* part_i, int* counters) {
  if (rows == 0) return 0;
  if (slices > 1) {
    if (part_v == nullptr || part_i == nullptr || counters == nullptr || slices > 65535) {
      return static_cast<int>(cudaErrorInvalidValue);
    }
    ArgmaxSplitKernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(slices)), 256, 0, stream>>>(
        logits, vocab, part_v, part_i, counters, out);
  } else {
    ArgmaxKernel<<<static_cast<unsigned>(rows), 1024, 0, stream>>>(logits, vocab, out);
  }
  return LastLaunchError();
}

int LaunchEditLogitRows(CUstream_st* stream, float* logits, int64_t rows, int64_t vocab, const PackedLogitEdits& edits) {
  if (rows == 0) return 0;
  if (rows > edits.rows || rows > 65535 * 1024LL) return static_cast<int>(cudaErrorInvalidValue);
  EditLogitRowsKernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(logits, vocab, edits);
  return LastLaunchError();
}

int LaunchSampleRows(CUstream_st* stream, float* logits, int64_t rows, int64_t vocab, const RowDraw* draws,
                     int32_t* out) {
  if (rows == 0) return 0;
  if (rows > 0x7FFFFFFF || vocab >= 0x7FFFFFFF) return static_cast<int>(cudaErrorInvalidValue);
  SampleRowsKernel<<<static_cast<unsigned>(rows), kSampleRowsThreads, 0, stream>>>(logits, vocab, draws, out);
  return LastLaunchError();
}

int ArgmaxSlices(int64_t rows, int64_t vocab, int sm_count) {
  // About 2048 logits a block (8 loads per thread), at most what fills the GPU twice over.
  if (rows <= 0 || rows > sm_count) return 1;
  const int64_t by_size = (vocab + 2047) / 2048, by_gpu = std::max<int64_t>(1, 2 * sm_count / rows);
  return static_cast<int>(std::clamp<int64_t>(std::min(by_size, by_gpu), 1, 1024));
}

int LaunchRotaryQKWritePagedKv(CUstream_st* stream, float* q, int64_t q_stride, int q_heads, float* k,
                               int64_t k_stride, int k_heads, int64_t rows, int head_dim, const float* cos,
                               const float* sin, const float* v, int64_t v_stride, const int64_t* slots,
                               int64_t num_slots, void* k_pool, void* v_pool, bool bf16_pool, bool early) {
  if (rows == 0) return 0;
  const int64_t work = std::max(int64_t{q_heads + k_heads} * head_dim / 2, int64_t{k_heads} * head_dim);
  // Each thread one rotary pair (and one v value): a row's work over ceil(work / 256) blocks.
  const int threads = BlockFor(work);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((work + threads - 1) / threads));
  if (bf16_pool) {
    LaunchMaybeEarly(stream, grid, static_cast<unsigned>(threads), early, RotaryQKWriteKvKernel<uint16_t>, q, q_stride,
                     q_heads, k, k_stride, k_heads, head_dim, cos, sin, v, v_stride, slots, num_slots,
                     static_cast<uint16_t*>(k_pool), static_cast<uint16_t*>(v_pool));
  } else {
    LaunchMaybeEarly(stream, grid, static_cast<unsigned>(threads), early, RotaryQKWriteKvKernel<float>, q, q_stride,
                     q_heads, k, k_stride, k_heads, head_dim, cos, sin, v, v_stride, slots, num_slots,
                     static_cast<float*>(k_pool), static_cast<float*>(v_pool));
  }
  return LastLaunchError();
}

int LaunchWritePagedKv(CUstream_st* stream, const float* k, int64_t k_row_stride, const float* v, int64_t v_row_stride,
                       const int64_t* slots, int64_t n, int64_t row_elems, int64_t num_slots, void* k_pool,
                       void* v_pool, bool bf16_pool) {
  if (n * row_elems == 0) return 0;
  const unsigned blocks = FlatBlocks(n * row_elems);
  if (bf16_pool) {
    WritePagedKvKernel<uint16_t><<<blocks, kFlatThreads, 0, stream>>>(k, k_row_stride, v, v_row_stride, slots, n,
                                                                       row_elems, num_slots,
                                                                       static_cast<uint16_t*>(k_pool),
                                                                       static_cast<uint16_t*>(v_pool));
  } else {
    WritePagedKvKernel<float><<<blocks, kFlatThreads, 0, stream>>>(k, k_row_stride, v, v_row_stride, slots, n,
                                                                    row_elems, num_slots, static_cast<float*>(k_pool),
                                                                    static_cast<float*>(v_pool));
  }
  return LastLaunchError();
}

int LaunchPagedAttention(CUstream_st* stream, const float* q, int64_t q_row_stride, float* out, int64_t out_row_stride,
                         int num_heads, float scale, const void* k_pool, const void* v_pool, bool bf16_pool,
                         int block_size, int num_kv_heads, int head_dim, const int32_t* query_start,
                         const int32_t* context_lens, const int32_t* block_tables, int max_blocks_per_seq,
                         int num_seqs, int64_t row_begin, int64_t row_end, int splits, float* partials,
                         int* split_counters, bool early, const PagedDecodeRotary* rotary, bool lean) {
  if (head_dim > kPagedMaxHeadDim || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || splits < 1 ||
      (splits > 1 && (partials == nullptr || split_counters == nullptr)) ||
      (rotary != nullptr && (head_dim % 2 != 0 || rotary->slots == nullptr || rotary->k_pool != k_pool ||
                             rotary->v_pool != v_pool))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (row_end <= row_begin || num_seqs == 0) return 0;
  if (splits == 1) partials = nullptr;
  const dim3 grid(static_cast<unsigned>(row_end - row_begin), static_cast<unsigned>(num_heads),
                  static_cast<unsigned>(splits));
  const int threads = kPagedWarps * kWarpSize;
  const PagedDecodeRotary r = rotary != nullptr ? *rotary : PagedDecodeRotary{};
  const auto launch = [&](auto kernel, auto* pool_type) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(pool_type)>>;
    LaunchMaybeEarly(stream, grid, threads, early, kernel, q, q_row_stride, out, out_row_stride, num_heads, scale,
                     static_cast<const T*>(k_pool), static_cast<const T*>(v_pool), block_size, num_kv_heads, head_dim,
                     query_start, context_lens, block_tables, max_blocks_per_seq, num_seqs, row_begin, partials,
                     split_counters, r);
  };
  // The instantiation for the pool's type, the rotary, V's layout (PagedVChunks: the kernel is
  // compiled for one) and the lean kernel (chunked V without rotary only).
  const auto pick = [&](auto* pool_type) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(pool_type)>>;
    const bool chunked = PagedVChunks(static_cast<const T*>(v_pool), head_dim) > 0;
    if (rotary != nullptr) {
      if (chunked) return launch(PagedAttentionKernel<T, true, true>, pool_type);
      return launch(PagedAttentionKernel<T, true, false>, pool_type);
    }
    if (!chunked) return launch(PagedAttentionKernel<T, false, false>, pool_type);
    if (lean) return launch(PagedAttentionKernel<T, false, true, true>, pool_type);
    return launch(PagedAttentionKernel<T, false, true>, pool_type);
  };
  if (bf16_pool) {
    pick(static_cast<uint16_t*>(nullptr));
  } else {
    pick(static_cast<float*>(nullptr));
  }
  return LastLaunchError();
}

int PagedAttentionSplits(int64_t rows, int num_heads, int sm_count, int max_splits) {
  const int64_t pairs = rows * num_heads;
  if (pairs <= 0) return 1;
  const int cap = std::clamp(max_splits, 1, kPagedAttentionMaxSplits);
  return static_cast<int>(std::clamp<int64_t>(sm_count / pairs, 1, cap));
}

size_t PagedAttentionPartialBytes(int64_t rows, int num_heads, int head_dim, int splits) {
  return static_cast<size_t>(PagedPartialIndex(rows, 0, num_heads, 0, splits, head_dim)) * sizeof(float);
}

}  // namespace iris::kernels::cuda
