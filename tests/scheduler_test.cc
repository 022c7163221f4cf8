// The scheduler without a model: scripted arrivals against small budgets and a KV cache of a few
// blocks, checking each step's plan — decodes before prefill chunks, chunk sizes, first come first
// served admission stopping at each budget, images deduplicated and skipped when cached,
// preemption of the newest running sequence (and no admission in that step), cancellation freeing
// blocks — and a long randomized run that must end with every block free. Prefix caching: a
// chat's next turn shares the blocks turn 1 computed and skips the image inside them, another
// image shares nothing, the last token and the partial block stay the sequence's own, an image
// straddling the match is encoded, and a randomized run over a fake KV store (shared prefixes,
// cancel, preemption) never writes a shared block and ends with every reference count zero.
#include "engine/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace iris::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class SchedulerTest : public ::testing::Test {
 protected:
  // A cache of `blocks` blocks of `block_size` tokens (pools of one float per token and layer).
  void Init(const SchedulerOptions& options, int64_t blocks, int block_size = 4,
            int64_t encoder_cache_bytes = 1 << 20) {
    encoder_cache_ = EncoderCache(encoder_cache_bytes);
    interleave_ = options.interleave_encoder;
    auto cache = llm::KvCache::Create(llm::KvCacheShape{.num_layers = 1, .num_kv_heads = 1, .head_dim = 1,
                                                        .block_size = block_size, .num_blocks = blocks});
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::make_unique<llm::KvCache>(std::move(*cache));
    scheduler_ = std::make_unique<Scheduler>(options, cache_.get(), &encoder_cache_);
  }

  // A new request of `prompt_len` tokens that will generate `max_new` tokens.
  Sequence* Add(const std::string& id, int64_t prompt_len, std::vector<SequenceImage> images = {},
                int64_t max_new = 1000) {
    auto seq = std::make_unique<Sequence>();
    seq->id = id;
    seq->prompt_len = prompt_len;
    seq->tokens.assign(static_cast<size_t>(prompt_len), 7);
    seq->images = std::move(images);
    for (SequenceImage& im : seq->images) {
      if (im.pad_end == 0) im.pad_end = prompt_len;  // unplaced: spans the prompt
    }
    Sequence* raw = seq.get();
    max_new_[raw] = max_new;
    scheduler_->Add(std::move(seq));
    return raw;
  }

  // Plays the runner and the output processing: images encoded into the cache and attached,
  // the planned rows computed, a token appended for each row that samples, sequences that
  // reached max_new finished.
  void Complete(const StepPlan& plan) {
    if (!plan.images.empty() && scheduler_->encoding()) {
      job_ = plan.images;  // interleaved: a job started; EndJob finishes it
    } else {
      for (const ImageToEncode& im : plan.images) {
        encoder_cache_.Insert(im.content_hash, Embeddings());
      }
    }
    for (Sequence* seq : plan.admitted) {
      if (interleave_ && seq->needs_images()) {  // (whole: its images may be in this plan's batch)
        for (const SequenceImage& im : seq->images) {
          if (!seq->needs_image(im)) continue;
          EXPECT_TRUE(encoder_cache_.Contains(im.content_hash)) << seq->id << " admitted without its images";
        }
      }
    }
    for (Sequence* seq : plan.admitted) {
      for (SequenceImage& im : seq->images) im.attached = im.attached || seq->needs_image(im);
    }
    for (const ScheduledWork& w : plan.work) {
      ASSERT_EQ(w.start, w.seq->num_computed) << w.seq->id;
      w.seq->num_computed += w.num_tokens;
      scheduler_->BlocksComputed(w.seq);
      if (!w.samples) continue;
      w.seq->tokens.push_back(1);
      if (static_cast<int64_t>(w.seq->tokens.size()) - w.seq->prompt_len >= max_new_[w.seq]) Finish(w.seq);
    }
  }

  // Plays the runner at the end of an interleaved encode job: embeddings into the cache and to the
  // waiting sequences it was for that are still there.
  void EndJob() {
    for (const ImageToEncode& im : job_) encoder_cache_.Insert(im.content_hash, Embeddings());
    for (const ImageToEncode& im : job_) {
      for (Sequence* seq : im.sequences) {
        if (scheduler_->Find(seq->id) != seq) continue;
        for (SequenceImage& own : seq->images) own.attached = own.attached || own.content_hash == im.content_hash;
      }
    }
    job_.clear();
    scheduler_->EndEncodeJob();
  }

  void Finish(Sequence* seq) {
    std::unique_ptr<Sequence> owned = scheduler_->Finish(seq);
    ASSERT_EQ(owned.get(), seq);
    EXPECT_EQ(seq->state, SequenceState::kFinished);
    EXPECT_TRUE(seq->table.blocks.empty());
    finished_.push_back(std::move(owned));
  }

  static std::shared_ptr<const core::Tensor> Embeddings() {
    return std::make_shared<const core::Tensor>(core::Tensor::Empty(core::DType::kF32, {2, 4}));
  }

  int64_t used() const { return cache_->allocator().num_used(); }

  // A new request with the given prompt tokens (prefix-caching tests).
  Sequence* AddTokens(const std::string& id, std::vector<int32_t> tokens, std::vector<SequenceImage> images = {},
                      int64_t max_new = 1000) {
    Sequence* seq = Add(id, static_cast<int64_t>(tokens.size()), std::move(images), max_new);
    seq->tokens = std::move(tokens);
    return seq;
  }

  // Schedules and completes steps until nothing is left.
  void RunToEnd() {
    for (int i = 0; i < 1000 && !scheduler_->empty(); ++i) Complete(scheduler_->Schedule());
    ASSERT_TRUE(scheduler_->empty());
  }

  std::unique_ptr<llm::KvCache> cache_;
  EncoderCache encoder_cache_{0};
  std::unique_ptr<Scheduler> scheduler_;
  std::map<const Sequence*, int64_t> max_new_;
  std::vector<std::unique_ptr<Sequence>> finished_;
  std::vector<ImageToEncode> job_;  // the interleaved encode job in flight
  bool interleave_ = false;
};

