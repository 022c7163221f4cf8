// SHA-256 (through OpenSSL), used to check weights and images against reference digests and to
// key the prefix cache's KV blocks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace iris::core {

// Lower-case hex digest of `size` bytes at `data`.
std::string Sha256Hex(const void* data, size_t size);

// The raw 32-byte digest of `size` bytes at `data`.
std::array<uint8_t, 32> Sha256(const void* data, size_t size);

}  // namespace iris::core
