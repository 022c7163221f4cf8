#include "server/openai_api.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace iris::server::openai {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// A field asked for something iris does not do.
absl::Status Refuse(const char* field, const std::string& why) {
  return Invalid(absl::StrCat(field, ": ", why));
}

absl::StatusOr<double> Number(const Json& v, const char* field) {
  if (!v.is_number()) return Invalid(absl::StrCat(field, ": must be a number"));
  const double d = v.get<double>();
  if (!std::isfinite(d)) return Invalid(absl::StrCat(field, ": must be finite"));
  return d;
}

absl::StatusOr<int64_t> Integer(const Json& v, const char* field) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(absl::StrCat(field, ": ", u, " is out of range"));
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return Invalid(absl::StrCat(field, ": must be an integer"));
}

absl::StatusOr<bool> Bool(const Json& v, const char* field) {
  if (!v.is_boolean()) return Invalid(absl::StrCat(field, ": must be true or false"));
  return v.get<bool>();
}

// "data:image/png;base64,AAAA" -> the decoded bytes.
absl::Status DecodeImageUrl(const Json& part, const std::string& path, const RequestLimits& limits, v1::Image* out) {
  const Json* url = nullptr;
  const auto it = part.find("image_url");
  if (it == part.end()) return Invalid(absl::StrCat(path, ".image_url: missing"));
  if (it->is_string()) {
    url = &*it;
  } else if (it->is_object() && it->contains("url")) {
    url = &(*it)["url"];
  }
  const std::string field = absl::StrCat(path, ".image_url.url");
  if (url == nullptr || !url->is_string()) return Invalid(absl::StrCat(field, ": missing or not a string"));
  const std::string& text = url->get_ref<const std::string&>();
  if (absl::StartsWithIgnoreCase(text, "http://") || absl::StartsWithIgnoreCase(text, "https://")) {
    return Invalid(absl::StrCat(field, ": http(s) URLs are not fetched by this server; send the image inline as "
                                       "a data URL (data:image/png;base64,...)"));
  }
  if (!absl::StartsWithIgnoreCase(text, "data:")) {
    return Invalid(absl::StrCat(field, ": must be a data URL (data:image/...;base64,...)"));
  }
  const size_t comma = text.find(',');
  if (comma == std::string::npos || !absl::EndsWithIgnoreCase(absl::string_view(text).substr(0, comma), ";base64")) {
    return Invalid(absl::StrCat(field, ": a data URL must be base64-encoded (data:image/...;base64,...)"));
  }
  const absl::string_view b64 = absl::string_view(text).substr(comma + 1);
  // Checked before decoding, so an oversized image costs no decode.
  if (static_cast<int64_t>(b64.size() / 4 * 3) > limits.max_image_bytes + 3) {
    return Invalid(absl::StrCat(field, ": about ", b64.size() / 4 * 3, " bytes once decoded, over the limit of ",
                                limits.max_image_bytes, " bytes (max_image_bytes)"));
  }
  if (!absl::Base64Unescape(b64, out->mutable_data())) return Invalid(absl::StrCat(field, ": invalid base64"));
  return absl::OkStatus();
}

