#include "llm/normalizer.h"

#include "absl/strings/str_cat.h"
#include "unicode/bytestream.h"
#include "unicode/normalizer2.h"
#include "unicode/stringpiece.h"

namespace iris::llm {
namespace {

const icu::Normalizer2* Nfc(UErrorCode* status) { return icu::Normalizer2::getNFCInstance(*status); }

bool AllAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

bool IsNfc(std::string_view text) {
  if (AllAscii(text)) return true;
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = Nfc(&status);
  if (U_FAILURE(status)) return false;
  const bool yes = nfc->isNormalizedUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), status);
  return U_SUCCESS(status) && yes;
}

absl::StatusOr<std::string> ToNfc(std::string_view text) {
  if (IsNfc(text)) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = Nfc(&status);
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  if (U_SUCCESS(status)) {
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
    nfc->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink, nullptr, status);
  }
  if (U_FAILURE(status)) {
    return absl::InternalError(absl::StrCat("NFC normalization failed (ICU: ", u_errorName(status), ")"));
  }
  return out;
}

}  // namespace iris::llm
