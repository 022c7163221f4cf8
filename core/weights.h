// Helpers for loading model weights from a checkpoint: a tensor checked against the shape the
// config implies, and row-wise concatenation (fused projections such as qkv and gate/up).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/safetensors.h"
#include "core/tensor.h"

namespace iris::core {

// `name` from the checkpoint; INVALID_ARGUMENT unless its shape is `shape` and its dtype is a
// float type (F32, BF16, F16). Error messages name the tensor and both shapes.
absl::StatusOr<Tensor> GetWeight(const Checkpoint& checkpoint, const std::string& name,
                                 const std::vector<int64_t>& shape);

// Copies `src` ([rows, cols]) into rows [at, at + rows) of `dst` ([*, dst_cols >= cols], same dtype);
// columns cols..dst_cols of those rows are left as they are.
void CopyRows(const Tensor& src, Tensor* dst, int64_t at);

// The tensors stacked along dim 0 (all [*, cols] of one dtype) in a fresh tensor.
absl::StatusOr<Tensor> ConcatRows(const std::vector<const Tensor*>& parts);

}  // namespace iris::core
