#include "core/weights.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace iris::core {

absl::StatusOr<Tensor> GetWeight(const Checkpoint& checkpoint, const std::string& name,
                                 const std::vector<int64_t>& shape) {
  IRIS_ASSIGN_OR_RETURN(Tensor t, checkpoint.Get(name));
  if (t.shape() != shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape ", t.ShapeString(),
                                                   ", the config implies ",
                                                   Tensor::View(nullptr, t.dtype(), shape, nullptr).ShapeString()));
  }
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has dtype ", DTypeName(t.dtype()),
                                                   "; expected BF16, F16 or F32"));
  }
  return t;
}

void CopyRows(const Tensor& src, Tensor* dst, int64_t at) {
  const size_t es = DTypeSize(src.dtype());
  const int64_t rows = src.dim(0), cols = src.numel() / src.dim(0), dst_cols = dst->numel() / dst->dim(0);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<char*>(dst->raw()) + ((at + r) * dst_cols) * es,
                static_cast<const char*>(src.raw()) + r * cols * es, cols * es);
  }
}

absl::StatusOr<Tensor> ConcatRows(const std::vector<const Tensor*>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("ConcatRows: no tensors");
  const DType dtype = parts[0]->dtype();
  const int64_t cols = parts[0]->numel() / parts[0]->dim(0);
  int64_t rows = 0;
  for (const Tensor* p : parts) {
    if (p->dtype() != dtype || p->numel() / p->dim(0) != cols) {
      return absl::InvalidArgumentError(absl::StrCat("ConcatRows: ", p->ShapeString(), " ", DTypeName(p->dtype()),
                                                     " does not stack with ", parts[0]->ShapeString(), " ",
                                                     DTypeName(dtype)));
    }
    rows += p->dim(0);
  }
  Tensor out = Tensor::Empty(dtype, {rows, cols});
  int64_t at = 0;
  for (const Tensor* p : parts) {
    CopyRows(*p, &out, at);
    at += p->dim(0);
  }
  return out;
}

}  // namespace iris::core
