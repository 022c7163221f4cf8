// ValidateRequest: every rule gives INVALID_ARGUMENT naming the field and the limit; good
// requests come out in the engine's terms.
#include "server/request_conversion.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace iris::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 1000;

v1::GenerateRequest GoodRequest() {
  v1::GenerateRequest r;
  r.set_request_id("req-1");
  v1::ChatMessage* m = r.add_messages();
  m->set_role("user");
  v1::Image* image = m->add_content()->mutable_image();
  image->set_data("\xff\xd8\xff not really a jpeg");
  image->set_max_pixels(100000);
  m->add_content()->set_text("What is this?");
  return r;
}

RequestLimits Limits() {
  RequestLimits l;
  l.max_image_bytes = 1000;
  l.max_images_per_request = 2;
  l.max_tokens = 64;
  l.default_max_tokens = 16;
  return l;
}

void ExpectInvalid(const v1::GenerateRequest& r, const std::string& field, const std::string& detail = "") {
  absl::StatusOr<ValidatedRequest> v = ValidateRequest(r, Limits(), kVocab);
  ASSERT_FALSE(v.ok()) << field;
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << v.status();
  EXPECT_THAT(std::string(v.status().message()), HasSubstr(field));
  if (!detail.empty()) {
    EXPECT_THAT(std::string(v.status().message()), HasSubstr(detail));
  }
}

TEST(ValidateRequestTest, GoodRequestInEngineTerms) {
  v1::GenerateRequest r = GoodRequest();
  r.mutable_sampling()->set_temperature(0.7f);
  r.mutable_sampling()->set_top_k(5);
  r.mutable_sampling()->set_seed(42);
  r.mutable_sampling()->add_stop("\n\n");
  r.mutable_sampling()->add_stop_token_ids(7);
  r.set_skip_special_tokens(false);
  absl::StatusOr<ValidatedRequest> v = ValidateRequest(r, Limits(), kVocab);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->request_id, "req-1");
  ASSERT_EQ(v->messages.size(), 1u);
  EXPECT_EQ(v->messages[0].role, "user");
  ASSERT_EQ(v->messages[0].parts.size(), 2u);
  EXPECT_EQ(v->messages[0].parts[0].kind, engine::ChatInputPart::Kind::kImage);
  EXPECT_EQ(v->messages[0].parts[0].image_bytes, r.messages(0).content(0).image().data());
  EXPECT_FALSE(v->messages[0].parts[0].min_pixels.has_value());  // 0 = not set
  EXPECT_EQ(v->messages[0].parts[0].max_pixels, 100000);
  EXPECT_EQ(v->messages[0].parts[1].text, "What is this?");
  EXPECT_EQ(v->sampling.max_tokens, 16);  // the server's default
  EXPECT_FLOAT_EQ(v->sampling.temperature, 0.7f);
  EXPECT_EQ(v->sampling.top_k, 5);
  EXPECT_EQ(v->sampling.seed, 42u);
  EXPECT_EQ(v->sampling.stop_strings, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(v->sampling.stop_token_ids, std::vector<int32_t>{7});
  EXPECT_FALSE(v->skip_special_tokens);
}

TEST(ValidateRequestTest, UnsetSamplingIsGreedyWithDefaults) {
  absl::StatusOr<ValidatedRequest> v = ValidateRequest(GoodRequest(), Limits(), kVocab);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->sampling.greedy());
  EXPECT_FLOAT_EQ(v->sampling.top_p, 1.f);
  EXPECT_FLOAT_EQ(v->sampling.repetition_penalty, 1.f);
  EXPECT_FALSE(v->sampling.seed.has_value());
  EXPECT_TRUE(v->skip_special_tokens);
}

// The model's defaults (generation_config.json) fill each unset field; a set field keeps its own
// value, an explicit temperature 0 included.
TEST(ValidateRequestTest, UnsetSamplingFieldsTakeTheModelsDefaults) {
  RequestLimits limits = Limits();
  limits.sampling_defaults = {0.1f, 0.001f, 1, 1.05f, 0, "generation_config.json"};
  absl::StatusOr<ValidatedRequest> v = ValidateRequest(GoodRequest(), limits, kVocab);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FLOAT_EQ(v->sampling.temperature, 0.1f);
  EXPECT_FLOAT_EQ(v->sampling.top_p, 0.001f);
  EXPECT_EQ(v->sampling.top_k, 1);
  EXPECT_FLOAT_EQ(v->sampling.repetition_penalty, 1.05f);
  EXPECT_EQ(v->sampling.max_tokens, 16);
  v1::GenerateRequest r = GoodRequest();
  r.mutable_sampling()->set_temperature(0.f);
  r.mutable_sampling()->set_top_k(0);
  r.mutable_sampling()->set_repetition_penalty(1.f);
  v = ValidateRequest(r, limits, kVocab);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->sampling.temperature, 0.f);
  EXPECT_EQ(v->sampling.top_k, 0);
  EXPECT_EQ(v->sampling.repetition_penalty, 1.f);
  EXPECT_FLOAT_EQ(v->sampling.top_p, 0.001f);  // still unset: the model's
  r = GoodRequest();
  r.mutable_sampling()->set_top_p(0.9f);
  v = ValidateRequest(r, limits, kVocab);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FLOAT_EQ(v->sampling.top_p, 0.9f);
  EXPECT_EQ(v->sampling.top_k, 1);
}

