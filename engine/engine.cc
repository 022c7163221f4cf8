#include "engine/engine.h"

#include <malloc.h>
#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/cpu_affinity.h"
#include "core/parallel_for.h"
#include "core/status_macros.h"
#include "engine/warm_up.h"
#include "llm/incremental_detokenizer.h"

namespace iris::engine {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

core::DType ResolveKvCacheDType(KvCacheDType dtype, kernels::ComputeType compute) {
  switch (dtype) {
    case KvCacheDType::kBF16: return core::DType::kBF16;
    case KvCacheDType::kF32: return core::DType::kF32;
    case KvCacheDType::kAuto: break;
  }
  return compute == kernels::ComputeType::kBF16 ? core::DType::kBF16 : core::DType::kF32;
}

// Prompt + output tokens a request may have: the option, or the model's positions.
int64_t MaxModelLen(const EngineOptions& options, const core::TextConfig& text) {
  return options.max_model_len > 0 ? options.max_model_len : text.max_position_embeddings;
}

}  // namespace

absl::StatusOr<KvCacheDType> KvCacheDTypeFromName(absl::string_view name) {
  if (name == "auto") return KvCacheDType::kAuto;
  if (name == "bf16") return KvCacheDType::kBF16;
  if (name == "f32") return KvCacheDType::kF32;
  return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype must be auto, bf16 or f32, got \"", name, "\""));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Model> model, const EngineOptions& options) {
  if (model == nullptr || model->decoder == nullptr || (model->config.has_vision() && model->encoder == nullptr)) {
    return absl::InvalidArgumentError("Engine::Create: no model");
  }
  if (options.kv_block_size <= 0 || options.max_num_batched_tokens <= 0 || options.max_num_seqs <= 0 ||
      options.max_queue <= 0) {
    return absl::InvalidArgumentError("engine options: kv_block_size, max_num_batched_tokens, max_num_seqs and "
                                      "max_queue must be positive");
  }
  const core::TextConfig& t = model->config.text;
  const core::DType kv_dtype = ResolveKvCacheDType(options.kv_cache_dtype, model->decoder->options().compute);
  const int64_t blocks = llm::KvCacheShape::BlocksForBytes(options.kv_cache_bytes, t.num_hidden_layers,
                                                           t.num_key_value_heads, t.head_dim(), options.kv_block_size,
                                                           kv_dtype);
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache_bytes ", options.kv_cache_bytes,
                                                   " holds no KV block of ", options.kv_block_size, " tokens"));
  }
  IRIS_ASSIGN_OR_RETURN(llm::KvCache cache,
                        llm::KvCache::Create(model->decoder->CacheShape(blocks, options.kv_block_size, kv_dtype),
                                             *model->device));
  // Activations sized once from the budgets: a step's rows and logit rows, and an encoder forward
  // of the budget's patches or of the largest image the preprocessor makes, whichever is more.
  const core::PreprocessorConfig& pre = model->preprocessor;
  const int64_t largest_image = pre.max_pixels / (int64_t{pre.patch_size} * pre.patch_size);
  if (model->encoder != nullptr) {  // text-only models have none
    IRIS_RETURN_IF_ERROR(
        model->encoder->ReserveActivations(std::max(options.max_encoder_patches_per_step, largest_image)));
    // Before the encoder's worker owns it (it records and replays them from then on).
    if (options.encoder_graphs.value_or(model->encoder_runs_on().records_graphs())) {
      IRIS_RETURN_IF_ERROR(model->encoder->EnableGraphs(vision::kEncoderGraphsKept));
    }
  }
  IRIS_RETURN_IF_ERROR(model->decoder->ReserveActivations(options.max_num_batched_tokens, options.max_num_seqs));
  kernels::Device& device = *model->device;
  const bool warm_up = options.warm_up.value_or(device.kind() != kernels::DeviceKind::kCpu);
  const bool decode_graphs = options.decode_graphs.value_or(device.records_graphs());
  // The encoder's own device gets its own thread, which issues everything the encoder does from
  // here on (its warm-up included).
  std::shared_ptr<kernels::ComputeShare> share;
  if (options.share_encoder_cores && model->encoder != nullptr) {  // a text-only model has nothing to share
    if (model->encoder_device == nullptr) {
      return absl::InvalidArgumentError("engine options: share_encoder_cores is for an encoder with a device of its own");
    }
    IRIS_ASSIGN_OR_RETURN(share, model->device->NewComputeShare());
    IRIS_RETURN_IF_ERROR(model->device->ShareCompute(share, kernels::ComputeShare::kDecoder));
    IRIS_RETURN_IF_ERROR(model->encoder_device->ShareCompute(share, kernels::ComputeShare::kEncoder));
  }
  std::unique_ptr<EncoderWorker> encoder_worker;
  if (model->encoder != nullptr && model->encoder_device != nullptr) {
    IRIS_ASSIGN_OR_RETURN(encoder_worker, EncoderWorker::Start(model->encoder.get(), model->encoder_device.get(),
                                                               options.encoder_cpus, share));
  } else if (!options.encoder_cpus.empty()) {
    return absl::InvalidArgumentError("engine options: encoder_cpus is for an encoder with a device of its own");
  }
  // This thread issues the warm-up and the graphs' recording; the engine thread attaches itself below.
  if (warm_up || decode_graphs) device.AttachThread();
  if (warm_up) IRIS_RETURN_IF_ERROR(WarmUp(*model, cache, encoder_worker.get()));  // at the sizes just reserved
  if (decode_graphs) {
    const int64_t graph_tokens =
        std::min({options.max_graph_context, MaxModelLen(options, t), blocks * options.kv_block_size});
    if (graph_tokens < 1) return absl::InvalidArgumentError("engine options: max_graph_context must be positive");
    llm::DecodeGraphOptions graphs;
    graphs.max_blocks_per_seq = static_cast<int>(cache.BlocksFor(graph_tokens));
    graphs.capture = device.records_graphs();
    IRIS_RETURN_IF_ERROR(model->decoder->EnableDecodeGraphs(graphs));
    if (graphs.capture) IRIS_RETURN_IF_ERROR(model->decoder->CaptureDecodeGraphs(&cache));
  }
  std::unique_ptr<StepTrace> trace;
  if (!options.step_trace_path.empty()) {
    IRIS_ASSIGN_OR_RETURN(trace, StepTrace::Open(options.step_trace_path));
  }
  std::unique_ptr<Engine> engine(new Engine(std::move(model), options, std::move(cache), std::move(encoder_worker)));
  engine->compute_share_ = std::move(share);
  engine->trace_ = std::move(trace);
  engine->trace_start_ = absl::Now();
  engine->thread_ = std::thread([e = engine.get()] {
    e->model_->device->AttachThread();
    e->Loop();
  });
  // Named so that its threads can be told apart in /proc and top (the OpenMP team threads it
  // starts inherit the name). Pinned before Create returns, so before any request reaches it and
  // its first parallel region starts the team.
  pthread_setname_np(engine->thread_.native_handle(), "iris-engine");
  if (!options.cpus.empty()) {
    IRIS_RETURN_IF_ERROR(core::PinThread(engine->thread_.native_handle(), options.cpus, "engine thread"));
  }
  return engine;
}