absl::Status ConvertContent(const Json& content, const std::string& path, const RequestLimits& limits,
                            v1::ChatMessage* out) {
  if (content.is_string()) {
    out->add_content()->set_text(content.get<std::string>());
    return absl::OkStatus();
  }
  if (!content.is_array()) return Invalid(absl::StrCat(path, ": must be a string or an array of parts"));
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string part_path = absl::StrCat(path, "[", j, "]");
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return Invalid(absl::StrCat(part_path, ".type: missing (\"text\" or \"image_url\")"));
    }
    const std::string& type = part["type"].get_ref<const std::string&>();
    if (type == "text") {
      if (!part.contains("text") || !part["text"].is_string()) {
        return Invalid(absl::StrCat(part_path, ".text: missing or not a string"));
      }
      out->add_content()->set_text(part["text"].get<std::string>());
    } else if (type == "image_url") {
      if (absl::Status st = DecodeImageUrl(part, part_path, limits, out->add_content()->mutable_image()); !st.ok()) {
        return st;
      }
    } else {
      return Invalid(absl::StrCat(part_path, ".type: \"", type.substr(0, 32),
                                  "\" is not supported (\"text\" or \"image_url\")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ConvertMessages(const Json& body, const RequestLimits& limits, v1::GenerateRequest* out) {
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array()) return Invalid("messages: missing or not an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string path = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Invalid(absl::StrCat(path, ": must be an object"));
    v1::ChatMessage* message = out->add_messages();
    if (!m.contains("role") || !m["role"].is_string()) return Invalid(absl::StrCat(path, ".role: missing"));
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system turn
    message->set_role(role);
    if (!m.contains("content") || m["content"].is_null()) return Invalid(absl::StrCat(path, ".content: missing"));
    if (absl::Status st = ConvertContent(m["content"], path + ".content", limits, message); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status ConvertPrompt(const Json& body, v1::GenerateRequest* out) {
  const auto it = body.find("prompt");
  if (it == body.end()) return Invalid("prompt: missing");
  const Json* prompt = &*it;
  if (prompt->is_array() && prompt->size() == 1) prompt = &(*prompt)[0];
  if (!prompt->is_string()) return Invalid("prompt: must be a string (one prompt per request)");
  v1::ChatMessage* message = out->add_messages();
  message->set_role("user");
  message->add_content()->set_text(prompt->get<std::string>());
  return absl::OkStatus();
}

absl::Status ConvertSampling(const Json& body, Endpoint endpoint, v1::SamplingParams* s) {
  auto present = [&](const char* key) { return body.contains(key) && !body[key].is_null(); };
  // max_completion_tokens is the newer name; it wins when both are sent (as vLLM does).
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!present(key)) continue;
    absl::StatusOr<int64_t> v = Integer(body[key], key);
    if (!v.ok()) return v.status();
    if (*v < 1 || *v > std::numeric_limits<uint32_t>::max()) {
      return Invalid(absl::StrCat(key, ": must be at least 1, got ", *v));
    }
    s->set_max_tokens(static_cast<uint32_t>(*v));
  }
  if (present("temperature")) {
    absl::StatusOr<double> v = Number(body["temperature"], "temperature");
    if (!v.ok()) return v.status();
    s->set_temperature(static_cast<float>(*v));
  }
  if (present("top_p")) {
    absl::StatusOr<double> v = Number(body["top_p"], "top_p");
    if (!v.ok()) return v.status();
    s->set_top_p(static_cast<float>(*v));
  }
  if (present("top_k")) {
    absl::StatusOr<int64_t> v = Integer(body["top_k"], "top_k");
    if (!v.ok()) return v.status();
    if (*v < -1 || *v > std::numeric_limits<int32_t>::max()) {
      return Invalid(absl::StrCat("top_k: must be -1 or 0 (off) or positive, got ", *v));
    }
    s->set_top_k(*v == -1 ? 0 : static_cast<int32_t>(*v));  // vLLM's -1 = off
  }
  if (present("seed")) {
    absl::StatusOr<int64_t> v = Integer(body["seed"], "seed");
    if (!v.ok()) return v.status();
    s->set_seed(static_cast<uint64_t>(*v));
  }
  if (present("repetition_penalty")) {
    absl::StatusOr<double> v = Number(body["repetition_penalty"], "repetition_penalty");
    if (!v.ok()) return v.status();
    s->set_repetition_penalty(static_cast<float>(*v));
  }
  if (present("stop")) {
    const Json& stop = body["stop"];
    if (stop.is_string()) {
      s->add_stop(stop.get<std::string>());
    } else if (stop.is_array()) {
      for (size_t i = 0; i < stop.size(); ++i) {
        if (!stop[i].is_string()) return Invalid(absl::StrCat("stop[", i, "]: must be a string"));
        s->add_stop(stop[i].get<std::string>());
      }
    } else {
      return Invalid("stop: must be a string or an array of strings");
    }
  }
  if (present("stop_token_ids")) {
    const Json& ids = body["stop_token_ids"];
    if (!ids.is_array()) return Invalid("stop_token_ids: must be an array of integers");
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string field = absl::StrCat("stop_token_ids[", i, "]");
      absl::StatusOr<int64_t> v = Integer(ids[i], field.c_str());
      if (!v.ok()) return v.status();
      if (*v < 0 || *v > std::numeric_limits<int32_t>::max()) return Invalid(absl::StrCat(field, ": out of range"));
      s->add_stop_token_ids(static_cast<int32_t>(*v));
    }
  }
  if (present("ignore_eos")) {
    absl::StatusOr<bool> v = Bool(body["ignore_eos"], "ignore_eos");
    if (!v.ok()) return v.status();
    s->set_ignore_eos(*v);
  }
  if (present("min_tokens")) {
    absl::StatusOr<int64_t> v = Integer(body["min_tokens"], "min_tokens");
    if (!v.ok()) return v.status();
    if (*v < 0 || *v > std::numeric_limits<uint32_t>::max()) return Invalid(absl::StrCat("min_tokens: must be >= 0, got ", *v));
    s->set_min_tokens(static_cast<uint32_t>(*v));
  }
  if (present("n")) {
    absl::StatusOr<int64_t> v = Integer(body["n"], "n");
    if (!v.ok()) return v.status();
    if (*v != 1) return Invalid(absl::StrCat("n: only 1 is supported, got ", *v));
  }
  if (present("best_of")) {
    absl::StatusOr<int64_t> v = Integer(body["best_of"], "best_of");
    if (!v.ok()) return v.status();
    if (*v != 1) return Invalid(absl::StrCat("best_of: only 1 is supported, got ", *v));
  }
  if (present("logprobs")) {
    const Json& lp = body["logprobs"];
    const bool asked = endpoint == Endpoint::kChatCompletions ? !(lp.is_boolean() && !lp.get<bool>())
                                                              : !(lp.is_number_integer() && lp.get<int64_t>() == 0);
    if (asked) return Refuse("logprobs", "log probabilities are not supported");
  }
  if (present("top_logprobs")) return Refuse("top_logprobs", "log probabilities are not supported");
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    if (!present(key)) continue;
    absl::StatusOr<double> v = Number(body[key], key);
    if (!v.ok()) return v.status();
    if (*v != 0) return Invalid(absl::StrCat(key, ": only 0 is supported (see repetition_penalty)"));
  }
  if (present("logit_bias") && !(body["logit_bias"].is_object() && body["logit_bias"].empty())) {
    return Refuse("logit_bias", "not supported");
  }
  if (present("tools") && !(body["tools"].is_array() && body["tools"].empty())) {
    return Refuse("tools", "tool calling is not supported");
  }
  if (present("response_format")) {
    const Json& rf = body["response_format"];
    if (!(rf.is_object() && rf.contains("type") && rf["type"] == "text")) {
      return Refuse("response_format", "only {\"type\": \"text\"} is supported");
    }
  }
  if (endpoint == Endpoint::kCompletions) {
    if (present("echo") && !(body["echo"].is_boolean() && !body["echo"].get<bool>())) {
      return Refuse("echo", "not supported");
    }
    if (present("suffix")) return Refuse("suffix", "not supported");
  }
  return absl::OkStatus();
}

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Json UsageObject(const v1::Usage& usage) {
  return Json{{"prompt_tokens", usage.prompt_tokens()},
              {"completion_tokens", usage.completion_tokens()},
              {"total_tokens", usage.prompt_tokens() + usage.completion_tokens()},
              {"prompt_tokens_details", {{"image_tokens", usage.image_tokens()}}}};
}

