// llm/IncrementalDetokenizer: streaming the ids of every golden string one at a time gives the same
// text as Tokenizer::Decode, and no piece it returns is ever invalid UTF-8 (emoji and CJK characters
// split across tokens are held back until complete).
#include "llm/incremental_detokenizer.h"

#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "llm/byte_level.h"
#include "llm/tokenizer.h"
#include "llm/utf8.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace iris::llm {
namespace {

using json = nlohmann::json;

const Tokenizer& Tiny() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::Load(testing::DataPath("tiny-qwen2.5-vl"));
    if (!t.ok()) {
      ADD_FAILURE() << t.status();
      std::abort();
    }
    return new Tokenizer(std::move(*t));
  }();
  return *tok;
}

const json& GoldenCases() {
  static const json cases = testing::LoadDataJson("tokenizer/tokenizer_cases.json")["cases"];
  return cases;
}

bool ValidUtf8(const std::string& s) { return FindInvalidUtf8(s) == s.size(); }

struct Streamed {
  std::string text;
  std::vector<std::string> pieces;  // one per Push, then the Flush
  size_t max_pending = 0;
};

Streamed Stream(const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detok(Tiny(), skip_special);
  Streamed s;
  for (int32_t id : ids) {
    auto piece = detok.Push(id);
    EXPECT_TRUE(piece.ok()) << piece.status();
    if (!piece.ok()) continue;
    s.max_pending = std::max(s.max_pending, detok.pending_bytes());
    s.pieces.push_back(*piece);
    s.text += *piece;
  }
  s.pieces.push_back(detok.Flush());
  s.text += s.pieces.back();
  EXPECT_EQ(detok.pending_bytes(), 0u);
  return s;
}

std::vector<int32_t> ByteIds(std::string_view bytes) {
  std::vector<int32_t> ids;
  for (char b : bytes) {
    std::string ch;
    AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &ch);
    ids.push_back(*Tiny().TokenToId(ch));
  }
  return ids;
}

TEST(IncrementalDetokenizerTest, EveryGoldenStringStreamsToItsDecode) {
  const json& cases = GoldenCases();
  ASSERT_EQ(cases.size(), 235u);
  int held_back = 0;  // cases where a character was split across tokens
  for (const json& c : cases) {
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    for (bool skip : {false, true}) {
      const Streamed s = Stream(ids, skip);
      auto full = Tiny().Decode(ids, skip);
      ASSERT_TRUE(full.ok()) << full.status();
      EXPECT_EQ(s.text, *full) << c["id"] << " skip_special=" << skip;
      if (!skip) {
        EXPECT_EQ(s.text, c["decoded"].get<std::string>()) << c["id"];
      }
      for (const std::string& p : s.pieces) EXPECT_TRUE(ValidUtf8(p)) << c["id"] << ": " << json(p).dump(-1, ' ', true, json::error_handler_t::replace);
      if (!skip && s.max_pending > 0) ++held_back;
    }
  }
  // Emoji, CJK and other scripts in the goldens are split mid-character by BPE.
  EXPECT_GT(held_back, 10);
}

TEST(IncrementalDetokenizerTest, HoldsAnEmojiUntilItIsComplete) {
  // U+1F600 as four single-byte tokens.
  const std::vector<int32_t> ids = ByteIds("\xF0\x9F\x98\x80");
  IncrementalDetokenizer detok(Tiny());
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(*detok.Push(ids[i]), "");
    EXPECT_EQ(detok.pending_bytes(), i + 1);
  }
  EXPECT_EQ(*detok.Push(ids[3]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(detok.Flush(), "");
}

TEST(IncrementalDetokenizerTest, CjkSplitAcrossTokens) {
  // 中文 as bytes E4 B8 | AD E6 | 96 87.
  const std::vector<int32_t> b = ByteIds("\xE4\xB8\xAD\xE6\x96\x87");
  IncrementalDetokenizer detok(Tiny());
  EXPECT_EQ(*detok.Push(b[0]), "");
  EXPECT_EQ(*detok.Push(b[1]), "");
  EXPECT_EQ(*detok.Push(b[2]), "\xE4\xB8\xAD");
  EXPECT_EQ(*detok.Push(b[3]), "");
  EXPECT_EQ(*detok.Push(b[4]), "");
  EXPECT_EQ(*detok.Push(b[5]), "\xE6\x96\x87");
}

TEST(IncrementalDetokenizerTest, InvalidBytesBecomeReplacementCharacters) {
  // A sequence that cannot complete is replaced as soon as that is known.
  IncrementalDetokenizer detok(Tiny());
  EXPECT_EQ(*detok.Push(ByteIds("\xE4")[0]), "");
  EXPECT_EQ(*detok.Push(ByteIds("A")[0]), "\xEF\xBF\xBD" "A");
  EXPECT_EQ(*detok.Push(ByteIds("\xFF")[0]), "\xEF\xBF\xBD");
  // An incomplete tail at the end is flushed as one U+FFFD, as Decode does.
  EXPECT_EQ(*detok.Push(ByteIds("\xF0")[0]), "");
  EXPECT_EQ(*detok.Push(ByteIds("\x9F")[0]), "");
  EXPECT_EQ(detok.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(*Tiny().Decode(ByteIds("\xE4" "A\xFF\xF0\x9F")), "\xEF\xBF\xBD" "A\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(IncrementalDetokenizerTest, AddedTokensEndTheByteRunUnlessSkipped) {
  std::vector<int32_t> ids = ByteIds("\xE4");
  ids.push_back(151645);  // <|im_end|>
  for (int32_t id : ByteIds("\xB8\xAD")) ids.push_back(id);
  EXPECT_EQ(Stream(ids, false).text, *Tiny().Decode(ids, false));
  EXPECT_EQ(Stream(ids, true).text, *Tiny().Decode(ids, true));
  EXPECT_EQ(Stream(ids, true).text, "\xE4\xB8\xAD");

  IncrementalDetokenizer detok(Tiny());
  EXPECT_EQ(*detok.Push(151644), "<|im_start|>");
  EXPECT_EQ(*detok.Push(151657), "<tool_call>");
}

TEST(IncrementalDetokenizerTest, UnknownIdIsAnErrorAndChangesNothing) {
  IncrementalDetokenizer detok(Tiny());
  EXPECT_EQ(*detok.Push(ByteIds("\xE4")[0]), "");
  auto bad = detok.Push(151665);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(detok.pending_bytes(), 1u);
  EXPECT_EQ(*detok.Push(ByteIds("\xB8")[0]), "");
  EXPECT_EQ(*detok.Push(ByteIds("\xAD")[0]), "\xE4\xB8\xAD");
}

TEST(IncrementalDetokenizerTest, LongGeneratedTextStreamsExactly) {
  // Mixed scripts, encoded then streamed back one id at a time.
  std::string text;
  for (int i = 0; i < 50; ++i) {
    text += "Hello \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD caf\xC3\xA9 \xD0\x9F\xD1\x80\xD0\xB8 ";
    text += "\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF<|im_end|>\n";
  }
  auto ids = Tiny().Encode(text);
  ASSERT_TRUE(ids.ok());
  const Streamed s = Stream(*ids, false);
  EXPECT_EQ(s.text, text);
  for (const std::string& p : s.pieces) EXPECT_TRUE(ValidUtf8(p));
}

}  // namespace
}  // namespace iris::llm