Engine::Engine(std::unique_ptr<Model> model, const EngineOptions& options, llm::KvCache cache,
               std::unique_ptr<EncoderWorker> encoder_worker)
    : model_(std::move(model)), options_(options), cache_(std::move(cache)),
      encoder_cache_(options.encoder_cache_bytes), encoder_worker_(std::move(encoder_worker)),
      // With a worker, images are encoded by jobs (as interleaved) whatever interleave_encoder says.
      scheduler_(SchedulerOptions{options.max_num_batched_tokens, options.max_num_seqs,
                                  options.max_encoder_patches_per_step,
                                  options.interleave_encoder || encoder_worker_ != nullptr,
                                  options.enable_prefix_caching},
                 &cache_, &encoder_cache_),
      runner_(model_.get(), &cache_, &encoder_cache_, &scheduler_, options.interleave_encoder, encoder_worker_.get(),
              options.sample_on_device.value_or(model_->device->kind() != kernels::DeviceKind::kCpu)),
      budget_(StepBudgetOptions{.step_budget_ms = options.step_budget_ms}),
      shared_budget_(StepBudgetOptions{.step_budget_ms = options.step_budget_ms, .min_prefill_tokens = 8}) {
  max_model_len_ = MaxModelLen(options, model_->config.text);
  if (encoder_worker_ != nullptr) {
    encoder_worker_->set_on_ready([this] {
      absl::MutexLock lock(&mu_);
      encoder_ready_ = true;
    });
  }
  absl::MutexLock lock(&mu_);
  stats_.kv_blocks_total = cache_.allocator().num_blocks();
  stats_.concurrent_encoder = encoder_worker_ != nullptr;
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
  if (!p.images.empty() && model_->encoder == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", p.images.size(), " images for a text-only model (",
                                                   core::FamilyModelType(model_->config.family), ")"));
  }
  const int merge = model_->config.vision.spatial_merge_size;
  const int64_t patch = model_->config.vision.patch_size;
  for (size_t j = 0; j < p.images.size(); ++j) {
    const PromptImage& im = p.images[j];
    const int64_t patches = im.grid_thw[0] * im.grid_thw[1] * im.grid_thw[2];
    const int64_t tokens = patches / (merge * merge);
    if (im.pad_begin < 0 || im.pad_end > L || im.pad_end - im.pad_begin != tokens) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: image ", j, " does not match its pad slots"));
    }
    if (im.rgb == nullptr || im.rgb->dtype() != core::DType::kU8 || im.grid_thw[0] != 1 ||
        im.rgb->numel() != im.grid_thw[1] * patch * im.grid_thw[2] * patch * 3) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: image ", j, " is not an RGB8 image resized to its grid ",
                                                     im.grid_thw[0], "x", im.grid_thw[1], "x", im.grid_thw[2]));
    }
    if (patches > model_->encoder->max_patches()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: image ", j, " has ", patches,
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

  auto seq = std::make_unique<RequestState>();
  seq->id = request.id;
  seq->prompt_len = L;
  seq->tokens = p.ids;
  seq->tokens.reserve(static_cast<size_t>(total));
  for (const PromptImage& im : p.images) {
    seq->images.push_back({im.content_hash, im.grid_thw[0] * im.grid_thw[1] * im.grid_thw[2], im.pad_begin,
                           im.pad_end});
  }
  seq->sampler = std::make_unique<llm::Sampler>(request.sampling, p.ids, model_->eos_token_ids);
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
      // request, a cancel, the encoder worker's result or the shutdown arrives.
      const bool idle = scheduler_.empty() || !progressed_;
      // An idle decoder leaves every shared core to the encoder until its next step with rows.
      if (idle && compute_share_ != nullptr) compute_share_->SetBusy(kernels::ComputeShare::kDecoder, false);
      if (scheduler_.empty() && trim_when_idle_) {
        // Activations of varying sizes leave freed memory in the heap; hand it back to the OS
        // when the engine runs dry, so an idle server's footprint returns to its idle level.
        malloc_trim(0);
        trim_when_idle_ = false;
      }
      absl::MutexLock lock(&mu_);
      if (idle) {
        mu_.Await(absl::Condition(
            +[](Engine* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
              return e->stopping_ || !e->incoming_.empty() || !e->cancels_.empty() || e->encoder_ready_;
            },
            this));
      }
      encoder_ready_ = false;  // the step below polls the worker
      stopping = stopping_;
    }
    TakeIncoming();
    if (stopping) {
      Outbox outbox;
      for (Sequence* seq : scheduler_.sequences()) {
        Finish(AsRequest(seq), llm::FinishReason::kCancelled, absl::UnavailableError("the engine shut down"), outbox);
      }
      Publish(StepCounters{}, outbox);
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
      scheduler_.Add(std::move(incoming_.front()));
      incoming_.pop_front();
    }
    cancels.swap(cancels_);
    RefreshGauges();  // in the same hold: Submit's queue limit never misses a request in between
  }
  if (cancels.empty()) return;
  Outbox outbox;
  for (const std::string& id : cancels) {
    Sequence* seq = scheduler_.Find(id);
    if (seq != nullptr) Finish(AsRequest(seq), llm::FinishReason::kCancelled, absl::OkStatus(), outbox);
  }
  Publish(StepCounters{}, outbox);
}

