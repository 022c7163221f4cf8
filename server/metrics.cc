#include "server/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace iris::server {
namespace {

// Latency buckets in seconds (vLLM's TTFT/E2E spread: a few ms to minutes).
std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
          2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0};
}
std::vector<double> TokenBuckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000};
}

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.17g", v);
}

void Head(std::string* out, const std::string& name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Scalar(std::string* out, const std::string& name, const char* type, const char* help, double value) {
  Head(out, name, type, help);
  absl::StrAppend(out, name, " ", Number(value), "\n");
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, std::string* out) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    absl::StrAppend(out, name, "_bucket{le=\"", Number(bounds_[i]), "\"} ", cumulative, "\n");
  }
  cumulative += counts_.back();
  absl::StrAppend(out, name, "_bucket{le=\"+Inf\"} ", cumulative, "\n", name, "_sum ", Number(sum_), "\n", name,
                  "_count ", count_, "\n");
}

Metrics::Metrics()
    : ttft_(LatencyBuckets()),
      tpot_(LatencyBuckets()),
      itl_(LatencyBuckets()),
      e2e_(LatencyBuckets()),
      queue_(LatencyBuckets()),
      preprocess_(LatencyBuckets()),
      prefill_(LatencyBuckets()),
      request_encode_(LatencyBuckets()),
      prompt_len_(TokenBuckets()),
      generation_len_(TokenBuckets()),
      step_(LatencyBuckets()),
      encoder_forward_(LatencyBuckets()),
      encoder_image_(LatencyBuckets()) {}

void Metrics::RequestEnded(const std::string& code, const std::string& finish, const engine::Usage& usage,
                           const engine::Timings& t, double preprocess_ms, double e2e_s) {
  absl::MutexLock lock(&mu_);
  ++requests_[{code, finish}];
  prompt_tokens_ += usage.prompt_tokens;
  image_tokens_ += usage.image_tokens;
  generation_tokens_ += usage.completion_tokens;
  if (finish.empty()) return;  // never reached the engine: no timings
  e2e_.Observe(e2e_s);
  queue_.Observe(t.queue_ms / 1e3);
  preprocess_.Observe(preprocess_ms / 1e3);
  prefill_.Observe(t.prefill_ms / 1e3);
  if (usage.image_tokens > 0) request_encode_.Observe(t.encode_ms / 1e3);
  prompt_len_.Observe(static_cast<double>(usage.prompt_tokens));
  generation_len_.Observe(static_cast<double>(usage.completion_tokens));
  if (usage.completion_tokens > 1) {
    tpot_.Observe((t.total_ms - t.first_token_ms) / 1e3 / static_cast<double>(usage.completion_tokens - 1));
  }
}

void Metrics::FirstToken(double ttft_s) {
  absl::MutexLock lock(&mu_);
  ttft_.Observe(ttft_s);
}

void Metrics::InterToken(double itl_s) {
  absl::MutexLock lock(&mu_);
  itl_.Observe(itl_s);
}

void Metrics::StepRan(double step_ms, double encoder_ms, int64_t encoder_forwards, int64_t images) {
  absl::MutexLock lock(&mu_);
  step_.Observe(step_ms / 1e3);
  if (encoder_forwards > 0) encoder_forward_.Observe(encoder_ms / 1e3 / static_cast<double>(encoder_forwards));
  // Encoder time is charged to the images it finished; slices of an image encoded over several
  // steps add up until it is done. Images finished together share their forwards' time.
  encoder_ms_since_image_ += encoder_ms;
  if (images > 0) {
    const double per_image_s = encoder_ms_since_image_ / 1e3 / static_cast<double>(images);
    for (int64_t i = 0; i < images; ++i) encoder_image_.Observe(per_image_s);
    encoder_ms_since_image_ = 0;
  }
}

