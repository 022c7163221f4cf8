// Tensor: a typed, shaped view of memory. CPU allocations are 64-byte aligned; a tensor may
// also view memory it does not own (an mmap'd checkpoint) and then keeps that owner alive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace iris::core {

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised, 64-byte-aligned CPU memory.
  static Tensor Empty(DType dtype, std::vector<int64_t> shape);
  static Tensor Zeros(DType dtype, std::vector<int64_t> shape);
  // A view of `data`; `owner` (may be null) is kept alive as long as any view exists.
  static Tensor View(void* data, DType dtype, std::vector<int64_t> shape,
                     std::shared_ptr<const void> owner, Device device = Device::kCpu);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T>
  T* data() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }

  // Same storage, new shape (element count must match).
  Tensor Reshaped(std::vector<int64_t> shape) const;
  // Rows [begin, end) of the leading dimension, sharing storage.
  Tensor Rows(int64_t begin, int64_t end) const;
  // A deep copy in fresh aligned CPU memory.
  Tensor Clone() const;
  // Elements converted to float32 (F32, BF16, F16, I32, I64, U8, F64 sources).
  Tensor ToF32() const;

  std::string ShapeString() const;

 private:
  std::shared_ptr<const void> owner_;
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  std::vector<int64_t> shape_;
};

// 64-byte aligned allocation shared by Tensor and the kernels' scratch buffers.
std::shared_ptr<void> AllocateAligned(size_t bytes);

}  // namespace iris::core