bool Engine::Step() {
  if (scheduler_.empty()) return false;
  const absl::Time start = absl::Now();
  StepSlices slices;  // unbounded
  const bool concurrent_encoder = encoder_worker_ != nullptr;
  if (options_.interleave_encoder) {
    const PendingWork pending = scheduler_.Pending();
    // An encoder on its own device takes nothing from the step.
    // Sized by the costs of the cores the decoder will have (shared while an encode job runs, once
    // such steps have been measured).
    const bool encoder_busy = compute_share_ != nullptr && compute_share_->busy(kernels::ComputeShare::kEncoder);
    const StepBudget& budget = encoder_busy && shared_budget_.measured() ? shared_budget_ : budget_;
    slices = budget.Next(pending.decode_rows, pending.prefill, pending.encoder && !concurrent_encoder);
  }
  StepPlan plan = scheduler_.Schedule(StepAllowance{slices.prefill_tokens});
  bool shared_cores = false;  // this step's decoder runs on its part of the cores
  if (compute_share_ != nullptr) {
    // The decoder's side is busy while it has rows to run (decode or prefill); a step without any
    // leaves the shared cores to the encoder's job.
    compute_share_->SetBusy(kernels::ComputeShare::kDecoder, !plan.work.empty());
    model_->device->Rebalance();
    shared_cores = !plan.work.empty() && compute_share_->busy(kernels::ComputeShare::kEncoder);
  }
  Outbox outbox;
  // Admissions and preemptions move requests between the counts Submit's queue limit reads:
  // published before the forward passes, not after them.
  Publish(StepCounters{.preemptions = static_cast<int64_t>(plan.preempted.size()),
                       .prefix_cache_queries = plan.prefix_cache_queries,
                       .prefix_cache_hits = plan.prefix_cache_hits},
          outbox);
  StepResult result = runner_.Run(plan, slices.encoder_flops);
  if (result.encode_job_ended) scheduler_.EndEncodeJob();
  budget_.ObserveEncoder(result.encoder_flops, result.encoder_slice_ms);
  if (result.decoder_rows > 0) {
    (shared_cores ? shared_budget_ : budget_)
        .ObserveDecoder(result.decoder_rows, result.decoder_logit_rows, result.decoder_ms);
  }
  StepCounters counters{.steps = 1,
                        .images_encoded = result.images_encoded,
                        .encoder_forwards = result.images_encoded > 0 ? 1 : 0,
                        .encoder_cache_hits = result.encoder_cache_hits,
                        .encoder_cache_misses = result.encoder_cache_misses,
                        .encoder_ms = result.encode_ms,
                        .encoder_slices = result.encoder_flops > 0 ? 1 : 0,
                        .shared_core_steps = shared_cores ? 1 : 0,
                        .target_ms = slices.target_ms};
  for (const auto& [id, status] : result.job_errors) {
    if (Sequence* seq = scheduler_.Find(id)) Finish(AsRequest(seq), llm::FinishReason::kError, status, outbox);
  }
  ProcessOutputs(plan, result, outbox, counters);
  counters.step_ms = Ms(absl::Now() - start);
  if (trace_ != nullptr) {
    StepTraceRecord r{.t_ms = Ms(start - trace_start_), .step_ms = counters.step_ms, .target_ms = slices.target_ms,
                      .decoder_ms = result.decoder_ms, .encoder_gflop = result.encoder_flops * 1e-9,
                      .encoder_ms = result.encoder_slice_ms > 0 ? result.encoder_slice_ms : result.encode_ms,
                      .images_encoded = result.images_encoded, .running = scheduler_.num_running(),
                      .waiting = scheduler_.num_waiting()};
    for (const ScheduledWork& w : plan.work) (w.num_tokens == 1 && !w.is_prefill ? r.decode_rows : r.prefill_rows) += w.num_tokens;
    trace_->Write(r);
  }
  Publish(counters, outbox);
  // A job on the worker is no reason to step again: its end wakes the loop (encoder_ready_).
  return !plan.empty() || !plan.images.empty() || result.encode_job_ended ||
         (runner_.encoding() && !concurrent_encoder);
}

