// SHA-256 (through OpenSSL), used to check weights and images against reference digests.
#pragma once

#include <cstddef>
#include <string>

namespace iris::core {

// Lower-case hex digest of `size` bytes at `data`.
std::string Sha256Hex(const void* data, size_t size);

}  // namespace iris::core
