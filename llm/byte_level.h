// GPT-2's byte-level alphabet: every byte 0..255 is shown as one printable Unicode character
// (printable Latin-1 bytes as themselves, the rest as U+0100 upwards), so BPE tokens are text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace iris::llm {

// The character that stands for byte b.
char32_t ByteToChar(uint8_t b);

// The byte that character c stands for, or -1 when c is not in the alphabet.
int CharToByte(char32_t c);

// Byte-level form of raw bytes (each byte becomes its character, UTF-8 encoded).
std::string BytesToByteLevel(std::string_view bytes);

// Raw bytes of a byte-level token; false when the token (valid UTF-8) has a character outside the
// alphabet.
bool ByteLevelToBytes(std::string_view token, std::string* bytes);

}  // namespace iris::llm