// The plan's rows as "id:rows" with p for a prefill chunk, d for a decode and * when it samples.
std::vector<std::string> Rows(const StepPlan& plan) {
  std::vector<std::string> out;
  for (const ScheduledWork& w : plan.work) {
    out.push_back(absl::StrCat(w.seq->id, ":", w.num_tokens, w.is_prefill ? "p" : "d", w.samples ? "*" : ""));
  }
  return out;
}

std::vector<std::string> Ids(const std::vector<Sequence*>& seqs) {
  std::vector<std::string> out;
  for (const Sequence* s : seqs) out.push_back(s->id);
  return out;
}

// interleave false: images encoded whole in the admitting step (the plans most tests check).
// Prefix caching off: these requests' prompts are all alike (token 7).
SchedulerOptions Options(int64_t tokens, int seqs = 64, int64_t patches = 16384, bool interleave = false) {
  return SchedulerOptions{tokens, seqs, patches, interleave, /*enable_prefix_caching=*/false};
}

TEST_F(SchedulerTest, ChunkedPrefillAndDecodesFirst) {
  Init(Options(8), 64);
  Sequence* a = Add("A", 3);
  Sequence* b = Add("B", 20);

  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:3p*", "B:5p"));
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("A", "B"));
  EXPECT_EQ(plan.num_tokens(), 8);
  EXPECT_EQ(a->state, SequenceState::kRunning);
  EXPECT_EQ(b->table.num_tokens, 5);  // blocks are reserved for the planned rows
  EXPECT_EQ(used(), 1 + 2);
  Complete(plan);

  // The decode goes first and the prefill takes what is left of the budget.
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:7p"));
  EXPECT_EQ(plan.work[0].start, 3);
  EXPECT_EQ(plan.work[1].start, 5);
  Complete(plan);
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:7p"));
  Complete(plan);
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:1p*"));  // the prompt's last token samples
  Complete(plan);
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:1d*"));
  EXPECT_THAT(plan.admitted, IsEmpty());
  EXPECT_THAT(plan.preempted, IsEmpty());
}

TEST_F(SchedulerTest, AdmissionStopsAtMaxNumSeqs) {
  Init(Options(64, /*seqs=*/2), 64);
  Sequence* a = Add("A", 2);
  Add("B", 2);
  Add("C", 2);
  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("A", "B"));
  EXPECT_EQ(scheduler_->num_running(), 2);
  EXPECT_EQ(scheduler_->num_waiting(), 1);
  Complete(plan);
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:1d*"));
  Complete(plan);
  Finish(a);
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("B:1d*", "C:2p*"));
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("C"));
}

