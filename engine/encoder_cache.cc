#include "engine/encoder_cache.h"

namespace iris::engine {

std::shared_ptr<const core::Tensor> EncoderCache::Lookup(const std::string& hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->embeddings;
}

void EncoderCache::Insert(const std::string& hash, std::shared_ptr<const core::Tensor> embeddings) {
  if (embeddings == nullptr || capacity_bytes_ <= 0) return;
  const int64_t size = static_cast<int64_t>(embeddings->nbytes());
  if (size > capacity_bytes_) return;
  if (auto it = index_.find(hash); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  while (bytes_ + size > capacity_bytes_ && !lru_.empty()) {
    bytes_ -= static_cast<int64_t>(lru_.back().embeddings->nbytes());
    index_.erase(lru_.back().hash);
    lru_.pop_back();
  }
  lru_.push_front(Entry{hash, std::move(embeddings)});
  index_[hash] = lru_.begin();
  bytes_ += size;
}

}  // namespace iris::engine
