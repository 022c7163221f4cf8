#include "server/generate_call.h"

#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/prompt_builder.h"
#include "server/iris_service.h"
#include "server/request_conversion.h"

namespace iris::server {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string RequestLogLine(const std::string& request_id, const grpc::Status& status, const char* finish,
                           const engine::Usage& usage, const engine::Timings& t, double preprocess_ms) {
  // The id is the client's: escaped and cut so a log line stays one line of bounded length.
  std::string id = absl::CEscape(request_id.substr(0, 128));
  if (request_id.size() > 128) id += "...";
  // gRPC and absl codes share their numbering (google.rpc.Code), and so their names.
  const std::string code = absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
  std::string line = absl::StrFormat(
      "iris-server: request id=%s status=%s finish=%s prompt_tokens=%d image_tokens=%d completion_tokens=%d "
      "preprocess_ms=%.1f queue_ms=%.1f encode_ms=%.1f prefill_ms=%.1f ttft_ms=%.1f total_ms=%.1f",
      id, code, *finish ? finish : "-", usage.prompt_tokens, usage.image_tokens, usage.completion_tokens, preprocess_ms, t.queue_ms, t.encode_ms, t.prefill_ms, t.first_token_ms, t.total_ms);
  if (!status.ok()) absl::StrAppend(&line, " message=\"", absl::CEscape(status.error_message()), "\"");
  return line;
}

GenerateCall::GenerateCall(IrisService* service, std::string request_id, bool streaming, CallReactorOps* ops)
    : service_(service), request_id_(std::move(request_id)), streaming_(streaming), ops_(ops) {}

void GenerateCall::Start(ValidatedRequest request) {
  service_->preprocessing_.fetch_add(1);
  const bool scheduled = service_->ScheduleWork(
      [self = shared_from_this(), request = std::move(request)]() mutable { self->BuildAndSubmit(std::move(request)); });
  if (!scheduled) {  // admitted just as the server began to shut down
    service_->preprocessing_.fetch_sub(1);
    Abort(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  }
}

void GenerateCall::BuildAndSubmit(ValidatedRequest request) {
  bool ended = false;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || final_status_.has_value()) {
      EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled before the prompt was built"), nullptr);
      ended = true;
    }
  }
  if (ended) {
    service_->preprocessing_.fetch_sub(1);
    Pump();
    return;
  }
  absl::StatusOr<engine::Prompt> prompt = engine::BuildPrompt(
      service_->engine_->model(), request.messages, PromptLimitsFor(service_->options_.limits));
  request.messages.clear();  // the image bytes are no longer needed
  // From the call's arrival: the wait for a free worker counts too.
  const double preprocess_ms = MsSince(arrival_);
  service_->preprocessing_.fetch_sub(1);
  {
    absl::MutexLock lock(&mu_);
    preprocess_ms_ = preprocess_ms;
    if (!prompt.ok()) {
      EndLocked(ToGrpcStatus(prompt.status()), nullptr);
    } else if (cancelled_ || final_status_.has_value()) {
      EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled before the engine took it"), nullptr);
    } else {
      submitted_ = true;
    }
    ended = !submitted_;
  }
  if (ended) {
    Pump();
    return;
  }
  engine::Request r;
  r.id = request_id_;
  r.prompt = std::move(*prompt);
  r.sampling = std::move(request.sampling);
  r.skip_special_tokens = request.skip_special_tokens;
  r.on_output = [self = shared_from_this()](engine::RequestOutput output) { self->OnOutput(std::move(output)); };
  const absl::Status submitted = service_->engine_->Submit(std::move(r));
  bool cancel_now = false;
  {
    absl::MutexLock lock(&mu_);
    if (!submitted.ok()) {
      submitted_ = false;
      EndLocked(ToGrpcStatus(submitted), nullptr);
    } else {
      cancel_now = cancelled_;
    }
  }
  // A cancel that came while Submit ran found no request to cancel yet.
  if (cancel_now) service_->engine_->Cancel(request_id_);
  Pump();
}

