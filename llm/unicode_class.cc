#include "llm/unicode_class.h"

#include <array>

#include "unicode/uchar.h"

namespace iris::llm {
namespace {

CharClass ClassifySlow(char32_t cp) {
  const UChar32 c = static_cast<UChar32>(cp);
  // No code point is both White_Space and a letter or number, so the order does not matter.
  if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) return CharClass::kSpace;
  const int32_t mask = U_GET_GC_MASK(c);
  if (mask & U_GC_L_MASK) return CharClass::kLetter;
  if (mask & U_GC_N_MASK) return CharClass::kNumber;
  return CharClass::kOther;
}

// Latin-1 is the hot range (ASCII text, NBSP); everything above goes to ICU's trie.
const std::array<CharClass, 256>& Latin1Table() {
  static const std::array<CharClass, 256> table = [] {
    std::array<CharClass, 256> t{};
    for (char32_t c = 0; c < 256; ++c) t[c] = ClassifySlow(c);
    return t;
  }();
  return table;
}

}  // namespace

CharClass ClassifyCodePoint(char32_t cp) {
  if (cp < 256) return Latin1Table()[cp];
  return ClassifySlow(cp);
}

}  // namespace iris::llm
