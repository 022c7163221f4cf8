// iris-server's gRPC server: the Iris service plus grpc.health.v1 and server reflection on one
// port, plaintext or TLS, and the graceful shutdown sequence.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "grpcpp/server.h"
#include "server/http_server.h"
#include "server/iris_service.h"
#include "server/server_options.h"

namespace iris::server {

class Server {
 public:
  // Binds and starts serving; health reports SERVING once this returns.
  static absl::StatusOr<std::unique_ptr<Server>> Start(std::unique_ptr<engine::Engine> engine,
                                                       const ServerOptions& options);
  ~Server();  // Shutdown()

  int port() const { return port_; }
  int http_port() const { return http_ ? http_->port() : 0; }        // 0: off
  int metrics_port() const { return metrics_http_ ? metrics_http_->port() : 0; }  // 0: off
  IrisService& service() { return *service_; }

  // Health NOT_SERVING and new calls UNAVAILABLE; calls in flight get `grace_period` to finish,
  // then are cancelled (ending with UNAVAILABLE); then the engine and the listener stop.
  // Returns the number of calls that had to be cancelled. Idempotent.
  int64_t Shutdown();

 private:
  Server() = default;

  // Destroyed bottom-up: the listener first, then the workers (their tasks use the service and
  // the engine), then the service, then the engine.
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<IrisService> service_;
  std::unique_ptr<core::ThreadPool> workers_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<HttpServer> metrics_http_;
  ServerOptions options_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace iris::server