TEST_F(SchedulerTest, AdmissionStopsAtTokenBudget) {
  Init(Options(10), 64);
  Add("A", 6);
  Add("B", 6);
  Add("C", 1);
  StepPlan plan = scheduler_->Schedule();
  // B gets the rest of the budget as a chunk; C waits though it is small.
  EXPECT_THAT(Rows(plan), ElementsAre("A:6p*", "B:4p"));
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("A", "B"));
  Complete(plan);
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:2p*", "C:1p*"));
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("C"));
}

TEST_F(SchedulerTest, AdmissionStopsAtFreeBlocksFirstComeFirstServed) {
  Init(Options(64), 5);  // 5 blocks of 4 tokens
  Sequence* a = Add("A", 10);  // 3 blocks
  Add("B", 9);                 // 3 blocks: does not fit beside A
  Add("C", 2);                 // 1 block: would fit, but B is first
  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("A"));
  EXPECT_EQ(used(), 3);
  EXPECT_EQ(scheduler_->num_waiting(), 2);
  Complete(plan);
  Finish(a);  // e.g. cancelled
  EXPECT_EQ(used(), 0);
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("B:9p*", "C:2p*"));
  EXPECT_EQ(used(), 4);
}

TEST_F(SchedulerTest, EncoderPatchBudget) {
  Init(Options(1000, 64, /*patches=*/100), 256);
  Add("A", 10, {{"h1", 64}});
  Add("B", 10, {{"h2", 64}});
  Add("D", 10, {{"h1", 64}});  // h1 is encoded with A: costs nothing more
  Add("C", 10, {{"h3", 200}});
  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("A"));  // 64 + 64 > 100 stops B, and D behind it
  ASSERT_EQ(plan.images.size(), 1u);
  EXPECT_EQ(plan.images[0].content_hash, "h1");
  Complete(plan);

  plan = scheduler_->Schedule();
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("B", "D"));  // D's image is in the cache now
  ASSERT_EQ(plan.images.size(), 1u);
  EXPECT_EQ(plan.images[0].content_hash, "h2");
  EXPECT_THAT(Ids(plan.images[0].sequences), ElementsAre("B"));
  Complete(plan);

  // One image over the budget is encoded alone.
  plan = scheduler_->Schedule();
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("C"));
  ASSERT_EQ(plan.images.size(), 1u);
  EXPECT_EQ(plan.images[0].num_patches, 200);
}

TEST_F(SchedulerTest, ImagesDeduplicatedAcrossRequestsAndSkippedWhenCached) {
  Init(Options(1000), 256);
  encoder_cache_.Insert("h3", Embeddings());
  Sequence* a = Add("A", 20, {{"h1", 16}, {"h2", 8}, {"h1", 16}});
  Add("B", 20, {{"h1", 16}});
  Add("C", 20, {{"h3", 32}});
  Sequence* d = Add("D", 20, {{"h2", 8}, {"h4", 4}});
  Add("E", 20);
  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("A", "B", "C", "D", "E"));
  ASSERT_EQ(plan.images.size(), 3u);
  EXPECT_EQ(plan.images[0].content_hash, "h1");
  EXPECT_EQ(plan.images[0].source, a);
  EXPECT_EQ(plan.images[0].index, 0u);
  EXPECT_THAT(Ids(plan.images[0].sequences), ElementsAre("A", "B"));
  EXPECT_EQ(plan.images[1].content_hash, "h2");
  EXPECT_THAT(Ids(plan.images[1].sequences), ElementsAre("A", "D"));
  EXPECT_EQ(plan.images[2].content_hash, "h4");
  EXPECT_EQ(plan.images[2].source, d);
  EXPECT_EQ(plan.images[2].index, 1u);
  EXPECT_THAT(Ids(plan.images[2].sequences), ElementsAre("D"));
}

TEST_F(SchedulerTest, PreemptsTheNewestAndAdmitsNothingThatStep) {
  Init(Options(64), 5);  // 5 blocks of 4 tokens
  Sequence* a = Add("A", 4);  // 1 block
  Sequence* b = Add("B", 4);  // 1 block
  Sequence* c = Add("C", 8, {{"h1", 16}});  // 2 blocks
  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("A", "B", "C"));
  EXPECT_EQ(used(), 4);
  Complete(plan);
  Add("D", 1);  // would fit once C's blocks are back

  // A takes the last free block; B needs one more: C, the newest, is preempted.
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:1d*"));
  EXPECT_THAT(Ids(plan.preempted), ElementsAre("C"));
  EXPECT_THAT(plan.admitted, IsEmpty());  // nothing is admitted in a step that preempted
  EXPECT_EQ(c->state, SequenceState::kWaiting);
  EXPECT_EQ(c->num_computed, 0);
  EXPECT_TRUE(c->table.blocks.empty());
  EXPECT_EQ(used(), 4);
  EXPECT_THAT(Ids(scheduler_->sequences()), ElementsAre("A", "B", "C", "D"));  // C at the queue's front
  Complete(plan);

  // C (prompt + 1 generated token: 3 blocks) does not fit yet, and D stays behind it.
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:1d*"));
  EXPECT_THAT(plan.admitted, IsEmpty());
  Complete(plan);
  Finish(a);
  Finish(b);

  // Recomputed with its generated token; its image embeddings were kept, so nothing to encode.
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("C:9p*", "D:1p*"));
  EXPECT_EQ(plan.work[0].start, 0);
  EXPECT_THAT(plan.images, IsEmpty());
}