void GenerateCall::OnOutput(engine::RequestOutput output) {
  {
    absl::MutexLock lock(&mu_);
    if (final_status_.has_value()) return;
    const bool has_delta = !output.text.empty() || !output.token_ids.empty();
    if (!output.token_ids.empty()) {
      const auto now = std::chrono::steady_clock::now();
      if (!last_token_.has_value()) {
        service_->metrics_->FirstToken(std::chrono::duration<double>(now - arrival_).count());
      } else {
        service_->metrics_->InterToken(std::chrono::duration<double>(now - *last_token_).count());
      }
      last_token_ = now;
    }
    if (streaming_ && !cancelled_ && (has_delta || output.finished)) {
      // Pieces that arrive while a write is in flight merge into one waiting message.
      if (pending_.empty()) pending_.emplace_back().set_request_id(request_id_);
      v1::GenerateResponse& r = pending_.back();
      r.mutable_text()->append(output.text);
      for (int32_t id : output.token_ids) r.add_token_ids(id);
      if (output.finished && output.status.ok()) {
        v1::Completion* c = r.mutable_final();
        c->set_finish_reason(ToProto(output.finish_reason));
        ToProto(output.usage, c->mutable_usage());
        ToProto(output.timings, preprocess_ms_, c->mutable_timings());
      }
    } else if (!streaming_) {
      reply_.mutable_text()->append(output.text);
      for (int32_t id : output.token_ids) reply_.add_token_ids(id);
      if (output.finished && output.status.ok()) {
        v1::Completion* c = reply_.mutable_completion();
        c->set_finish_reason(ToProto(output.finish_reason));
        ToProto(output.usage, c->mutable_usage());
        ToProto(output.timings, preprocess_ms_, c->mutable_timings());
      }
    }
    if (output.finished) {
      grpc::Status status = ToGrpcStatus(output.status);
      if (status.ok() && output.finish_reason == llm::FinishReason::kCancelled) {
        status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
      } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE && service_->draining()) {
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "the server shut down before the request finished (grace period over); retry elsewhere");
      }
      EndLocked(status, &output);
    }
  }
  Pump();
}

void GenerateCall::ClientCancelled() {
  bool cancel_in_engine = false;
  {
    absl::MutexLock lock(&mu_);
    if (final_status_.has_value() || cancelled_) return;
    cancelled_ = true;
    pending_.clear();
    cancel_in_engine = submitted_;
  }
  if (cancel_in_engine) service_->engine_->Cancel(request_id_);
  Pump();
}

void GenerateCall::WriteDone(bool ok) {
  bool cancel_in_engine = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok && !cancelled_) {  // the stream broke: nobody reads what comes next
      cancelled_ = true;
      pending_.clear();
      cancel_in_engine = submitted_ && !final_status_.has_value();
    }
  }
  if (cancel_in_engine) service_->engine_->Cancel(request_id_);
  Pump();
}

void GenerateCall::ReactorDone() {
  absl::MutexLock lock(&mu_);
  ops_ = nullptr;
}

void GenerateCall::Abort(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (final_status_.has_value() || submitted_) return;  // the engine ends submitted calls
    EndLocked(status, nullptr);
  }
  Pump();
}

void GenerateCall::EndLocked(grpc::Status status, const engine::RequestOutput* output) {
  if (final_status_.has_value()) return;
  final_status_ = status;
  static const engine::Usage kNoUsage;
  static const engine::Timings kNoTimings;
  const std::string line =
      RequestLogLine(request_id_, status, output ? llm::FinishReasonName(output->finish_reason) : "",
                     output ? output->usage : kNoUsage, output ? output->timings : kNoTimings, preprocess_ms_);
  std::fprintf(stderr, "%s\n", line.c_str());
  service_->metrics_->RequestEnded(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                                   output ? llm::FinishReasonName(output->finish_reason) : "",
                                   output ? output->usage : kNoUsage, output ? output->timings : kNoTimings,
                                   preprocess_ms_, MsSince(arrival_) / 1e3);
  if (!status.ok()) service_->requests_failed_.fetch_add(1);
  service_->Unregister(request_id_);
}

void GenerateCall::Pump() {
  enum class Action { kWrite, kFinishStream, kFinishUnary };
  Action action;
  CallReactorOps* ops;
  grpc::Status status;
  v1::GenerateReply reply;
  {
    absl::MutexLock lock(&mu_);
    if (ops_ == nullptr || finish_issued_ || writing_) return;
    if (streaming_ && !cancelled_ && !pending_.empty()) {
      current_ = std::move(pending_.front());
      pending_.pop_front();
      writing_ = true;
      action = Action::kWrite;
    } else if (final_status_.has_value()) {
      finish_issued_ = true;
      status = *final_status_;
      action = streaming_ ? Action::kFinishStream : Action::kFinishUnary;
      if (!streaming_) reply = std::move(reply_);
    } else {
      return;
    }
    ops = ops_;
  }
  // The reactor outlives these calls: OnDone comes only after Finish, and Finish only once no
  // write is in flight.
  switch (action) {
    case Action::kWrite:
      ops->StartWrite(&current_);
      break;
    case Action::kFinishStream:
      ops->FinishStream(status);
      break;
    case Action::kFinishUnary:
      if (status.ok()) reply.set_request_id(request_id_);
      ops->FinishUnary(std::move(reply), status);
      break;
  }
}

}  // namespace iris::server