Json Head(const ReplyIdentity& who, bool chunk) {
  const bool chat = who.endpoint == Endpoint::kChatCompletions;
  return Json{{"id", who.id},
              {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", who.created},
              {"model", who.model}};
}

std::string Event(const Json& j) { return absl::StrCat("data: ", Dump(j), "\n\n"); }

}  // namespace

absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body, const std::string& served_model,
                                           const RequestLimits& limits) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid("body: not valid JSON");
  if (!j.is_object()) return Invalid("body: must be a JSON object");
  ParsedRequest out;
  out.endpoint = endpoint;
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return Invalid("model: must be a string");
    const std::string& model = j["model"].get_ref<const std::string&>();
    if (model != served_model) {
      return absl::NotFoundError(absl::StrCat("model: \"", model.substr(0, 64), "\" does not exist; this server serves \"",
                                              served_model, "\" (GET /v1/models)"));
    }
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    absl::StatusOr<bool> v = Bool(j["stream"], "stream");
    if (!v.ok()) return v.status();
    out.stream = *v;
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const Json& so = j["stream_options"];
    if (!so.is_object()) return Invalid("stream_options: must be an object");
    if (!out.stream) return Invalid("stream_options: only allowed with stream true");
    if (so.contains("include_usage") && !so["include_usage"].is_null()) {
      absl::StatusOr<bool> v = Bool(so["include_usage"], "stream_options.include_usage");
      if (!v.ok()) return v.status();
      out.include_usage = *v;
    }
  }
  if (j.contains("skip_special_tokens") && !j["skip_special_tokens"].is_null()) {
    absl::StatusOr<bool> v = Bool(j["skip_special_tokens"], "skip_special_tokens");
    if (!v.ok()) return v.status();
    out.request.set_skip_special_tokens(*v);
  }
  if (absl::Status st = ConvertSampling(j, endpoint, out.request.mutable_sampling()); !st.ok()) return st;
  absl::Status st = endpoint == Endpoint::kChatCompletions ? ConvertMessages(j, limits, &out.request)
                                                           : ConvertPrompt(j, &out.request);
  if (!st.ok()) return st;
  return out;
}

