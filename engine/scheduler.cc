#include "engine/scheduler.h"

#include <algorithm>
#include <utility>

#include "engine/prefix_cache.h"

namespace iris::engine {

int64_t StepPlan::num_tokens() const {
  int64_t n = 0;
  for (const ScheduledWork& w : work) n += w.num_tokens;
  return n;
}

Scheduler::Scheduler(const SchedulerOptions& options, llm::KvCache* cache, const EncoderCache* encoder_cache)
    : options_(options), cache_(cache), encoder_cache_(encoder_cache) {}

void Scheduler::Add(std::unique_ptr<Sequence> seq) {
  seq->state = SequenceState::kWaiting;
  waiting_.push_back(std::move(seq));
}

StepPlan Scheduler::Schedule(const StepAllowance& allowance) {
  StepPlan plan;
  int64_t budget = options_.max_num_batched_tokens;
  int64_t prefill_budget = std::max<int64_t>(1, allowance.prefill_tokens);
  ScheduleRunning(plan, budget, prefill_budget);
  // After a preemption blocks are short: let the running sequences finish first.
  if (plan.preempted.empty()) Admit(plan, budget, prefill_budget);
  if (options_.interleave_encoder && encoding_.empty()) PlanEncodeJob(plan);
  return plan;
}

PendingWork Scheduler::Pending() const {
  PendingWork p;
  for (const auto& s : running_) {
    if (s->remaining() == 1) {
      ++p.decode_rows;
    } else if (s->remaining() > 1) {
      p.prefill = true;
    }
  }
  p.encoder = !encoding_.empty();
  for (const auto& s : waiting_) {
    if (!options_.interleave_encoder || ImagesReady(*s)) {
      p.prefill = true;
    } else {
      p.encoder = true;
    }
  }
  return p;
}

bool Scheduler::ImagesReady(const Sequence& seq) const {
  return std::all_of(seq.images.begin(), seq.images.end(), [&](const SequenceImage& im) {
    return !seq.needs_image(im) || encoder_cache_->Contains(im.content_hash);
  });
}

void Scheduler::PlanEncodeJob(StepPlan& plan) {
  int64_t patches = 0;
  // Looks ahead at most as far as could run at once: embeddings made for requests far back in the
  // queue would only wait (and hold memory).
  const size_t horizon = std::min(waiting_.size(), static_cast<size_t>(options_.max_num_seqs));
  for (size_t i = 0; i < horizon; ++i) {
    Sequence* seq = waiting_[i].get();
    if (!seq->needs_images()) continue;
    std::vector<size_t> fresh;
    int64_t need = 0;
    for (size_t j = 0; j < seq->images.size(); ++j) {
      if (!seq->needs_image(seq->images[j])) continue;
      const std::string& hash = seq->images[j].content_hash;
      const bool planned = std::any_of(plan.images.begin(), plan.images.end(),
                                       [&](const ImageToEncode& im) { return im.content_hash == hash; });
      const bool seen = std::any_of(fresh.begin(), fresh.end(),
                                    [&](size_t k) { return seq->images[k].content_hash == hash; });
      if (encoder_cache_->Contains(hash) || planned || seen) continue;
      fresh.push_back(j);
      need += seq->images[j].num_patches;
    }
    if (need > 0 && patches > 0 && patches + need > options_.max_encoder_patches_per_step) break;
    patches += need;
    for (size_t j : fresh) {
      plan.images.push_back(ImageToEncode{seq->images[j].content_hash, seq->images[j].num_patches, seq, j, {}});
      encoding_.push_back(seq->images[j].content_hash);
    }
    // Every planned image this sequence carries lists it (it gets its embeddings at the job's end).
    for (const SequenceImage& im : seq->images) {
      if (!seq->needs_image(im)) continue;
      for (ImageToEncode& planned : plan.images) {
        if (planned.content_hash == im.content_hash &&
            (planned.sequences.empty() || planned.sequences.back() != seq)) {
          planned.sequences.push_back(seq);
        }
      }
    }
  }
}

ScheduledWork Scheduler::Work(Sequence* seq, int64_t n) {
  return ScheduledWork{seq, seq->num_computed, n, seq->num_computed < seq->prompt_len,
                       seq->num_computed + n == static_cast<int64_t>(seq->tokens.size())};
}

void Scheduler::ScheduleRunning(StepPlan& plan, int64_t& budget, int64_t& prefill_budget) {
  // Decodes first (they keep everyone's tokens flowing), then prefill chunks.
  for (const bool decodes : {true, false}) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence* seq = running_[i].get();
      if (seq->in_decode() != decodes) continue;
      const bool chunk = seq->remaining() > 1;  // a prefill chunk or a recompute, not one decode row
      if (chunk && prefill_budget <= 0) continue;
      const int64_t n = std::min({seq->remaining(), budget, chunk ? prefill_budget : int64_t{1}});
      bool placed = true;
      while (!cache_->Reserve(&seq->table, seq->num_computed + n).ok()) {
        // The newest running sequence gives its blocks back (and its rows, if already planned).
        Sequence* victim = running_.back().get();
        auto it = std::find_if(plan.work.begin(), plan.work.end(), [&](const auto& w) { return w.seq == victim; });
        if (it != plan.work.end()) {
          budget += it->num_tokens;
          if (it->seq->remaining() > 1) prefill_budget += it->num_tokens;
          plan.work.erase(it);
        }
        Preempt(victim, plan);
        if (victim == seq) {
          placed = false;
          break;
        }
      }
      if (!placed) break;  // seq itself was the newest: it waits; everything before it is placed
      plan.work.push_back(Work(seq, n));
      budget -= n;
      if (chunk) prefill_budget -= n;
    }
  }
}

