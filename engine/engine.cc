#include "engine/engine.h"

#include <malloc.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "llm/incremental_detokenizer.h"
#include "llm/mrope.h"
#include "vision/encoder_plan.h"

namespace iris::engine {

using core::Tensor;

struct Engine::Sequence {
  Request req;
  int64_t prompt_len = 0;
  std::vector<int32_t> tokens;  // prompt, then generated ids
  int64_t num_computed = 0;     // leading tokens whose k/v are in the cache
  llm::BlockTable table;
  std::vector<std::shared_ptr<const Tensor>> image_embeds;  // per image once encoded
  std::unique_ptr<llm::Sampler> sampler;
  std::unique_ptr<llm::StopChecker> stop;
  std::unique_ptr<llm::IncrementalDetokenizer> detok;
  int64_t num_generated = 0;
  bool logits_captured = false;
  // Output gathered during a step, delivered once at its end.
  RequestOutput pending;
  bool has_pending = false;
  // Timings.
  absl::Time arrival;
  absl::Time first_scheduled = absl::InfinitePast();
  absl::Time prompt_done = absl::InfinitePast();
  absl::Time first_token = absl::InfinitePast();
  double encode_ms = 0;
  bool running = false;  // in running_ (counted in stats_.running), else waiting

  bool images_ready() const { return image_embeds.size() == req.prompt.images.size(); }
  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - num_computed; }
  bool in_decode() const { return num_computed >= prompt_len; }
};

namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Model> model, const EngineOptions& options) {
  if (model == nullptr || model->decoder == nullptr || model->encoder == nullptr) {
    return absl::InvalidArgumentError("Engine::Create: no model");
  }
  if (options.kv_block_size <= 0 || options.max_num_batched_tokens <= 0 || options.max_num_seqs <= 0 ||
      options.max_queue <= 0) {
    return absl::InvalidArgumentError("engine options: kv_block_size, max_num_batched_tokens, max_num_seqs and "
                                      "max_queue must be positive");
  }
  const core::TextConfig& t = model->config.text;
  const int64_t blocks = llm::KvCacheShape::BlocksForBytes(options.kv_cache_bytes, t.num_hidden_layers,
                                                           t.num_key_value_heads, t.head_dim(), options.kv_block_size);
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache_bytes ", options.kv_cache_bytes,
                                                   " holds no KV block of ", options.kv_block_size, " tokens"));
  }
  IRIS_ASSIGN_OR_RETURN(llm::KvCache cache,
                        llm::KvCache::Create(model->decoder->CacheShape(blocks, options.kv_block_size)));
  // Activations sized once from the budgets: a step's rows and logit rows, and an encoder forward
  // of the budget's patches or of the largest image the preprocessor makes, whichever is more.
  const core::PreprocessorConfig& pre = model->preprocessor;
  const int64_t largest_image = pre.max_pixels / (int64_t{pre.patch_size} * pre.patch_size);
  IRIS_RETURN_IF_ERROR(model->encoder->ReserveActivations(std::max(options.max_encoder_patches_per_step, largest_image)));
  IRIS_RETURN_IF_ERROR(model->decoder->ReserveActivations(options.max_num_batched_tokens, options.max_num_seqs));
  std::unique_ptr<Engine> engine(new Engine(std::move(model), options, std::move(cache)));
  engine->thread_ = std::thread([e = engine.get()] { e->Loop(); });
  return engine;
}

Engine::Engine(std::unique_ptr<Model> model, const EngineOptions& options, llm::KvCache cache)
    : model_(std::move(model)), options_(options), cache_(std::move(cache)),
      encoder_cache_(options.encoder_cache_bytes) {
  max_model_len_ = options.max_model_len > 0 ? options.max_model_len : model_->config.text.max_position_embeddings;
  absl::MutexLock lock(&mu_);
  stats_.kv_blocks_total = cache_.allocator().num_blocks();
}

Engine::~Engine() { Shutdown(); }

