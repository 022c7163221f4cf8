// llm/Tokenizer (Qwen2 byte-level BPE): the 235 golden strings of tests/data/tokenizer, added and
// special tokens, look-alikes, the pre-tokenizer regex, lossy UTF-8 decoding, loading errors, the
// ["a", "b"] merge form, and iris-tokenize run as a subprocess.
#include "llm/tokenizer.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "llm/byte_level.h"
#include "llm/pretokenizer.h"
#include "llm/utf8.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace iris::llm {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr int kGoldenCases = 235;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TinyDir() { return testing::DataPath("tiny-qwen2.5-vl"); }

// Loaded once for the whole suite (~0.1 s).
const Tokenizer& Tiny() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::Load(TinyDir());
    if (!t.ok()) {
      ADD_FAILURE() << t.status();
      std::abort();
    }
    return new Tokenizer(std::move(*t));
  }();
  return *tok;
}

const json& GoldenCases() {
  static const json cases = json::parse(ReadFile(testing::DataPath("tokenizer/tokenizer_cases.json")))["cases"];
  return cases;
}

std::vector<int32_t> EncodeOk(const Tokenizer& tok, std::string_view text) {
  auto ids = tok.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::string DecodeOk(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special = false) {
  auto text = tok.Decode(ids, skip_special);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : std::string();
}

TEST(TokenizerTest, LoadsTheFullQwenVocabulary) {
  const Tokenizer& tok = Tiny();
  EXPECT_EQ(tok.num_vocab_tokens(), 151643);
  EXPECT_EQ(tok.num_merges(), 151387);
  ASSERT_EQ(tok.added_tokens().size(), 22u);
  EXPECT_EQ(tok.added_tokens().front().id, 151643);
  EXPECT_EQ(tok.added_tokens().back().id, 151664);
  EXPECT_EQ(tok.id_limit(), 151665);
  EXPECT_EQ(tok.eos_token_id(), 151645);  // <|im_end|> (tokenizer_config.json)
  EXPECT_EQ(tok.pad_token_id(), 151643);  // <|endoftext|>
  EXPECT_FALSE(tok.bos_token_id().has_value());
}

TEST(TokenizerTest, EveryGoldenStringGivesItsIdsAndDecodes) {
  const Tokenizer& tok = Tiny();
  const json& cases = GoldenCases();
  ASSERT_EQ(static_cast<int>(cases.size()), kGoldenCases);
  int checked = 0;
  for (const json& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> expected = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(EncodeOk(tok, text), expected) << c["id"] << " (" << c["category"] << "): " << c["text"].dump();
    EXPECT_EQ(DecodeOk(tok, expected), c["decoded"].get<std::string>()) << c["id"];
    ++checked;
  }
  EXPECT_EQ(checked, kGoldenCases);
}

TEST(TokenizerTest, TokenToIdAndBack) {
  const Tokenizer& tok = Tiny();
  EXPECT_EQ(tok.TokenToId("Hello"), 9707);
  EXPECT_EQ(tok.TokenToId("\xC4\xA0world"), 1879);  // "Ġworld"
  EXPECT_EQ(tok.TokenToId("<|im_start|>"), 151644);
  EXPECT_EQ(tok.TokenToId("<tool_call>"), 151657);
  EXPECT_FALSE(tok.TokenToId("<|IM_START|>").has_value());
  EXPECT_FALSE(tok.TokenToId("").has_value());
  EXPECT_EQ(*tok.IdToToken(1879), "\xC4\xA0world");
  EXPECT_EQ(*tok.IdToToken(151655), "<|image_pad|>");
  EXPECT_EQ(tok.IdToToken(151665).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tok.IdToToken(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(tok.IsSpecial(151643));
  EXPECT_TRUE(tok.IsSpecial(151656));
  EXPECT_FALSE(tok.IsSpecial(151657));  // <tool_call> is added but not special
  EXPECT_FALSE(tok.IsSpecial(9707));
}

TEST(TokenizerTest, AddedTokensAnywhereInText) {
  const Tokenizer& tok = Tiny();
  EXPECT_THAT(EncodeOk(tok, "<|im_start|>user\nHello<|im_end|>"), ElementsAre(151644, 872, 198, 9707, 151645));
  EXPECT_THAT(EncodeOk(tok, "x<|image_pad|><|image_pad|>y"), ElementsAre(87, 151655, 151655, 88));
  EXPECT_THAT(EncodeOk(tok, "<|fim_prefix|>a<|fim_suffix|>"), ElementsAre(151659, 64, 151661));
  EXPECT_THAT(EncodeOk(tok, "<|im_end|>"), ElementsAre(151645));
}

TEST(TokenizerTest, LookAlikesAreOrdinaryText) {
  const Tokenizer& tok = Tiny();
  for (const char* text : {"<|IM_START|>", "<|im_start", "im_start|>", "<|placeholder|>", "<think>", "</think>",
                           "<tool_response>", "< |im_end|>", "<|im_end |>", "<<|im_end|"}) {
    const std::vector<int32_t> ids = EncodeOk(tok, text);
    ASSERT_FALSE(ids.empty()) << text;
    for (int32_t id : ids) EXPECT_LT(id, 151643) << text;
    EXPECT_EQ(DecodeOk(tok, ids), text);
  }
}

TEST(TokenizerTest, DecodeSkipsOnlySpecialTokens) {
  const Tokenizer& tok = Tiny();
  const std::vector<int32_t> ids = EncodeOk(tok, "<|im_start|>user\n<tool_call>Hi<|im_end|><|endoftext|>");
  EXPECT_EQ(DecodeOk(tok, ids), "<|im_start|>user\n<tool_call>Hi<|im_end|><|endoftext|>");
  EXPECT_EQ(DecodeOk(tok, ids, /*skip_special=*/true), "user\n<tool_call>Hi");
}

// Bytes of single-byte tokens, for building invalid UTF-8 on purpose.
std::vector<int32_t> ByteIds(const Tokenizer& tok, std::string_view bytes) {
  std::vector<int32_t> ids;
  for (char b : bytes) {
    std::string ch;
    AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &ch);
    ids.push_back(*tok.TokenToId(ch));
  }
  return ids;
}

TEST(TokenizerTest, DecodeReplacesInvalidBytesLikePython) {
  const Tokenizer& tok = Tiny();
  // Expected values are Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(DecodeOk(tok, ByteIds(tok, "\xE4\xB8\xAD")), "\xE4\xB8\xAD");
  EXPECT_EQ(DecodeOk(tok, ByteIds(tok, "\xE4\xB8")), "\xEF\xBF\xBD");
  EXPECT_EQ(DecodeOk(tok, ByteIds(tok, "\xE4\xB8" "A")), "\xEF\xBF\xBD" "A");
  EXPECT_EQ(DecodeOk(tok, ByteIds(tok, "\xF0\x80\x80")), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(DecodeOk(tok, ByteIds(tok, "\xED\xA0\x80")), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(DecodeOk(tok, ByteIds(tok, "\xFF" "a\x80")), "\xEF\xBF\xBD" "a" "\xEF\xBF\xBD");
  EXPECT_EQ(DecodeOk(tok, ByteIds(tok, "\xF0\x9F\x98")), "\xEF\xBF\xBD");
  // An added token ends the byte run before it (HF's slow decode), unless it is skipped.
  std::vector<int32_t> ids = ByteIds(tok, "\xE4");
  ids.push_back(151645);
  for (int32_t id : ByteIds(tok, "\xB8\xAD")) ids.push_back(id);
  EXPECT_EQ(DecodeOk(tok, ids), "\xEF\xBF\xBD<|im_end|>\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(DecodeOk(tok, ids, /*skip_special=*/true), "\xE4\xB8\xAD");
}

TEST(TokenizerTest, RejectsBadInput) {
  const Tokenizer& tok = Tiny();
  auto bad_utf8 = tok.Encode("ok \xC3(");
  EXPECT_EQ(bad_utf8.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_utf8.status().message(), HasSubstr("UTF-8"));
  EXPECT_EQ(tok.Encode("\xED\xA0\x80").status().code(), absl::StatusCode::kInvalidArgument);  // surrogate
  EXPECT_EQ(tok.Encode("\xC0\xAF").status().code(), absl::StatusCode::kInvalidArgument);      // overlong
  auto unknown = tok.Decode({9707, 151665});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("151665"));
  EXPECT_FALSE(tok.Decode({-3}).ok());
  EXPECT_TRUE(EncodeOk(tok, "").empty());
  EXPECT_EQ(DecodeOk(tok, {}), "");
}

TEST(TokenizerTest, NfcComesFirst) {
  const Tokenizer& tok = Tiny();
  EXPECT_EQ(EncodeOk(tok, "e\xCC\x81t\xC3\xA9"), EncodeOk(tok, "\xC3\xA9t\xC3\xA9"));  // é decomposed / composed
  EXPECT_EQ(EncodeOk(tok, "\xE2\x84\xAB"), EncodeOk(tok, "\xC3\x85"));                  // Å angstrom sign → Å
  // Normalization does not reach across an added token.
  EXPECT_EQ(EncodeOk(tok, "e<|im_end|>\xCC\x81").size(), 3u);
}

TEST(TokenizerTest, LongRepeatsRoundTrip) {
  const Tokenizer& tok = Tiny();
  for (const std::string& text :
       {std::string(20000, 'a'), std::string(5000, ' '), std::string(3000, '\n'), std::string(1000, '7'),
        [] { std::string s; for (int i = 0; i < 2000; ++i) s += "\xE4\xB8\xAD"; return s; }(),
        [] { std::string s; for (int i = 0; i < 500; ++i) s += "ab \xF0\x9F\x98\x80!"; return s; }()}) {
    const std::vector<int32_t> ids = EncodeOk(tok, text);
    EXPECT_LT(ids.size(), text.size() + 1);
    EXPECT_EQ(DecodeOk(tok, ids), text);
  }
  EXPECT_EQ(EncodeOk(tok, std::string(1000, '7')).size(), 1000u);  // \p{N} is one digit
}

TEST(TokenizerTest, ConcurrentEncodeGivesTheSameIds) {
  const Tokenizer& tok = Tiny();
  const json& cases = GoldenCases();
  auto work = [&](int* mismatches) {
    for (int round = 0; round < 10; ++round) {
      for (const json& c : cases) {
        auto ids = tok.Encode(c["text"].get<std::string>());
        if (!ids.ok() || *ids != c["ids"].get<std::vector<int32_t>>()) ++*mismatches;
      }
    }
  };
  int m1 = 0, m2 = 0;
  std::thread t1(work, &m1), t2(work, &m2);
  t1.join();
  t2.join();
  EXPECT_EQ(m1, 0);
  EXPECT_EQ(m2, 0);
}

// Merges written as ["a", "b"] pairs (newer `tokenizers`) give the same tokenizer as "a b" strings.
TEST(TokenizerTest, AcceptsMergesAsPairs) {
  json doc = json::parse(ReadFile(TinyDir() + "/tokenizer.json"));
  json pairs = json::array();
  for (const json& m : doc["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    pairs.push_back(json::array({s.substr(0, space), s.substr(space + 1)}));
  }
  doc["model"]["merges"] = std::move(pairs);
  auto tok = Tokenizer::FromJson(doc.dump(), ReadFile(TinyDir() + "/tokenizer_config.json"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->num_merges(), 151387);
  for (const json& c : GoldenCases()) {
    EXPECT_EQ(EncodeOk(*tok, c["text"].get<std::string>()), c["ids"].get<std::vector<int32_t>>()) << c["id"];
  }
}

// --- A small synthetic tokenizer: the 256 byte characters (id = byte), a few merges, added tokens.

json SmallTokenizerJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &ch);
    vocab[ch] = b;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["\xC4\xA0" "a"] = 258;  // "Ġa"
  json doc = {
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern",
                        {{"Regex",
                          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"vocab", vocab},
        {"merges", json::array({"a b", "ab c", "\xC4\xA0 a"})}}}};
  return doc;
}

json Added(int id, const std::string& content, bool special = true) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", false}, {"special", special}};
}

absl::StatusOr<Tokenizer> FromDoc(const json& doc, const std::string& config = "") {
  return Tokenizer::FromJson(doc.dump(), config);
}

TEST(TokenizerTest, SmallTokenizerMergesByRank) {
  auto tok = FromDoc(SmallTokenizerJson());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(EncodeOk(*tok, "abc"), ElementsAre(257));
  EXPECT_THAT(EncodeOk(*tok, "abcab a"), ElementsAre(257, 256, 258));
  EXPECT_THAT(EncodeOk(*tok, "cba"), ElementsAre('c', 'b', 'a'));
  EXPECT_EQ(DecodeOk(*tok, {257, 256, 258}), "abcab a");
}

TEST(TokenizerTest, AddedTokensLeftmostThenLongest) {
  json doc = SmallTokenizerJson();
  doc["added_tokens"] = json::array({Added(300, "<x>"), Added(301, "<x>y"), Added(302, "bc"), Added(303, "abcd"),
                                     Added(304, "ab")});
  auto tok = FromDoc(doc);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(EncodeOk(*tok, "<x>y<x>z"), ElementsAre(301, 300, 'z'));
  EXPECT_THAT(EncodeOk(*tok, "abcd"), ElementsAre(303));       // longest at the leftmost position
  EXPECT_THAT(EncodeOk(*tok, "abce"), ElementsAre(304, 'c', 'e'));  // "ab" starts before "bc"
  EXPECT_THAT(EncodeOk(*tok, "xbc"), ElementsAre('x', 302));
}

TEST(TokenizerTest, AddedTokenStripFlags) {
  json doc = SmallTokenizerJson();
  json l = Added(300, "<l>"), r = Added(301, "<r>");
  l["lstrip"] = true;
  r["rstrip"] = true;
  doc["added_tokens"] = json::array({l, r});
  auto tok = FromDoc(doc);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(EncodeOk(*tok, "a  <l>  b"), ElementsAre('a', 300, 32, 32, 'b'));
  EXPECT_THAT(EncodeOk(*tok, "a  <r>  b"), ElementsAre('a', 32, 32, 301, 'b'));
}

TEST(TokenizerTest, ConfigAddsTokensAndNamesSpecialOnes) {
  json doc = SmallTokenizerJson();
  doc["added_tokens"] = json::array({Added(300, "<eos>")});
  const json config = {{"eos_token", "<eos>"},
                       {"pad_token", {{"content", "<pad>"}}},
                       {"added_tokens_decoder", {{"300", {{"content", "<eos>"}, {"special", true}}},
                                                 {"301", {{"content", "<pad>"}, {"special", true}}}}}};
  auto tok = FromDoc(doc, config.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->eos_token_id(), 300);
  EXPECT_EQ(tok->pad_token_id(), 301);
  EXPECT_THAT(EncodeOk(*tok, "a<pad>"), ElementsAre('a', 301));

  json clash = config;
  clash["added_tokens_decoder"]["300"]["content"] = "<other>";
  auto bad = FromDoc(doc, clash.dump());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("300"));

  json unknown = {{"eos_token", "<nope>"}};
  EXPECT_THAT(FromDoc(doc, unknown.dump()).status().message(), HasSubstr("eos_token"));
  EXPECT_FALSE(FromDoc(doc, "{not json").ok());
}

TEST(TokenizerTest, LoadErrorsAreClear) {
  auto missing = Tokenizer::Load("/nonexistent/iris-model");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("tokenizer.json"));

  json wordpiece = SmallTokenizerJson();
  wordpiece["model"]["type"] = "WordPiece";
  auto wp = FromDoc(wordpiece);
  EXPECT_EQ(wp.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(wp.status().message(), HasSubstr("model type \"WordPiece\""));

  json bad_merge = SmallTokenizerJson();
  bad_merge["model"]["merges"].push_back("q zz");
  auto bm = FromDoc(bad_merge);
  EXPECT_EQ(bm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bm.status().message(), HasSubstr("merge 3"));
  EXPECT_THAT(bm.status().message(), HasSubstr("\"zz\""));

  json no_result = SmallTokenizerJson();
  no_result["model"]["merges"].push_back("c a");  // "ca" is not a token
  EXPECT_THAT(FromDoc(no_result).status().message(), HasSubstr("\"ca\", which is not in the vocabulary"));

  json three_parts = SmallTokenizerJson();
  three_parts["model"]["merges"].push_back("a b c");
  EXPECT_THAT(FromDoc(three_parts).status().message(), HasSubstr("merges[3]"));

  json bad_pair = SmallTokenizerJson();
  bad_pair["model"]["merges"].push_back(json::array({"a"}));
  EXPECT_THAT(FromDoc(bad_pair).status().message(), HasSubstr("pair"));

  json no_merges = SmallTokenizerJson();
  no_merges["model"].erase("merges");
  EXPECT_THAT(FromDoc(no_merges).status().message(), HasSubstr("merges"));

  json missing_byte = SmallTokenizerJson();
  missing_byte["model"]["vocab"].erase("!");
  EXPECT_THAT(FromDoc(missing_byte).status().message(), HasSubstr("byte 0x21"));

  json dup_id = SmallTokenizerJson();
  dup_id["model"]["vocab"]["zz"] = 5;
  EXPECT_THAT(FromDoc(dup_id).status().message(), HasSubstr("id 5"));

  json gpt2_regex = SmallTokenizerJson();
  gpt2_regex["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  auto pre = FromDoc(gpt2_regex);
  EXPECT_EQ(pre.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(pre.status().message(), HasSubstr("pre_tokenizer"));

  json nfkc = SmallTokenizerJson();
  nfkc["normalizer"] = {{"type", "NFKC"}};
  EXPECT_THAT(FromDoc(nfkc).status().message(), HasSubstr("normalizer"));

  auto not_json = Tokenizer::FromJson("{\"model\": ");
  EXPECT_EQ(not_json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_json.status().message(), HasSubstr("tokenizer.json"));
}

// --- The pre-tokenizer, against Python's `regex` module on the same pattern.

std::vector<std::string> Pieces(std::string_view text) {
  std::vector<std::string_view> views;
  PreTokenizeQwen2(text, &views);
  return std::vector<std::string>(views.begin(), views.end());
}

TEST(PreTokenizerTest, MatchesTheRegex) {
  struct Case {
    const char* text;
    std::vector<std::string> pieces;
  };
  const std::vector<Case> cases = {
      {"Hello world", {"Hello", " world"}},
      {"don't DON'T I'M we'LL", {"don", "'t", " DON", "'T", " I", "'M", " we", "'LL"}},
      {"'s's", {"'s", "'s"}},
      {"'\u017f \u017fx'x", {"'\u017f", " \u017fx", "'x"}},  // long s folds to s
      {"12345 abc1d", {"1", "2", "3", "4", "5", " abc", "1", "d"}},
      {"a  b   c", {"a", " ", " b", "  ", " c"}},
      {"end   ", {"end", "   "}},
      {"x \n y", {"x", " \n", " y"}},
      {"\n\n\t\n  z", {"\n\n\t\n", " ", " z"}},
      {"  \r\n\r\n  ", {"  \r\n\r\n", "  "}},
      {"a\u00a0b \u3000c", {"a", "\u00a0b", " ", "\u3000c"}},
      {"e\u0301!", {"e", "\u0301!"}},
      {"hi!!!\n\nok", {"hi", "!!!\n\n", "ok"}},
      {"...\r\n", {"...\r\n"}},
      {"(x) => {", {"(x", ")", " =>", " {"}},
      {"\u4e2d\u6587\u5b57", {"\u4e2d\u6587\u5b57"}},
      {"\U0001F600\U0001F600 a\U0001F44D", {"\U0001F600\U0001F600", " a", "\U0001F44D"}},
      {"\u00b2\u0663\u2167", {"\u00b2", "\u0663", "\u2167"}},
      {"\x1c\x1f\u0085 x", {"\x1c\x1f", "\u0085", " x"}},
      {"\ufeffBOM", {"\ufeffBOM"}},
      {"'quoted'", {"'quoted", "'"}},
      {" 'n' ", {" '", "n", "'", " "}},
      {"\t\tindent\n", {"\t", "\tindent", "\n"}},
      {"a\u2028b", {"a", "\u2028b"}},
      {"$100.00", {"$", "1", "0", "0", ".", "0", "0"}},
  };
  for (const Case& c : cases) EXPECT_THAT(Pieces(c.text), ElementsAreArray(c.pieces)) << json(c.text).dump();
}

// --- Lossy UTF-8 decoding, including the streaming form.

TEST(Utf8Test, LossyDecodeHoldsAnIncompleteTail) {
  std::string out;
  EXPECT_EQ(AppendUtf8Lossy("ab\xF0\x9F\x98", /*hold_incomplete_tail=*/true, &out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(AppendUtf8Lossy("ab\xF0\x9F\x98", /*hold_incomplete_tail=*/false, &out), 5u);
  EXPECT_EQ(out, "ab\xEF\xBF\xBD");
  out.clear();
  // A tail that can never complete is not held.
  EXPECT_EQ(AppendUtf8Lossy("a\xF0\x80", true, &out), 3u);
  EXPECT_EQ(out, "a\xEF\xBF\xBD\xEF\xBF\xBD");
  out.clear();
  EXPECT_EQ(AppendUtf8Lossy("\xF5\xC1", true, &out), 2u);
  EXPECT_EQ(out, "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(FindInvalidUtf8("ok\xE2\x82"), 2u);
  EXPECT_EQ(FindInvalidUtf8("\xF4\x8F\xBF\xBF"), 4u);   // U+10FFFF
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0u);   // above U+10FFFF
}

// --- iris-tokenize as a subprocess.

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() / ("iris_tok_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

std::string ToolPath() { return std::string(IRIS_BINARY_DIR) + "/tools/iris-tokenize/iris-tokenize"; }

RunResult RunTool(const TempDir& dir, const std::string& args, const std::string& input) {
  std::ofstream(dir / "in.jsonl", std::ios::binary) << input;
  const std::string cmd = ToolPath() + " " + args + " < " + (dir / "in.jsonl") + " > " + (dir / "out") + " 2> " +
                          (dir / "err");
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(dir / "out");
  r.err = ReadFile(dir / "err");
  return r;
}

TEST(IrisTokenizeTest, RoundTripThroughTheTool) {
  if (!std::filesystem::exists(ToolPath())) GTEST_SKIP() << "iris-tokenize not built: " << ToolPath();
  TempDir dir;
  std::string texts, id_lines, expected_ids, expected_text;
  for (const json& c : GoldenCases()) {
    texts += c["text"].dump() + "\n";
    id_lines += c["ids"].dump() + "\n";
    expected_ids += c["ids"].dump() + "\n";
    expected_text += c["decoded"].dump(-1, ' ', false) + "\n";
  }
  RunResult enc = RunTool(dir, "--model " + TinyDir(), texts);
  EXPECT_EQ(enc.exit_code, 0) << enc.err;
  EXPECT_EQ(enc.out, expected_ids);
  RunResult dec = RunTool(dir, "--model " + TinyDir() + " --decode", id_lines);
  EXPECT_EQ(dec.exit_code, 0) << dec.err;
  EXPECT_EQ(dec.out, expected_text);
  RunResult skip = RunTool(dir, "--model=" + TinyDir() + " --decode --skip-special-tokens", "[151644, 9707, 151645]\n");
  EXPECT_EQ(skip.exit_code, 0) << skip.err;
  EXPECT_EQ(skip.out, "\"Hello\"\n");
}

TEST(IrisTokenizeTest, ErrorsNameTheLine) {
  if (!std::filesystem::exists(ToolPath())) GTEST_SKIP() << "iris-tokenize not built: " << ToolPath();
  TempDir dir;
  RunResult bad_json = RunTool(dir, "--model " + TinyDir(), "\"ok\"\n\"unterminated\n");
  EXPECT_NE(bad_json.exit_code, 0);
  EXPECT_EQ(bad_json.out, "[562]\n");
  EXPECT_THAT(bad_json.err, HasSubstr("line 2"));
  RunResult not_string = RunTool(dir, "--model " + TinyDir(), "[1, 2]\n");
  EXPECT_NE(not_string.exit_code, 0);
  EXPECT_THAT(not_string.err, HasSubstr("line 1"));
  RunResult unknown_id = RunTool(dir, "--model " + TinyDir() + " --decode", "[1]\n[2]\n[9707, 999999]\n");
  EXPECT_NE(unknown_id.exit_code, 0);
  EXPECT_THAT(unknown_id.err, HasSubstr("line 3"));
  EXPECT_THAT(unknown_id.err, HasSubstr("999999"));
  RunResult no_model = RunTool(dir, "--model /nonexistent/iris-model", "");
  EXPECT_NE(no_model.exit_code, 0);
  EXPECT_THAT(no_model.err, HasSubstr("tokenizer.json"));
}

}  // namespace
}  // namespace iris::llm
