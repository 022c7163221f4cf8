#include "server/server.h"

#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace iris::server {
namespace {

constexpr char kServiceName[] = "iris.v1.Iris";

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(std::unique_ptr<engine::Engine> engine,
                                                      const ServerOptions& options) {
  if (options.limits.max_message_bytes <= 0 || options.limits.max_message_bytes > (1ll << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-message-bytes must be in [1, 2147483647], got ",
                                                   options.limits.max_message_bytes));
  }
  if (options.tls_cert_pem.empty() != options.tls_key_pem.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  std::unique_ptr<Server> server(new Server());
  server->options_ = options;
  server->engine_ = std::move(engine);
  server->workers_ = std::make_unique<core::ThreadPool>(options.workers, "iris-worker");
  server->service_ = std::make_unique<IrisService>(server->engine_.get(), server->workers_.get(), options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (!options.tls_cert_pem.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }
  grpc::ServerBuilder builder;
  // Bracket IPv6 literals ("::1" -> "[::1]:port").
  const std::string host =
      options.host.find(':') != std::string::npos && options.host.front() != '[' ? absl::StrCat("[", options.host, "]")
                                                                                : options.host;
  builder.AddListeningPort(absl::StrCat(host, ":", options.port), credentials, &server->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.limits.max_message_bytes));
  // gRPC sets SO_REUSEPORT by default: a second server on the same port would silently share
  // its traffic. Refuse the port instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(server->service_.get());
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr || server->port_ == 0) {
    server->shut_down_ = true;  // nothing to drain: the destructor only releases
    server->service_->CloseWorkers();
    server->workers_.reset();
    server->engine_->Shutdown();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", options.port,
                                               " (address in use, or not a local address?)"));
  }
  for (auto [port, mode, out] : {std::tuple(options.http_port, HttpServer::Mode::kApi, &server->http_),
                                 std::tuple(options.metrics_port, HttpServer::Mode::kMetricsOnly,
                                            &server->metrics_http_)}) {
    if (port < 0) continue;
    absl::StatusOr<std::unique_ptr<HttpServer>> http = HttpServer::Start(server->service_.get(), options, port, mode);
    if (!http.ok()) {
      server->Shutdown();
      return http.status();
    }
    *out = std::move(*http);
  }
  grpc::HealthCheckServiceInterface* health = server->grpc_server_->GetHealthCheckService();
  health->SetServingStatus(kServiceName, true);
  health->SetServingStatus(true);
  return server;
}

Server::~Server() { Shutdown(); }

int64_t Server::Shutdown() {
  if (shut_down_) return 0;
  shut_down_ = true;
  if (grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService()) {
    health->SetServingStatus(kServiceName, false);
    health->SetServingStatus(false);
  }
  service_->StartDraining();
  const bool idle = service_->WaitForIdle(absl::Now() + options_.grace_period);
  const int64_t cancelled = idle ? 0 : service_->in_flight();
  // What is still in flight ends with UNAVAILABLE: prompts still being built here, the rest by
  // the engine's shutdown.
  service_->AbortAll("the server is shutting down");
  engine_->Shutdown();
  // Prompt builds still queued or running end now (their calls were aborted, or the engine
  // refuses them): every call has its final status before the listener stops.
  service_->CloseWorkers();
  workers_.reset();
  // Ended calls may still be writing their last message: give them up to 5 s, then stop the
  // listener at once (a deadline given to grpc::Server::Shutdown is waited out in full while
  // idle client connections stay open).
  service_->WaitForReactors(absl::Now() + absl::Seconds(5));
  if (http_) http_->Stop();
  if (metrics_http_) metrics_http_->Stop();
  grpc_server_->Shutdown(std::chrono::system_clock::now());
  return cancelled;
}

}  // namespace iris::server
