#include "llm/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "llm/bpe.h"
#include "llm/normalizer.h"
#include "llm/pretokenizer.h"
#include "llm/tokenizer_json.h"
#include "llm/utf8.h"
#include "nlohmann/json.hpp"

namespace iris::llm {

using json = nlohmann::json;

struct Tokenizer::State {
  std::unique_ptr<BpeModel> bpe;
  std::vector<AddedToken> added;             // as loaded, in id order
  std::vector<AddedToken> added_normalized;  // copies of the normalized ones with NFC content
  absl::flat_hash_map<int32_t, size_t> added_by_id;
  absl::flat_hash_map<std::string, int32_t> added_by_content;
  AddedTokenMatcher raw_matcher;         // tokens matched in the raw text
  AddedTokenMatcher normalized_matcher;  // tokens matched after NFC
  int32_t id_limit = 0;
  std::optional<int32_t> eos_id, pad_id, bos_id;
};

namespace {

// The only pre-tokenizer regex implemented (llm/pretokenizer.h).
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

absl::Status Unsupported(std::string_view what, const json& value) {
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: unsupported ", std::string(what), " ",
                                               value.dump(-1, ' ', false, json::error_handler_t::replace),
                                               " (iris implements Qwen2's byte-level BPE)"));
}

std::string TypeOf(const json& v) {
  return v.is_object() && v.contains("type") && v["type"].is_string() ? v["type"].get<std::string>() : "";
}

// A JSON boolean field that may be absent (then `fallback`).
bool BoolField(const json& obj, const char* name, bool fallback) {
  auto it = obj.find(name);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

bool IsNullOrEmptyString(const json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

absl::Status CheckModelOptions(const json& model) {
  const std::string type = TypeOf(model);
  if (type != "BPE") {
    return absl::UnimplementedError(absl::StrCat("tokenizer.json: unsupported model type \"",
                                                 type.empty() ? std::string("(none)") : type,
                                                 "\" (iris implements byte-level BPE)"));
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0)) {
    return Unsupported("BPE dropout", *it);
  }
  if (!IsNullOrEmptyString(model, "continuing_subword_prefix")) {
    return Unsupported("BPE continuing_subword_prefix", model["continuing_subword_prefix"]);
  }
  if (!IsNullOrEmptyString(model, "end_of_word_suffix")) {
    return Unsupported("BPE end_of_word_suffix", model["end_of_word_suffix"]);
  }
  if (BoolField(model, "byte_fallback", false)) return Unsupported("BPE byte_fallback", true);
  if (BoolField(model, "ignore_merges", false)) return Unsupported("BPE ignore_merges", true);
  return absl::OkStatus();
}

absl::Status CheckPipeline(const json& doc) {
  // normalizer: NFC (or none).
  if (auto it = doc.find("normalizer"); it != doc.end() && !it->is_null() && TypeOf(*it) != "NFC") {
    return Unsupported("normalizer", *it);
  }
  // pre_tokenizer: Split on the Qwen2 regex (isolated), then ByteLevel without its own regex.
  auto pre = doc.find("pre_tokenizer");
  if (pre == doc.end() || TypeOf(*pre) != "Sequence" || !(*pre).contains("pretokenizers") ||
      !(*pre)["pretokenizers"].is_array() || (*pre)["pretokenizers"].size() != 2) {
    return Unsupported("pre_tokenizer", pre == doc.end() ? json(nullptr) : *pre);
  }
  const json& split = (*pre)["pretokenizers"][0];
  const json& byte_level = (*pre)["pretokenizers"][1];
  const json* regex = nullptr;
  if (split.contains("pattern") && split["pattern"].is_object() && split["pattern"].contains("Regex")) {
    regex = &split["pattern"]["Regex"];
  }
  if (TypeOf(split) != "Split" || regex == nullptr || !regex->is_string() || regex->get<std::string>() != kQwen2Pattern ||
      split.value("behavior", "") != "Isolated" || BoolField(split, "invert", false)) {
    return Unsupported("pre_tokenizer split", split);
  }
  if (TypeOf(byte_level) != "ByteLevel" || BoolField(byte_level, "use_regex", true) ||
      BoolField(byte_level, "add_prefix_space", false)) {
    return Unsupported("pre_tokenizer step", byte_level);
  }
  if (auto it = doc.find("decoder"); it == doc.end() || TypeOf(*it) != "ByteLevel") {
    return Unsupported("decoder", it == doc.end() ? json(nullptr) : *it);
  }
  return absl::OkStatus();
}

absl::StatusOr<AddedToken> ParseAddedToken(const json& t, std::string_view where) {
  if (!t.is_object() || !t.contains("content") || !t["content"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": an added token has no \"content\" string"));
  }
  AddedToken a;
  a.content = t["content"].get<std::string>();
  if (t.contains("id")) {
    if (!t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() >= INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(where), ": added token \"", a.content, "\" has a bad id"));
    }
    a.id = t["id"].get<int32_t>();
  }
  a.special = BoolField(t, "special", false);
  a.lstrip = BoolField(t, "lstrip", false);
  a.rstrip = BoolField(t, "rstrip", false);
  a.normalized = BoolField(t, "normalized", false);
  a.single_word = BoolField(t, "single_word", false);
  if (a.single_word) {
    return absl::UnimplementedError(absl::StrCat(std::string(where), ": added token \"", a.content,
                                                 "\" is single_word, which iris does not implement"));
  }
  if (a.content.empty() || FindInvalidUtf8(a.content) != a.content.size()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": added token ", a.id, " has empty or invalid content"));
  }
  return a;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return std::move(ss).str();
}

