// UTF-8 helpers for the tokenizer: strict validation, code point decoding, and lossy decoding of
// byte streams the way Python's `bytes.decode("utf-8", "replace")` does it (one U+FFFD per maximal
// invalid subpart), including the streaming form that holds back an incomplete tail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace iris::llm {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when s[i..] does not start with a
// complete, well-formed sequence (bad lead byte, bad continuation, overlong, surrogate, > U+10FFFF,
// truncated). Writes the code point to *cp when the length is not 0.
int DecodeUtf8(std::string_view s, size_t i, char32_t* cp);

// Byte offset of the first ill-formed sequence in s, or s.size() when s is valid UTF-8.
size_t FindInvalidUtf8(std::string_view s);

// Appends the UTF-8 encoding of cp (must be a Unicode scalar value) to *out.
void AppendUtf8(char32_t cp, std::string* out);

// Appends `bytes` decoded lossily to *out: valid sequences are copied, each maximal ill-formed subpart
// becomes U+FFFD. When `hold_incomplete_tail` is true, a trailing sequence that is well formed so far
// but cut short by the end of `bytes` is not decoded; the number of bytes consumed is returned, so the
// caller can keep the tail and retry once more bytes arrive. Returns bytes.size() otherwise.
size_t AppendUtf8Lossy(std::string_view bytes, bool hold_incomplete_tail, std::string* out);

}  // namespace iris::llm
