#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/bf16.h"

namespace iris::core {

std::shared_ptr<void> AllocateAligned(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw std::bad_alloc();
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::Empty(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  auto mem = AllocateAligned(t.nbytes());
  t.data_ = mem.get();
  t.owner_ = std::move(mem);
  return t;
}

Tensor Tensor::Zeros(DType dtype, std::vector<int64_t> shape) {
  Tensor t = Empty(dtype, std::move(shape));
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::View(void* data, DType dtype, std::vector<int64_t> shape,
                    std::shared_ptr<const void> owner, Device device) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  t.device_ = device;
  return t;
}

Tensor Tensor::Reshaped(std::vector<int64_t> shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  if (t.numel() != numel()) throw std::invalid_argument("Tensor::Reshaped: element count differs");
  return t;
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  Tensor t = *this;
  const int64_t row = shape_.empty() || shape_[0] == 0 ? 0 : numel() / shape_[0];
  t.shape_[0] = end - begin;
  t.data_ = static_cast<char*>(data_) + begin * row * DTypeSize(dtype_);
  return t;
}

Tensor Tensor::Clone() const {
  Tensor t = Empty(dtype_, shape_);
  if (nbytes() > 0) std::memcpy(t.data_, data_, nbytes());
  return t;
}

Tensor Tensor::ToF32() const {
  Tensor out = Empty(DType::kF32, shape_);
  float* o = out.data<float>();
  const int64_t n = numel();
  switch (dtype_) {
    case DType::kF32: std::memcpy(o, data_, nbytes()); break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) o[i] = Bf16ToFloat(data<uint16_t>()[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) o[i] = F16ToFloat(data<uint16_t>()[i]);
      break;
    case DType::kI32:
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(data<int32_t>()[i]);
      break;
    case DType::kI64:
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(data<int64_t>()[i]);
      break;
    case DType::kU8:
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(data<uint8_t>()[i]);
      break;
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(data<double>()[i]);
      break;
  }
  return out;
}

// StrCat, not "[" + ... + "]": GCC 12 warns falsely (-Wrestrict) on the inlined operator+.
std::string Tensor::ShapeString() const { return absl::StrCat("[", absl::StrJoin(shape_, ", "), "]"); }

}  // namespace iris::core
