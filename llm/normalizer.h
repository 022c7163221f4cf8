// Unicode NFC normalization (the Qwen2 tokenizer's normalizer), via ICU.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace iris::llm {

// True when `text` (valid UTF-8) is already in NFC; a cheap check that skips most text.
bool IsNfc(std::string_view text);

// NFC form of `text`, which must be valid UTF-8.
absl::StatusOr<std::string> ToNfc(std::string_view text);

}  // namespace iris::llm
