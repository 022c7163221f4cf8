// The checkpoint's tokenizer (Qwen2 byte-level BPE, loaded once from the test checkpoint) on
// arbitrary input. The first byte chooses: text to encode (the rest, any bytes), or ids to decode
// (the rest, 3 bytes per id, spread a little past both ends of the id range). Properties: Encode
// accepts exactly valid UTF-8, gives known ids, and round-trips NFC text; Decode accepts exactly
// known ids, returns valid UTF-8, and equals the concatenated IncrementalDetokenizer pieces (with
// and without special tokens).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "llm/incremental_detokenizer.h"
#include "llm/normalizer.h"
#include "llm/tokenizer.h"
#include "llm/utf8.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

const iris::llm::Tokenizer& TheTokenizer() {
  static const iris::llm::Tokenizer* tokenizer = [] {
    auto t = iris::llm::Tokenizer::Load(IRIS_TEST_DATA "/tiny-qwen2.5-vl");
    if (!t.ok()) {
      std::fprintf(stderr, "cannot load the test tokenizer: %s\n", std::string(t.status().message()).c_str());
      std::abort();
    }
    return new iris::llm::Tokenizer(std::move(*t));
  }();
  return *tokenizer;
}

bool IsValidUtf8(std::string_view s) { return iris::llm::FindInvalidUtf8(s) == s.size(); }

void FuzzEncode(const iris::llm::Tokenizer& tok, std::string_view text) {
  const auto ids = tok.Encode(text);
  IRIS_FUZZ_CHECK(ids.ok() == IsValidUtf8(text), "Encode ok=%d for text valid=%d", ids.ok(), IsValidUtf8(text));
  if (!ids.ok()) return;
  for (int32_t id : *ids) IRIS_FUZZ_CHECK(tok.GetPiece(id).ok(), "Encode produced unknown id %d", id);
  if (!iris::llm::IsNfc(text)) return;
  const auto back = tok.Decode(*ids, /*skip_special_tokens=*/false);
  IRIS_FUZZ_CHECK(back.ok(), "Decode of Encode failed: %s", std::string(back.status().message()).c_str());
  IRIS_FUZZ_CHECK(*back == text, "round trip changed the text (%zu bytes -> %zu bytes)", text.size(),
                  back->size());
}

void FuzzDecode(const iris::llm::Tokenizer& tok, const uint8_t* data, size_t size) {
  const int64_t span = int64_t{tok.id_limit()} + 16;
  std::vector<int32_t> ids;
  bool all_known = true;
  for (size_t i = 0; i + 3 <= size; i += 3) {
    const int64_t raw = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16);
    const int32_t id = static_cast<int32_t>(raw % span - 8);
    ids.push_back(id);
    all_known = all_known && tok.GetPiece(id).ok();
  }
  for (bool skip : {false, true}) {
    const auto text = tok.Decode(ids, skip);
    IRIS_FUZZ_CHECK(text.ok() == all_known, "Decode ok=%d with all ids known=%d", text.ok(), all_known);
    if (!text.ok()) continue;
    IRIS_FUZZ_CHECK(IsValidUtf8(*text), "Decode returned invalid UTF-8");
    iris::llm::IncrementalDetokenizer detok(tok, skip);
    std::string streamed;
    for (int32_t id : ids) {
      const auto piece = detok.Push(id);
      IRIS_FUZZ_CHECK(piece.ok(), "Push(%d) failed", id);
      IRIS_FUZZ_CHECK(IsValidUtf8(*piece), "a streamed piece is not valid UTF-8");
      IRIS_FUZZ_CHECK(detok.pending_bytes() <= 3, "%zu bytes held back", detok.pending_bytes());
      streamed += *piece;
    }
    streamed += detok.Flush();
    IRIS_FUZZ_CHECK(streamed == *text, "streamed text (%zu bytes) != Decode (%zu bytes), skip=%d",
                    streamed.size(), text->size(), skip);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  TheTokenizer();  // load before the first input, so its time is not charged to an input
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const iris::llm::Tokenizer& tok = TheTokenizer();
  if (data[0] % 2 == 0) {
    FuzzEncode(tok, std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  } else {
    FuzzDecode(tok, data + 1, size - 1);
  }
  return 0;
}
