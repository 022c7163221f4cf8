// Automatic prefix caching: the keys of a sequence's full KV blocks, matching a waiting
// sequence's leading blocks against the cached ones at admission, and registering its blocks once
// their k/v are computed. The blocks themselves (reference counts, LRU eviction) are the
// llm::BlockAllocator's.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sequence.h"
#include "llm/kv_cache.h"

namespace iris::engine {

// The key of the block holding `tokens` (its full block_size ids) starting at token `begin`, after
// the block keyed `prev` (null for the first block). Every image whose placeholder tokens overlap
// the block mixes in its content hash and the offset of the overlap into its tokens, so blocks of
// different images differ however equal their placeholder ids.
llm::BlockHash HashBlock(const llm::BlockHash* prev, std::span<const int32_t> tokens, int64_t begin,
                         const std::vector<SequenceImage>& images);

// Extends seq.block_hashes over every full block of seq.tokens[0, num_tokens).
void ExtendBlockHashes(Sequence& seq, int block_size, int64_t num_tokens);

// For a sequence with no blocks: holds the cached blocks of its longest cached run of leading full
// blocks — leaving at least its last known token to compute, so that a token is sampled — and
// starts it after them (num_computed). Returns the tokens matched.
int64_t AttachCachedPrefix(Sequence& seq, llm::KvCache& cache);

// Registers seq's full blocks whose k/v are computed and that the cache does not know yet.
void RegisterComputedBlocks(Sequence& seq, llm::KvCache& cache);

}  // namespace iris::engine
