#include "llm/utf8.h"

namespace iris::llm {
namespace {

// Result of scanning one sequence: `len` bytes form a valid code point (complete = true), or the first
// `len` bytes are a maximal subpart (complete = false; len >= 1 unless the input was empty).
// `truncated` says the subpart ended because the input ended, not because of a bad byte.
struct Scan {
  int len = 0;
  bool complete = false;
  bool truncated = false;
  char32_t cp = 0;
};

// Unicode 15, Table 3-7 (well-formed UTF-8 byte sequences).
Scan ScanSequence(std::string_view s, size_t i) {
  Scan r;
  const size_t n = s.size();
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {1, true, false, b0};
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false, 0};
  }
  r.len = 1;
  for (int k = 1; k <= need; ++k) {
    if (i + k >= n) {
      r.truncated = true;
      return r;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return r;
    lo = 0x80, hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
    r.len = k + 1;
  }
  r.complete = true;
  r.cp = cp;
  return r;
}

}  // namespace

int DecodeUtf8(std::string_view s, size_t i, char32_t* cp) {
  if (i >= s.size()) return 0;
  const Scan r = ScanSequence(s, i);
  if (!r.complete) return 0;
  *cp = r.cp;
  return r.len;
}

size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Scan r = ScanSequence(s, i);
    if (!r.complete) return i;
    i += r.len;
  }
  return s.size();
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t AppendUtf8Lossy(std::string_view bytes, bool hold_incomplete_tail, std::string* out) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const Scan r = ScanSequence(bytes, i);
    if (r.complete) {
      i += r.len;
      continue;
    }
    out->append(bytes.data() + run, i - run);
    if (r.truncated && hold_incomplete_tail) return i;
    out->append(kReplacement, 3);
    i += r.len;
    run = i;
  }
  out->append(bytes.data() + run, i - run);
  return bytes.size();
}

}  // namespace iris::llm