TEST_F(SchedulerTest, NewestPreemptsItselfAndWaitsOutTheStep) {
  Init(Options(5), 3);  // 3 blocks of 4 tokens
  Sequence* a = Add("A", 4);
  Sequence* v = Add("V", 7);
  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:4p*", "V:1p"));
  Complete(plan);
  // A's decode takes the last free block; V's next chunk needs one more and V is the newest.
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*"));
  EXPECT_THAT(Ids(plan.preempted), ElementsAre("V"));
  EXPECT_EQ(v->state, SequenceState::kWaiting);
  EXPECT_EQ(used(), 2);
  // A chunk of V would fit the block it gave back, but not in the step that preempted it.
  EXPECT_THAT(plan.admitted, IsEmpty());
  Complete(plan);
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "V:4p"));
  EXPECT_EQ(a->table.blocks.size(), 2u);
}

TEST_F(SchedulerTest, CancellingWaitingAndRunningFreesTheirBlocks) {
  Init(Options(6), 16);
  Sequence* a = Add("A", 10);
  Sequence* b = Add("B", 3);
  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("A:6p"));
  EXPECT_EQ(used(), 2);
  Complete(plan);
  EXPECT_EQ(scheduler_->Find("B"), b);
  Finish(b);  // waiting
  EXPECT_EQ(scheduler_->Find("B"), nullptr);
  EXPECT_EQ(scheduler_->num_waiting(), 0);
  Finish(a);  // running, mid-prefill
  EXPECT_EQ(scheduler_->Find("A"), nullptr);
  EXPECT_EQ(used(), 0);
  EXPECT_TRUE(scheduler_->empty());
  EXPECT_TRUE(scheduler_->Schedule().empty());
}

// Many requests arriving over time, with images, small budgets and a tight cache, some cancelled:
// every plan keeps the budgets and invariants, and at the end every block is free.
class SchedulerRandomizedTest : public SchedulerTest, public ::testing::WithParamInterface<bool> {};

