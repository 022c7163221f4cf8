// Attention over a paged KV cache (the decoder's): keys and values live in fixed-size blocks of a
// shared pool, each sequence names its blocks in a block table. One call serves a whole scheduler
// step: sequences in prefill (several new query rows, causal over the cached prefix and
// themselves) and sequences in decode (one new row) side by side, reading the pages in place.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "kernels/device.h"
#include "kernels/linear.h"
#include "kernels/rotary.h"

namespace iris::kernels {

// One layer's K and V pools, each [num_blocks, block_size, num_kv_heads, head_dim] of `dtype`
// (float32, or bf16 as uint16_t: half the memory and half the bytes attention reads): token slot
// s = block * block_size + offset holds k[s * num_kv_heads * head_dim + h * head_dim + d].
struct PagedKvLayer {
  void* k = nullptr;
  void* v = nullptr;
  int64_t num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  core::DType dtype = core::DType::kF32;  // kF32 or kBF16
};

// Stores `rows` tokens' k and v rows (each num_kv_heads * head_dim floats, head-major, at
// k + r * k_row_stride / v + r * v_row_stride) into the pool slots `slot_mapping[r]`
// (block * block_size + offset; device memory). bf16 pools get the rows rounded to nearest even.
// A row whose slot is kPadSlot is padding (a decode graph's rows past the step's sequences) and is
// not written. Any other slot outside the pool is a bug: the CPU stops on it; a GPU (the slots are
// in its memory) skips that row.
inline constexpr int64_t kPadSlot = -1;
void WritePagedKv(Device& device, const PagedKvLayer& layer, const float* k, int64_t k_row_stride,
                  const float* v, int64_t v_row_stride, std::span<const int64_t> slot_mapping);

// RotaryQK (kernels/rotary.h) of q and k in place, then WritePagedKv of the rotated k and of v
// into slot_mapping's slots (one per row): a decode step's two ops, one launch on a GPU where the
// shapes agree (k's heads are the layer's kv heads, head_dim the layer's), the two ops in turn
// otherwise. Either way the same results as the two calls.
void RotaryQKWritePagedKv(Device& device, HeadsView q, HeadsView k, int64_t rows, int head_dim, const float* cos,
                          const float* sin, const PagedKvLayer& layer, const float* v, int64_t v_row_stride,
                          std::span<const int64_t> slot_mapping);

// A step's sequences as flat arrays (device memory, as vLLM's attention metadata), the maxima as
// host integers. Sequence s's new tokens are query rows [query_start[s], query_start[s + 1]) and
// they are the last q_len = query_start[s + 1] - query_start[s] tokens of its context: query row
// query_start[s] + i sits at position context_lens[s] - q_len + i and attends (causally) to
// cached tokens 0 .. that position. Its blocks are
// block_tables[s * max_blocks_per_seq .. + ceil(context_lens[s] / block_size)). The k/v of the new
// tokens must already be written to the pool.
struct PagedMetadata {
  int num_seqs = 0;
  std::span<const int32_t> query_start;   // [num_seqs + 1] (query_start[0] = 0 in a whole step)
  std::span<const int32_t> context_lens;  // [num_seqs]
  std::span<const int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  int max_query_len = 0;
  int64_t max_context_len = 0;
  // query_start[0] and query_start[num_seqs] as host integers: the step's query rows are
  // [row_begin, row_end) (a GPU sizes its launch by them without reading device memory back).
  int64_t row_begin = 0;
  int64_t row_end = 0;
  // The first sequence with more than one query row (a prefill chunk) and its first row, as host
  // integers (num_seqs and row_end when there is none). A step puts its decodes first, so the
  // rows before it are single-row sequences: a GPU gives those to its decode kernel and the
  // sequences from it on to its prefill kernel (kernels/cuda/paged_flash_mma.cuh).
  int prefill_seq_begin = 0;
  int64_t prefill_row_begin = 0;
};

// md's host integers from the step's host arrays (num_seqs + 1 query starts, num_seqs context
// lengths; md.num_seqs set): the row range, max_query_len, max_context_len and the first prefill
// sequence and row. Both metadata builders (this one and llm::Decoder's) use it.
void SetHostSummaries(std::span<const int32_t> query_start, std::span<const int32_t> context_lens,
                      PagedMetadata& md);

// Host arrays for a PagedMetadata, sequence by sequence (tests, benchmarks; the engine fills its
// own in llm::DecoderBatch). The metadata views this builder's vectors.
class PagedMetadataBuilder {
 public:
  // The next sequence: its new tokens are query rows [q_begin, q_begin + q_len), the last of its
  // context. Sequences are added in row order, each starting where the previous one ends.
  void Add(std::span<const int32_t> block_table, int64_t context_len, int64_t q_begin, int64_t q_len);
  PagedMetadata Build();

