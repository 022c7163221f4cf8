// Launches of iris's own CUDA kernels (kernels.cuh) on a stream. Pointers are device memory;
// each call only enqueues, and returns the launch's cudaError_t value (0: cudaSuccess) so that
// this header and its callers need no CUDA header; CudaDevice turns errors into absl::Status.
#pragma once

#include <cstdint>

#include "kernels/cuda/paged_decode_rotary.h"
#include "kernels/packed_logit_edits.h"
#include "kernels/patch_grid.h"
#include "kernels/row_draw.h"

struct CUstream_st;

namespace iris::kernels::cuda {

// kernels/elementwise.h's ops (y may alias x where the op allows it).
int LaunchRmsNorm(CUstream_st* stream, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                  float* y);
int LaunchLayerNorm(CUstream_st* stream, const float* x, const float* weight, const float* bias, int64_t rows,
                    int64_t dim, float eps, float* y);
int LaunchSiluMulRows(CUstream_st* stream, const float* gu, int64_t rows, int64_t inter, float* out);
int LaunchSiluMul(CUstream_st* stream, const float* gate, const float* up, int64_t n, float* out);
// RmsNorm and SiluMulRows writing a matmul's bf16 input rows (stride ld >= the row's width;
// columns past it left as they are): the values LaunchToBf16Rows would make of the f32 ops'
// output, without that pass.
int LaunchRmsNormBf16(CUstream_st* stream, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                      uint16_t* out, int64_t ld);
int LaunchSiluMulRowsBf16(CUstream_st* stream, const float* gu, int64_t rows, int64_t inter, uint16_t* out,
                          int64_t ld);
// SiluMulRows from bf16 gate/up rows (a matmul's bf16 output, row stride gu_ld >= 2 inter) to
// bf16 rows: the bf16 hand-off of kernels::GatedMlp on the GPU.
int LaunchSiluMulBf16RowsBf16(CUstream_st* stream, const uint16_t* gu, int64_t gu_ld, int64_t rows, int64_t inter,
                              uint16_t* out, int64_t ld);
int LaunchGeluErf(CUstream_st* stream, const float* x, int64_t n, float* y);
int LaunchQuickGelu(CUstream_st* stream, const float* x, int64_t n, float* y);
int LaunchAdd(CUstream_st* stream, const float* a, const float* b, int64_t n, float* y);

// q and k rotated in place in one launch (cos/sin: head_dim / 2 values per row, on the device).
int LaunchRotaryQK(CUstream_st* stream, float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride,
                   int k_heads, int64_t rows, int head_dim, const float* cos, const float* sin);
// The same on bf16 rows (the vision blocks' qkv rows held in bf16): each pair widened, rotated
// in f32 and rounded once. k may be null with k_heads = 0 (one tensor).
int LaunchRotaryQKBf16(CUstream_st* stream, uint16_t* q, int64_t q_stride, int q_heads, uint16_t* k,
                       int64_t k_stride, int k_heads, int64_t rows, int head_dim, const float* cos, const float* sin);
// One tensor's heads rotated in place.
int LaunchRotary(CUstream_st* stream, float* x, int64_t stride, int heads, int64_t rows, int head_dim,
                 const float* cos, const float* sin);

// q, k and v padded from head_dim to padded_dim in one launch; one of them (which = 0 q, 1 k,
// 2 v); and the inverse for an attention output (kernels/qkv_pad.h).
int LaunchPadQkv(CUstream_st* stream, const float* qkv, int64_t rows, int heads, int head_dim, int padded_dim,
                 float* q, float* k, float* v);
int LaunchPadOneOfQkv(CUstream_st* stream, const float* qkv, int64_t rows, int heads, int head_dim, int padded_dim,
                      int which, float* out);
int LaunchUnpadHeads(CUstream_st* stream, const float* padded, int64_t rows, int heads, int head_dim, int padded_dim,
                     float* out);

// kernels/rows.h's row moves over n rows of `width` floats (index: n device int32s).
int LaunchGatherRows(CUstream_st* stream, const float* src, int64_t width, const int32_t* index, int64_t n,
                     float* dst);
int LaunchScatterRows(CUstream_st* stream, const float* src, int64_t width, const int32_t* index, int64_t n,
                      float* dst);
// kernels::PatchRows: rows [row_begin, row_end) of a resized RGB8 image width pixels wide.
int LaunchPatchRows(CUstream_st* stream, const uint8_t* rgb, const PatchGrid& grid, const float* table,
                    int64_t row_begin, int64_t row_end, float* out);
// out[i, :] = table[ids[i], :] as f32; table [vocab, width] of f32, bf16 or f16 bits. An id
// outside [0, vocab) gives a NaN row (the GPU cannot stop on it as the CPU op does).
enum class EmbeddingDType { kF32, kBf16, kF16 };
int LaunchEmbeddingLookup(CUstream_st* stream, const void* table, EmbeddingDType dtype, int64_t vocab, int64_t width,
                          const int32_t* ids, int64_t n, float* out);

// Greedy token per row of logits (the CPU sampler's rule), into out[rows] on the device. slices
// > 1: each row is read by that many blocks, which leave their best in part_v / part_i (rows x
// slices each) and count arrivals in `counters` (rows ints, zero before and after the launch);
// the last block of a row merges. ArgmaxSlices picks it (1 past sm_count rows: the device's
// counters are sm_count ints).
int LaunchArgmax(CUstream_st* stream, const float* logits, int64_t rows, int64_t vocab, int32_t* out, int slices = 1,
                 float* part_v = nullptr, int32_t* part_i = nullptr, int* counters = nullptr);
int ArgmaxSlices(int64_t rows, int64_t vocab, int sm_count);

// kernels::EditLogitRows: a block per row, the packed edits' buffer in device memory.
int LaunchEditLogitRows(CUstream_st* stream, float* logits, int64_t rows, int64_t vocab, const PackedLogitEdits& edits);
// kernels::SampleRows: a block per row (sample_rows.cuh); draws and out in device memory.
int LaunchSampleRows(CUstream_st* stream, float* logits, int64_t rows, int64_t vocab, const RowDraw* draws,
                     int32_t* out);

// Writes n tokens' k and v rows (row_elems = num_kv_heads * head_dim floats each) into pool slots
// slots[r] (n device int64s) of f32 or bf16 pools (rounded to nearest even, as the CPU op). A slot
// outside [0, num_slots) is skipped (the GPU cannot stop on it as the CPU op does).
int LaunchWritePagedKv(CUstream_st* stream, const float* k, int64_t k_row_stride, const float* v, int64_t v_row_stride,
                       const int64_t* slots, int64_t n, int64_t row_elems, int64_t num_slots, void* k_pool,
                       void* v_pool, bool bf16_pool);
// LaunchRotaryQK on `rows` rows, then LaunchWritePagedKv of the rotated k and of v into slots[0,
// rows) of pools with k_heads * head_dim values a slot: one launch, the same results. early
// (sm_90 and later): launched with programmatic stream serialization (kernels.cuh says what its
// blocks read before they wait for the kernel ahead: only the slots).
int LaunchRotaryQKWritePagedKv(CUstream_st* stream, float* q, int64_t q_stride, int q_heads, float* k,
                               int64_t k_stride, int k_heads, int64_t rows, int head_dim, const float* cos,
                               const float* sin, const float* v, int64_t v_stride, const int64_t* slots,
                               int64_t num_slots, void* k_pool, void* v_pool, bool bf16_pool, bool early = false);

// Paged attention over f32 or bf16 pools (f32 products), kernels/paged_attention.h's layout and
// metadata (device arrays); the step's query rows are [row_begin, row_end). head_dim at most 256
// (cudaErrorInvalidValue otherwise). splits > 1: each row's keys go to that many blocks, whose
// partials (`partials`, PagedAttentionPartialBytes) the last of them to finish merges, counting
// arrivals in `split_counters`: (row_end - row_begin) x num_heads ints, zero before the launch
// and zero again after it. early: launched to start early (programmatic dependent launch, sm_90+;
// CudaDevice::early_start): its blocks read the metadata and ask for their first keys while the
// kernel ahead (which writes q and the step's keys) finishes.
// rotary (a step whose rows are all decode rows; even head_dim): the step's rotary and KV write
// done by the attention too (PagedDecodeRotary), where q is then before rotary.
// lean: the kernel that holds two blocks an SM (kernels.cuh's kLean: at most 128 registers, V rows
// half as many at a time), where V is read in whole chunks and there is no rotary; the same
// output bit for bit. For grids of more blocks than one wave holds.
int LaunchPagedAttention(CUstream_st* stream, const float* q, int64_t q_row_stride, float* out, int64_t out_row_stride,
                         int num_heads, float scale, const void* k_pool, const void* v_pool, bool bf16_pool,
                         int block_size, int num_kv_heads, int head_dim, const int32_t* query_start,
                         const int32_t* context_lens, const int32_t* block_tables, int max_blocks_per_seq,
                         int num_seqs, int64_t row_begin, int64_t row_end, int splits = 1,
                         float* partials = nullptr, int* split_counters = nullptr, bool early = false,
                         const PagedDecodeRotary* rotary = nullptr, bool lean = false);

// Paged attention's key splits for a step of `rows` query rows: as many blocks per (row, head)
// as fit in one wave on `sm_count` SMs (the kernel holds an SM's registers: one block each), at
// most 16; 1 where the (row, head) pairs alone fill half the SMs. A second wave would double
// the step's latency (at 3b batch 1, 16 heads: 8 splits, 128 blocks, not 16 and 256). So
// splits > 1 only where rows x heads <= sm_count / 2. Each split past the first needs
// PagedAttentionPartialBytes of device scratch in all. `max_splits` (1 .. kPagedAttentionMaxSplits)
// lowers the cap: the device passes its paged_attention_max_splits, 4 by default (at 3b batch 1
// a step with 4 splits was faster than with 8 or 1 on an H200: CudaDevice says by how much).
constexpr int kPagedAttentionMaxSplits = 16;
int PagedAttentionSplits(int64_t rows, int num_heads, int sm_count, int max_splits = kPagedAttentionMaxSplits);
size_t PagedAttentionPartialBytes(int64_t rows, int num_heads, int head_dim, int splits);

}  // namespace iris::kernels::cuda
