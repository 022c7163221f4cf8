// The text tokenizer of a checkpoint: Qwen2's byte-level BPE loaded from tokenizer.json (and
// tokenizer_config.json). Encode turns text into ids (nothing added: no BOS/EOS), Decode turns ids
// back into text. Thread-safe after loading; move-only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "llm/added_tokens.h"

namespace iris::llm {

class BpeModel;

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static absl::StatusOr<Tokenizer> Load(const std::string& model_dir);
  // The same from the files' contents; `config_json` may be empty.
  static absl::StatusOr<Tokenizer> FromJson(std::string_view tokenizer_json, std::string_view config_json = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text`, which must be valid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;

  // Text of `ids`; byte sequences that are not valid UTF-8 become U+FFFD. Unknown ids are an error.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The id of a vocabulary token (byte-level text, e.g. "Ġhello") or an added token's content.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The inverse: byte-level text for vocabulary tokens, the content for added tokens.
  absl::StatusOr<std::string> IdToToken(int32_t id) const;

  // What one id contributes to decoded text: raw bytes for a vocabulary token, or an added token.
  struct Piece {
    std::string_view bytes;               // vocabulary token; not necessarily valid UTF-8 on its own
    const AddedToken* added = nullptr;    // set for added tokens
  };
  absl::StatusOr<Piece> GetPiece(int32_t id) const;

  // One past the largest id (vocabulary and added tokens).
  int32_t id_limit() const;
  int64_t num_vocab_tokens() const;
  int64_t num_merges() const;
  const std::vector<AddedToken>& added_tokens() const;
  // True for added tokens marked special (the ones Decode(skip_special_tokens) drops).
  bool IsSpecial(int32_t id) const;

  // From tokenizer_config.json (absent when not configured).
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  std::optional<int32_t> bos_token_id() const;

 private:
  struct State;
  explicit Tokenizer(std::unique_ptr<State> state);
  void EncodeNormalized(std::string_view text, std::vector<int32_t>* ids) const;

  std::unique_ptr<State> state_;
};

}  // namespace iris::llm
