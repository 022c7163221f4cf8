// The iris.v1.Iris gRPC service on the callback API: authentication, validation, admission
// (queue limit, duplicate ids, draining), the calls in flight, and the model/engine info RPCs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <functional>
#include <optional>
#include <string_view>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "iris/v1/iris.grpc.pb.h"
#include "server/metrics.h"
#include "server/request_conversion.h"
#include "server/server_options.h"

namespace iris::server {

class CallReactorOps;
class GenerateCall;

class IrisService final : public v1::Iris::CallbackService {
 public:
  IrisService(engine::Engine* engine, core::ThreadPool* workers, const ServerOptions& options);
  ~IrisService() override;

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* context,
                                                           const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* GenerateUnary(grpc::CallbackServerContext* context, const v1::GenerateRequest* request,
                                          v1::GenerateReply* reply) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context, const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* info) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context, const v1::GetStatsRequest* request,
                                     v1::ServerStats* stats) override;

  // The HTTP front's way in: the same admission (bearer token from the Authorization header,
  // draining), validation, queue limit and registration as Generate. On error the status to
  // answer with (already logged and counted).
  grpc::Status StartCall(std::optional<std::string_view> authorization, const v1::GenerateRequest& request,
                         bool streaming, CallReactorOps* ops, std::shared_ptr<GenerateCall>* call);
  // OK, UNAUTHENTICATED (`authorization` is the header's value, nullopt when absent) or
  // UNAVAILABLE while draining.
  grpc::Status Admit(std::optional<std::string_view> authorization) const;
  const v1::ModelInfo& model_info() const { return model_info_; }
  // HTTP generation calls from StartCall's success to their last write (for /metrics).
  void HttpCallStarted() { http_calls_.fetch_add(1); }
  void HttpCallEnded() { http_calls_.fetch_sub(1); }
  int64_t max_model_len() const { return engine_->max_model_len(); }
  Metrics& metrics() { return *metrics_; }
  // What /metrics reads besides the recorded metrics.
  ScrapeState scrape_state() const;

  // New calls are refused with UNAVAILABLE from now on; calls in flight go on.
  void StartDraining();
  bool draining() const { return draining_.load(); }
  // Waits until no call is in flight or the deadline passes; true when none is left.
  bool WaitForIdle(absl::Time deadline);
  // Ends calls still preprocessing (after the engine shut down, the rest end through it).
  void AbortAll(const std::string& reason);
  int64_t in_flight() const;
  // Waits until every Generate reactor has finished (its last message written, or the client
  // gone) or the deadline passes; true when none is left.
  bool WaitForReactors(absl::Time deadline);
  void ReactorStarted();
  void ReactorDone();
  // Queues a prompt build on the worker pool; false once CloseWorkers() ran (shutdown).
  bool ScheduleWork(std::function<void()> task);
  // After this returns no task is scheduled any more, so the pool can be destroyed.
  void CloseWorkers();

 private:
  friend class GenerateCall;

  // OK, or the status a new call is refused with (auth, draining).
  grpc::Status Admit(const grpc::CallbackServerContext& context) const;
  // Validates and registers an admitted call (`admitted` is Admit's answer) and starts it; on
  // error the status to finish with (already logged).
  grpc::Status StartAdmittedCall(grpc::Status admitted, const v1::GenerateRequest& request, bool streaming,
                                 CallReactorOps* ops, std::shared_ptr<GenerateCall>* call);
  void Unregister(const std::string& request_id);
  void LogRejected(const std::string& request_id, const grpc::Status& status) const;

  engine::Engine* const engine_;
  core::ThreadPool* const workers_;
  const ServerOptions options_;
  std::shared_ptr<Metrics> metrics_;
  v1::ModelInfo model_info_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> preprocessing_{0};
  std::atomic<int64_t> requests_failed_{0};
  std::atomic<int64_t> http_calls_{0};
  std::atomic<uint64_t> next_id_{1};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<GenerateCall>> calls_ ABSL_GUARDED_BY(mu_);
  int64_t reactors_open_ ABSL_GUARDED_BY(mu_) = 0;
  bool workers_closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace iris::server
