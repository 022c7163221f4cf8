// iris-server's HTTP listener on Boost.Beast (async, a few threads for every connection): the
// OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models), /health and
// /metrics, or only the last two (the metrics listener). Generation goes through the gRPC
// service's StartCall and GenerateCall, so both fronts share admission, validation, the queue
// limit, cancellation and metrics.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/iris_service.h"
#include "server/server_options.h"

namespace iris::server {

class HttpServer {
 public:
  enum class Mode { kApi, kMetricsOnly };
  // Binds host:port (0 = any free port) and starts serving. TLS when options has a certificate.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(IrisService* service, const ServerOptions& options,
                                                           int port, Mode mode);
  ~HttpServer();  // Stop()

  int port() const;
  // Stops accepting, closes every connection and joins the threads. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace iris::server
