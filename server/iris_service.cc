#include "server/iris_service.h"

#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/generate_call.h"
#include "server/request_conversion.h"

namespace iris::server {
namespace {

constexpr char kVersion[] = "iris 0.4.0";

// What both reactors do: forward the client's cancel and the end of the RPC to their call, and
// keep the service's count of open reactors (shutdown waits for it).
template <class GrpcReactor>
class CallReactor : public GrpcReactor, public CallReactorOps {
 public:
  explicit CallReactor(IrisService* service) : service_(service) { service_->ReactorStarted(); }
  void set_call(std::shared_ptr<GenerateCall> call) { call_ = std::move(call); }

  void OnCancel() override {
    if (call_) call_->ClientCancelled();
  }
  void OnDone() override {
    if (call_) call_->ReactorDone();
    IrisService* service = service_;
    delete this;
    service->ReactorDone();
  }

 protected:
  std::shared_ptr<GenerateCall> call_;

 private:
  IrisService* const service_;
};

class StreamReactor final : public CallReactor<grpc::ServerWriteReactor<v1::GenerateResponse>> {
 public:
  using CallReactor::CallReactor;

  void StartWrite(const v1::GenerateResponse* response) override {
    grpc::ServerWriteReactor<v1::GenerateResponse>::StartWrite(response);
  }
  void FinishStream(const grpc::Status& status) override { Finish(status); }
  void FinishUnary(v1::GenerateReply, const grpc::Status& status) override { Finish(status); }
  void OnWriteDone(bool ok) override {
    if (call_) call_->WriteDone(ok);
  }
};

class UnaryReactor final : public CallReactor<grpc::ServerUnaryReactor> {
 public:
  UnaryReactor(IrisService* service, v1::GenerateReply* reply) : CallReactor(service), reply_(reply) {}

  void StartWrite(const v1::GenerateResponse*) override {}
  void FinishStream(const grpc::Status& status) override { Finish(status); }
  void FinishUnary(v1::GenerateReply reply, const grpc::Status& status) override {
    if (status.ok()) *reply_ = std::move(reply);
    Finish(status);
  }

