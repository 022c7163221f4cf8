// An HTTP body as a client sends it to /v1/chat/completions or /v1/completions (the first byte
// picks which) -> openai::ParseRequest -> the gRPC-side validation both fronts share -> the
// error object the HTTP front would answer with. Properties: parsing answers OK, INVALID_ARGUMENT
// or NOT_FOUND (never throws: nlohmann's exceptions would escape the handler); an accepted body
// is a request that survives the wire (serialize, parse back, equal) and that validation accepts
// or refuses with INVALID_ARGUMENT; every refusal's error body is JSON with error.message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "iris/v1/iris.pb.h"
#include "nlohmann/json.hpp"
#include "server/openai_api.h"
#include "server/request_conversion.h"
#include "server/server_options.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

constexpr int64_t kVocab = 151936;
const std::string kModel = "iris-fuzz";

iris::server::RequestLimits FuzzLimits() {
  iris::server::RequestLimits limits;
  limits.max_image_bytes = 1 << 16;
  limits.max_images_per_request = 4;
  limits.max_prompt_tokens = 4096;
  return limits;
}

// What the HTTP front sends for a refusal must be an OpenAI error object a client can parse.
void CheckErrorBody(const absl::Status& status) {
  const grpc::Status g = iris::server::ToGrpcStatus(status);
  const int http = iris::server::openai::HttpStatusOf(g.error_code());
  IRIS_FUZZ_CHECK(http >= 400 && http < 600, "HTTP status %d for %s", http, status.ToString().c_str());
  const std::string body =
      iris::server::openai::ErrorBody(http, g.error_message(), iris::server::openai::ParamOf(g.error_message()));
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  IRIS_FUZZ_CHECK(!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
                      j["error"].contains("message") && j["error"]["message"].is_string(),
                  "error body is not an OpenAI error object: %s", body.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using iris::server::openai::Endpoint;
  static const iris::server::RequestLimits limits = FuzzLimits();
  if (size == 0) return 0;
  const Endpoint endpoint = (data[0] & 1) != 0 ? Endpoint::kCompletions : Endpoint::kChatCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);

  const auto parsed = iris::server::openai::ParseRequest(endpoint, body, kModel, limits);
  if (!parsed.ok()) {
    const absl::StatusCode code = parsed.status().code();
    IRIS_FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound,
                    "parse failed with %s", parsed.status().ToString().c_str());
    CheckErrorBody(parsed.status());
    return 0;
  }
  IRIS_FUZZ_CHECK(parsed->endpoint == endpoint, "endpoint changed");
  IRIS_FUZZ_CHECK(!parsed->include_usage || parsed->stream, "include_usage without stream");

  // The request crosses no wire here, but it must be one that could (proto3 strings are UTF-8).
  std::string wire;
  IRIS_FUZZ_CHECK(parsed->request.SerializeToString(&wire), "the request does not serialize");
  iris::v1::GenerateRequest back;
  IRIS_FUZZ_CHECK(back.ParseFromString(wire), "the serialized request does not parse back");
  IRIS_FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(back, parsed->request),
                  "the request changed on the wire");

  const auto validated = iris::server::ValidateRequest(parsed->request, limits, kVocab);
  if (!validated.ok()) {
    IRIS_FUZZ_CHECK(validated.status().code() == absl::StatusCode::kInvalidArgument, "validation failed with %s",
                    validated.status().ToString().c_str());
    CheckErrorBody(validated.status());
  }
  return 0;
}
