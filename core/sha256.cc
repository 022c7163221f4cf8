#include "core/sha256.h"

#include <openssl/evp.h>

#include "absl/strings/escaping.h"

namespace iris::core {

std::string Sha256Hex(const void* data, size_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data, size, digest, &len, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), len));
}

std::array<uint8_t, 32> Sha256(const void* data, size_t size) {
  std::array<uint8_t, 32> digest{};
  unsigned int len = 0;
  EVP_Digest(data, size, digest.data(), &len, EVP_sha256(), nullptr);
  return digest;
}

}  // namespace iris::core