 private:
  v1::GenerateReply* const reply_;
};

// Compares without an early exit, so the time taken does not tell how much of a guess matched.
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

IrisService::IrisService(engine::Engine* engine, core::ThreadPool* workers, const ServerOptions& options)
    : engine_(engine),
      workers_(workers),
      options_(options),
      metrics_(options.metrics ? options.metrics : std::make_shared<Metrics>()) {
  const engine::Model& model = engine->model();
  const engine::EngineOptions& eo = engine->options();
  // The folder's name ("models/Qwen2.5-VL-3B-Instruct/" -> "Qwen2.5-VL-3B-Instruct").
  std::filesystem::path dir = std::filesystem::path(model.dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  model_info_.set_model(dir.filename().string());
  model_info_.set_model_type(model.config.model_type.empty() ? core::FamilyModelType(model.config.family)
                                                             : model.config.model_type);
  model_info_.set_dtype(options.dtype);
  model_info_.set_vocab_size(model.config.text.vocab_size);
  v1::Limits* limits = model_info_.mutable_limits();
  limits->set_max_message_bytes(options.limits.max_message_bytes);
  limits->set_max_image_bytes(options.limits.max_image_bytes);
  limits->set_max_image_pixels(options.limits.max_image_pixels);
  limits->set_max_images_per_request(options.limits.max_images_per_request);
  limits->set_max_prompt_tokens(options.limits.max_prompt_tokens);
  limits->set_max_tokens(options.limits.max_tokens);
  limits->set_max_model_len(engine->max_model_len());
  limits->set_max_queue(eo.max_queue);
  model_info_.set_accepts_images(model.config.has_vision());
  model_info_.set_architecture(core::FamilyArchitecture(model.config.family));
  model_info_.set_device(model.device->Describe());
  if (model.encoder_device != nullptr) model_info_.set_encoder_device(model.encoder_device->Describe());
  const engine::SamplingDefaults& sd = options.limits.sampling_defaults;
  v1::SamplingDefaults* defaults = model_info_.mutable_sampling_defaults();
  defaults->set_temperature(sd.temperature);
  defaults->set_top_p(sd.top_p);
  defaults->set_top_k(sd.top_k);
  defaults->set_repetition_penalty(sd.repetition_penalty);
  defaults->set_source(sd.source);
  defaults->set_max_tokens(static_cast<uint64_t>(DefaultMaxTokens(options.limits)));
  if (model.config.has_vision()) {
    limits->set_min_pixels(model.preprocessor.min_pixels);
    limits->set_max_pixels(model.preprocessor.max_pixels);
    v1::EncoderTechniques* t = model_info_.mutable_encoder_techniques();
    t->set_fused_rotary(model.options.techniques.fused_rotary);
    t->set_parallel_qkv_padding(model.options.techniques.parallel_qkv_padding);
    t->set_cached_cu_seqlens(model.options.techniques.cached_cu_seqlens);
  } else {
    // No image is accepted: the image limits say so.
    limits->set_max_image_bytes(0);
    limits->set_max_image_pixels(0);
    limits->set_max_images_per_request(0);
  }
  model_info_.set_max_num_seqs(eo.max_num_seqs);
  model_info_.set_max_num_batched_tokens(eo.max_num_batched_tokens);
  model_info_.set_kv_cache_blocks(engine->stats().kv_blocks_total);
  model_info_.set_kv_block_size(eo.kv_block_size);
  model_info_.set_server_version(kVersion);
}

IrisService::~IrisService() = default;

grpc::Status IrisService::Admit(const grpc::CallbackServerContext& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return Admit(std::nullopt);
  return Admit(std::string_view(it->second.data(), it->second.size()));
}

grpc::Status IrisService::Admit(std::optional<std::string_view> authorization) const {
  if (!options_.auth_token.empty()) {
    if (!authorization.has_value()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "authorization: missing (send \"authorization: Bearer <token>\" as gRPC metadata or HTTP header)");
    }
    const std::string_view value = *authorization;
    constexpr std::string_view kBearer = "Bearer ";
    if (value.substr(0, kBearer.size()) != kBearer ||
        !ConstantTimeEquals(value.substr(kBearer.size()), options_.auth_token)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization: invalid bearer token");
    }
  }
  if (draining_.load()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
  return grpc::Status::OK;
}

grpc::Status IrisService::StartCall(std::optional<std::string_view> authorization,
                                    const v1::GenerateRequest& request, bool streaming, CallReactorOps* ops,
                                    std::shared_ptr<GenerateCall>* call) {
  return StartAdmittedCall(Admit(authorization), request, streaming, ops, call);
}

grpc::Status IrisService::StartAdmittedCall(grpc::Status admitted, const v1::GenerateRequest& request,
                                            bool streaming, CallReactorOps* ops, std::shared_ptr<GenerateCall>* call) {
  const std::string& given_id = request.request_id();
  grpc::Status status = std::move(admitted);
  absl::StatusOr<ValidatedRequest> validated;
  if (status.ok()) {
    validated = ValidateRequest(request, options_.limits, engine_->model().config.text.vocab_size);
    if (!validated.ok()) status = ToGrpcStatus(validated.status());
  }
  if (status.ok()) {
    // Waiting work = prompts being built + requests queued in the engine.
    const int64_t waiting = preprocessing_.load() + engine_->stats().waiting;
    if (waiting >= engine_->options().max_queue) {
      status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("the server's queue is full: ", waiting, " requests waiting, limit ",
                                         engine_->options().max_queue, " (max_queue); retry later"));
    }
  }
  std::string id = given_id.empty() ? absl::StrCat("iris-", next_id_.fetch_add(1)) : given_id;
  if (status.ok()) {
    auto created = std::make_shared<GenerateCall>(this, id, streaming, ops);
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = calls_.try_emplace(id, created);
    if (!inserted && !it->second.expired()) {
      status = grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                            absl::StrCat("request_id: \"", id, "\" is already in flight"));
    } else {
      it->second = created;
      *call = std::move(created);
    }
  }
  if (!status.ok()) {
    LogRejected(id, status);
    requests_failed_.fetch_add(1);
    return status;
  }
  (*call)->Start(std::move(*validated));
  return grpc::Status::OK;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* IrisService::Generate(grpc::CallbackServerContext* context,
                                                                      const v1::GenerateRequest* request) {
  auto* reactor = new StreamReactor(this);
  std::shared_ptr<GenerateCall> call;
  grpc::Status status = StartAdmittedCall(Admit(*context), *request, /*streaming=*/true, reactor, &call);
  if (!status.ok()) {
    reactor->Finish(status);
  } else {
    reactor->set_call(std::move(call));
  }
  return reactor;
}

grpc::ServerUnaryReactor* IrisService::GenerateUnary(grpc::CallbackServerContext* context,
                                                     const v1::GenerateRequest* request, v1::GenerateReply* reply) {
  auto* reactor = new UnaryReactor(this, reply);
  std::shared_ptr<GenerateCall> call;
  grpc::Status status = StartAdmittedCall(Admit(*context), *request, /*streaming=*/false, reactor, &call);
  if (!status.ok()) {
    reactor->Finish(status);
  } else {
    reactor->set_call(std::move(call));
  }
  return reactor;
}

grpc::ServerUnaryReactor* IrisService::GetModelInfo(grpc::CallbackServerContext* context,
                                                    const v1::GetModelInfoRequest*, v1::ModelInfo* info) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status status = Admit(*context);
  if (status.ok()) *info = model_info_;
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* IrisService::GetStats(grpc::CallbackServerContext* context, const v1::GetStatsRequest*,
                                                v1::ServerStats* out) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status status = Admit(*context);
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) status = grpc::Status::OK;  // stats stay readable while draining
  if (status.ok()) {
    const engine::EngineStats s = engine_->stats();
    out->set_waiting(s.waiting);
    out->set_running(s.running);
    out->set_preprocessing(preprocessing_.load());
    out->set_streams_open(in_flight());
    out->set_kv_blocks_total(s.kv_blocks_total);
    out->set_kv_blocks_used(s.kv_blocks_used);
    out->set_encoder_cache_hits(s.encoder_cache_hits);
    out->set_encoder_cache_misses(s.encoder_cache_misses);
    out->set_images_encoded(s.images_encoded);
    out->set_steps(s.steps);
    out->set_preemptions(s.preemptions);
    out->set_tokens_generated(s.tokens_generated);
    out->set_requests_finished(s.requests_finished);
    out->set_requests_failed(requests_failed_.load());
    out->set_draining(draining_.load());
    out->set_encoder_cache_entries(s.encoder_cache_entries);
    out->set_encoder_cache_bytes(s.encoder_cache_bytes);
    out->set_prefix_cache_queries(s.prefix_cache_queries);
    out->set_prefix_cache_hits(s.prefix_cache_hits);
    out->set_prefix_cache_hit_rate(s.prefix_cache_hit_rate());
    out->set_kv_blocks_cached(s.kv_blocks_cached);
  }
  reactor->Finish(status);
  return reactor;
}