std::string Metrics::Render(const ScrapeState& state) const {
  const engine::EngineStats& s = state.engine;
  std::string out;
  // Gauges and totals the engine keeps.
  Scalar(&out, "iris:num_requests_running", "gauge", "Sequences holding KV blocks (prefilling or decoding).",
         static_cast<double>(s.running));
  Scalar(&out, "iris:num_requests_waiting", "gauge", "Requests queued in the engine, not yet scheduled.",
         static_cast<double>(s.waiting));
  Scalar(&out, "iris:num_requests_preprocessing", "gauge",
         "Requests in the worker pool (image decode, resize, tokenization).", static_cast<double>(state.preprocessing));
  Scalar(&out, "iris:num_requests_in_flight", "gauge", "Calls admitted and not yet ended (both fronts).",
         static_cast<double>(state.calls_in_flight));
  Scalar(&out, "iris:num_requests_in_flight_http", "gauge",
         "Of iris:num_requests_in_flight, those on the HTTP front (the rest are gRPC).",
         static_cast<double>(state.http_calls_in_flight));
  Scalar(&out, "iris:draining", "gauge", "1 after SIGTERM while in-flight requests finish, else 0.",
         state.draining ? 1 : 0);
  Scalar(&out, "iris:kv_cache_blocks_capacity", "gauge", "KV cache blocks in all (the pool's size).", static_cast<double>(s.kv_blocks_total));
  Scalar(&out, "iris:kv_cache_blocks_used", "gauge", "KV cache blocks held by sequences.",
         static_cast<double>(s.kv_blocks_used));
  Scalar(&out, "iris:kv_cache_blocks_cached", "gauge", "KV cache blocks registered in the prefix cache.",
         static_cast<double>(s.kv_blocks_cached));
  Scalar(&out, "iris:kv_cache_usage_ratio", "gauge", "Fraction of KV cache blocks held by sequences (0 to 1).",
         s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks_total : 0.0);
  Scalar(&out, "iris:encoder_cache_entries", "gauge", "Image embeddings kept in the encoder cache.",
         static_cast<double>(s.encoder_cache_entries));
  Scalar(&out, "iris:encoder_cache_bytes", "gauge", "Bytes of image embeddings kept in the encoder cache.",
         static_cast<double>(s.encoder_cache_bytes));
  Scalar(&out, "iris:encoder_cache_hits_total", "counter", "Images whose embeddings came from the encoder cache.",
         static_cast<double>(s.encoder_cache_hits));
  Scalar(&out, "iris:encoder_cache_misses_total", "counter", "Images that had to be encoded.",
         static_cast<double>(s.encoder_cache_misses));
  Scalar(&out, "iris:images_encoded_total", "counter", "Images run through the vision encoder.",
         static_cast<double>(s.images_encoded));
  Scalar(&out, "iris:encoder_forwards_total", "counter", "Vision encoder forwards.",
         static_cast<double>(s.encoder_forwards));
  Scalar(&out, "iris:encoder_time_seconds_total", "counter", "Time spent in vision encoder forwards.",
         s.total_encoder_ms / 1e3);
  Scalar(&out, "iris:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
         static_cast<double>(s.prefix_cache_queries));
  Scalar(&out, "iris:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache (prefill skipped).",
         static_cast<double>(s.prefix_cache_hits));
  Scalar(&out, "iris:num_preemptions_total", "counter", "Sequences preempted (blocks freed, recomputed later).",
         static_cast<double>(s.preemptions));
  Scalar(&out, "iris:engine_steps_total", "counter", "Engine steps that ran something.", static_cast<double>(s.steps));
  Scalar(&out, "iris:shared_core_steps_total", "counter",
         "Engine steps whose decoder ran on its part of cores shared with a busy encoder (--encoder-cpus shared).",
         static_cast<double>(s.shared_core_steps));
  Scalar(&out, "iris:decode_graph_steps_total", "counter",
         "Decode-only steps padded to a decode graph's batch size (replayed from a CUDA graph on a GPU).",
         static_cast<double>(s.decode_graph_steps));
  Scalar(&out, "iris:prompt_tokens_computed_total", "counter",
         "Prefill rows the decoder ran (recomputed ones included, prefix-cache hits excluded).",
         static_cast<double>(s.prompt_tokens_computed));

  absl::MutexLock lock(&mu_);
  Head(&out, "iris:requests_total", "counter",
       "Requests ended, by gRPC status name and finish reason (stop, length, cancelled; none if never run).");
  for (const auto& [key, n] : requests_) {
    absl::StrAppend(&out, "iris:requests_total{status=\"", key.first, "\",finish_reason=\"",
                    key.second.empty() ? "none" : key.second, "\"} ", n, "\n");
  }
  Scalar(&out, "iris:prompt_tokens_total", "counter", "Prompt tokens of ended requests (image tokens included).",
         static_cast<double>(prompt_tokens_));
  Scalar(&out, "iris:image_tokens_total", "counter", "Image placeholder tokens of ended requests.",
         static_cast<double>(image_tokens_));
  Scalar(&out, "iris:generation_tokens_total", "counter", "Tokens generated for ended requests.",
         static_cast<double>(generation_tokens_));
  struct Named {
    const char* name;
    const char* help;
    const Histogram* h;
  };
  const Named histograms[] = {
      {"iris:time_to_first_token_seconds", "Arrival to first token (preprocessing included).", &ttft_},
      {"iris:time_per_output_token_seconds", "Per request: (end - first token) / (completion tokens - 1).", &tpot_},
      {"iris:inter_token_latency_seconds", "Time between successive outputs of a request.", &itl_},
      {"iris:e2e_request_latency_seconds", "Arrival to last token.", &e2e_},
      {"iris:request_queue_time_seconds", "Engine arrival to first scheduled.", &queue_},
      {"iris:request_preprocess_time_seconds", "Waiting for a worker plus image decode, resize and tokenization.",
       &preprocess_},
      {"iris:request_prefill_time_seconds", "First scheduled to prompt fully computed.", &prefill_},
      {"iris:request_encoder_time_seconds", "Per request with images: encoder forwards that included its images.",
       &request_encode_},
      {"iris:request_prompt_tokens", "Prompt tokens per request (image tokens included).", &prompt_len_},
      {"iris:request_generation_tokens", "Generated tokens per request.", &generation_len_},
      {"iris:engine_step_time_seconds", "Engine step time (encoder and decoder forwards, sampling).", &step_},
      {"iris:encoder_forward_time_seconds", "Vision encoder time per forward.", &encoder_forward_},
      {"iris:encoder_time_per_image_seconds",
       "Vision encoder time per image (its slices summed; images encoded together share the time).", &encoder_image_},
  };
  for (const Named& n : histograms) {
    Head(&out, n.name, "histogram", n.help);
    n.h->Render(n.name, &out);
  }
  return out;
}

}  // namespace iris::server