 private:
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int32_t> query_start_ = {0}, context_lens_, block_tables_;
};

struct PagedAttentionArgs {
  // Head h of query row r: q[r * q_row_stride + h * head_dim .. + head_dim).
  const float* q = nullptr;
  int64_t q_row_stride = 0;
  // out[r * out_row_stride + h * head_dim + d].
  float* out = nullptr;
  int64_t out_row_stride = 0;
  int num_heads = 0;  // a multiple of layer.num_kv_heads (GQA: q head h reads kv head h / group)
  float scale = 0.f;
  PagedKvLayer layer;
  PagedMetadata metadata;
  // As AttentionArgs::bf16: bf16-rounded dot products, f32 softmax and accumulation. Independent
  // of the pools' dtype: bf16 pages are read (and widened to f32 where needed) either way. (A GPU
  // computes f32 products either way, so far.)
  bool bf16 = false;
};

// Bad arguments stop the program (kernels/cpu/paged_sequences.h lists the checks; a GPU makes
// those that read no device memory, not the metadata's values).
void PagedAttention(Device& device, const PagedAttentionArgs& args);

// A decode step's RotaryQKWritePagedKv(q, k, ...) into args.layer, then PagedAttention(args) over
// q's rows (args.q and q_row_stride are q's; one slot per step row). On a GPU whose step rows are
// all decode rows (CudaDevice::fused_decode_rotary, the default; on the CUDA-core kernel, or on
// the packed tensor-core one where a kv head's q heads fit one warp's rows), one launch does the
// three: the attention rotates q as it reads it, takes each row's own key and value from its qkv
// rows, and stores them into the pool. The same output and pools either way, bit for bit; q and k
// in their rows may be left rotated or not (the attention is their last reader).
void RotaryPagedAttention(Device& device, const PagedAttentionArgs& args, HeadsView q, HeadsView k, int head_dim,
                          const float* cos, const float* sin, const float* v, int64_t v_row_stride,
                          std::span<const int64_t> slot_mapping);

// A step's qkv projection, qkv_out = qkv(in) for `rows` rows (q heads, then layer's kv heads of k,
// then of v: rows of (num_heads + 2 kv heads) * layer.head_dim), and, where it returns true, the
// step's rotary and KV write too: q and k rotated by cos/sin and the new k and v stored into
// `layer` at slot_mapping, as RotaryPagedAttention would (then PagedAttention alone is left to
// run). False: only the projection ran (LinearForward), and RotaryPagedAttention does the rest.
// True only on a GPU set to it (CudaDevice::SetQkvGemvRotary) for a step of decode rows only
// (md) whose rows its CUDA-core GEMV takes: the GEMV does the rotary and the KV write as its
// epilogue, one launch fewer. The same values either way, bit for bit.
bool ProjectQkvRotaryWriteKv(Device& device, const Linear& qkv, const LinearInput& in, int64_t rows, float* qkv_out,
                             int num_heads, const PagedKvLayer& layer, const PagedMetadata& md, const float* cos,
                             const float* sin, std::span<const int64_t> slot_mapping);

}  // namespace iris::kernels