TEST_P(SchedulerRandomizedTest, RandomizedRunEndsWithEveryBlockFree) {
  const bool interleave = GetParam();
  const SchedulerOptions options = Options(24, 5, 96, interleave);
  // 48 tokens: the largest request (40 + 8) fits alone. Room for two images' embeddings: the
  // others are evicted and encoded again.
  Init(options, 12, 4, 2 * static_cast<int64_t>(Embeddings()->nbytes()));
  std::mt19937 rng(1234);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::vector<SequenceImage> pool = {{"h1", 64}, {"h2", 32}, {"h3", 8}, {"h4", 120}};
  int added = 0, preemptions = 0, cancelled = 0;
  for (int step = 0; step < 5000 && (added < 60 || !scheduler_->empty()); ++step) {
    if (added < 60 && uniform(0, 2) == 0) {
      std::vector<SequenceImage> images;
      for (int k = uniform(0, 2); k > 0; --k) images.push_back(pool[uniform(0, 3)]);
      Add(absl::StrCat("r", added++), uniform(1, 40), images, uniform(1, 8));
    }
    if (uniform(0, 30) == 0 && !scheduler_->empty()) {
      std::vector<Sequence*> all = scheduler_->sequences();
      Finish(all[uniform(0, static_cast<int>(all.size()) - 1)]);
      ++cancelled;
    }
    // Interleaved: the job in flight ends after a random number of steps, and the prefill
    // allowance varies as a step budget would make it.
    if (interleave && scheduler_->encoding() && uniform(0, 2) == 0) EndJob();
    const int64_t allowance = interleave ? uniform(1, 30) : INT64_MAX;
    const bool was_encoding = scheduler_->encoding();
    StepPlan plan = scheduler_->Schedule(StepAllowance{allowance});
    if (was_encoding) {
      EXPECT_THAT(plan.images, IsEmpty()) << "a second job while one is in flight";
    }
    for (const Sequence* seq : plan.admitted) {
      if (interleave) {
        EXPECT_TRUE(std::find_if(plan.images.begin(), plan.images.end(), [&](const ImageToEncode& im) {
                      return std::find(im.sequences.begin(), im.sequences.end(), seq) != im.sequences.end();
                    }) == plan.images.end())
            << "admitted with its images still to encode";
      }
    }
    int64_t prefill_rows = 0;
    for (const ScheduledWork& w : plan.work) {
      if (w.seq->remaining() > 1) prefill_rows += w.num_tokens;
    }
    EXPECT_LE(prefill_rows, allowance);
    EXPECT_LE(plan.num_tokens(), options.max_num_batched_tokens);
    EXPECT_LE(scheduler_->num_running(), options.max_num_seqs);
    if (!plan.preempted.empty()) {
      EXPECT_THAT(plan.admitted, IsEmpty());
    }
    preemptions += static_cast<int>(plan.preempted.size());
    std::set<const Sequence*> seen;
    bool prefill_seen = false;
    const size_t running_rows = plan.work.size() - plan.admitted.size();
    for (size_t i = 0; i < plan.work.size(); ++i) {
      const ScheduledWork& w = plan.work[i];
      EXPECT_TRUE(seen.insert(w.seq).second) << "twice in one plan";
      EXPECT_EQ(w.seq->state, SequenceState::kRunning);
      EXPECT_GT(w.num_tokens, 0);
      EXPECT_EQ(w.seq->table.num_tokens, w.start + w.num_tokens);
      EXPECT_EQ(static_cast<int64_t>(w.seq->table.blocks.size()), cache_->BlocksFor(w.start + w.num_tokens));
      if (i < running_rows) {  // running sequences: decodes, then prefill chunks
        if (w.is_prefill) prefill_seen = true;
        EXPECT_FALSE(prefill_seen && !w.is_prefill) << "a decode after a prefill chunk";
      }
    }
    int64_t patches = 0;
    std::set<std::string> hashes;
    for (const ImageToEncode& im : plan.images) {
      EXPECT_TRUE(hashes.insert(im.content_hash).second);
      EXPECT_FALSE(encoder_cache_.Contains(im.content_hash));
      patches += im.num_patches;
    }
    if (patches > options.max_encoder_patches_per_step) {  // only one request's images may exceed it
      std::set<const Sequence*> sources;
      for (const ImageToEncode& im : plan.images) sources.insert(im.source);
      EXPECT_EQ(sources.size(), 1u);
    }
    int64_t held = 0;
    for (const Sequence* s : scheduler_->sequences()) held += static_cast<int64_t>(s->table.blocks.size());
    EXPECT_EQ(held, used());
    Complete(plan);
  }
  EXPECT_EQ(added, 60);
  EXPECT_TRUE(scheduler_->empty());
  EXPECT_EQ(used(), 0);
  EXPECT_GT(preemptions, 0) << "the cache was meant to be tight";
  EXPECT_GT(cancelled, 0);
}

INSTANTIATE_TEST_SUITE_P(EncoderMode, SchedulerRandomizedTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "interleaved" : "whole"; });

// Interleaved: an image is encoded by a job while its request waits; first come first served holds
// the text-only request behind it; no second job starts while one is in flight; once the job ends
// both are admitted without encoding anything in that step.
TEST_F(SchedulerTest, InterleavedRequestWaitsForItsEncodeJob) {
  Init(Options(64, 64, 16384, /*interleave=*/true), 64);
  Sequence* a = Add("A", 10, {{"h1", 64}});
  Add("B", 5);
  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(plan.admitted, IsEmpty());
  ASSERT_EQ(plan.images.size(), 1u);
  EXPECT_EQ(plan.images[0].content_hash, "h1");
  EXPECT_THAT(Ids(plan.images[0].sequences), ElementsAre("A"));
  EXPECT_TRUE(scheduler_->encoding());
  EXPECT_EQ(used(), 0);
  Complete(plan);
  PendingWork pending = scheduler_->Pending();
  EXPECT_TRUE(pending.encoder);
  EXPECT_TRUE(pending.prefill);  // B is ready
  EXPECT_EQ(pending.decode_rows, 0);

  plan = scheduler_->Schedule();  // the job still runs
  EXPECT_THAT(plan.admitted, IsEmpty());
  EXPECT_THAT(plan.images, IsEmpty());
  Complete(plan);
  EndJob();
  EXPECT_FALSE(a->needs_images());
  plan = scheduler_->Schedule();
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("A", "B"));
  EXPECT_THAT(plan.images, IsEmpty());
  Complete(plan);
  pending = scheduler_->Pending();
  EXPECT_FALSE(pending.encoder);
  EXPECT_FALSE(pending.prefill);
  EXPECT_EQ(pending.decode_rows, 2);
}

