// The scheduler: owns the waiting queue and the running set and their KV blocks, and decides each
// step's work as a plain-data StepPlan. Knows nothing of the model: what it runs and what comes of
// it is the StepRunner's and the engine's business. Engine thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/encoder_cache.h"
#include "engine/sequence.h"
#include "llm/kv_cache.h"

namespace iris::engine {

struct SchedulerOptions {
  int64_t max_num_batched_tokens = 2048;  // decoder rows per step
  int max_num_seqs = 64;                  // running at once
  int64_t max_encoder_patches_per_step = 16384;  // one image alone may exceed it
  // On: an image is encoded by a job that runs in pieces over several steps while its request
  // waits, and the request is admitted once its embeddings are in hand. Off: images are encoded
  // whole, in the step that admits their request.
  bool interleave_encoder = true;
  bool enable_prefix_caching = true;  // admitted sequences share cached blocks of their prefix
};

// What one step may spend beyond the running requests' decode rows (from engine::StepBudget).
struct StepAllowance {
  int64_t prefill_tokens = INT64_MAX;  // rows of prefill chunks (and recomputes), admissions included
};

// What is left to do, for sizing the next step: decode rows, and whether prefill or encoder work
// is pending.
struct PendingWork {
  int64_t decode_rows = 0;
  bool prefill = false;  // a running sequence in prefill, or a waiting one whose images are in hand
  bool encoder = false;  // an encode job in flight, or a waiting sequence whose images are not
};

// One sequence's rows in this step's decoder forward: tokens [start, start + num_tokens).
struct ScheduledWork {
  Sequence* seq = nullptr;
  int64_t start = 0;       // seq->num_computed when scheduled
  int64_t num_tokens = 0;
  bool is_prefill = false;  // starts inside the prompt (else a decode, or the recompute of generated ids)
  bool samples = false;     // reaches the last known token: its logits are wanted and a token is sampled
};

// An image to encode this step: not in the encoder cache, listed once however many carry it.
struct ImageToEncode {
  std::string content_hash;
  int64_t num_patches = 0;
  Sequence* source = nullptr;  // the first admitted sequence carrying it: source->images[index]
  size_t index = 0;
  std::vector<Sequence*> sequences;  // admitted sequences that carry it, in admission order
};

struct StepPlan {
  // Decoder rows in order: running decodes, running prefill chunks, then admitted sequences.
  std::vector<ScheduledWork> work;
  // Encoder off (interleave_encoder false): encoded together in one forward before the decoder
  // runs, for the admitted sequences. On: the images of a new encode job, started this step for
  // the waiting sequences listed with them (which are admitted in a later step).
  std::vector<ImageToEncode> images;
  std::vector<Sequence*> admitted;    // waiting → running this step, first come first served
  std::vector<Sequence*> preempted;   // running → front of the waiting queue, blocks freed
  // Prefix caching, over this step's admissions: tokens looked up, and of them found cached.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;

  bool empty() const { return work.empty() && admitted.empty(); }
  int64_t num_tokens() const;
};

class Scheduler {
 public:
  // `cache` (blocks) and `encoder_cache` (only asked what it holds) outlive the scheduler.
  Scheduler(const SchedulerOptions& options, llm::KvCache* cache, const EncoderCache* encoder_cache);

  // Appends to the waiting queue.
  void Add(std::unique_ptr<Sequence> seq);

  // Plans one step. Running sequences first — decodes, then prefill chunks — within the token
  // budget; when blocks run out the newest running sequence is preempted (recomputed later). Then,
  // unless something was preempted, waiting sequences first come first served while max_num_seqs,
  // the token budget, free blocks and the encoder patch budget allow; the first that does not fit
  // stops admission. Blocks for every planned row are reserved here; the caller advances
  // num_computed after the forward.
  StepPlan Schedule(const StepAllowance& allowance = {});

  // Interleaved encoding: the encode job the last plan started has ended (done, failed or
  // abandoned); the next Schedule may start another.
  void EndEncodeJob() { encoding_.clear(); }
  bool encoding() const { return !encoding_.empty(); }
  PendingWork Pending() const;

  // Takes `seq` out of the queues (waiting or running), frees its blocks and marks it finished.
  // Returns its ownership: keep it alive until its last output is delivered.
  std::unique_ptr<Sequence> Finish(Sequence* seq);

  // After seq->num_computed advanced: its newly computed full blocks join the prefix cache.
  void BlocksComputed(Sequence* seq);

  Sequence* Find(std::string_view id) const;  // running or waiting; null when neither
  // Running in admission order, then waiting in queue order.
  std::vector<Sequence*> sequences() const;

  bool empty() const { return waiting_.empty() && running_.empty(); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  const llm::KvCache& cache() const { return *cache_; }

 private:
  void ScheduleRunning(StepPlan& plan, int64_t& budget, int64_t& prefill_budget);
  void Admit(StepPlan& plan, int64_t budget, int64_t prefill_budget);
  // Interleaved: whether `seq` may be admitted as far as its images go (in hand, or all cached).
  bool ImagesReady(const Sequence& seq) const;
  // Interleaved: a new encode job over the first waiting sequences whose images are not ready.
  void PlanEncodeJob(StepPlan& plan);
  void Preempt(Sequence* seq, StepPlan& plan);
  // Prefix caching at admission: a waiting sequence without blocks takes the cached blocks of its
  // prefix and starts after them (the tokens matched; 0 when switched off).
  int64_t MatchCachedPrefix(Sequence* seq);
  // Lets go of seq's blocks (matched, reserved or computed) and of its progress.
  void ReleaseBlocks(Sequence* seq);
  static ScheduledWork Work(Sequence* seq, int64_t n);

  SchedulerOptions options_;
  llm::KvCache* cache_;
  const EncoderCache* encoder_cache_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // oldest first: the back is preempted first
  std::vector<std::string> encoding_;  // content hashes of the encode job in flight
};

}  // namespace iris::engine
