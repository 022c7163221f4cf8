// Streaming detokenization: fed one generated id at a time, returns the text that id completes.
// A vocabulary token may end in the middle of a UTF-8 character (emoji and CJK often span tokens);
// those bytes are held back until the character is complete, so every returned piece is valid UTF-8
// and the pieces concatenate to Tokenizer::Decode of the same ids.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "llm/tokenizer.h"

namespace iris::llm {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // The text completed by `id` (often empty while a character is still incomplete). Unknown ids are
  // an error and leave the state unchanged.
  absl::StatusOr<std::string> Push(int32_t id);

  // Ends the stream: the held bytes, with an incomplete character replaced by U+FFFD (as Decode does).
  std::string Flush();

  // Bytes currently held back (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;  // the start of an incomplete UTF-8 sequence
};

}  // namespace iris::llm
