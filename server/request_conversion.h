// The boundary between the wire API (iris.v1 messages) and the engine's types: request
// validation with field-named errors, and engine outputs turned into responses.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/prompt_builder.h"
#include "engine/request.h"
#include "grpcpp/support/status.h"
#include "iris/v1/iris.pb.h"
#include "llm/sampler.h"
#include "server/server_options.h"

namespace iris::server {

// A request checked field by field, in the engine's terms (prompt not yet built: that is the
// worker pool's job).
struct ValidatedRequest {
  std::string request_id;  // as the client sent it (may be empty: the server assigns one)
  std::vector<engine::ChatInputMessage> messages;
  llm::SamplingParams sampling;
  bool skip_special_tokens = true;
};

// INVALID_ARGUMENT naming the field (request_id, messages[i].role, messages[i].content[j].image,
// sampling.max_tokens, ...) and the limit it broke. Image bytes are copied out of `request`.
// The prompt-build limits (images, prompt tokens, image bytes and pixels) that the request
// limits imply: what a worker passes to engine::BuildPrompt.
engine::PromptLimits PromptLimitsFor(const RequestLimits& limits);
// The tokens a request that sets no sampling.max_tokens gets: the model's max_new_tokens
// (sampling_defaults), else default_max_tokens; at most max_tokens.
int64_t DefaultMaxTokens(const RequestLimits& limits);

absl::StatusOr<ValidatedRequest> ValidateRequest(const v1::GenerateRequest& request,
                                                 const RequestLimits& limits, int64_t vocab_size);

v1::FinishReason ToProto(llm::FinishReason reason);
void ToProto(const engine::Usage& usage, v1::Usage* out);
void ToProto(const engine::Timings& timings, double preprocess_ms, v1::Timings* out);

// absl codes map one to one onto gRPC codes (both follow google.rpc.Code).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace iris::server
