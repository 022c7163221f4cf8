#include "llm/kv_cache.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace iris::llm {

int64_t KvCacheShape::BytesPerBlock() const {
  return 2 * static_cast<int64_t>(num_layers) * block_size * num_kv_heads * head_dim *
         static_cast<int64_t>(core::DTypeSize(dtype));
}

int64_t KvCacheShape::BlocksForBytes(int64_t bytes, int num_layers, int num_kv_heads, int head_dim,
                                     int block_size, core::DType dtype) {
  KvCacheShape s;
  s.dtype = dtype;
  s.num_layers = num_layers;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.block_size = block_size;
  if (bytes <= 0 || num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0 || block_size <= 0) return 0;
  if (dtype != core::DType::kF32 && dtype != core::DType::kBF16) return 0;
  return bytes / s.BytesPerBlock();
}

BlockAllocator::BlockAllocator(int64_t num_blocks)
    : num_blocks_(num_blocks < 0 ? 0 : num_blocks),
      ref_(static_cast<size_t>(num_blocks_), 0),
      lru_pos_(static_cast<size_t>(num_blocks_)),
      hash_(static_cast<size_t>(num_blocks_)),
      has_hash_(static_cast<size_t>(num_blocks_), 0) {
  // Popped from the back: block 0 goes out first.
  free_.reserve(static_cast<size_t>(num_blocks_));
  for (int64_t b = num_blocks_ - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

absl::Status BlockAllocator::Allocate(int64_t n, std::vector<int32_t>* out) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", n, " blocks"));
  if (n > num_free()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: ", n, " blocks needed, ", num_free(), " of ", num_blocks_, " free"));
  }
  out->reserve(out->size() + static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      // Evict the least recently freed cached block: its key no longer finds it.
      b = lru_.front();
      lru_.pop_front();
      index_.erase(hash_[b]);
      has_hash_[b] = 0;
      ++evictions_;
    }
    ref_[b] = 1;
    out->push_back(b);
  }
  return absl::OkStatus();
}

void BlockAllocator::Free(const std::vector<int32_t>& blocks) {
  // In reverse: the next allocation hands never-cached blocks out again in the same order, and a
  // table's last cached blocks are evicted before its first (a prefix outlives its tail).
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    if (b < 0 || b >= num_blocks_ || ref_[b] <= 0) {
      std::fprintf(stderr, "iris BlockAllocator: freeing block %d, which is not in use\n", b);
      std::abort();
    }
    if (--ref_[b] > 0) continue;
    if (has_hash_[b]) {
      lru_pos_[b] = lru_.insert(lru_.end(), b);
    } else {
      free_.push_back(b);
    }
  }
}

int32_t BlockAllocator::Find(const BlockHash& hash) const {
  auto it = index_.find(hash);
  return it == index_.end() ? -1 : it->second;
}

void BlockAllocator::Share(int32_t b) {
  if (b < 0 || b >= num_blocks_ || (ref_[b] == 0 && !has_hash_[b])) {
    std::fprintf(stderr, "iris BlockAllocator: sharing block %d, which is neither held nor cached\n", b);
    std::abort();
  }
  if (ref_[b]++ == 0) lru_.erase(lru_pos_[b]);
}

bool BlockAllocator::Register(int32_t b, const BlockHash& hash) {
  if (b < 0 || b >= num_blocks_ || ref_[b] <= 0) {
    std::fprintf(stderr, "iris BlockAllocator: registering block %d, which is not in use\n", b);
    std::abort();
  }
  if (has_hash_[b] || index_.contains(hash)) return false;
  index_.emplace(hash, b);
  hash_[b] = hash;
  has_hash_[b] = 1;
  return true;
}

KvCache::KvCache(const KvCacheShape& shape, core::Tensor k, core::Tensor v)
    : shape_(shape), k_(std::move(k)), v_(std::move(v)), allocator_(shape.num_blocks) {}