absl::Status Engine::Submit(Request request) {
  IRIS_RETURN_IF_ERROR(request.sampling.Validate());
  const Prompt& p = request.prompt;
  const int64_t L = static_cast<int64_t>(p.ids.size());
  if (L == 0) return absl::InvalidArgumentError("prompt: empty");
  const int64_t vocab = model_->decoder->vocab_size();
  for (int64_t i = 0; i < L; ++i) {
    if (p.ids[i] < 0 || p.ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: token id ", p.ids[i], " at index ", i,
                                                     " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  for (size_t j = 0; j < 3; ++j) {
    if (static_cast<int64_t>(p.positions.positions[j].size()) != L) {
      return absl::InvalidArgumentError("prompt: M-RoPE positions do not cover the prompt");
    }
  }
  const int merge = model_->config.vision.spatial_merge_size;
  for (size_t j = 0; j < p.images.size(); ++j) {
    const PromptImage& im = p.images[j];
    const int64_t tokens = im.grid_thw[0] * im.grid_thw[1] * im.grid_thw[2] / (merge * merge);
    if (im.pixel_values == nullptr || im.pad_begin < 0 || im.pad_end > L || im.pad_end - im.pad_begin != tokens ||
        im.pixel_values->dim(0) != im.grid_thw[0] * im.grid_thw[1] * im.grid_thw[2]) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: image ", j, " does not match its pad slots"));
    }
    if (im.pixel_values->dim(0) > model_->encoder->max_patches()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: image ", j, " has ", im.pixel_values->dim(0),
                                                     " patches, more than one encoder forward holds (",
                                                     model_->encoder->max_patches(), ")"));
    }
  }
  const int64_t total = L + request.sampling.max_tokens;
  if (total > max_model_len_) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", L, " tokens) + max_tokens (", request.sampling.max_tokens,
                                                   ") = ", total, " exceeds max_model_len ", max_model_len_));
  }
  if (cache_.BlocksFor(total) > cache_.allocator().num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", L, " tokens) + max_tokens (", request.sampling.max_tokens,
                                                   ") needs ", cache_.BlocksFor(total), " KV blocks, the cache has ",
                                                   cache_.allocator().num_blocks()));
  }

  auto seq = std::make_unique<Sequence>();
  seq->prompt_len = L;
  seq->tokens = p.ids;
  seq->tokens.reserve(static_cast<size_t>(total));
  seq->sampler = std::make_unique<llm::Sampler>(request.sampling, p.ids);
  seq->stop = std::make_unique<llm::StopChecker>(request.sampling, model_->eos_token_ids);
  seq->detok = std::make_unique<llm::IncrementalDetokenizer>(model_->tokenizer, request.skip_special_tokens);
  seq->arrival = absl::Now();
  seq->req = std::move(request);

  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the engine is shutting down");
  if (in_flight_.contains(seq->req.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request id \"", seq->req.id, "\" is already in flight"));
  }
  if (stats_.waiting + static_cast<int64_t>(incoming_.size()) >= options_.max_queue) {
    return absl::ResourceExhaustedError(absl::StrCat("the request queue is full (", options_.max_queue, " waiting)"));
  }
  in_flight_[seq->req.id] = 1;
  incoming_.push_back(std::move(seq));
  return absl::OkStatus();
}

void Engine::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  if (in_flight_.contains(request_id)) cancels_.push_back(request_id);
}

void Engine::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Engine::Loop() {
  for (;;) {
    bool stopping = false;
    {
      // Sleep while there is nothing to do (or nothing could be scheduled last step) until a
      // request, a cancel or the shutdown arrives.
      const bool idle = (waiting_.empty() && running_.empty()) || !progressed_;
      if (waiting_.empty() && running_.empty() && trim_when_idle_) {
        // Activations of varying sizes leave freed memory in the heap; hand it back to the OS
        // when the engine runs dry, so an idle server's footprint returns to its idle level.
        malloc_trim(0);
        trim_when_idle_ = false;
      }
      absl::MutexLock lock(&mu_);
      if (idle) {
        mu_.Await(absl::Condition(
            +[](Engine* e) { return e->stopping_ || !e->incoming_.empty() || !e->cancels_.empty(); }, this));
      }
      stopping = stopping_;
    }
    TakeIncoming();
    if (stopping) {
      for (auto& s : running_) Finish(s.get(), llm::FinishReason::kCancelled, absl::UnavailableError("the engine shut down"));
      for (auto& s : waiting_) Finish(s.get(), llm::FinishReason::kCancelled, absl::UnavailableError("the engine shut down"));
      running_.clear();
      waiting_.clear();
      absl::MutexLock lock(&mu_);
      stats_.running = stats_.waiting = 0;
      stats_.kv_blocks_used = cache_.allocator().num_used();
      return;
    }
    progressed_ = Step();
    trim_when_idle_ = true;
  }
}

