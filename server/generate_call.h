// One Generate / GenerateUnary call from validation to its final status. It is shared by the gRPC
// reactor (which may go away first, when the client leaves), the worker-pool task that builds the
// prompt, and the engine's output callback. gRPC operations are decided under the call's lock
// and issued outside it (a reaction may run inline inside StartWrite).
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "engine/request.h"
#include "grpcpp/support/status.h"
#include "iris/v1/iris.pb.h"
#include "server/request_conversion.h"

namespace iris::server {

class IrisService;

// The one line logged per request when it ends.
std::string RequestLogLine(const std::string& request_id, const grpc::Status& status, const char* finish,
                           const engine::Usage& usage, const engine::Timings& timings, double preprocess_ms);

// What the call needs from its reactor; implemented by the streaming and the unary reactor.
class CallReactorOps {
 public:
  virtual ~CallReactorOps() = default;
  virtual void StartWrite(const v1::GenerateResponse* response) = 0;  // streaming only
  virtual void FinishUnary(v1::GenerateReply reply, const grpc::Status& status) = 0;  // unary only
  virtual void FinishStream(const grpc::Status& status) = 0;  // streaming only
};

class GenerateCall : public std::enable_shared_from_this<GenerateCall> {
 public:
  GenerateCall(IrisService* service, std::string request_id, bool streaming, CallReactorOps* ops);

  const std::string& request_id() const { return request_id_; }

  // Queues the prompt build on the worker pool; the engine takes it from there.
  void Start(ValidatedRequest request);
  // From the reactor: the client cancelled, went away or ran past its deadline.
  void ClientCancelled();
  // From the streaming reactor: the last StartWrite completed (ok = false: the stream is broken).
  void WriteDone(bool ok);
  // From the reactor's OnDone: no gRPC operation may be issued any more.
  void ReactorDone();
  // Ends a call that has not reached the engine (server draining, shutdown).
  void Abort(const grpc::Status& status);

 private:
  void BuildAndSubmit(ValidatedRequest request);  // worker thread
  void OnOutput(engine::RequestOutput output);    // engine thread
  // Records the final status (first one wins), logs the request's line (usage and timings from
  // the engine's final output when there is one) and frees the request id.
  void EndLocked(grpc::Status status, const engine::RequestOutput* output) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Issues the next write or the Finish the state calls for, outside the lock.
  void Pump();

  IrisService* const service_;
  const std::string request_id_;
  const bool streaming_;
  const std::chrono::steady_clock::time_point arrival_ = std::chrono::steady_clock::now();

  absl::Mutex mu_;
  CallReactorOps* ops_ ABSL_GUARDED_BY(mu_);  // null after ReactorDone
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool submitted_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_issued_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> final_status_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::GenerateResponse> pending_ ABSL_GUARDED_BY(mu_);  // streaming: not yet written
  v1::GenerateResponse current_ ABSL_GUARDED_BY(mu_);             // streaming: being written
  v1::GenerateReply reply_ ABSL_GUARDED_BY(mu_);                  // unary: accumulated
  double preprocess_ms_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<std::chrono::steady_clock::time_point> last_token_ ABSL_GUARDED_BY(mu_);  // for TTFT/ITL
};

}  // namespace iris::server
