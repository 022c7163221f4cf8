// Chat prompts against the full-model goldens (tests/data/model): input_ids must be identical.
#include "llm/chat_format.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "llm/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace iris::llm {
namespace {

using json = nlohmann::json;

const Tokenizer& Tok() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::Load(testing::DataPath("tiny-qwen2.5-vl"));
    EXPECT_TRUE(t.ok()) << t.status();
    return new Tokenizer(std::move(*t));
  }();
  return *tok;
}

const core::ModelConfig& Config() {
  static const core::ModelConfig* config = [] {
    auto c = core::LoadModelConfig(testing::DataPath("tiny-qwen2.5-vl"));
    EXPECT_TRUE(c.ok()) << c.status();
    return new core::ModelConfig(*c);
  }();
  return *config;
}

const json& Cases() {
  static const json cases = testing::LoadDataJson("model/manifest_tiny.json")["cases"];
  return cases;
}

// The case's messages, with image parts taking the golden image_grid_thw in order.
std::vector<ChatMessage> Messages(const json& c, const std::string& file) {
  std::vector<std::array<int64_t, 3>> grids;
  if (!c["images"].empty()) {
    std::vector<int64_t> g = testing::Int64Values(testing::LoadGolden(file, "image_grid_thw"));
    for (size_t i = 0; i + 2 < g.size(); i += 3) grids.push_back({g[i], g[i + 1], g[i + 2]});
  }
  size_t next_image = 0;
  std::vector<ChatMessage> messages;
  for (const json& m : c["messages"]) {
    ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    if (m["content"].is_string()) {
      msg.parts.push_back(ChatPart::Text(m["content"].get<std::string>()));
    } else {
      for (const json& part : m["content"]) {
        if (part["type"] == "image") {
          EXPECT_LT(next_image, grids.size());
          msg.parts.push_back(ChatPart::Image(grids.at(next_image++)));
        } else {
          msg.parts.push_back(ChatPart::Text(part["text"].get<std::string>()));
        }
      }
    }
    messages.push_back(std::move(msg));
  }
  EXPECT_EQ(next_image, grids.size());
  return messages;
}

std::string CaseFile(const json& c) { return c["arrays"]["file"].get<std::string>(); }

TEST(ChatFormatTest, GoldenInputIds) {
  ASSERT_EQ(Cases().size(), 3u);
  for (const json& c : Cases()) {
    SCOPED_TRACE(c["case"].get<std::string>());
    const std::string file = CaseFile(c);
    auto prompt = BuildPrompt(Tok(), Config(), Messages(c, file));
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    std::vector<int64_t> want = testing::Int64Values(testing::LoadGolden(file, "input_ids"));
    std::vector<int64_t> got(prompt->ids.begin(), prompt->ids.end());
    EXPECT_EQ(got, want);
    EXPECT_EQ(static_cast<int64_t>(got.size()), c["prompt_len"].get<int64_t>());
    // The rendered text equals the reference's prompt_text with each image's pads collapsed to one.
    auto text = Tok().Decode(prompt->ids);
    ASSERT_TRUE(text.ok());
    std::string collapsed;
    const std::string pad = "<|image_pad|>";
    for (size_t pos = 0; pos < text->size();) {
      if (text->compare(pos, pad.size(), pad) == 0) {
        collapsed += pad;
        while (text->compare(pos, pad.size(), pad) == 0) pos += pad.size();
      } else {
        collapsed += (*text)[pos++];
      }
    }
    EXPECT_EQ(collapsed, c["prompt_text"].get<std::string>());
    // Image slots: contiguous pad runs of t*h*w/4, one per image, preceded/followed by vision start/end.
    int64_t pads = 0;
    for (const auto& slot : prompt->images) {
      ASSERT_GT(slot.pad_begin, 0);
      ASSERT_LT(slot.pad_end, static_cast<int64_t>(got.size()));
      EXPECT_EQ(slot.pad_end - slot.pad_begin, slot.grid_thw[0] * slot.grid_thw[1] * slot.grid_thw[2] / 4);
      EXPECT_EQ(got[slot.pad_begin - 1], Config().vision_start_token_id);
      EXPECT_EQ(got[slot.pad_end], Config().vision_end_token_id);
      for (int64_t i = slot.pad_begin; i < slot.pad_end; ++i) ASSERT_EQ(got[i], Config().image_token_id);
      pads += slot.pad_end - slot.pad_begin;
    }
    EXPECT_EQ(pads, c["num_image_tokens"].get<int64_t>());
    EXPECT_EQ(std::count(got.begin(), got.end(), Config().image_token_id), pads);
  }
}

TEST(ChatFormatTest, SystemMessageKeptAndNoGenerationPrompt) {
  std::vector<ChatMessage> messages = {{"system", {ChatPart::Text("Be brief.")}},
                                       {"user", {ChatPart::Text("Hi")}},
                                       {"assistant", {ChatPart::Text("Hello.")}}};
  auto prompt = BuildPrompt(Tok(), Config(), messages, /*add_generation_prompt=*/false);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  auto text = Tok().Decode(prompt->ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n");
  // Text runs are tokenized exactly as the whole rendered prompt would be.
  auto whole = Tok().Encode(*text);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(prompt->ids, *whole);
}

TEST(ChatFormatTest, InterleavedPartsInOrder) {
  std::vector<ChatMessage> messages = {
      {"user", {ChatPart::Text("A"), ChatPart::Image({1, 4, 6}), ChatPart::Text("B"), ChatPart::Image({1, 2, 2})}}};
  auto prompt = BuildPrompt(Tok(), Config(), messages);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  ASSERT_EQ(prompt->images.size(), 2u);
  EXPECT_EQ(prompt->images[0].pad_end - prompt->images[0].pad_begin, 6);
  EXPECT_EQ(prompt->images[1].pad_end - prompt->images[1].pad_begin, 1);
  auto text = Tok().Decode(prompt->ids);
  ASSERT_TRUE(text.ok());
  std::string six;
  for (int i = 0; i < 6; ++i) six += "<|image_pad|>";
  EXPECT_EQ(*text, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nA"
                   "<|vision_start|>" + six + "<|vision_end|>B<|vision_start|><|image_pad|><|vision_end|>"
                   "<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(prompt->image_grids()[0], (std::array<int64_t, 3>{1, 4, 6}));
}

TEST(ChatFormatTest, LiteralImageTokensInTextAreRejected) {
  for (const char* s : {"look: <|image_pad|>", "<|vision_start|>", "x<|vision_end|>", "<|video_pad|>"}) {
    SCOPED_TRACE(s);
    auto prompt = BuildPrompt(Tok(), Config(), {{"user", {ChatPart::Text(s)}}});
    EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // The reference's <|placeholder|> quirk does not exist here: it is ordinary text.
  auto prompt = BuildPrompt(Tok(), Config(), {{"user", {ChatPart::Text("<|placeholder|>"), ChatPart::Image({1, 2, 2})}}});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(std::count(prompt->ids.begin(), prompt->ids.end(), static_cast<int32_t>(Config().image_token_id)), 1);
}

TEST(ChatFormatTest, BadImageGridIsRejected) {
  for (std::array<int64_t, 3> g : {std::array<int64_t, 3>{1, 3, 4}, {0, 2, 2}, {1, 2, -2}}) {
    auto prompt = BuildPrompt(Tok(), Config(), {{"user", {ChatPart::Image(g)}}});
    EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace iris::llm