void Engine::TakeIncoming() {
  std::vector<std::string> cancels;
  {
    absl::MutexLock lock(&mu_);
    while (!incoming_.empty()) {
      waiting_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
      ++stats_.waiting;
    }
    cancels.swap(cancels_);
  }
  for (const std::string& id : cancels) {
    auto match = [&](const std::unique_ptr<Sequence>& s) { return s->req.id == id; };
    if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
      Finish(it->get(), llm::FinishReason::kCancelled);
      running_.erase(it);
    } else if (auto wt = std::find_if(waiting_.begin(), waiting_.end(), match); wt != waiting_.end()) {
      Finish(wt->get(), llm::FinishReason::kCancelled);
      waiting_.erase(wt);
    }
  }
  absl::MutexLock lock(&mu_);
  stats_.waiting = static_cast<int64_t>(waiting_.size());
  stats_.running = static_cast<int64_t>(running_.size());
  stats_.kv_blocks_used = cache_.allocator().num_used();
}

void Engine::Preempt(Sequence* seq) {
  cache_.Release(&seq->table);
  seq->num_computed = 0;
  seq->running = false;
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == seq; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
  absl::MutexLock lock(&mu_);
  ++stats_.preemptions;
  --stats_.running;
  ++stats_.waiting;
}

bool Engine::Step() {
  if (waiting_.empty() && running_.empty()) return false;
  const absl::Time step_start = absl::Now();
  int64_t budget = options_.max_num_batched_tokens;
  std::vector<std::pair<Sequence*, int64_t>> work;
  bool preempted = false;

  auto unschedule = [&](Sequence* victim) {
    auto it = std::find_if(work.begin(), work.end(), [&](const auto& w) { return w.first == victim; });
    if (it != work.end()) {
      budget += it->second;
      work.erase(it);
    }
  };
  // Running sequences: decodes first (they keep everyone's tokens flowing), then prefill chunks.
  // When blocks run out, the newest running sequence is preempted (recomputed later).
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence* seq = running_[i].get();
      if (seq->in_decode() != (pass == 0)) continue;
      if (std::any_of(work.begin(), work.end(), [&](const auto& w) { return w.first == seq; })) continue;
      const int64_t n = std::min(seq->remaining(), budget);
      bool placed = false;
      while (!placed) {
        if (cache_.Reserve(&seq->table, seq->num_computed + n).ok()) {
          placed = true;
          break;
        }
        Sequence* victim = running_.back().get();
        unschedule(victim);
        Preempt(victim);
        preempted = true;
        if (victim == seq) break;
      }
      if (!placed) break;  // seq itself was the newest: it waits; everything before it is placed
      work.emplace_back(seq, n);
      budget -= n;
    }
  }

  // Waiting sequences, first come first served, while sequences, tokens, blocks and the encoder
  // budget allow. Their images are encoded together before the decoder runs.
  std::vector<Sequence*> admit;
  {
    int64_t patches = 0, blocks_left = cache_.allocator().num_free(), budget_left = budget;
    absl::flat_hash_set<std::string> planned;
    for (auto& up : waiting_) {
      if (preempted) break;  // blocks are short: let the running sequences finish first
      Sequence* seq = up.get();
      if (static_cast<int64_t>(running_.size() + admit.size()) >= options_.max_num_seqs || budget_left <= 0) break;
      int64_t need = 0;
      if (!seq->images_ready()) {
        for (const PromptImage& im : seq->req.prompt.images) {
          if (!encoder_cache_.Contains(im.content_hash) && planned.insert(im.content_hash).second) {
            need += im.pixel_values->dim(0);
          }
        }
      }
      if (need > 0 && patches > 0 && patches + need > options_.max_encoder_patches_per_step) break;
      const int64_t n = std::min(seq->remaining(), budget_left);
      const int64_t blocks = cache_.BlocksFor(seq->num_computed + n) - static_cast<int64_t>(seq->table.blocks.size());
      if (blocks > blocks_left) break;
      admit.push_back(seq);
      patches += need;
      blocks_left -= blocks;
      budget_left -= n;
    }
  }
  if (!admit.empty()) EncodeImages(admit);
  for (Sequence* seq : admit) {
    auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& s) { return s.get() == seq; });
    if (!seq->images_ready()) {  // the encoder failed: already finished with an error
      waiting_.erase(it);
      continue;
    }
    const int64_t n = std::min(seq->remaining(), budget);
    if (n <= 0 || !cache_.Reserve(&seq->table, seq->num_computed + n).ok()) break;
    if (seq->first_scheduled == absl::InfinitePast()) seq->first_scheduled = absl::Now();
    work.emplace_back(seq, n);
    budget -= n;
    seq->running = true;
    running_.push_back(std::move(*it));
    waiting_.erase(it);
    absl::MutexLock lock(&mu_);
    ++stats_.running;
    --stats_.waiting;
  }

  if (!work.empty()) {
    absl::Status s = RunDecoder(work);
    if (!s.ok()) {
      for (auto& [seq, n] : work) Finish(seq, llm::FinishReason::kError, s);
    }
  }
  // Deliver this step's outputs and drop finished sequences.
  for (auto& [seq, n] : work) {
    if (seq->has_pending) {
      seq->has_pending = false;
      if (seq->req.on_output) seq->req.on_output(std::move(seq->pending));
      seq->pending = RequestOutput{};
    }
  }
  std::erase_if(running_, [](const auto& s) { return s->num_computed < 0; });

  const bool progressed = !work.empty() || !admit.empty();
  const double ms = Ms(absl::Now() - step_start);
  absl::MutexLock lock(&mu_);
  ++stats_.steps;
  stats_.last_step_ms = ms;
  stats_.total_step_ms += ms;
  stats_.waiting = static_cast<int64_t>(waiting_.size());
  stats_.running = static_cast<int64_t>(running_.size());
  stats_.kv_blocks_used = cache_.allocator().num_used();
  stats_.encoder_cache_entries = encoder_cache_.entries();
  stats_.encoder_cache_bytes = encoder_cache_.bytes();
  return progressed;
}

