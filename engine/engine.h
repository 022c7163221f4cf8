// The engine: one thread that owns the model and the KV cache and runs continuous batching.
// Requests enter a queue (Submit, any thread). Each step on the engine thread takes new requests
// and cancels, then: the Scheduler plans (decodes, prefill chunks and admissions within the token,
// sequence, block and encoder budgets; preemption by recompute when blocks run out) → the
// StepRunner runs the plan (the plan's images in one encoder forward, skipping those in the
// encoder cache, then one decoder forward) → ProcessOutputs samples, detokenizes, checks stops and
// finishes → stats are published and outputs stream through each request's callback.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "engine/encoder_cache.h"
#include "engine/encoder_worker.h"
#include "engine/model.h"
#include "engine/request.h"
#include "engine/request_state.h"
#include "engine/scheduler.h"
#include "engine/step_budget.h"
#include "engine/step_runner.h"
#include "engine/step_trace.h"
#include "llm/kv_cache.h"

namespace iris::engine {

// The KV cache pools' element type. kAuto follows the decoder's compute: bf16 pages with bf16
// compute (half the memory and attention reads), f32 with f32.
enum class KvCacheDType { kAuto, kBF16, kF32 };
// "auto", "bf16" or "f32" (the --kv-cache-dtype flag); INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<KvCacheDType> KvCacheDTypeFromName(absl::string_view name);

struct EngineOptions {
  int64_t kv_cache_bytes = 1ll << 30;   // K and V pools, all layers
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  int kv_block_size = 16;               // tokens per block
  int64_t max_num_batched_tokens = 2048;  // decoder rows per step (prefill chunks + decodes)
  int max_num_seqs = 64;                // sequences running at once
  int64_t max_encoder_patches_per_step = 16384;  // vision patches per encoder forward (one image may exceed it alone)
  int64_t encoder_cache_bytes = 256ll << 20;
  int64_t max_queue = 1024;             // waiting requests before Submit says RESOURCE_EXHAUSTED
  int64_t max_model_len = 0;            // prompt + max_tokens; 0 = the model's max_position_embeddings
  // Images encoded in pieces over several steps and prefill sized, so that a step stays near
  // step_budget_ms (0: auto, see StepBudget) while requests are decoding. Off: whole images in
  // the admitting step, prefill chunks only bounded by max_num_batched_tokens.
  bool interleave_encoder = true;
  double step_budget_ms = 0;
  std::string step_trace_path;  // non-empty: one JSON line per step written here (StepTrace)
  bool enable_prefix_caching = true;    // share the KV blocks of common prompt prefixes (images by content)
  // One decoder step at the step budget and one encoder forward at its largest before taking
  // requests (engine/warm_up.h), so that device memory for them is taken, and found short, at
  // start. Unset: on where the model runs on an accelerator, off on the CPU (nothing to take).
  std::optional<bool> warm_up;
  // Decode-only steps padded to fixed batch sizes and replayed from graphs recorded at start
  // (llm/decode_graph.h). Unset: on where the device records graphs (a GPU), off on the CPU; set
  // on a device without graphs, the padded steps run directly (what a graph would compute).
  std::optional<bool> decode_graphs;
  // Encoder forwards replayed from graphs, one per grid list met more than once
  // (VisionEncoder::EnableGraphs). Unset: on where the encoder's device records graphs (a GPU).
  std::optional<bool> encoder_graphs;
  // Sampled picks (temperature, top-k, top-p) drawn where the logits are (kernels::SampleRows):
  // on a GPU one int per row comes back instead of the vocabulary's floats. Unset: on where the
  // decoder's logits are not in host memory (a GPU), off on the CPU (the host sampler picks the
  // rows in parallel). The same tokens either way, up to the rounding of sums.
  std::optional<bool> sample_on_device;
  // The longest sequence (tokens) a decode graph serves: its block tables are this wide and every
  // graph step uploads them. A step with a longer sequence runs without a graph.
  int64_t max_graph_context = 8192;
  // Non-empty: the engine thread runs only on these CPUs, and so does its compute team (the
  // OpenMP threads it starts inherit its mask). Empty: the creating thread's CPUs.
  std::vector<int> cpus;
  // Where the model's encoder has a device of its own (Model::encoder_device), encode jobs run on
  // a thread of their own beside the engine's steps (engine/encoder_worker.h; one job in flight,
  // the steps only poll it), and interleave_encoder sizes prefill only. Non-empty: that thread
  // and its compute team run only on these CPUs (give them cores the engine's team does not use).
  std::vector<int> encoder_cpus;
  // With an encoder device of its own on the CPU sharing the decoder's cores (both teams as large
  // as the decoder's): the two split the cores while both have work, and each takes them all
  // while the other is idle (kernels/compute_share.h). Off: each team keeps its own size. A
  // text-only model (no encoder) ignores it.
  bool share_encoder_cores = false;
  // Set: called on the engine thread after every step that ran something, with its time, the
  // time of its encoder forwards, their count and the images they finished (for metrics). Must
  // return quickly.
  std::function<void(double step_ms, double encoder_ms, int64_t encoder_forwards, int64_t images_encoded)> on_step;
};

struct EngineStats {
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;    // held by sequences
  int64_t kv_blocks_cached = 0;  // registered in the prefix cache (held or evictable)
  int64_t encoder_cache_hits = 0;
  int64_t encoder_cache_misses = 0;
  int64_t encoder_cache_entries = 0;
  int64_t encoder_cache_bytes = 0;
  int64_t images_encoded = 0;
  int64_t encoder_forwards = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens_computed = 0;  // prefill rows run (recomputed ones included)
  int64_t tokens_generated = 0;
  int64_t requests_finished = 0;
  int64_t prefix_cache_queries = 0;  // tokens of admitted sequences looked up in the prefix cache
  int64_t prefix_cache_hits = 0;     // of them, found cached: their prefill is skipped
  double last_step_ms = 0;
  double total_step_ms = 0;
  double total_encoder_ms = 0;
  int64_t encoder_slices = 0;      // steps that ran a piece of an encode job (interleaved)
  bool concurrent_encoder = false; // encode jobs run beside the steps, on the encoder's own device
  int64_t shared_core_steps = 0;   // share_encoder_cores: steps whose decoder ran on its part of the cores (an encode job busy)
  int64_t decode_graph_steps = 0;  // decode-only steps padded to a graph size (replayed where graphs exist)
  double last_step_target_ms = 0;  // the step budget's target for the last step (0: unbounded)

