// The decoder's paged KV cache: one pool of fixed-size blocks per layer (K and V), a block
// manager that hands blocks out and takes them back, and per-sequence block tables that grow on
// demand. Single-threaded: the engine thread owns it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/paged_attention.h"

namespace iris::llm {

struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;   // tokens per block
  int64_t num_blocks = 0;
  // The pools' element type: kF32, or kBF16 (half the bytes per block; the engine's default with
  // bf16 compute).
  core::DType dtype = core::DType::kF32;

  // Bytes of one block across all layers, K and V, in `dtype`.
  int64_t BytesPerBlock() const;
  // The number of blocks of `dtype` that fit in `bytes` (at least 0).
  static int64_t BlocksForBytes(int64_t bytes, int num_layers, int num_kv_heads, int head_dim,
                                int block_size, core::DType dtype = core::DType::kF32);
};

// Hands out block ids 0..num_blocks-1. Freed blocks are reused first (LIFO, warm in cache).
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_blocks_ - num_free(); }

  // `n` blocks appended to `out`, or RESOURCE_EXHAUSTED (and nothing taken) when fewer are free.
  absl::Status Allocate(int64_t n, std::vector<int32_t>* out);
  // Returns blocks to the pool. Freeing a block that is not in use is a programming error (abort).
  void Free(const std::vector<int32_t>& blocks);

 private:
  int64_t num_blocks_;
  std::vector<int32_t> free_;
  std::vector<uint8_t> in_use_;
};

// One sequence's blocks: token i of the sequence lives in slot
// blocks[i / block_size] * block_size + i % block_size.
struct BlockTable {
  std::vector<int32_t> blocks;
  int64_t num_tokens = 0;  // tokens whose k/v are (or are about to be) stored
};

class KvCache {
 public:
  // Allocates the pools (zeroed lazily by the OS). Fails on a bad shape or when the allocation fails.
  static absl::StatusOr<KvCache> Create(const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  BlockAllocator& allocator() { return allocator_; }
  const BlockAllocator& allocator() const { return allocator_; }

  // Blocks needed to hold `tokens` tokens.
  int64_t BlocksFor(int64_t tokens) const;
  // Grows `table` so that it can hold `new_num_tokens` tokens (allocating blocks as needed) and
  // sets table->num_tokens. RESOURCE_EXHAUSTED, with the table unchanged, when blocks run out.
  absl::Status Reserve(BlockTable* table, int64_t new_num_tokens);
  // Frees every block of `table` and empties it.
  void Release(BlockTable* table);

  // The slot of token `i` of `table` (i < blocks.size() * block_size).
  int64_t Slot(const BlockTable& table, int64_t i) const;

  kernels::PagedKvLayer layer(int l);

 private:
  KvCache(const KvCacheShape& shape, core::Tensor k, core::Tensor v);

  KvCacheShape shape_;
  core::Tensor k_;  // [num_layers, num_blocks, block_size, num_kv_heads, head_dim] of shape_.dtype
  core::Tensor v_;
  BlockAllocator allocator_;
};

}  // namespace iris::llm