void Engine::EncodeImages(std::vector<Sequence*>& admit) {
  // Images not in the cache, each once even when several requests carry it.
  std::vector<const PromptImage*> todo;
  absl::flat_hash_set<std::string> todo_hashes;
  int64_t hits = 0, misses = 0;
  for (Sequence* seq : admit) {
    if (seq->images_ready()) continue;
    for (const PromptImage& im : seq->req.prompt.images) {
      if (encoder_cache_.Contains(im.content_hash) || todo_hashes.contains(im.content_hash)) {
        ++hits;
      } else {
        ++misses;
        todo_hashes.insert(im.content_hash);
        todo.push_back(&im);
      }
    }
  }
  const absl::Time start = absl::Now();
  for (Sequence* seq : admit) {
    if (seq->first_scheduled == absl::InfinitePast()) seq->first_scheduled = start;  // queue time ends here
  }
  absl::flat_hash_map<std::string, std::shared_ptr<const Tensor>> fresh;
  absl::Status status;
  double encode_ms = 0;
  if (!todo.empty()) {
    const absl::Time t0 = absl::Now();
    int64_t rows = 0;
    const int64_t width = todo[0]->pixel_values->dim(1);
    for (const PromptImage* im : todo) rows += im->pixel_values->dim(0);
    Tensor pixels = Tensor::Empty(core::DType::kF32, {rows, width});
    std::vector<vision::GridThw> grids;
    int64_t at = 0;
    for (const PromptImage* im : todo) {
      std::memcpy(pixels.data<float>() + at * width, im->pixel_values->data<float>(),
                  im->pixel_values->nbytes());
      at += im->pixel_values->dim(0);
      grids.push_back(im->grid_thw);
    }
    absl::StatusOr<Tensor> out = model_->encoder->Forward(pixels, grids);
    if (out.ok()) {
      int64_t row = 0;
      for (const PromptImage* im : todo) {
        const int64_t n = im->pad_end - im->pad_begin;
        auto emb = std::make_shared<const Tensor>(out->Rows(row, row + n).Clone());
        row += n;
        encoder_cache_.Insert(im->content_hash, emb);
        fresh[im->content_hash] = std::move(emb);
      }
    } else {
      status = out.status();
    }
    encode_ms = Ms(absl::Now() - t0);
  }
  for (Sequence* seq : admit) {
    if (seq->images_ready()) continue;
    bool in_batch = false;
    for (const PromptImage& im : seq->req.prompt.images) {
      if (auto f = fresh.find(im.content_hash); f != fresh.end()) {
        seq->image_embeds.push_back(f->second);
        in_batch = true;
      } else if (auto cached = encoder_cache_.Lookup(im.content_hash)) {
        seq->image_embeds.push_back(std::move(cached));
      } else {
        seq->image_embeds.clear();
        break;
      }
    }
    if (in_batch) seq->encode_ms += encode_ms;
    if (!seq->images_ready()) {
      Finish(seq, llm::FinishReason::kError,
             status.ok() ? absl::InternalError("image embeddings missing after encoding") : status);
    }
  }
  absl::MutexLock lock(&mu_);
  stats_.encoder_cache_hits += hits;
  stats_.encoder_cache_misses += misses;
  if (!todo.empty()) {
    stats_.images_encoded += static_cast<int64_t>(todo.size());
    ++stats_.encoder_forwards;
    stats_.total_encoder_ms += encode_ms;
  }
}