// A job looks ahead through the waiting queue within the patch budget, lists every sequence that
// carries each image, and skips cached images.
TEST_F(SchedulerTest, InterleavedJobLooksAheadWithinThePatchBudget) {
  Init(Options(64, 64, /*patches=*/150, /*interleave=*/true), 64);
  encoder_cache_.Insert("cached", Embeddings());
  Add("A", 10, {{"h1", 64}, {"cached", 8}});
  Add("B", 10, {{"h2", 64}});
  Add("C", 10, {{"h1", 64}});
  Add("D", 10, {{"h3", 64}});  // 64 * 3 > 150: the next job's
  StepPlan plan = scheduler_->Schedule();
  ASSERT_EQ(plan.images.size(), 2u);
  EXPECT_EQ(plan.images[0].content_hash, "h1");
  EXPECT_THAT(Ids(plan.images[0].sequences), ElementsAre("A", "C"));
  EXPECT_EQ(plan.images[1].content_hash, "h2");
  EXPECT_THAT(Ids(plan.images[1].sequences), ElementsAre("B"));
  Complete(plan);
  EndJob();
  plan = scheduler_->Schedule();
  EXPECT_THAT(Ids(plan.admitted), ElementsAre("A", "B", "C"));
  ASSERT_EQ(plan.images.size(), 1u);  // the next job starts in the same step
  EXPECT_EQ(plan.images[0].content_hash, "h3");
}

// The step allowance caps prefill rows (running chunks and admissions) but never a decode row.
TEST_F(SchedulerTest, PrefillAllowanceCapsChunksNotDecodes) {
  Init(Options(64), 64);
  Add("A", 2);
  Add("B", 30);
  StepPlan plan = scheduler_->Schedule(StepAllowance{12});
  EXPECT_THAT(Rows(plan), ElementsAre("A:2p*", "B:10p"));
  Complete(plan);
  Add("C", 4);
  plan = scheduler_->Schedule(StepAllowance{5});
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:5p"));  // C waits: the allowance is spent
  EXPECT_THAT(plan.admitted, IsEmpty());
  Complete(plan);
  plan = scheduler_->Schedule(StepAllowance{1});
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:1p"));
  Complete(plan);
  plan = scheduler_->Schedule(StepAllowance{100});
  EXPECT_THAT(Rows(plan), ElementsAre("A:1d*", "B:14p*", "C:4p*"));
}

SchedulerOptions PrefixCachingOptions(int64_t tokens, int seqs = 64, int64_t patches = 16384) {
  return SchedulerOptions{tokens, seqs, patches, /*interleave_encoder=*/false, /*enable_prefix_caching=*/true};
}

