// The OpenAI-compatible wire format: chat/completions request bodies turned into the gRPC
// request (so both fronts share ValidateRequest and GenerateCall), and the replies, stream
// chunks and error objects shaped as OpenAI's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/request.h"
#include "grpcpp/support/status.h"
#include "iris/v1/iris.pb.h"
#include "server/server_options.h"

namespace iris::server::openai {

enum class Endpoint { kChatCompletions, kCompletions };

// A request body in iris.v1 terms plus what only the HTTP reply needs.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChatCompletions;
  v1::GenerateRequest request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// INVALID_ARGUMENT naming the OpenAI field ("messages[0].content[1].image_url.url: ...",
// "n: ...") for what the gRPC validation cannot see (JSON types, refused features, URLs);
// NOT_FOUND for a model other than `served_model`. Range checks are left to ValidateRequest.
absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body, const std::string& served_model,
                                           const RequestLimits& limits);

// The OpenAI field a validation message is about: "sampling.max_tokens: ..." -> "max_tokens",
// "messages[0].content[1].image.data: ..." -> "messages[0].content[1].image_url"; "" if none.
std::string ParamOf(std::string_view message);

// HTTP status for a gRPC status (400, 401, 404, 409, 413, 429, 499, 500, 503).
int HttpStatusOf(grpc::StatusCode code);
// {"error":{"message","type","param","code"}} as OpenAI sends it.
std::string ErrorBody(int http_status, std::string_view message, std::string_view param = {});

// One reply's identity: the same in every chunk of a stream.
struct ReplyIdentity {
  std::string id;  // "chatcmpl-<request id>" / "cmpl-<request id>"
  int64_t created = 0;
  std::string model;
  Endpoint endpoint = Endpoint::kChatCompletions;
};
ReplyIdentity MakeIdentity(Endpoint endpoint, const std::string& request_id, const std::string& model);

const char* FinishReasonText(v1::FinishReason reason);  // "stop", "length", "abort" or null
std::string UsageJson(const v1::Usage& usage);

// Non-streaming reply body.
std::string ReplyBody(const ReplyIdentity& who, const v1::GenerateReply& reply);
// One SSE event ("data: {...}\n\n"): a content delta, and with finish_reason set the last
// choice event. `first` adds the chat delta's role.
std::string ChunkEvent(const ReplyIdentity& who, std::string_view text, bool first, const char* finish_reason);
// The usage event of stream_options.include_usage (choices empty).
std::string UsageEvent(const ReplyIdentity& who, const v1::Usage& usage);
// An error inside a stream whose headers are already sent, then nothing.
std::string ErrorEvent(int http_status, std::string_view message);
inline constexpr std::string_view kDoneEvent = "data: [DONE]\n\n";

// GET /v1/models.
std::string ModelsBody(const std::string& model, int64_t created, int64_t max_model_len);

}  // namespace iris::server::openai