// tokenizer_config.json gives special tokens as "text" or {"content": "text", ...}.
std::optional<std::string> TokenText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<State> state) : state_(std::move(state)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer.json";
  auto text = ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat("no tokenizer.json in ", model_dir, " (", text.status().message(), ")"));
  }
  std::string config;
  const std::string config_path = model_dir + "/tokenizer_config.json";
  if (std::ifstream(config_path).good()) {
    IRIS_ASSIGN_OR_RETURN(config, ReadFile(config_path));
  }
  auto tok = FromJson(*text, config);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat(model_dir, ": ", tok.status().message()));
  }
  return tok;
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view tokenizer_json, std::string_view config_json) {
  IRIS_ASSIGN_OR_RETURN(TokenizerJson file, ParseTokenizerJson(tokenizer_json, "tokenizer.json"));
  const json& doc = file.doc;
  if (!doc.contains("model") || !doc["model"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: no \"model\" object");
  }
  IRIS_RETURN_IF_ERROR(CheckModelOptions(doc["model"]));
  if (!file.has_vocab) return absl::InvalidArgumentError("tokenizer.json: model.vocab is missing");
  if (!file.has_merges) return absl::InvalidArgumentError("tokenizer.json: model.merges is missing");
  IRIS_RETURN_IF_ERROR(CheckPipeline(doc));

  auto state = std::make_unique<State>();
  {
    auto bpe = BpeModel::Create(std::move(file.bpe));
    if (!bpe.ok()) return absl::Status(bpe.status().code(), absl::StrCat("tokenizer.json: ", bpe.status().message()));
    state->bpe = std::move(*bpe);
  }

  // Added tokens: tokenizer.json's list, then any that only tokenizer_config.json names.
  auto add = [&](AddedToken a, std::string_view where) -> absl::Status {
    if (a.id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": added token \"", a.content, "\" has no id"));
    }
    if (auto it = state->added_by_id.find(a.id); it != state->added_by_id.end()) {
      const AddedToken& old = state->added[it->second];
      if (old.content != a.content) {
        return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": added token ", a.id, " is \"", a.content,
                                                       "\" but was \"", old.content, "\""));
      }
      return absl::OkStatus();
    }
    if (auto it = state->added_by_content.find(a.content); it != state->added_by_content.end()) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": added token \"", a.content,
                                                     "\" has two ids, ", it->second, " and ", a.id));
    }
    state->added_by_id[a.id] = state->added.size();
    state->added_by_content[a.content] = a.id;
    state->added.push_back(std::move(a));
    return absl::OkStatus();
  };
  if (auto it = doc.find("added_tokens"); it != doc.end() && !it->is_null()) {
    if (!it->is_array()) return absl::InvalidArgumentError("tokenizer.json: added_tokens is not an array");
    for (const json& t : *it) {
      IRIS_ASSIGN_OR_RETURN(AddedToken a, ParseAddedToken(t, "tokenizer.json"));
      IRIS_RETURN_IF_ERROR(add(std::move(a), "tokenizer.json"));
    }
  }
  json config;
  if (!config_json.empty()) {
    config = json::parse(config_json.begin(), config_json.end(), nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: not a JSON object");
    }
    if (auto it = config.find("added_tokens_decoder"); it != config.end() && it->is_object()) {
      for (auto& [key, value] : it->items()) {
        json t = value;
        int64_t id = -1;
        if (!absl::SimpleAtoi(key, &id) || id < 0 || id >= INT32_MAX) {
          return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: added_tokens_decoder key \"", key,
                                                         "\" is not an id"));
        }
        t["id"] = id;
        IRIS_ASSIGN_OR_RETURN(AddedToken a, ParseAddedToken(t, "tokenizer_config.json"));
        IRIS_RETURN_IF_ERROR(add(std::move(a), "tokenizer_config.json"));
      }
    }
  }
  std::sort(state->added.begin(), state->added.end(), [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  state->added_by_id.clear();
  std::vector<const AddedToken*> raw;
  for (size_t i = 0; i < state->added.size(); ++i) {
    state->added_by_id[state->added[i].id] = i;
    if (!state->added[i].normalized) raw.push_back(&state->added[i]);
  }
  for (const AddedToken& a : state->added) {
    if (!a.normalized) continue;
    AddedToken n = a;
    IRIS_ASSIGN_OR_RETURN(n.content, ToNfc(a.content));
    state->added_normalized.push_back(std::move(n));
  }
  std::vector<const AddedToken*> normalized;
  for (const AddedToken& a : state->added_normalized) normalized.push_back(&a);
  state->raw_matcher = AddedTokenMatcher(raw);
  state->normalized_matcher = AddedTokenMatcher(normalized);
  state->id_limit = state->bpe->id_limit();
  if (!state->added.empty()) state->id_limit = std::max(state->id_limit, state->added.back().id + 1);

  Tokenizer tok(std::move(state));
  // Special token names from tokenizer_config.json.
  for (auto [name, slot] : {std::pair{"eos_token", &tok.state_->eos_id}, std::pair{"pad_token", &tok.state_->pad_id},
                            std::pair{"bos_token", &tok.state_->bos_id}}) {
    auto it = config.is_object() ? config.find(name) : config.end();
    if (!config.is_object() || it == config.end() || it->is_null()) continue;
    const std::optional<std::string> text = TokenText(*it);
    const std::optional<int32_t> id = text ? tok.TokenToId(*text) : std::nullopt;
    if (!id) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: ", name, " ",
                                                     it->dump(-1, ' ', false, json::error_handler_t::replace),
                                                     " is not a token of this tokenizer"));
    }
    *slot = *id;
  }
  return tok;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != text.size()) {
    return absl::InvalidArgumentError(absl::StrCat("text to tokenize is not valid UTF-8 (at byte ", bad, ")"));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<TextSegment> segments;
  state_->raw_matcher.Split(text, &segments);
  for (const TextSegment& seg : segments) {
    if (seg.token != nullptr) {
      ids.push_back(seg.token->id);
    } else if (IsNfc(seg.text)) {
      EncodeNormalized(seg.text, &ids);
    } else {
      IRIS_ASSIGN_OR_RETURN(std::string nfc, ToNfc(seg.text));
      EncodeNormalized(nfc, &ids);
    }
  }
  return ids;
}

