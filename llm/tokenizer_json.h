// Reads a Hugging Face tokenizer.json in one streaming pass: the BPE vocabulary and merges go straight
// into a BpeSpec (no JSON tree for the ~300k entries), everything else into a small JSON document.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "llm/bpe.h"
#include "nlohmann/json.hpp"

namespace iris::llm {

struct TokenizerJson {
  BpeSpec bpe;           // model.vocab and model.merges ("a b" strings or ["a", "b"] pairs)
  nlohmann::json doc;    // the rest of the file; model.vocab and model.merges are absent
  bool has_vocab = false;
  bool has_merges = false;
};

// `source` names the file in error messages.
absl::StatusOr<TokenizerJson> ParseTokenizerJson(std::string_view text, std::string_view source);

}  // namespace iris::llm
