#include "server/request_conversion.h"

#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace iris::server {
namespace {

constexpr size_t kMaxRequestIdBytes = 128;

absl::Status Invalid(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

absl::Status CheckRequestId(const std::string& id) {
  if (id.size() > kMaxRequestIdBytes) {
    return Invalid(absl::StrCat("request_id: ", id.size(), " bytes, the limit is ", kMaxRequestIdBytes));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if (c < 0x21 || c > 0x7e) {
      return Invalid(absl::StrCat("request_id: character ", i,
                                  " is not printable ASCII (allowed: '!' to '~', no spaces)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> PixelBound(uint64_t value, const std::string& field) {
  if (value == 0) return std::optional<int64_t>();
  if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Invalid(absl::StrCat(field, ": ", value, " is out of range"));
  }
  return std::optional<int64_t>(static_cast<int64_t>(value));
}

absl::Status ConvertMessages(const v1::GenerateRequest& request, const RequestLimits& limits,
                             std::vector<engine::ChatInputMessage>* out) {
  if (request.messages().empty()) return Invalid("messages: empty (at least one message is required)");
  int images = 0;
  for (const v1::ChatMessage& m : request.messages()) {
    for (const v1::ContentPart& p : m.content()) images += p.has_image() ? 1 : 0;
  }
  if (images > limits.max_images_per_request) {
    return Invalid(absl::StrCat("messages: ", images, " images, over the limit of ", limits.max_images_per_request,
                                " per request (max_images_per_request)"));
  }
  out->reserve(request.messages_size());
  for (int i = 0; i < request.messages_size(); ++i) {
    const v1::ChatMessage& m = request.messages(i);
    const std::string path = absl::StrCat("messages[", i, "]");
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant") {
      return Invalid(absl::StrCat(path, ".role: must be \"system\", \"user\" or \"assistant\", got \"",
                                  m.role().substr(0, 32), m.role().size() > 32 ? "...\"" : "\""));
    }
    if (m.content().empty()) return Invalid(absl::StrCat(path, ".content: empty (at least one part is required)"));
    engine::ChatInputMessage& message = out->emplace_back();
    message.role = m.role();
    message.parts.reserve(m.content_size());
    for (int j = 0; j < m.content_size(); ++j) {
      const v1::ContentPart& p = m.content(j);
      const std::string part_path = absl::StrCat(path, ".content[", j, "]");
      engine::ChatInputPart& part = message.parts.emplace_back();
      switch (p.kind_case()) {
        case v1::ContentPart::kText:
          part.kind = engine::ChatInputPart::Kind::kText;
          part.text = p.text();
          break;
        case v1::ContentPart::kImage: {
          const v1::Image& image = p.image();
          if (image.data().empty()) return Invalid(absl::StrCat(part_path, ".image.data: empty"));
          if (static_cast<int64_t>(image.data().size()) > limits.max_image_bytes) {
            return Invalid(absl::StrCat(part_path, ".image.data: ", image.data().size(), " bytes, over the limit of ",
                                        limits.max_image_bytes, " bytes (max_image_bytes)"));
          }
          part.kind = engine::ChatInputPart::Kind::kImage;
          part.image_bytes = image.data();
          auto min_px = PixelBound(image.min_pixels(), part_path + ".image.min_pixels");
          if (!min_px.ok()) return min_px.status();
          auto max_px = PixelBound(image.max_pixels(), part_path + ".image.max_pixels");
          if (!max_px.ok()) return max_px.status();
          part.min_pixels = *min_px;
          part.max_pixels = *max_px;
          break;
        }
        case v1::ContentPart::KIND_NOT_SET:
          return Invalid(absl::StrCat(part_path, ": neither text nor image is set"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<llm::SamplingParams> ConvertSampling(const v1::SamplingParams& s, const RequestLimits& limits,
                                                    int64_t vocab_size) {
  llm::SamplingParams out;
  if (s.has_max_tokens()) {
    if (s.max_tokens() < 1 || s.max_tokens() > limits.max_tokens) {
      return Invalid(absl::StrCat("sampling.max_tokens: must be in [1, ", limits.max_tokens, "], got ",
                                  s.max_tokens(), " (max_tokens limit)"));
    }
    out.max_tokens = s.max_tokens();
  } else {
    out.max_tokens = DefaultMaxTokens(limits);
  }
  // Each unset field takes the model's default (its generation_config.json, as transformers'
  // generate() would; iris's own with --generation-config none), each set one its own value.
  const engine::SamplingDefaults& d = limits.sampling_defaults;
  out.temperature = s.has_temperature() ? s.temperature() : d.temperature;
  out.top_p = s.has_top_p() ? s.top_p() : d.top_p;
  out.top_k = d.top_k;
  out.repetition_penalty = s.has_repetition_penalty() ? s.repetition_penalty() : d.repetition_penalty;
  if (s.has_top_k()) {
    if (s.top_k() > vocab_size) {
      return Invalid(absl::StrCat("sampling.top_k: must be at most the vocabulary size ", vocab_size, ", got ",
                                  s.top_k()));
    }
    out.top_k = s.top_k();
  }
  if (s.has_seed()) out.seed = s.seed();
  if (s.stop_size() > static_cast<int>(llm::SamplingParams::kMaxStopStrings)) {
    return Invalid(absl::StrCat("sampling.stop: ", s.stop_size(), " strings, over the limit of ",
                                llm::SamplingParams::kMaxStopStrings));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    if (s.stop(i).empty()) return Invalid(absl::StrCat("sampling.stop[", i, "]: empty"));
    if (s.stop(i).size() > llm::SamplingParams::kMaxStopStringBytes) {
      return Invalid(absl::StrCat("sampling.stop[", i, "]: ", s.stop(i).size(), " bytes, over the limit of ",
                                  llm::SamplingParams::kMaxStopStringBytes));
    }
    out.stop_strings.push_back(s.stop(i));
  }
  for (int i = 0; i < s.stop_token_ids_size(); ++i) {
    const int32_t id = s.stop_token_ids(i);
    if (id < 0 || id >= vocab_size) {
      return Invalid(absl::StrCat("sampling.stop_token_ids[", i, "]: must be in [0, ", vocab_size, "), got ", id));
    }
    out.stop_token_ids.push_back(id);
  }
  out.ignore_eos = s.ignore_eos();
  out.min_tokens = s.min_tokens();
  // The remaining range checks (temperature, top_p, top_k >= 0, repetition_penalty) are the
  // sampler's own; its messages start with the field name.
  if (absl::Status st = out.Validate(); !st.ok()) {
    // "temperature must be ..." -> "sampling.temperature: must be ..."
    std::string message(st.message());
    if (const size_t space = message.find(' '); space != std::string::npos) message.replace(space, 1, ": ");
    return absl::Status(st.code(), absl::StrCat("sampling.", message));
  }
  return out;
}

}  // namespace

int64_t DefaultMaxTokens(const RequestLimits& limits) {
  const int64_t model = limits.sampling_defaults.max_tokens;
  return std::min(model > 0 ? model : limits.default_max_tokens, limits.max_tokens);
}

engine::PromptLimits PromptLimitsFor(const RequestLimits& limits) {
  engine::PromptLimits out;
  out.max_images = limits.max_images_per_request;
  out.max_prompt_tokens = limits.max_prompt_tokens;
  out.decode.max_bytes = limits.max_image_bytes;
  out.decode.max_pixels = limits.max_image_pixels;
  return out;
}

absl::StatusOr<ValidatedRequest> ValidateRequest(const v1::GenerateRequest& request, const RequestLimits& limits,
                                                 int64_t vocab_size) {
  ValidatedRequest out;
  if (absl::Status st = CheckRequestId(request.request_id()); !st.ok()) return st;
  out.request_id = request.request_id();
  auto sampling = ConvertSampling(request.sampling(), limits, vocab_size);
  if (!sampling.ok()) return sampling.status();
  out.sampling = std::move(*sampling);
  if (absl::Status st = ConvertMessages(request, limits, &out.messages); !st.ok()) return st;
  out.skip_special_tokens = request.has_skip_special_tokens() ? request.skip_special_tokens() : true;
  return out;
}

v1::FinishReason ToProto(llm::FinishReason reason) {
  switch (reason) {
    case llm::FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case llm::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case llm::FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case llm::FinishReason::kNone:
    case llm::FinishReason::kError:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToProto(const engine::Usage& usage, v1::Usage* out) {
  out->set_prompt_tokens(static_cast<uint32_t>(usage.prompt_tokens));
  out->set_image_tokens(static_cast<uint32_t>(usage.image_tokens));
  out->set_completion_tokens(static_cast<uint32_t>(usage.completion_tokens));
}

void ToProto(const engine::Timings& timings, double preprocess_ms, v1::Timings* out) {
  out->set_preprocess_ms(preprocess_ms);
  out->set_queue_ms(timings.queue_ms);
  out->set_encode_ms(timings.encode_ms);
  out->set_prefill_ms(timings.prefill_ms);
  out->set_first_token_ms(timings.first_token_ms);
  out->set_total_ms(timings.total_ms);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())), std::string(status.message()));
}

}  // namespace iris::server
