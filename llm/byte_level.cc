#include "llm/byte_level.h"

#include <array>

#include "llm/utf8.h"

namespace iris::llm {
namespace {

struct Tables {
  std::array<char32_t, 256> byte_to_char{};
  std::array<int16_t, 512> char_to_byte{};  // every character of the alphabet is below U+0200
};

const Tables& GetTables() {
  static const Tables tables = [] {
    Tables t;
    t.char_to_byte.fill(-1);
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      t.byte_to_char[b] = c;
      t.char_to_byte[c] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

char32_t ByteToChar(uint8_t b) { return GetTables().byte_to_char[b]; }

int CharToByte(char32_t c) { return c < 512 ? GetTables().char_to_byte[c] : -1; }

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &out);
  return out;
}

bool ByteLevelToBytes(std::string_view token, std::string* bytes) {
  const size_t start = bytes->size();
  size_t i = 0;
  while (i < token.size()) {
    char32_t c;
    const int len = DecodeUtf8(token, i, &c);
    const int b = len > 0 ? CharToByte(c) : -1;
    if (b < 0) {
      bytes->resize(start);
      return false;
    }
    bytes->push_back(static_cast<char>(b));
    i += len;
  }
  return true;
}

}  // namespace iris::llm
