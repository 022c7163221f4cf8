#include "llm/added_tokens.h"

#include <algorithm>

#include "llm/unicode_class.h"
#include "llm/utf8.h"

namespace iris::llm {
namespace {

bool IsContinuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Start of the white space run that ends at `end` (not before `floor`).
size_t SkipSpaceLeft(std::string_view text, size_t end, size_t floor) {
  while (end > floor) {
    size_t start = end - 1;
    while (start > floor && IsContinuation(text[start])) --start;
    char32_t cp;
    if (DecodeUtf8(text, start, &cp) == 0 || !IsWhiteSpace(cp)) break;
    end = start;
  }
  return end;
}

// End of the white space run that starts at `pos`.
size_t SkipSpaceRight(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    char32_t cp;
    const int len = DecodeUtf8(text, pos, &cp);
    if (len == 0 || !IsWhiteSpace(cp)) break;
    pos += len;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<const AddedToken*>& tokens) {
  for (const AddedToken* t : tokens) {
    if (t->content.empty()) continue;
    by_length_.push_back(t);
    first_byte_[static_cast<unsigned char>(t->content[0])] = true;
  }
  std::stable_sort(by_length_.begin(), by_length_.end(),
                   [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
}

void AddedTokenMatcher::Split(std::string_view text, std::vector<TextSegment>* out) const {
  size_t emitted = 0;  // text before this is already in *out
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const AddedToken* match = nullptr;
    for (const AddedToken* t : by_length_) {
      if (text.compare(pos, t->content.size(), t->content) == 0) {
        match = t;
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, end = pos + match->content.size();
    if (match->lstrip) start = SkipSpaceLeft(text, start, emitted);
    if (match->rstrip) end = SkipSpaceRight(text, end);
    if (start > emitted) out->push_back({text.substr(emitted, start - emitted), nullptr});
    out->push_back({std::string_view(), match});
    emitted = pos = end;
  }
  if (emitted < text.size()) out->push_back({text.substr(emitted), nullptr});
}

}  // namespace iris::llm