ScrapeState IrisService::scrape_state() const {
  ScrapeState state;
  state.engine = engine_->stats();
  state.preprocessing = preprocessing_.load();
  state.calls_in_flight = in_flight();
  state.http_calls_in_flight = http_calls_.load();
  state.draining = draining_.load();
  return state;
}

void IrisService::StartDraining() { draining_.store(true); }

int64_t IrisService::in_flight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(calls_.size());
}

bool IrisService::WaitForIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(
      absl::Condition(+[](IrisService* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->calls_.empty(); }, this),
      deadline);
}

bool IrisService::ScheduleWork(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (workers_closed_) return false;
  workers_->Schedule(std::move(task));
  return true;
}

void IrisService::CloseWorkers() {
  absl::MutexLock lock(&mu_);
  workers_closed_ = true;
}

void IrisService::ReactorStarted() {
  absl::MutexLock lock(&mu_);
  ++reactors_open_;
}

void IrisService::ReactorDone() {
  absl::MutexLock lock(&mu_);
  --reactors_open_;
}

bool IrisService::WaitForReactors(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(
      absl::Condition(+[](IrisService* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->reactors_open_ == 0; },
                      this),
      deadline);
}

void IrisService::AbortAll(const std::string& reason) {
  std::vector<std::shared_ptr<GenerateCall>> calls;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, weak] : calls_) {
      if (auto call = weak.lock()) calls.push_back(std::move(call));
    }
  }
  for (auto& call : calls) call->Abort(grpc::Status(grpc::StatusCode::UNAVAILABLE, reason));
}

void IrisService::Unregister(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  calls_.erase(request_id);
}

void IrisService::LogRejected(const std::string& request_id, const grpc::Status& status) const {
  const std::string line = RequestLogLine(request_id, status, "", engine::Usage{}, engine::Timings{}, 0);
  std::fprintf(stderr, "%s\n", line.c_str());
  metrics_->RequestEnded(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())), "",
                         engine::Usage{}, engine::Timings{}, 0, 0);
}

}  // namespace iris::server