void Tokenizer::EncodeNormalized(std::string_view text, std::vector<int32_t>* ids) const {
  std::vector<TextSegment> segments;
  if (state_->normalized_matcher.empty()) {
    segments.push_back({text, nullptr});
  } else {
    state_->normalized_matcher.Split(text, &segments);
  }
  std::vector<std::string_view> words;
  for (const TextSegment& seg : segments) {
    if (seg.token != nullptr) {
      ids->push_back(seg.token->id);
      continue;
    }
    words.clear();
    PreTokenizeQwen2(seg.text, &words);
    for (std::string_view w : words) state_->bpe->Encode(w, ids);
  }
}

absl::StatusOr<Tokenizer::Piece> Tokenizer::GetPiece(int32_t id) const {
  if (auto it = state_->added_by_id.find(id); it != state_->added_by_id.end()) {
    return Piece{std::string_view(), &state_->added[it->second]};
  }
  if (!state_->bpe->HasId(id)) return absl::InvalidArgumentError(absl::StrCat("unknown token id ", id));
  return Piece{state_->bpe->IdToBytes(id), nullptr};
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  // As HF's slow tokenizer does: runs of vocabulary tokens are decoded as bytes, each run on its own;
  // added tokens are inserted as their text.
  std::string out, run;
  for (int32_t id : ids) {
    IRIS_ASSIGN_OR_RETURN(Piece piece, GetPiece(id));
    if (piece.added == nullptr) {
      run.append(piece.bytes);
      continue;
    }
    if (skip_special_tokens && piece.added->special) continue;
    AppendUtf8Lossy(run, /*hold_incomplete_tail=*/false, &out);
    run.clear();
    out.append(piece.added->content);
  }
  AppendUtf8Lossy(run, /*hold_incomplete_tail=*/false, &out);
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = state_->added_by_content.find(absl::string_view(token.data(), token.size()));
      it != state_->added_by_content.end()) {
    return it->second;
  }
  const int32_t id = state_->bpe->TokenToId(token);
  if (id < 0) return std::nullopt;
  return id;
}

absl::StatusOr<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (auto it = state_->added_by_id.find(id); it != state_->added_by_id.end()) return state_->added[it->second].content;
  if (!state_->bpe->HasId(id)) return absl::InvalidArgumentError(absl::StrCat("unknown token id ", id));
  return std::string(state_->bpe->IdToToken(id));
}

int32_t Tokenizer::id_limit() const { return state_->id_limit; }
int64_t Tokenizer::num_vocab_tokens() const { return state_->bpe->num_tokens(); }
int64_t Tokenizer::num_merges() const { return state_->bpe->num_merges(); }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return state_->added; }
std::optional<int32_t> Tokenizer::eos_token_id() const { return state_->eos_id; }
std::optional<int32_t> Tokenizer::pad_token_id() const { return state_->pad_id; }
std::optional<int32_t> Tokenizer::bos_token_id() const { return state_->bos_id; }

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = state_->added_by_id.find(id);
  return it != state_->added_by_id.end() && state_->added[it->second].special;
}

}  // namespace iris::llm
