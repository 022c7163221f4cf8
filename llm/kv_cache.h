// The decoder's paged KV cache: one pool of fixed-size blocks per layer (K and V), a block
// manager that hands blocks out and takes them back, and per-sequence block tables that grow on
// demand. Single-threaded: the engine thread owns it.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
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

// A full block's prefix-cache key: SHA-256 of its token ids (image tokens carrying their image's
// content hash) chained with the previous block's key, so equal keys mean equal k/v.
using BlockHash = std::array<uint8_t, 32>;

// Hands out block ids 0..num_blocks-1, reference-counted so that sequences with a common prefix
// share its blocks. A full computed block may be registered under its BlockHash; when its last
// holder lets go it stays cached (findable, and shareable again) on an LRU list, and is evicted —
// its key dropped — only when a fresh block is wanted and no never-cached block is free. A block
// someone holds is never evicted.
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);

  int64_t num_blocks() const { return num_blocks_; }
  // Blocks nobody holds: never-cached ones plus cached ones that may be evicted.
  int64_t num_free() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t num_used() const { return num_blocks_ - num_free(); }
  int64_t num_cached() const { return static_cast<int64_t>(index_.size()); }  // registered, held or not
  int64_t num_evictable() const { return static_cast<int64_t>(lru_.size()); }
  int64_t evictions() const { return evictions_; }
  int32_t ref_count(int32_t block) const { return ref_[block]; }

  // `n` fresh blocks (each held once) appended to `out`, or RESOURCE_EXHAUSTED (and nothing taken)
  // when fewer are free. Never-cached blocks go first (LIFO), then the least recently freed cached.
  absl::Status Allocate(int64_t n, std::vector<int32_t>* out);
  // Lets go of each block once. Freeing a block nobody holds is a programming error (abort).
  void Free(const std::vector<int32_t>& blocks);

  // The cached block registered under `hash`, or -1.
  int32_t Find(const BlockHash& hash) const;
  // Holds `block` once more (a cached block nobody held leaves the LRU list).
  void Share(int32_t block);
  // Registers a held, full, computed `block` under `hash`. False (nothing changes) when `hash`
  // already names a block or `block` has a key.
  bool Register(int32_t block, const BlockHash& hash);

 private:
  int64_t num_blocks_;
  int64_t evictions_ = 0;
  std::vector<int32_t> free_;  // held by none, not cached
  std::vector<int32_t> ref_;   // holders per block
  std::list<int32_t> lru_;     // cached and held by none, least recently freed first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<BlockHash> hash_;
  std::vector<uint8_t> has_hash_;
  absl::flat_hash_map<BlockHash, int32_t> index_;
};

// One sequence's blocks: token i of the sequence lives in slot
// blocks[i / block_size] * block_size + i % block_size.
struct BlockTable {
  std::vector<int32_t> blocks;
  int64_t num_tokens = 0;  // tokens whose k/v are (or are about to be) stored
};

class KvCache {
 public:
  // Allocates the pools on `device` (on the CPU zeroed lazily by the OS). Fails on a bad shape or
  // when the allocation fails.
  static absl::StatusOr<KvCache> Create(const KvCacheShape& shape,
                                        kernels::Device& device = kernels::DefaultCpuDevice());

  const KvCacheShape& shape() const { return shape_; }
  BlockAllocator& allocator() { return allocator_; }
  const BlockAllocator& allocator() const { return allocator_; }

  // Blocks needed to hold `tokens` tokens.
  int64_t BlocksFor(int64_t tokens) const;
  // Grows `table` so that it can hold `new_num_tokens` tokens (allocating blocks as needed) and
  // sets table->num_tokens. RESOURCE_EXHAUSTED, with the table unchanged, when blocks run out.
  absl::Status Reserve(BlockTable* table, int64_t new_num_tokens);
  // Lets go of every block of `table` and empties it.
  void Release(BlockTable* table);
  // Prefix caching: appends to the empty `table` the cached blocks of the longest run of leading
  // `hashes` found in the cache, holding each once more, and returns how many. The caller sets
  // num_tokens (the blocks are full).
  int64_t AttachCached(BlockTable* table, std::span<const BlockHash> hashes);

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