absl::Status Engine::RunDecoder(const std::vector<std::pair<Sequence*, int64_t>>& work) {
  llm::Decoder& dec = *model_->decoder;
  const int64_t h = dec.hidden_size(), vocab = dec.vocab_size();
  const int block_size = cache_.shape().block_size;
  size_t max_blocks = 0;
  for (const auto& [seq, n] : work) max_blocks = std::max(max_blocks, seq->table.blocks.size());
  llm::DecoderBatch& batch = batch_;
  batch.Clear(static_cast<int>(max_blocks));
  int64_t prompt_rows = 0;
  for (const auto& [seq, n] : work) {
    const int64_t row = batch.num_rows();
    const int64_t begin = seq->num_computed, end = begin + n;
    batch.token_ids.insert(batch.token_ids.end(), seq->tokens.begin() + begin, seq->tokens.begin() + end);
    const Prompt& p = seq->req.prompt;
    for (size_t j = 0; j < p.images.size(); ++j) {
      const int64_t lo = std::max(begin, p.images[j].pad_begin), hi = std::min(end, p.images[j].pad_end);
      if (lo >= hi) continue;
      const float* src = seq->image_embeds[j]->data<float>() + (lo - p.images[j].pad_begin) * h;
      for (int64_t i = lo; i < hi; ++i) batch.embed_rows.push_back(static_cast<int32_t>(row + i - begin));
      batch.embeds.insert(batch.embeds.end(), src, src + (hi - lo) * h);
    }
    for (int64_t i = begin; i < end; ++i) {
      for (int a = 0; a < 3; ++a) {
        batch.positions[a].push_back(
            i < seq->prompt_len ? p.positions.positions[a][i]
                                : llm::DecodePosition(seq->prompt_len, i - seq->prompt_len, p.positions.rope_delta));
      }
    }
    prompt_rows += std::max<int64_t>(0, std::min(end, static_cast<int64_t>(seq->tokens.size()) - 1) - begin);
    IRIS_RETURN_IF_ERROR(batch.AddSequence(seq->table, block_size, n, end == static_cast<int64_t>(seq->tokens.size())));
  }
  IRIS_ASSIGN_OR_RETURN(Tensor logits, dec.Forward(batch, &cache_));

  int64_t k = 0, generated = 0;
  const absl::Time now = absl::Now();
  for (const auto& [seq, n] : work) {
    seq->num_computed += n;
    if (seq->num_computed < static_cast<int64_t>(seq->tokens.size())) continue;  // prefill chunk
    float* lg = logits.data<float>() + (k++) * vocab;
    if (seq->prompt_done == absl::InfinitePast()) seq->prompt_done = now;
    if (seq->req.capture_prompt_logits && !seq->logits_captured) {
      seq->pending.prompt_logits.assign(lg, lg + vocab);
      seq->logits_captured = true;
    }
    const int32_t id = seq->sampler->Sample(lg, vocab);
    seq->tokens.push_back(id);
    ++seq->num_generated;
    ++generated;
    if (seq->first_token == absl::InfinitePast()) seq->first_token = now;
    absl::StatusOr<std::string> piece = seq->detok->Push(id);
    // Ids past the tokenizer (the padded vocabulary rows) have no text.
    const llm::StopChecker::Step st = seq->stop->Push(id, piece.ok() ? *piece : std::string(), seq->num_generated);
    seq->pending.request_id = seq->req.id;
    seq->pending.token_ids.push_back(id);
    seq->pending.text += st.text;
    seq->has_pending = true;
    if (st.finish != llm::FinishReason::kNone) Finish(seq, st.finish);
  }
  absl::MutexLock lock(&mu_);
  stats_.prompt_tokens_computed += prompt_rows;
  stats_.tokens_generated += generated;
  return absl::OkStatus();
}