void Scheduler::Preempt(Sequence* seq, StepPlan& plan) {
  ReleaseBlocks(seq);
  seq->state = SequenceState::kWaiting;
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == seq; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
  plan.preempted.push_back(seq);
}

void Scheduler::ReleaseBlocks(Sequence* seq) {
  cache_->Release(&seq->table);
  seq->num_computed = 0;
  seq->num_registered_blocks = 0;
}

int64_t Scheduler::MatchCachedPrefix(Sequence* seq) {
  if (!options_.enable_prefix_caching) return 0;
  return AttachCachedPrefix(*seq, *cache_);
}

void Scheduler::BlocksComputed(Sequence* seq) {
  if (options_.enable_prefix_caching) RegisterComputedBlocks(*seq, *cache_);
}

void Scheduler::Admit(StepPlan& plan, int64_t budget, int64_t prefill_budget) {
  int64_t patches = 0;
  auto planned = [&](const std::string& hash) {
    return std::find_if(plan.images.begin(), plan.images.end(),
                        [&](const ImageToEncode& im) { return im.content_hash == hash; });
  };
  while (!waiting_.empty() && num_running() < options_.max_num_seqs && budget > 0) {
    Sequence* seq = waiting_.front().get();
    const int64_t matched = MatchCachedPrefix(seq);  // before the images: those it covers are not needed
    // Interleaved: first come first served, so a request whose images are not ready holds back
    // the ones behind it (its job is planned or running).
    const bool chunk = seq->remaining() > 1;
    if ((options_.interleave_encoder && !ImagesReady(*seq)) || (chunk && prefill_budget <= 0)) {
      ReleaseBlocks(seq);  // the matched prefix, if any: it waits without blocks
      break;
    }
    // Its images that would join this step's encoder batch: not cached, not planned already.
    std::vector<size_t> fresh;
    int64_t need = 0;
    if (seq->needs_images() && !options_.interleave_encoder) {
      for (size_t j = 0; j < seq->images.size(); ++j) {
        const SequenceImage& im = seq->images[j];
        if (!seq->needs_image(im)) continue;
        const bool seen = std::any_of(fresh.begin(), fresh.end(),
                                      [&](size_t k) { return seq->images[k].content_hash == im.content_hash; });
        if (encoder_cache_->Contains(im.content_hash) || planned(im.content_hash) != plan.images.end() || seen) {
          continue;
        }
        fresh.push_back(j);
        need += im.num_patches;
      }
    }
    const int64_t n = std::min({seq->remaining(), budget, chunk ? prefill_budget : int64_t{1}});
    if ((need > 0 && patches > 0 && patches + need > options_.max_encoder_patches_per_step) ||
        !cache_->Reserve(&seq->table, seq->num_computed + n).ok()) {
      ReleaseBlocks(seq);  // the matched prefix, if any: it waits without blocks
      break;
    }
    plan.prefix_cache_queries += static_cast<int64_t>(seq->tokens.size());
    plan.prefix_cache_hits += matched;

    patches += need;
    for (size_t j : fresh) {
      plan.images.push_back(
          ImageToEncode{seq->images[j].content_hash, seq->images[j].num_patches, seq, j, {}});
    }
    if (seq->needs_images()) {
      for (const SequenceImage& im : seq->images) {
        if (!seq->needs_image(im)) continue;
        auto it = planned(im.content_hash);
        if (it != plan.images.end() && (it->sequences.empty() || it->sequences.back() != seq)) {
          it->sequences.push_back(seq);
        }
      }
    }
    plan.work.push_back(Work(seq, n));
    budget -= n;
    if (chunk) prefill_budget -= n;
    plan.admitted.push_back(seq);
    seq->state = SequenceState::kRunning;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

std::unique_ptr<Sequence> Scheduler::Finish(Sequence* seq) {
  std::unique_ptr<Sequence> owned;
  auto match = [&](const std::unique_ptr<Sequence>& s) { return s.get() == seq; };
  if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
    owned = std::move(*it);
    running_.erase(it);
  } else if (auto wt = std::find_if(waiting_.begin(), waiting_.end(), match); wt != waiting_.end()) {
    owned = std::move(*wt);
    waiting_.erase(wt);
  }
  ReleaseBlocks(seq);
  seq->state = SequenceState::kFinished;
  return owned;
}

Sequence* Scheduler::Find(std::string_view id) const {
  for (const auto& s : running_) {
    if (s->id == id) return s.get();
  }
  for (const auto& s : waiting_) {
    if (s->id == id) return s.get();
  }
  return nullptr;
}

std::vector<Sequence*> Scheduler::sequences() const {
  std::vector<Sequence*> out;
  for (const auto& s : running_) out.push_back(s.get());
  for (const auto& s : waiting_) out.push_back(s.get());
  return out;
}

}  // namespace iris::engine