  double prefix_cache_hit_rate() const {
    return prefix_cache_queries > 0 ? static_cast<double>(prefix_cache_hits) / prefix_cache_queries : 0.0;
  }
};

class Engine {
 public:
  // Takes the model; sizes the KV cache from options.kv_cache_bytes and starts the engine thread.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<Model> model, const EngineOptions& options);
  ~Engine();  // Shutdown()

  // Queues a request. INVALID_ARGUMENT for bad sampling parameters, an empty prompt, or
  // prompt + max_tokens over max_model_len / the KV cache's capacity; ALREADY_EXISTS for an id in
  // flight; RESOURCE_EXHAUSTED when the queue is full; UNAVAILABLE after Shutdown began.
  // On OK the callback will be called until an output with finished = true.
  absl::Status Submit(Request request);

  // Cancels a request in flight (no-op for unknown ids): its blocks are freed at the next step and
  // its last output has finish_reason kCancelled.
  void Cancel(const std::string& request_id);

  // Stops accepting, cancels what is in flight (each gets its final output) and joins the thread.
  void Shutdown();

  EngineStats stats() const;
  const Model& model() const { return *model_; }
  const EngineOptions& options() const { return options_; }
  int64_t max_model_len() const { return max_model_len_; }
  // The KV cache's shape: its blocks and their dtype (kAuto resolved).
  const llm::KvCacheShape& kv_cache_shape() const { return cache_.shape(); }

 private:
  // A step's counters, added to the stats in one place (Publish).
  struct StepCounters {
    int64_t steps = 0;
    int64_t preemptions = 0;
    int64_t prefix_cache_queries = 0;
    int64_t prefix_cache_hits = 0;
    int64_t images_encoded = 0;
    int64_t encoder_forwards = 0;
    int64_t encoder_cache_hits = 0;
    int64_t encoder_cache_misses = 0;
    int64_t prompt_tokens_computed = 0;
    int64_t tokens_generated = 0;
    double encoder_ms = 0;
    int64_t encoder_slices = 0;
    int64_t shared_core_steps = 0;
    double step_ms = 0;
    double target_ms = 0;
  };

  Engine(std::unique_ptr<Model> model, const EngineOptions& options, llm::KvCache cache,
         std::unique_ptr<EncoderWorker> encoder_worker);
  void Loop();
  bool Step();  // false when nothing could be scheduled
  // New requests into the scheduler's queue; cancelled ones finished and their outputs delivered.
  void TakeIncoming();
  // Samples from the step's logits, advances the sequences, detokenizes, checks stops, finishes.
  void ProcessOutputs(const StepPlan& plan, StepResult& result, Outbox& outbox, StepCounters& counters);
  // Takes `s` out of the scheduler (blocks freed) and makes its pending output the final one.
  void Finish(RequestState& s, llm::FinishReason reason, const absl::Status& status, Outbox& outbox);
  // Adds `counters` and the finished requests to the stats and refreshes the gauges, then delivers
  // the outputs: stats first, so whoever reacts to a final output sees the request gone and its
  // blocks free.
  void Publish(const StepCounters& counters, Outbox& outbox);
  void RefreshGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<Model> model_;
  EngineOptions options_;
  int64_t max_model_len_ = 0;
  llm::KvCache cache_;
  EncoderCache encoder_cache_;
  // Null unless the encoder has a device of its own. Goes before the model, after the runner.
  std::unique_ptr<EncoderWorker> encoder_worker_;
  std::shared_ptr<kernels::ComputeShare> compute_share_;  // share_encoder_cores: the decoder's side

  // Shared with other threads.
  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<RequestState>> incoming_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cancels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> in_flight_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool encoder_ready_ ABSL_GUARDED_BY(mu_) = false;  // the worker's job ended since the engine last looked
  EngineStats stats_ ABSL_GUARDED_BY(mu_);

  // Engine thread only.
  Scheduler scheduler_;
  StepRunner runner_;
  StepBudget budget_;
  // share_encoder_cores: the costs of steps whose decoder ran on its part of the cores (about
  // twice a whole-core step's), learned apart; its prefill floor is smaller, as a floor-sized
  // chunk there alone outlasts the target.
  StepBudget shared_budget_;
  std::unique_ptr<StepTrace> trace_;  // null unless options.step_trace_path
  absl::Time trace_start_;
  bool progressed_ = true;  // the last step ran something
  bool trim_when_idle_ = false;  // work was done since the heap was last trimmed
  std::thread thread_;
};

// Runs one request to the end on `engine` and returns everything it produced merged into one
// output (ids, text, final reason, usage, timings, prompt logits). For tools and tests.
absl::StatusOr<RequestOutput> GenerateBlocking(Engine& engine, Request request);

}  // namespace iris::engine
