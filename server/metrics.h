// Prometheus metrics under iris: names: per-request counters and latency histograms recorded by
// the calls of both fronts, per-step histograms from the engine's on_step hook, and the engine's
// gauges and totals read at scrape time. Rendered in the text exposition format (0.0.4).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/engine.h"

namespace iris::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  // `name`_bucket{le=...}, _sum and _count lines.
  void Render(const std::string& name, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative), +Inf last
  double sum_ = 0;
  int64_t count_ = 0;
};

// What a scrape reads besides the recorded metrics.
struct ScrapeState {
  engine::EngineStats engine;
  int64_t preprocessing = 0;
  int64_t calls_in_flight = 0;
  int64_t http_calls_in_flight = 0;  // of them, on the HTTP front
  bool draining = false;
};

class Metrics {
 public:
  Metrics();

  // A request that ended: `code` is its gRPC status name ("OK", "INVALID_ARGUMENT", ...),
  // `finish` the engine's finish reason ("stop", "length", "cancelled", "" when it never ran).
  void RequestEnded(const std::string& code, const std::string& finish, const engine::Usage& usage,
                    const engine::Timings& timings, double preprocess_ms, double e2e_s);
  void FirstToken(double ttft_s);
  void InterToken(double itl_s);
  // `images`: images whose encoding finished in the step (an image may span several steps).
  void StepRan(double step_ms, double encoder_ms, int64_t encoder_forwards, int64_t images);

  std::string Render(const ScrapeState& state) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, int64_t> requests_ ABSL_GUARDED_BY(mu_);  // (code, finish)
  int64_t prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t image_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  Histogram ttft_ ABSL_GUARDED_BY(mu_);
  Histogram tpot_ ABSL_GUARDED_BY(mu_);
  Histogram itl_ ABSL_GUARDED_BY(mu_);
  Histogram e2e_ ABSL_GUARDED_BY(mu_);
  Histogram queue_ ABSL_GUARDED_BY(mu_);
  Histogram preprocess_ ABSL_GUARDED_BY(mu_);
  Histogram prefill_ ABSL_GUARDED_BY(mu_);
  Histogram request_encode_ ABSL_GUARDED_BY(mu_);
  Histogram prompt_len_ ABSL_GUARDED_BY(mu_);
  Histogram generation_len_ ABSL_GUARDED_BY(mu_);
  Histogram step_ ABSL_GUARDED_BY(mu_);
  Histogram encoder_forward_ ABSL_GUARDED_BY(mu_);
  Histogram encoder_image_ ABSL_GUARDED_BY(mu_);
  double encoder_ms_since_image_ ABSL_GUARDED_BY(mu_) = 0;  // slices of images not yet finished
};

}  // namespace iris::server
