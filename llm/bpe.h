// Byte-level BPE model: the vocabulary (byte-level token text <-> id), the merge ranks, and the encoding
// of one pre-tokenized word (raw bytes) into ids. Encoding merges by rank with a priority queue over a
// linked list of symbols and caches the ids of recent words; it is safe to call from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace iris::llm {

// The vocabulary and merges as read from tokenizer.json, with the strings packed into two buffers.
struct BpeSpec {
  struct Token {
    uint32_t offset = 0;  // into vocab_text
    uint32_t length = 0;
    int64_t id = 0;
  };
  struct Merge {
    uint32_t offset = 0;  // into merge_text: the left part, then the right part
    uint32_t left_length = 0;
    uint32_t right_length = 0;
  };
  std::string vocab_text;
  std::vector<Token> vocab;
  std::string merge_text;
  std::vector<Merge> merges;  // in rank order

  void AddToken(std::string_view token, int64_t id);
  void AddMerge(std::string_view left, std::string_view right);
};

class BpeModel {
 public:
  // Checks the spec (unique tokens and ids, every merge part and result in the vocabulary, all 256
  // byte characters present) and builds the lookup tables. Messages name the offending token/merge.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(BpeSpec spec);

  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one word (raw bytes, non-empty) to *ids.
  void Encode(std::string_view word, std::vector<int32_t>* ids) const;

  // One past the largest id in the vocabulary.
  int32_t id_limit() const { return static_cast<int32_t>(token_offset_.size()); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_merges() const { return num_merges_; }

  // -1 when the token is not in the vocabulary.
  int32_t TokenToId(std::string_view token) const;
  // False for ids outside the vocabulary.
  bool HasId(int32_t id) const;
  // The token's byte-level text; requires HasId(id).
  std::string_view IdToToken(int32_t id) const;
  // The raw bytes a token stands for; requires HasId(id).
  std::string_view IdToBytes(int32_t id) const;

 private:
  BpeModel() = default;
  void MergeWord(std::string_view word, std::vector<int32_t>* ids) const;

  struct MergeTarget {
    int32_t rank;
    int32_t id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::string vocab_text_;                // token texts, referenced by the views below
  std::vector<uint32_t> token_offset_;    // per id; kNoToken for holes
  std::vector<uint32_t> token_length_;
  std::string bytes_text_;                // raw bytes of every token
  std::vector<uint32_t> bytes_offset_;    // per id, size id_limit()+1
  absl::flat_hash_map<std::string_view, int32_t> token_to_id_;
  absl::flat_hash_map<uint64_t, MergeTarget> merges_;
  int32_t byte_id_[256] = {};
  int64_t num_tokens_ = 0;
  int64_t num_merges_ = 0;

  // Ids of recently encoded words. Cleared when it reaches kCacheCapacity.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedWord = 256;
  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace iris::llm
