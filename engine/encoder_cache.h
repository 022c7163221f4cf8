// Image embeddings by image content hash, so a repeated image is encoded once. Least recently
// used entries are dropped beyond a byte budget; entries in use by a request stay alive through
// their shared_ptr even when dropped from the cache.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "core/tensor.h"

namespace iris::engine {

class EncoderCache {
 public:
  explicit EncoderCache(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  // The embeddings for `hash`, or null. Counts a hit or a miss.
  std::shared_ptr<const core::Tensor> Lookup(const std::string& hash);
  // Without counting (for planning).
  bool Contains(const std::string& hash) const { return index_.contains(hash); }
  void Insert(const std::string& hash, std::shared_ptr<const core::Tensor> embeddings);

  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  int64_t entries() const { return static_cast<int64_t>(index_.size()); }
  int64_t bytes() const { return bytes_; }

 private:
  struct Entry {
    std::string hash;
    std::shared_ptr<const core::Tensor> embeddings;
  };
  int64_t capacity_bytes_;
  int64_t bytes_ = 0;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
  std::list<Entry> lru_;  // front = most recent
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace iris::engine