namespace {

// The logits row of each work item that samples (-1: none): the rows go to the items that
// sample, in order, skipping those whose image failed (the decoder ran none for them).
std::vector<int64_t> LogitRows(const StepPlan& plan, const StepResult& result) {
  std::vector<int64_t> rows(plan.work.size(), -1);
  if (!result.decoder_status.ok()) return rows;
  int64_t row = 0;
  for (size_t i = 0; i < plan.work.size(); ++i) {
    const ScheduledWork& w = plan.work[i];
    if (result.image_errors.contains(w.seq) || !w.samples) continue;
    rows[i] = row++;
  }
  return rows;
}

}  // namespace

void Engine::ProcessOutputs(const StepPlan& plan, StepResult& result, Outbox& outbox, StepCounters& counters) {
  const int64_t vocab = model_->decoder->vocab_size();
  const absl::Time now = absl::Now();
  const std::vector<int64_t> rows = LogitRows(plan, result);
  // Rows sampled from f32 logits are picked first, in parallel: a sampled pick is a few passes
  // over the vocabulary (~0.1-0.3 ms a row), which one thread would repeat for every row of a
  // batch while the device waits for the next step. Each request's sampler is its own (its seed,
  // its penalty set), so the picks are those of the rows one after another.
  std::vector<int32_t> picked(plan.work.size(), -1);
  if (result.decoder_status.ok() && result.logits.dtype() != core::DType::kI32) {
    std::vector<size_t> sampled;
    for (size_t i = 0; i < plan.work.size(); ++i) {
      if (rows[i] < 0) continue;
      RequestState& s = AsRequest(plan.work[i].seq);
      const float* lg = result.logits.data<float>() + rows[i] * vocab;
      if (s.req.capture_prompt_logits && !s.logits_captured) {  // before the pick changes them
        outbox.For(s).prompt_logits.assign(lg, lg + vocab);
        s.logits_captured = true;
      }
      sampled.push_back(i);
    }
    core::ParallelFor(static_cast<int>(sampled.size()), [&](int k, int /*worker*/) {
      const size_t i = sampled[static_cast<size_t>(k)];
      picked[i] = AsRequest(plan.work[i].seq).sampler->Sample(result.logits.data<float>() + rows[i] * vocab, vocab);
    });
  }
  for (size_t i = 0; i < plan.work.size(); ++i) {
    const ScheduledWork& w = plan.work[i];
    RequestState& s = AsRequest(w.seq);
    if (auto e = result.image_errors.find(w.seq); e != result.image_errors.end()) {
      Finish(s, llm::FinishReason::kError, e->second, outbox);
      continue;
    }
    if (!result.decoder_status.ok()) {
      Finish(s, llm::FinishReason::kError, result.decoder_status, outbox);
      continue;
    }
    // Prefill rows: all but a row that samples.
    counters.prompt_tokens_computed += w.num_tokens - (w.samples ? 1 : 0);
    s.num_computed += w.num_tokens;
    scheduler_.BlocksComputed(&s);
    if (!w.samples) continue;  // a prefill chunk
    if (s.prompt_done == absl::InfinitePast()) s.prompt_done = now;
    RequestOutput& out = outbox.For(s);
    int32_t id;
    if (result.logits.dtype() == core::DType::kI32) {  // the decoder's greedy picks
      id = result.logits.data<int32_t>()[rows[i]];
      s.sampler->Accept(id);
    } else {
      id = picked[i];
    }
    s.tokens.push_back(id);
    ++s.num_generated;
    ++counters.tokens_generated;
    if (s.first_token == absl::InfinitePast()) s.first_token = now;
    absl::StatusOr<std::string> piece = s.detok->Push(id);
    // Ids past the tokenizer (the padded vocabulary rows) have no text.
    const llm::StopChecker::Step st = s.stop->Push(id, piece.ok() ? *piece : std::string(), s.num_generated);
    out.token_ids.push_back(id);
    out.text += st.text;
    if (st.finish != llm::FinishReason::kNone) Finish(s, st.finish, absl::OkStatus(), outbox);
  }
}

