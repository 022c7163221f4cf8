// The OpenAI wire format: bodies parsed into the gRPC request (then checked by the same
// ValidateRequest as gRPC), field names in errors, statuses, and the reply/chunk JSON.
#include "server/openai_api.h"

#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/request_conversion.h"

namespace iris::server::openai {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

absl::StatusOr<ParsedRequest> Chat(const Json& body, const RequestLimits& limits = {}) {
  return ParseRequest(Endpoint::kChatCompletions, body.dump(), "tiny", limits);
}

Json UserText(const std::string& text) { return Json::array({{{"role", "user"}, {"content", text}}}); }

TEST(OpenAIParseTest, ChatWithImageAndSamplingBecomesTheGrpcRequest) {
  const std::string png = "\x89PNG fake bytes";
  const Json body = {
      {"model", "tiny"},
      {"messages", {{{"role", "developer"}, {"content", "Be brief."}},
                    {{"role", "user"},
                     {"content", {{{"type", "image_url"},
                                   {"image_url", {{"url", "data:image/png;base64," + absl::Base64Escape(png)}}}},
                                  {{"type", "text"}, {"text", "What is it?"}}}}}}},
      {"max_tokens", 9},          {"max_completion_tokens", 7}, {"temperature", 0.5}, {"top_p", 0.9},
      {"top_k", -1},              {"seed", 42},                 {"stop", "END"},      {"ignore_eos", true},
      {"min_tokens", 2},          {"n", 1},                     {"logprobs", false},  {"stream", true},
      {"stream_options", {{"include_usage", true}}}};
  absl::StatusOr<ParsedRequest> parsed = Chat(body);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->stream);
  EXPECT_TRUE(parsed->include_usage);
  const v1::GenerateRequest& r = parsed->request;
  ASSERT_EQ(r.messages_size(), 2);
  EXPECT_EQ(r.messages(0).role(), "system");
  EXPECT_EQ(r.messages(0).content(0).text(), "Be brief.");
  ASSERT_EQ(r.messages(1).content_size(), 2);
  EXPECT_EQ(r.messages(1).content(0).image().data(), png);
  EXPECT_EQ(r.messages(1).content(1).text(), "What is it?");
  EXPECT_EQ(r.sampling().max_tokens(), 7u);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(r.sampling().top_p(), 0.9f);
  EXPECT_EQ(r.sampling().top_k(), 0);  // -1 = off
  EXPECT_EQ(r.sampling().seed(), 42u);
  EXPECT_THAT(r.sampling().stop(), ::testing::ElementsAre("END"));
  EXPECT_TRUE(r.sampling().ignore_eos());
  EXPECT_EQ(r.sampling().min_tokens(), 2u);
  // The same validation as the gRPC front accepts it.
  EXPECT_TRUE(ValidateRequest(r, RequestLimits{}, 1000).ok());
}

TEST(OpenAIParseTest, RefusalsNameTheField) {
  const struct {
    Json extra;
    std::string field;
  } cases[] = {
      {{{"n", 3}}, "n: "},
      {{{"logprobs", true}}, "logprobs: "},
      {{{"top_logprobs", 1}}, "top_logprobs: "},
      {{{"temperature", "warm"}}, "temperature: "},
      {{{"max_tokens", 0}}, "max_tokens: "},
      {{{"stop", {1, 2}}}, "stop[0]: "},
      {{{"frequency_penalty", 0.5}}, "frequency_penalty: "},
      {{{"tools", {{{"type", "function"}}}}}, "tools: "},
      {{{"response_format", {{"type", "json_object"}}}}, "response_format: "},
      {{{"stream_options", {{"include_usage", true}}}}, "stream_options: "},  // without stream
      {{{"stream", "yes"}}, "stream: "},
  };
  for (const auto& c : cases) {
    Json body = {{"messages", UserText("Hi")}};
    body.update(c.extra);
    absl::StatusOr<ParsedRequest> parsed = Chat(body);
    ASSERT_FALSE(parsed.ok()) << body.dump();
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), ::testing::StartsWith(c.field)) << body.dump();
  }
}

TEST(OpenAIParseTest, ImageUrls) {
  auto with_url = [](const std::string& url) {
    return Json{{"messages", {{{"role", "user"},
                               {"content", {{{"type", "image_url"}, {"image_url", {{"url", url}}}}}}}}}};
  };
  for (const std::string url : {"http://x/a.png", "HTTPS://x/a.png"}) {
    absl::StatusOr<ParsedRequest> parsed = Chat(with_url(url));
    ASSERT_FALSE(parsed.ok());
    EXPECT_THAT(std::string(parsed.status().message()),
                ::testing::AllOf(::testing::StartsWith("messages[0].content[0].image_url.url: "), HasSubstr("data URL")));
  }
  EXPECT_FALSE(Chat(with_url("file:///etc/passwd")).ok());
  EXPECT_FALSE(Chat(with_url("data:image/png,rawbytes")).ok());    // not base64
  EXPECT_FALSE(Chat(with_url("data:image/png;base64,%%%")).ok());  // bad base64
  RequestLimits small;
  small.max_image_bytes = 10;
  absl::StatusOr<ParsedRequest> big = Chat(with_url("data:image/png;base64," + std::string(400, 'A')), small);
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("max_image_bytes"));
  // The string form of image_url (older clients) is accepted too.
  Json string_form = {{"messages", {{{"role", "user"},
                                     {"content", {{{"type", "image_url"}, {"image_url", "data:image/png;base64,QUJD"}}}}}}}};
  absl::StatusOr<ParsedRequest> ok = Chat(string_form);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->request.messages(0).content(0).image().data(), "ABC");
}