std::vector<int32_t> Iota(int n, int32_t first = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

// Turn 2 of a chat = turn 1's prompt + reply + new text, same image: it starts after every block
// turn 1 computed, sharing them, and needs no embeddings for the image inside that prefix (the
// encoder cache keeps nothing here, so a lookup would have to encode it again).
TEST_F(SchedulerTest, PrefixCacheHitOnTheNextTurnSkipsTheCoveredImage) {
  Init(PrefixCachingOptions(64), 32, 4, /*encoder_cache_bytes=*/0);
  const SequenceImage h1{"h1", 16, 2, 10};
  Sequence* a = AddTokens("A", Iota(22), {h1}, /*max_new=*/3);
  StepPlan plan = scheduler_->Schedule();
  EXPECT_EQ(plan.prefix_cache_hits, 0);
  EXPECT_EQ(plan.prefix_cache_queries, 22);
  Complete(plan);
  plan = scheduler_->Schedule();
  Complete(plan);
  // A has computed 22 + 1 tokens: 5 full blocks, registered.
  const std::vector<int32_t> a_blocks = a->table.blocks;
  std::vector<int32_t> turn2 = a->tokens;
  RunToEnd();  // A's third token; 24 computed (6 blocks) when it finishes
  EXPECT_EQ(turn2.size(), 24u);
  turn2.push_back(1);  // A's last token
  for (int32_t t : {100, 101, 102, 103, 104}) turn2.push_back(t);
  EXPECT_EQ(cache_->allocator().num_used(), 0);
  EXPECT_EQ(cache_->allocator().num_cached(), 6);

  Sequence* b = AddTokens("B", turn2, {h1});
  plan = scheduler_->Schedule();
  ASSERT_THAT(Ids(plan.admitted), ElementsAre("B"));
  EXPECT_THAT(Rows(plan), ElementsAre("B:6p*"));
  EXPECT_EQ(plan.work[0].start, 24);
  EXPECT_EQ(plan.prefix_cache_hits, 24);
  EXPECT_EQ(plan.prefix_cache_queries, 30);
  EXPECT_THAT(plan.images, IsEmpty());
  EXPECT_FALSE(b->needs_images());
  ASSERT_EQ(b->table.blocks.size(), 8u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(b->table.blocks[i], a_blocks[i]) << i;
  Complete(plan);

  // The same text with another image shares nothing: the image's tokens start in block 0.
  Sequence* c = AddTokens("C", turn2, {{"h2", 16, 2, 10}});
  plan = scheduler_->Schedule();
  ASSERT_THAT(Ids(plan.admitted), ElementsAre("C"));
  EXPECT_EQ(plan.prefix_cache_hits, 0);
  ASSERT_EQ(plan.images.size(), 1u);
  EXPECT_EQ(plan.images[0].content_hash, "h2");
  for (int32_t blk : c->table.blocks) {
    EXPECT_EQ(cache_->allocator().ref_count(blk), 1) << "C holds block " << blk << " with another sequence";
  }
}

// A matched prefix always leaves the last prompt token to compute (it samples the first token),
// and the partially filled last block is the sequence's own.
TEST_F(SchedulerTest, PrefixCacheLeavesTheLastTokenAndThePartialBlockPrivate) {
  Init(PrefixCachingOptions(64), 16, 4);
  Sequence* a = AddTokens("A", Iota(8), {}, /*max_new=*/1);
  StepPlan plan = scheduler_->Schedule();
  const std::vector<int32_t> a_blocks = a->table.blocks;
  Complete(plan);  // A computed its 8 tokens (2 blocks) and finished
  Sequence* b = AddTokens("B", Iota(8), {}, 1);
  plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("B:4p*"));
  EXPECT_EQ(plan.prefix_cache_hits, 4);
  ASSERT_EQ(b->table.blocks.size(), 2u);
  EXPECT_EQ(b->table.blocks[0], a_blocks[0]);
  EXPECT_NE(b->table.blocks[1], a_blocks[1]);
  EXPECT_EQ(cache_->allocator().ref_count(b->table.blocks[1]), 1);
}

// An image that straddles the matched prefix still needs its embeddings: the normal encode path.
TEST_F(SchedulerTest, PrefixCacheImageStraddlingTheMatchIsEncoded) {
  Init(PrefixCachingOptions(8), 16, 4, /*encoder_cache_bytes=*/0);
  const SequenceImage h1{"h1", 16, 2, 18};
  Sequence* a = AddTokens("A", Iota(20), {h1});
  Complete(scheduler_->Schedule());  // 8 of A's tokens: 2 blocks registered
  Finish(a);                         // cancelled mid-prefill: its blocks stay cached
  Sequence* b = AddTokens("B", Iota(20), {h1});
  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("B:8p"));
  EXPECT_EQ(plan.work[0].start, 8);
  ASSERT_EQ(plan.images.size(), 1u);
  EXPECT_EQ(plan.images[0].content_hash, "h1");
  EXPECT_TRUE(b->needs_images());
}

TEST_F(SchedulerTest, PrefixCachingOffSharesNothing) {
  Init(Options(64), 16, 4);
  AddTokens("A", Iota(8), {}, 1);
  Complete(scheduler_->Schedule());
  AddTokens("B", Iota(8), {}, 1);
  StepPlan plan = scheduler_->Schedule();
  EXPECT_THAT(Rows(plan), ElementsAre("B:8p*"));
  EXPECT_EQ(plan.prefix_cache_hits, 0);
  EXPECT_EQ(cache_->allocator().num_cached(), 0);
}

