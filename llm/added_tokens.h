// Added tokens (special tokens such as <|im_start|> and extra ones such as <tool_call>): matched
// verbatim in the text before pre-tokenization, leftmost first and, among those, longest first.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace iris::llm {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;     // skipped by Decode(skip_special_tokens)
  bool lstrip = false;      // the match also takes the white space on its left
  bool rstrip = false;      // ... and on its right
  bool normalized = false;  // matched in the normalized text instead of the raw text
  bool single_word = false;
};

// A piece of split text: either plain text or one added token.
struct TextSegment {
  std::string_view text;  // empty for a token
  const AddedToken* token = nullptr;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // The tokens must outlive the matcher. Empty contents are ignored.
  explicit AddedTokenMatcher(const std::vector<const AddedToken*>& tokens);

  bool empty() const { return by_length_.empty(); }

  // Appends the segments of `text` (valid UTF-8) to *out, in order. Text segments are non-empty.
  void Split(std::string_view text, std::vector<TextSegment>* out) const;

 private:
  std::vector<const AddedToken*> by_length_;  // longest first
  bool first_byte_[256] = {};
};

}  // namespace iris::llm