absl::StatusOr<KvCache> KvCache::Create(const KvCacheShape& shape, kernels::Device& device) {
  auto positive = [](const char* field, int64_t value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("KV cache shape: ", field, " must be positive, got ", value));
  };
  for (auto [field, value] : {std::pair<const char*, int64_t>{"num_layers", shape.num_layers},
                              {"num_kv_heads", shape.num_kv_heads},
                              {"head_dim", shape.head_dim},
                              {"block_size", shape.block_size},
                              {"num_blocks", shape.num_blocks}}) {
    if (absl::Status s = positive(field, value); !s.ok()) return s;
  }
  if (shape.num_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache shape: num_blocks ", shape.num_blocks, " does not fit the int32 block ids"));
  }
  if (shape.dtype != core::DType::kF32 && shape.dtype != core::DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache shape: dtype must be F32 or BF16, got ",
                                                   core::DTypeName(shape.dtype)));
  }
  // Bytes of one pool, checked against overflow.
  int64_t pool_bytes = static_cast<int64_t>(core::DTypeSize(shape.dtype));
  for (int64_t d : {static_cast<int64_t>(shape.num_layers), shape.num_blocks, static_cast<int64_t>(shape.block_size),
                    static_cast<int64_t>(shape.num_kv_heads), static_cast<int64_t>(shape.head_dim)}) {
    if (__builtin_mul_overflow(pool_bytes, d, &pool_bytes) || pool_bytes > (int64_t{1} << 60)) {
      return absl::InvalidArgumentError("KV cache shape: the pools would exceed the address space");
    }
  }
  const std::vector<int64_t> dims = {shape.num_layers, shape.num_blocks, shape.block_size, shape.num_kv_heads,
                                     shape.head_dim};
  try {
    absl::StatusOr<core::Tensor> k = device.Allocate(shape.dtype, dims);
    absl::StatusOr<core::Tensor> v = k.ok() ? device.Allocate(shape.dtype, dims) : k;
    if (!v.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("KV cache: cannot allocate 2 x ", pool_bytes, " bytes for ",
                                                       shape.num_blocks, " blocks on ", device.Describe(), ": ",
                                                       v.status().message()));
    }
    return KvCache(shape, *std::move(k), *std::move(v));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: cannot allocate 2 x ", pool_bytes,
                                                     " bytes for ", shape.num_blocks, " blocks"));
  }
}

int64_t KvCache::BlocksFor(int64_t tokens) const {
  if (tokens <= 0) return 0;
  return (tokens + shape_.block_size - 1) / shape_.block_size;
}

absl::Status KvCache::Reserve(BlockTable* table, int64_t new_num_tokens) {
  if (new_num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: cannot reserve ", new_num_tokens, " tokens"));
  }
  const int64_t need = BlocksFor(new_num_tokens) - static_cast<int64_t>(table->blocks.size());
  if (need > 0) {
    // Allocate appends only on success: the table is unchanged on RESOURCE_EXHAUSTED.
    if (absl::Status s = allocator_.Allocate(need, &table->blocks); !s.ok()) return s;
  }
  // A smaller count keeps the blocks (they go back on Release).
  table->num_tokens = new_num_tokens;
  return absl::OkStatus();
}

void KvCache::Release(BlockTable* table) {
  allocator_.Free(table->blocks);
  table->blocks.clear();
  table->num_tokens = 0;
}

int64_t KvCache::AttachCached(BlockTable* table, std::span<const BlockHash> hashes) {
  if (!table->blocks.empty()) {
    std::fprintf(stderr, "iris KvCache::AttachCached: the table already holds %zu blocks\n", table->blocks.size());
    std::abort();
  }
  for (const BlockHash& h : hashes) {
    const int32_t b = allocator_.Find(h);
    if (b < 0) break;
    allocator_.Share(b);
    table->blocks.push_back(b);
  }
  return static_cast<int64_t>(table->blocks.size());
}

int64_t KvCache::Slot(const BlockTable& table, int64_t i) const {
  const int64_t bs = shape_.block_size;
  if (i < 0 || i / bs >= static_cast<int64_t>(table.blocks.size())) {
    std::fprintf(stderr, "iris KvCache::Slot: token %lld is beyond the table's %zu blocks\n",
                 static_cast<long long>(i), table.blocks.size());
    std::abort();
  }
  return table.blocks[i / bs] * bs + i % bs;
}

kernels::PagedKvLayer KvCache::layer(int l) {
  if (l < 0 || l >= shape_.num_layers) {
    std::fprintf(stderr, "iris KvCache::layer: layer %d out of range [0, %d)\n", l, shape_.num_layers);
    std::abort();
  }
  const int64_t per_layer = shape_.num_blocks * shape_.block_size * shape_.num_kv_heads * shape_.head_dim;
  kernels::PagedKvLayer out;
  const int64_t layer_bytes = per_layer * static_cast<int64_t>(core::DTypeSize(shape_.dtype));
  out.k = static_cast<char*>(k_.raw()) + l * layer_bytes;
  out.v = static_cast<char*>(v_.raw()) + l * layer_bytes;
  out.dtype = shape_.dtype;
  out.num_blocks = shape_.num_blocks;
  out.block_size = shape_.block_size;
  out.num_kv_heads = shape_.num_kv_heads;
  out.head_dim = shape_.head_dim;
  return out;
}

}  // namespace iris::llm
