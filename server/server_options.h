// Everything iris-server is configured with besides the model and engine: the listening address,
// the request limits it enforces and reports, security, and shutdown behaviour.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/model.h"

namespace iris::server {

class Metrics;

// Limits a request is checked against before any work is queued for it (the engine's own limits,
// max_queue and max_model_len, live in EngineOptions).
struct RequestLimits {
  int64_t max_message_bytes = 64ll << 20;   // one request message
  int64_t max_image_bytes = 20ll << 20;     // encoded size of one image
  int64_t max_image_pixels = 64ll << 20;    // decoded width * height of one image
  int max_images_per_request = 16;
  int64_t max_prompt_tokens = 32768;        // image tokens included
  int64_t max_tokens = 4096;                // sampling.max_tokens upper bound
  int64_t default_max_tokens = 16;          // when sampling.max_tokens is not set
  // What unset sampling.temperature / top_p / top_k / repetition_penalty take: the model's
  // generation_config.json (--generation-config auto) or iris's own, greedy (none).
  engine::SamplingDefaults sampling_defaults;
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 50051;  // 0 = any free port (the bound one is reported by Server::port())
  RequestLimits limits;
  int workers = 2;   // preprocessing threads (image decode, resize, tokenization)
  absl::Duration grace_period = absl::Seconds(30);  // for in-flight work after SIGTERM
  std::string auth_token;     // non-empty: calls must send "authorization: Bearer <token>"
  std::string tls_cert_pem;   // both non-empty: TLS instead of plaintext
  std::string tls_key_pem;
  std::string dtype = "bf16";  // as loaded, for GetModelInfo
  // The OpenAI-compatible HTTP front and a metrics-only HTTP listener (/metrics, /health) for
  // when the HTTP front is off: -1 = off, 0 = any free port (see Server::http_port()).
  int http_port = -1;
  int metrics_port = -1;
  absl::Duration http_read_timeout = absl::Seconds(30);   // a request's header and body
  absl::Duration http_write_timeout = absl::Seconds(60);  // one write to a slow reader
  absl::Duration http_idle_timeout = absl::Seconds(60);   // a kept-alive connection between requests
  int http_threads = 2;
  // Shared with the engine's on_step hook (set by main); null: the server makes its own.
  std::shared_ptr<Metrics> metrics;
};

}  // namespace iris::server
