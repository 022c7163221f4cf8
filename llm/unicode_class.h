// Unicode character classes the Qwen2 pre-tokenizer regex uses: \p{L} (general category L*),
// \p{N} (N*) and \s (the White_Space property). Backed by ICU's character database.
#pragma once

#include <cstdint>

namespace iris::llm {

enum class CharClass : uint8_t { kOther, kLetter, kNumber, kSpace };

CharClass ClassifyCodePoint(char32_t cp);
inline bool IsWhiteSpace(char32_t cp) { return ClassifyCodePoint(cp) == CharClass::kSpace; }

}  // namespace iris::llm