// Ends a sequence: frees its blocks, fills the final output (delivered at the end of the step for
// sequences in it, at once otherwise) and marks it for removal.
void Engine::Finish(Sequence* seq, llm::FinishReason reason, absl::Status status) {
  cache_.Release(&seq->table);
  RequestOutput& out = seq->pending;
  out.request_id = seq->req.id;
  out.finished = true;
  out.finish_reason = status.ok() ? reason : (reason == llm::FinishReason::kCancelled ? reason : llm::FinishReason::kError);
  out.status = status;
  if (reason == llm::FinishReason::kLength || reason == llm::FinishReason::kCancelled) {
    out.text += seq->detok->Flush();
    out.text += seq->stop->Flush();
  }
  out.usage.prompt_tokens = seq->prompt_len;
  out.usage.image_tokens = seq->req.prompt.num_image_tokens();
  out.usage.completion_tokens = seq->num_generated;
  const absl::Time now = absl::Now();
  Timings& t = out.timings;
  if (seq->first_scheduled != absl::InfinitePast()) {
    t.queue_ms = Ms(seq->first_scheduled - seq->arrival);
    if (seq->prompt_done != absl::InfinitePast()) t.prefill_ms = Ms(seq->prompt_done - seq->first_scheduled);
  } else {
    t.queue_ms = Ms(now - seq->arrival);
  }
  t.encode_ms = seq->encode_ms;
  if (seq->first_token != absl::InfinitePast()) t.first_token_ms = Ms(seq->first_token - seq->arrival);
  t.total_ms = Ms(now - seq->arrival);
  seq->num_computed = -1;  // marks it finished for removal from running_
  seq->has_pending = false;
  {
    // Stats first: whoever reacts to the final output sees the request gone and its blocks free.
    absl::MutexLock lock(&mu_);
    in_flight_.erase(seq->req.id);
    ++stats_.requests_finished;
    if (seq->running) {
      --stats_.running;
    } else {
      --stats_.waiting;
    }
    stats_.kv_blocks_used = cache_.allocator().num_used();
  }
  if (seq->req.on_output) seq->req.on_output(std::move(out));
  seq->pending = RequestOutput{};
}

absl::StatusOr<RequestOutput> GenerateBlocking(Engine& engine, Request request) {
  struct State {
    absl::Mutex mu;
    RequestOutput merged;
    absl::Notification done;
  };
  auto state = std::make_shared<State>();
  request.on_output = [state](RequestOutput out) {
    absl::MutexLock lock(&state->mu);
    RequestOutput& m = state->merged;
    m.request_id = out.request_id;
    m.token_ids.insert(m.token_ids.end(), out.token_ids.begin(), out.token_ids.end());
    m.text += out.text;
    if (!out.prompt_logits.empty()) m.prompt_logits = std::move(out.prompt_logits);
    if (out.finished) {
      m.finished = true;
      m.finish_reason = out.finish_reason;
      m.status = out.status;
      m.usage = out.usage;
      m.timings = out.timings;
      state->done.Notify();
    }
  };
  IRIS_RETURN_IF_ERROR(engine.Submit(std::move(request)));
  state->done.WaitForNotification();
  absl::MutexLock lock(&state->mu);
  if (!state->merged.status.ok()) return state->merged.status;
  return std::move(state->merged);
}

}  // namespace iris::engine