std::string ParamOf(std::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == std::string_view::npos) return "";
  std::string field(message.substr(0, colon));
  if (field.find(' ') != std::string::npos) return "";
  if (absl::StartsWith(field, "sampling.")) field = field.substr(9);
  // The gRPC path names the image part "...content[j].image[.data|.min_pixels]".
  if (const size_t image = field.find("].image"); image != std::string::npos && field.find("image_url") == std::string::npos) {
    field = field.substr(0, image + 1) + ".image_url";
  }
  if (field == "request_id") field = "X-Request-Id";
  return field;
}

int HttpStatusOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
      return 409;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

std::string ErrorBody(int http_status, std::string_view message, std::string_view param) {
  const char* type = "invalid_request_error";
  const char* code = nullptr;
  switch (http_status) {
    case 401:
      type = "authentication_error";
      code = "invalid_api_key";
      break;
    case 404:
      code = "model_not_found";
      break;
    case 413:
      code = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      code = "queue_full";
      break;
    case 503:
      type = "service_unavailable";
      code = "server_draining";
      break;
    default:
      if (http_status >= 500) type = "server_error";
      break;
  }
  Json error{{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) error["param"] = param;
  if (code != nullptr) error["code"] = code;
  return Dump(Json{{"error", error}});
}

ReplyIdentity MakeIdentity(Endpoint endpoint, const std::string& request_id, const std::string& model) {
  ReplyIdentity who;
  who.endpoint = endpoint;
  who.id = absl::StrCat(endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", request_id);
  who.created = NowSeconds();
  who.model = model;
  return who;
}

const char* FinishReasonText(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "abort";
    default:
      return nullptr;
  }
}

std::string UsageJson(const v1::Usage& usage) { return Dump(UsageObject(usage)); }

std::string ReplyBody(const ReplyIdentity& who, const v1::GenerateReply& reply) {
  Json j = Head(who, /*chunk=*/false);
  const char* finish = FinishReasonText(reply.completion().finish_reason());
  Json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish ? Json(finish) : Json(nullptr)}};
  if (who.endpoint == Endpoint::kChatCompletions) {
    choice["message"] = Json{{"role", "assistant"}, {"content", reply.text()}};
  } else {
    choice["text"] = reply.text();
  }
  j["choices"] = Json::array({choice});
  j["usage"] = UsageObject(reply.completion().usage());
  return Dump(j);
}

std::string ChunkEvent(const ReplyIdentity& who, std::string_view text, bool first, const char* finish_reason) {
  Json j = Head(who, /*chunk=*/true);
  Json choice{{"index", 0}, {"logprobs", nullptr},
              {"finish_reason", finish_reason ? Json(finish_reason) : Json(nullptr)}};
  if (who.endpoint == Endpoint::kChatCompletions) {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  j["choices"] = Json::array({choice});
  return Event(j);
}

std::string UsageEvent(const ReplyIdentity& who, const v1::Usage& usage) {
  Json j = Head(who, /*chunk=*/true);
  j["choices"] = Json::array();
  j["usage"] = UsageObject(usage);
  return Event(j);
}

std::string ErrorEvent(int http_status, std::string_view message) {
  return absl::StrCat("data: ", ErrorBody(http_status, message), "\n\n");
}

std::string ModelsBody(const std::string& model, int64_t created, int64_t max_model_len) {
  Json m{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "iris"},
         {"max_model_len", max_model_len}};
  return Dump(Json{{"object", "list"}, {"data", Json::array({m})}});
}

}  // namespace iris::server::openai
