// What the scheduler knows of a request: its tokens and how many are computed, its KV blocks, its
// images (by content hash and size) and where it is. Plain data, no model types, so the scheduler
// can be driven by a test without a model. The engine's per-request state derives from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llm/kv_cache.h"

namespace iris::engine {

enum class SequenceState {
  kWaiting,   // in the scheduler's waiting queue (new, or preempted and to be recomputed)
  kRunning,   // in the running set: it holds KV blocks for its computed tokens
  kFinished,  // out of both queues, blocks freed; alive only until its last output is delivered
};

struct SequenceImage {
  std::string content_hash;  // the encoder cache key
  int64_t num_patches = 0;   // rows of its pixel values: its cost against the encoder budget
  int64_t pad_begin = 0;     // tokens[pad_begin, pad_end) are its placeholder tokens
  int64_t pad_end = 0;
  bool attached = false;     // its embeddings are in hand (kept across preemption)
};

struct Sequence {
  virtual ~Sequence() = default;  // owned by the scheduler through unique_ptr<Sequence>

  std::string id;                // the request id (unique among requests in flight)
  int64_t prompt_len = 0;
  std::vector<int32_t> tokens;   // prompt, then generated ids
  int64_t num_computed = 0;      // leading tokens whose k/v are in the cache
  llm::BlockTable table;
  std::vector<SequenceImage> images;
  SequenceState state = SequenceState::kWaiting;
  // Prefix caching: the keys of its full blocks (of known tokens), and how many leading blocks of
  // its table the cache already knows (matched at admission or registered once computed).
  std::vector<llm::BlockHash> block_hashes;
  int64_t num_registered_blocks = 0;

  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - num_computed; }
  bool in_decode() const { return num_computed >= prompt_len; }
  // An image whose tokens all lie in the computed (or cached) prefix has no rows left to compute.
  bool needs_image(const SequenceImage& im) const { return !im.attached && im.pad_end > num_computed; }
  bool needs_images() const {
    for (const SequenceImage& im : images) {
      if (needs_image(im)) return true;
    }
    return false;
  }
};

}  // namespace iris::engine
