// The Qwen2 pre-tokenizer: splits normalized text into the words BPE runs on, exactly as the regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// does (leftmost-first alternation, greedy quantifiers with backtracking), written as a hand scanner
// over code points.
#pragma once

#include <string_view>
#include <vector>

namespace iris::llm {

// Appends the pieces of `text` (valid UTF-8) to *pieces, in order. The pieces are non-empty views into
// `text` and cover it exactly.
void PreTokenizeQwen2(std::string_view text, std::vector<std::string_view>* pieces);

}  // namespace iris::llm
