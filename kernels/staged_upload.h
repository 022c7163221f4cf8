// A step's small host arrays (token ids, attention metadata, KV slots, rotary tables) sent to the
// device together: packed into one staging buffer (pinned on a GPU) and copied up in one transfer,
// into one device buffer that stays at the same address from step to step. Instead of a Mirror
// per array (an allocation, a copy and a host wait each), a step costs one copy and no wait, and
// a recorded graph can read its inputs from fixed addresses.
//
// Use: Clear(); Add() each array (returns its offset); Upload(); then At<T>(offset) is the
// array's device address. Add() only records the source: the arrays must stay as they are until
// Upload() returns. The next Upload() waits for the device's queue before it rewrites the staging
// buffer (the previous copy may still be queued), so one upload is in flight at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "kernels/device.h"

namespace iris::kernels {

class StagedUpload {
 public:
  explicit StagedUpload(Device& device) : device_(device) {}

  void Clear();
  // Records `bytes` from `host` for the next Upload; returns the offset (64-byte aligned) they
  // will have in the device buffer.
  size_t Add(const void* host, size_t bytes);
  template <typename T>
  size_t Add(std::span<const T> values) {
    return Add(values.data(), values.size_bytes());
  }
  // Grows both buffers when the arrays need more room than they have (a new address: call it
  // outside graph capture), packs the arrays and copies them to the device in one transfer.
  absl::Status Upload();
  // Bytes Upload() will send (what a step's inputs take), and the buffers' capacity.
  size_t bytes() const { return size_; }
  size_t capacity() const { return capacity_; }
  // The device address of what was added at `offset`.
  template <typename T>
  const T* At(size_t offset) const {
    return reinterpret_cast<const T*>(device_buffer_.data<uint8_t>() + offset);
  }

 private:
  struct Piece {
    const void* host;
    size_t bytes, offset;
  };
  Device& device_;
  std::vector<Piece> pieces_;
  size_t size_ = 0;
  size_t capacity_ = 0;
  bool uploaded_ = false;       // a copy from staging_ was issued (and may still be queued)
  core::Tensor staging_;        // host, pinned where that matters (AllocateStaging)
  core::Tensor device_buffer_;  // device
};

}  // namespace iris::kernels
