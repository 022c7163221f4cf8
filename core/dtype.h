// Element types a Tensor can hold, and their safetensors names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace iris::core {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kU8, kF64 };

size_t DTypeSize(DType dtype);
// The safetensors spelling: "F32", "BF16", "F16", "I32", "I64", "U8", "F64".
const char* DTypeName(DType dtype);
absl::StatusOr<DType> DTypeFromName(std::string_view name);

// Where a tensor's bytes live. CUDA is a tag for now: the CPU path never dereferences it.
enum class Device : uint8_t { kCpu, kCuda };

}  // namespace iris::core