// Requests from a few common prefixes with random suffixes and images, a tight cache (preemption),
// cancellations. The runner is played with a fake KV store: each computed slot holds a fingerprint
// of the tokens and images up to it. Every step, the rows to compute go to blocks held by their
// sequence alone, every slot before them holds that sequence's own fingerprints (shared blocks
// carry the right k/v, and no held block was evicted and overwritten), and reference counts equal
// the tables' holdings; at the end every block is free and unreferenced.
TEST_F(SchedulerTest, PrefixCacheRandomizedRunWithCancelAndPreemption) {
  const SchedulerOptions options = PrefixCachingOptions(24, 5, 96);
  const int bs = 4;
  const int64_t num_blocks = 14;
  Init(options, num_blocks, bs, 2 * static_cast<int64_t>(Embeddings()->nbytes()));
  std::mt19937 rng(99);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> prefixes = {Iota(6, 50), Iota(10, 60), Iota(13, 80)};
  const std::vector<std::string> images = {"h1", "h2", "h3"};
  std::vector<size_t> fingerprints(static_cast<size_t>(num_blocks * bs), 0);
  auto fingerprint = [](const Sequence& s, int64_t i) {
    std::string key;
    for (int64_t t = 0; t <= i; ++t) key += absl::StrCat(s.tokens[t], ",");
    for (const SequenceImage& im : s.images) {
      if (im.pad_begin <= i) key += absl::StrCat("|", im.content_hash, "@", im.pad_begin);
    }
    return std::hash<std::string>()(key);
  };
  int added = 0, preemptions = 0, cancelled = 0;
  int64_t hits = 0;
  for (int step = 0; step < 5000 && (added < 80 || !scheduler_->empty()); ++step) {
    if (added < 80 && uniform(0, 1) == 0) {
      std::vector<int32_t> tokens = prefixes[uniform(0, 2)];
      for (int k = uniform(0, 20); k > 0; --k) tokens.push_back(uniform(0, 2));  // suffixes often alike
      std::vector<SequenceImage> ims;
      if (uniform(0, 1) == 0) {
        const int64_t end = std::min<int64_t>(static_cast<int64_t>(tokens.size()), 2 + uniform(1, 9));
        ims.push_back({images[uniform(0, 2)], 16, 2, end});
      }
      if (tokens.size() < 3) ims.clear();
      AddTokens(absl::StrCat("r", added++), tokens, ims, uniform(1, 12));
    }
    if (uniform(0, 25) == 0 && !scheduler_->empty()) {
      std::vector<Sequence*> all = scheduler_->sequences();
      Finish(all[uniform(0, static_cast<int>(all.size()) - 1)]);
      ++cancelled;
    }
    StepPlan plan = scheduler_->Schedule();
    preemptions += static_cast<int>(plan.preempted.size());
    hits += plan.prefix_cache_hits;
    std::map<int32_t, int> holders;
    for (const Sequence* s : scheduler_->sequences()) {
      for (int32_t b : s->table.blocks) ++holders[b];
    }
    for (int32_t b = 0; b < num_blocks; ++b) {
      ASSERT_EQ(cache_->allocator().ref_count(b), holders[b]) << "block " << b << " at step " << step;
    }
    for (const ScheduledWork& w : plan.work) {
      const Sequence& s = *w.seq;
      for (int64_t i = 0; i < w.start; ++i) {
        ASSERT_EQ(fingerprints[cache_->Slot(s.table, i)], fingerprint(s, i))
            << s.id << " token " << i << " at step " << step;
      }
      for (int64_t i = w.start; i < w.start + w.num_tokens; ++i) {
        ASSERT_EQ(cache_->allocator().ref_count(s.table.blocks[i / bs]), 1)
            << s.id << " writes token " << i << " into a shared block at step " << step;
        fingerprints[cache_->Slot(s.table, i)] = fingerprint(s, i);
      }
    }
    Complete(plan);
  }
  EXPECT_EQ(added, 80);
  EXPECT_TRUE(scheduler_->empty());
  EXPECT_EQ(used(), 0);
  EXPECT_EQ(cache_->allocator().num_free(), num_blocks);
  for (int32_t b = 0; b < num_blocks; ++b) EXPECT_EQ(cache_->allocator().ref_count(b), 0) << b;
  EXPECT_GT(hits, 100) << "the prompts were meant to share prefixes";
  EXPECT_GT(cache_->allocator().evictions(), 0);
  EXPECT_GT(preemptions, 0) << "the cache was meant to be tight";
  EXPECT_GT(cancelled, 0);
}

}  // namespace
}  // namespace iris::engine