void Engine::Finish(RequestState& s, llm::FinishReason reason, const absl::Status& status, Outbox& outbox) {
  outbox.finished.push_back(scheduler_.Finish(&s));
  outbox.For(s);
  s.SetFinal(reason, status);
}

void Engine::Publish(const StepCounters& c, Outbox& outbox) {
  {
    absl::MutexLock lock(&mu_);
    stats_.steps += c.steps;
    stats_.preemptions += c.preemptions;
    stats_.images_encoded += c.images_encoded;
    stats_.encoder_forwards += c.encoder_forwards;
    stats_.encoder_cache_hits += c.encoder_cache_hits;
    stats_.encoder_cache_misses += c.encoder_cache_misses;
    stats_.total_encoder_ms += c.encoder_ms;
    stats_.encoder_slices += c.encoder_slices;
    stats_.shared_core_steps += c.shared_core_steps;
    stats_.prompt_tokens_computed += c.prompt_tokens_computed;
    stats_.tokens_generated += c.tokens_generated;
    stats_.prefix_cache_queries += c.prefix_cache_queries;
    stats_.prefix_cache_hits += c.prefix_cache_hits;
    stats_.decode_graph_steps = model_->decoder->decode_graph_steps();
    if (c.steps > 0) {
      stats_.last_step_ms = c.step_ms;
      stats_.last_step_target_ms = c.target_ms;
      stats_.total_step_ms += c.step_ms;
    }
    for (const auto& seq : outbox.finished) in_flight_.erase(seq->id);
    stats_.requests_finished += static_cast<int64_t>(outbox.finished.size());
    RefreshGauges();
  }
  if (c.steps > 0 && options_.on_step) options_.on_step(c.step_ms, c.encoder_ms, c.encoder_forwards, c.images_encoded);
  outbox.Deliver();
}

void Engine::RefreshGauges() {
  stats_.waiting = scheduler_.num_waiting();
  stats_.running = scheduler_.num_running();
  stats_.kv_blocks_used = cache_.allocator().num_used();
  stats_.kv_blocks_cached = cache_.allocator().num_cached();
  stats_.encoder_cache_entries = encoder_cache_.entries();
  stats_.encoder_cache_bytes = encoder_cache_.bytes();
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