// A request without max_tokens gets the model's max_new_tokens where it has one, else the server's
// default, never past the limit; a request's own max_tokens is its own.
TEST(ValidateRequestTest, UnsetMaxTokensTakesTheModelsMaxNewTokens) {
  RequestLimits limits = Limits();
  ASSERT_EQ(DefaultMaxTokens(limits), 16);
  limits.sampling_defaults.max_tokens = 40;
  absl::StatusOr<ValidatedRequest> v = ValidateRequest(GoodRequest(), limits, kVocab);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->sampling.max_tokens, 40);
  EXPECT_EQ(DefaultMaxTokens(limits), 40);
  v1::GenerateRequest r = GoodRequest();
  r.mutable_sampling()->set_max_tokens(3);
  v = ValidateRequest(r, limits, kVocab);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->sampling.max_tokens, 3);
  limits.sampling_defaults.max_tokens = limits.max_tokens + 100;
  v = ValidateRequest(GoodRequest(), limits, kVocab);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->sampling.max_tokens, limits.max_tokens);
}

TEST(ValidateRequestTest, RequestId) {
  v1::GenerateRequest r = GoodRequest();
  r.set_request_id(std::string(129, 'a'));
  ExpectInvalid(r, "request_id", "128");
  r.set_request_id("has space");
  ExpectInvalid(r, "request_id", "printable");
  r.set_request_id("");  // the server assigns one
  EXPECT_TRUE(ValidateRequest(r, Limits(), kVocab).ok());
}

TEST(ValidateRequestTest, Messages) {
  v1::GenerateRequest r = GoodRequest();
  r.clear_messages();
  ExpectInvalid(r, "messages", "empty");
  r = GoodRequest();
  r.mutable_messages(0)->set_role("bot");
  ExpectInvalid(r, "messages[0].role", "\"bot\"");
  r = GoodRequest();
  r.mutable_messages(0)->clear_content();
  ExpectInvalid(r, "messages[0].content", "empty");
  r = GoodRequest();
  r.mutable_messages(0)->add_content();  // neither text nor image
  ExpectInvalid(r, "messages[0].content[2]", "neither");
}

TEST(ValidateRequestTest, Images) {
  v1::GenerateRequest r = GoodRequest();
  r.mutable_messages(0)->mutable_content(0)->mutable_image()->set_data("");
  ExpectInvalid(r, "messages[0].content[0].image.data", "empty");
  r = GoodRequest();
  r.mutable_messages(0)->mutable_content(0)->mutable_image()->set_data(std::string(1001, 'x'));
  ExpectInvalid(r, "messages[0].content[0].image.data", "1000");
  r = GoodRequest();
  for (int i = 0; i < 2; ++i) *r.mutable_messages(0)->add_content() = r.messages(0).content(0);
  ExpectInvalid(r, "messages", "3 images, over the limit of 2");
  r = GoodRequest();
  r.mutable_messages(0)->mutable_content(0)->mutable_image()->set_min_pixels(~0ull);
  ExpectInvalid(r, "messages[0].content[0].image.min_pixels", "out of range");
}

TEST(ValidateRequestTest, Sampling) {
  auto with = [](auto set) {
    v1::GenerateRequest r = GoodRequest();
    set(r.mutable_sampling());
    return r;
  };
  ExpectInvalid(with([](v1::SamplingParams* s) { s->set_max_tokens(0); }), "sampling.max_tokens", "[1, 64]");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->set_max_tokens(65); }), "sampling.max_tokens", "65");
  EXPECT_TRUE(ValidateRequest(with([](v1::SamplingParams* s) { s->set_max_tokens(64); }), Limits(), kVocab).ok());
  ExpectInvalid(with([](v1::SamplingParams* s) { s->set_temperature(-1); }), "sampling.temperature");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->set_temperature(NAN); }), "sampling.temperature");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->set_top_p(0); }), "sampling.top_p");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->set_top_p(1.5f); }), "sampling.top_p");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->set_top_k(-1); }), "sampling.top_k");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->set_top_k(kVocab + 1); }), "sampling.top_k", "1000");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->set_repetition_penalty(0); }), "sampling.repetition_penalty");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->add_stop(""); }), "sampling.stop[0]", "empty");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->add_stop(std::string(257, 'x')); }), "sampling.stop[0]", "256");
  ExpectInvalid(with([](v1::SamplingParams* s) { for (int i = 0; i < 17; ++i) s->add_stop("x"); }),
                "sampling.stop", "16");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->add_stop_token_ids(kVocab); }), "sampling.stop_token_ids[0]");
  ExpectInvalid(with([](v1::SamplingParams* s) { s->add_stop_token_ids(-1); }), "sampling.stop_token_ids[0]");
}

TEST(RequestConversionTest, StatusCodesMapOneToOne) {
  EXPECT_EQ(ToGrpcStatus(absl::OkStatus()).error_code(), grpc::StatusCode::OK);
  const grpc::Status s = ToGrpcStatus(absl::ResourceExhaustedError("queue full"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "queue full");
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(absl::AlreadyExistsError("x")).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(ToProto(llm::FinishReason::kStop), v1::FINISH_REASON_STOP);
  EXPECT_EQ(ToProto(llm::FinishReason::kLength), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(ToProto(llm::FinishReason::kCancelled), v1::FINISH_REASON_CANCELLED);
}

TEST(RequestConversionTest, PromptLimitsComeFromTheRequestLimits) {
  RequestLimits limits;
  limits.max_images_per_request = 3;
  limits.max_prompt_tokens = 1234;
  limits.max_image_bytes = 5678;
  limits.max_image_pixels = 91011;
  const engine::PromptLimits p = PromptLimitsFor(limits);
  EXPECT_EQ(p.max_images, 3);
  EXPECT_EQ(p.max_prompt_tokens, 1234);
  EXPECT_EQ(p.decode.max_bytes, 5678);
  EXPECT_EQ(p.decode.max_pixels, 91011);
}

}  // namespace
}  // namespace iris::server