TEST(OpenAIParseTest, ModelAndBody) {
  EXPECT_EQ(Chat({{"model", "gpt-4o"}, {"messages", UserText("Hi")}}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Chat({{"messages", UserText("Hi")}}).ok());  // model may be left out
  EXPECT_EQ(ParseRequest(Endpoint::kChatCompletions, "{", "tiny", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseRequest(Endpoint::kChatCompletions, "[1]", "tiny", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ParsedRequest> completion =
      ParseRequest(Endpoint::kCompletions, R"({"prompt":["Once upon"],"max_tokens":3})", "tiny", {});
  ASSERT_TRUE(completion.ok()) << completion.status();
  EXPECT_EQ(completion->request.messages(0).role(), "user");
  EXPECT_EQ(completion->request.messages(0).content(0).text(), "Once upon");
  EXPECT_FALSE(ParseRequest(Endpoint::kCompletions, R"({"prompt":["a","b"]})", "tiny", {}).ok());
  EXPECT_FALSE(ParseRequest(Endpoint::kCompletions, R"({"prompt":"a","echo":true})", "tiny", {}).ok());
}

TEST(OpenAIErrorTest, ParamFromTheValidationMessage) {
  EXPECT_EQ(ParamOf("sampling.max_tokens: must be in [1, 4096], got 0"), "max_tokens");
  EXPECT_EQ(ParamOf("messages[0].content[1].image: cannot decode"), "messages[0].content[1].image_url");
  EXPECT_EQ(ParamOf("messages[2].content[0].image.data: empty"), "messages[2].content[0].image_url");
  EXPECT_EQ(ParamOf("messages[0].content[0].image_url.url: http(s) URLs..."), "messages[0].content[0].image_url.url");
  EXPECT_EQ(ParamOf("request_id: 200 bytes"), "X-Request-Id");
  EXPECT_EQ(ParamOf("the server's queue is full: 3 requests waiting"), "");
  EXPECT_EQ(ParamOf("no field here"), "");
}

TEST(OpenAIErrorTest, StatusesAndErrorObject) {
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::INVALID_ARGUMENT), 400);
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::UNAUTHENTICATED), 401);
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::NOT_FOUND), 404);
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::RESOURCE_EXHAUSTED), 429);
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::UNAVAILABLE), 503);
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::INTERNAL), 500);
  const Json e = Json::parse(ErrorBody(400, "n: only 1", "n"));
  EXPECT_EQ(e, Json::parse(R"({"error":{"message":"n: only 1","type":"invalid_request_error","param":"n","code":null}})"));
  const Json queue = Json::parse(ErrorBody(429, "full"));
  EXPECT_TRUE(queue["error"]["param"].is_null());
  EXPECT_EQ(queue["error"]["type"], "rate_limit_error");
}

TEST(OpenAIReplyTest, ReplyAndChunksAreShapedAsOpenAIs) {
  const ReplyIdentity who = MakeIdentity(Endpoint::kChatCompletions, "r1", "tiny");
  v1::GenerateReply reply;
  reply.set_text("Hello \xe4\xb8\x96");
  reply.mutable_completion()->set_finish_reason(v1::FINISH_REASON_LENGTH);
  reply.mutable_completion()->mutable_usage()->set_prompt_tokens(10);
  reply.mutable_completion()->mutable_usage()->set_image_tokens(4);
  reply.mutable_completion()->mutable_usage()->set_completion_tokens(2);
  const Json body = Json::parse(ReplyBody(who, reply));
  EXPECT_EQ(body["id"], "chatcmpl-r1");
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["choices"][0]["message"], Json::parse(R"({"role":"assistant","content":"Hello 世"})"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["total_tokens"], 12);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["image_tokens"], 4);

  const std::string first = ChunkEvent(who, "", /*first=*/true, nullptr);
  ASSERT_THAT(first, ::testing::StartsWith("data: "));
  ASSERT_THAT(first, ::testing::EndsWith("\n\n"));
  const Json c0 = Json::parse(first.substr(6));
  EXPECT_EQ(c0["object"], "chat.completion.chunk");
  EXPECT_EQ(c0["choices"][0]["delta"], Json::parse(R"({"role":"assistant","content":""})"));
  EXPECT_TRUE(c0["choices"][0]["finish_reason"].is_null());
  const Json last = Json::parse(ChunkEvent(who, "", false, "stop").substr(6));
  EXPECT_EQ(last["choices"][0]["delta"], Json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  const Json usage = Json::parse(UsageEvent(who, reply.completion().usage()).substr(6));
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);

  const ReplyIdentity text = MakeIdentity(Endpoint::kCompletions, "r2", "tiny");
  const Json t = Json::parse(ChunkEvent(text, "abc", false, nullptr).substr(6));
  EXPECT_EQ(t["object"], "text_completion");
  EXPECT_EQ(t["choices"][0]["text"], "abc");
}

}  // namespace
}  // namespace iris::server::openai
