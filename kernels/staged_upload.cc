#include "kernels/staged_upload.h"

#include <cstring>

#include "core/status_macros.h"

namespace iris::kernels {

void StagedUpload::Clear() {
  pieces_.clear();
  size_ = 0;
}

size_t StagedUpload::Add(const void* host, size_t bytes) {
  const size_t offset = (size_ + 63) / 64 * 64;
  pieces_.push_back({host, bytes, offset});
  size_ = offset + bytes;
  return offset;
}

absl::Status StagedUpload::Upload() {
  if (device_.kind() != DeviceKind::kCpu && uploaded_) {
    // The previous upload's copy may still be queued behind earlier work (a step that returned no
    // results waited for nothing): it must have read the staging buffer before it is rewritten.
    // Usually the stream is idle by now and this costs a few microseconds.
    device_.Synchronize();
  }
  if (size_ > capacity_) {
    // Room for half again as much, so that a slowly growing step does not reallocate every time.
    const size_t capacity = (size_ + size_ / 2 + 4095) / 4096 * 4096;
    const int64_t n = static_cast<int64_t>(capacity);
    IRIS_ASSIGN_OR_RETURN(core::Tensor device_buffer, device_.Allocate(core::DType::kU8, {n}));
    if (device_.kind() != DeviceKind::kCpu) {
      IRIS_ASSIGN_OR_RETURN(staging_, device_.AllocateStaging(core::DType::kU8, {n}));
    }
    device_buffer_ = std::move(device_buffer);
    capacity_ = capacity;
  }
  // Where the device reads host memory (the CPU) the arrays go straight to the device buffer.
  uint8_t* pack = device_.kind() == DeviceKind::kCpu ? device_buffer_.data<uint8_t>() : staging_.data<uint8_t>();
  for (const Piece& p : pieces_) {
    if (p.bytes > 0) std::memcpy(pack + p.offset, p.host, p.bytes);
  }
  if (pack != device_buffer_.data<uint8_t>() && size_ > 0) {
    device_.CopyToDevice(pack, device_buffer_.data<uint8_t>(), size_);
    uploaded_ = true;
  }
  return device_.status();
}

}  // namespace iris::kernels
