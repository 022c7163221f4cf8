// A step's logit edits (kernels/logit_edits.h) as the edit op reads them: pointers into the one
// int32 buffer LogitEdits::Pack fills, in host or device memory (host and device code: a plain
// struct the CPU op takes and the CUDA launch passes by value).
#pragma once

#include <cstdint>

namespace iris::kernels {

struct PackedLogitEdits {
  int64_t rows = 0;
  const int32_t* penalty_bits = nullptr;     // [rows] the penalty's float bits
  const int32_t* penalized_begin = nullptr;  // [rows + 1] row r's penalized ids: penalized[begin[r], begin[r + 1])
  const int32_t* masked_begin = nullptr;     // [rows + 1] likewise for masked
  const int32_t* penalized = nullptr;
  const int32_t* masked = nullptr;
};

}  // namespace iris::kernels
