#include "engine/prefix_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/sha256.h"

namespace iris::engine {

llm::BlockHash HashBlock(const llm::BlockHash* prev, std::span<const int32_t> tokens, int64_t begin,
                         const std::vector<SequenceImage>& images) {
  // prev key (or a tag) | token ids | per overlapping image: offset into it, content hash.
  std::string bytes;
  bytes.reserve(32 + tokens.size_bytes() + 80);
  if (prev != nullptr) {
    bytes.append(reinterpret_cast<const char*>(prev->data()), prev->size());
  } else {
    bytes.append("iris-kv-block-0");
  }
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
  const int64_t end = begin + static_cast<int64_t>(tokens.size());
  for (const SequenceImage& im : images) {
    const int64_t lo = std::max(begin, im.pad_begin);
    if (lo >= std::min(end, im.pad_end)) continue;
    const int64_t offset = lo - im.pad_begin;
    bytes.append("|image|");
    bytes.append(reinterpret_cast<const char*>(&offset), sizeof offset);
    bytes.append(im.content_hash);
  }
  return core::Sha256(bytes.data(), bytes.size());
}

void ExtendBlockHashes(Sequence& seq, int block_size, int64_t num_tokens) {
  num_tokens = std::min<int64_t>(num_tokens, static_cast<int64_t>(seq.tokens.size()));
  for (int64_t i = static_cast<int64_t>(seq.block_hashes.size()); (i + 1) * block_size <= num_tokens; ++i) {
    const llm::BlockHash* prev = i > 0 ? &seq.block_hashes[i - 1] : nullptr;
    seq.block_hashes.push_back(HashBlock(
        prev, std::span<const int32_t>(seq.tokens.data() + i * block_size, block_size), i * block_size, seq.images));
  }
}

int64_t AttachCachedPrefix(Sequence& seq, llm::KvCache& cache) {
  const int bs = cache.shape().block_size;
  const int64_t known = static_cast<int64_t>(seq.tokens.size());
  if (!seq.table.blocks.empty() || seq.num_computed != 0 || known < 2) return 0;
  // Only blocks that end before the last known token: it is always computed.
  const int64_t max_blocks = (known - 1) / bs;
  ExtendBlockHashes(seq, bs, max_blocks * bs);
  const int64_t n = cache.AttachCached(
      &seq.table, std::span<const llm::BlockHash>(seq.block_hashes.data(), static_cast<size_t>(max_blocks)));
  seq.table.num_tokens = n * bs;
  seq.num_computed = n * bs;
  seq.num_registered_blocks = n;
  return n * bs;
}

void RegisterComputedBlocks(Sequence& seq, llm::KvCache& cache) {
  const int bs = cache.shape().block_size;
  const int64_t full = std::min<int64_t>(seq.num_computed / bs, static_cast<int64_t>(seq.table.blocks.size()));
  if (seq.num_registered_blocks >= full) return;
  ExtendBlockHashes(seq, bs, full * bs);
  for (int64_t i = seq.num_registered_blocks; i < full; ++i) {
    // False when an equal block is cached already (computed by another sequence in the same step):
    // this one stays private and goes back to the free list when let go.
    cache.allocator().Register(seq.table.blocks[i], seq.block_hashes[i]);
  }
  seq.num_registered_blocks = full;
}

}  // namespace iris::engine
