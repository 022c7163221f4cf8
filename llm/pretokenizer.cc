#include "llm/pretokenizer.h"

#include <cstddef>

#include "llm/unicode_class.h"
#include "llm/utf8.h"

namespace iris::llm {
namespace {

struct Char {
  char32_t cp = 0;
  CharClass cls = CharClass::kOther;
  int len = 0;  // 0 at the end of the text
};

class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text) {}

  Char At(size_t pos) const {
    Char c;
    if (pos >= text_.size()) return c;
    const auto b = static_cast<unsigned char>(text_[pos]);
    if (b < 0x80) {
      c.cp = b;
      c.len = 1;
    } else {
      c.len = DecodeUtf8(text_, pos, &c.cp);
      if (c.len == 0) {  // not expected (the caller validated); treat the byte as a symbol
        c.cp = 0xFFFD;
        c.len = 1;
      }
    }
    c.cls = ClassifyCodePoint(c.cp);
    return c;
  }

  // End of the run of characters of class `cls` starting at pos.
  size_t RunEnd(size_t pos, CharClass cls) const {
    while (pos < text_.size()) {
      const Char c = At(pos);
      if (c.cls != cls) break;
      pos += c.len;
    }
    return pos;
  }

  // Length in bytes of the piece that starts at pos.
  size_t Match(size_t pos) const {
    const Char c0 = At(pos);
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (c0.cp == '\'') {
      if (size_t n = Contraction(pos + 1)) return 1 + n;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c0.cls == CharClass::kLetter) return RunEnd(pos, CharClass::kLetter) - pos;
    if (c0.cp != '\r' && c0.cp != '\n' && c0.cls != CharClass::kNumber) {
      const Char c1 = At(pos + c0.len);
      if (c1.cls == CharClass::kLetter) return RunEnd(pos + c0.len, CharClass::kLetter) - pos;
    }
    // \p{N}
    if (c0.cls == CharClass::kNumber) return c0.len;
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    size_t sym = std::string_view::npos;
    if (c0.cls == CharClass::kOther) {
      sym = pos;
    } else if (c0.cp == ' ' && At(pos + 1).cls == CharClass::kOther && At(pos + 1).len > 0) {
      sym = pos + 1;
    }
    if (sym != std::string_view::npos) {
      size_t end = RunEnd(sym, CharClass::kOther);
      while (end < text_.size() && (text_[end] == '\r' || text_[end] == '\n')) ++end;
      return end - pos;
    }
    // c0 is white space here. \s*[\r\n]+ : the run up to and including its last \r or \n.
    size_t end = pos, last_newline_end = 0, last_start = pos;
    while (end < text_.size()) {
      const Char c = At(end);
      if (c.cls != CharClass::kSpace) break;
      last_start = end;
      end += c.len;
      if (c.cp == '\r' || c.cp == '\n') last_newline_end = end;
    }
    if (last_newline_end != 0) return last_newline_end - pos;
    // \s+(?!\S) : the whole run at the end of the text, else all but its last character.
    if (end == text_.size() || last_start == pos) return end - pos;  // the second case is \s+
    return last_start - pos;
  }

 private:
  // Length of s|t|re|ve|m|ll|d (case-insensitive, with simple case folding) at pos, or 0.
  size_t Contraction(size_t pos) const {
    const Char c1 = At(pos);
    auto lower = [](char32_t c) { return c < 0x80 ? static_cast<char32_t>(c | 0x20) : c; };
    const char32_t a = c1.cp < 0x80 && ((c1.cp | 0x20) >= 'a' && (c1.cp | 0x20) <= 'z') ? lower(c1.cp) : c1.cp;
    if (a == 's' || a == 0x017F /* LATIN SMALL LETTER LONG S folds to s */ || a == 't' || a == 'm' || a == 'd') {
      return c1.len;
    }
    if (a == 'r' || a == 'v' || a == 'l') {
      const Char c2 = At(pos + c1.len);
      const char32_t b = c2.cp < 0x80 && ((c2.cp | 0x20) >= 'a' && (c2.cp | 0x20) <= 'z') ? lower(c2.cp) : c2.cp;
      if ((a == 'l' && b == 'l') || (a != 'l' && b == 'e')) return c1.len + c2.len;
    }
    return 0;
  }

  std::string_view text_;
};

}  // namespace

void PreTokenizeQwen2(std::string_view text, std::vector<std::string_view>* pieces) {
  const Scanner scanner(text);
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = scanner.Match(pos);
    pieces->push_back(text.substr(pos, n));
    pos += n;
  }
}

}  // namespace iris::llm
