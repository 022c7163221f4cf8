#include "llm/incremental_detokenizer.h"

#include "core/status_macros.h"
#include "llm/utf8.h"

namespace iris::llm {

absl::StatusOr<std::string> IncrementalDetokenizer::Push(int32_t id) {
  IRIS_ASSIGN_OR_RETURN(Tokenizer::Piece piece, tokenizer_->GetPiece(id));
  std::string out;
  if (piece.added != nullptr) {
    if (skip_special_tokens_ && piece.added->special) return out;
    // An added token ends the byte run before it, as in Decode.
    out = Flush();
    out.append(piece.added->content);
    return out;
  }
  if (pending_.empty()) {
    const size_t used = AppendUtf8Lossy(piece.bytes, /*hold_incomplete_tail=*/true, &out);
    pending_.assign(piece.bytes.substr(used));
    return out;
  }
  pending_.append(piece.bytes);
  const size_t used = AppendUtf8Lossy(pending_, /*hold_incomplete_tail=*/true, &out);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out;
  AppendUtf8Lossy(pending_, /*hold_incomplete_tail=*/false, &out);
  pending_.clear();
  return out;
}

}  // namespace iris::llm
