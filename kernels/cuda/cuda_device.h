// The CUDA backend's device: one GPU, one stream every op is issued on, a stream-ordered memory
// pool (allocations and frees are ordered with the work, and freed memory is reused without a
// device-wide synchronisation), pinned host staging, and graph capture of the stream. (The
// cuBLASLt and cuDNN handles and their workspaces join it with the kernels that use them.)
//
// Copies and ops are asynchronous; CopyToHost waits for its copy (the caller reads the host
// buffer next). A CUDA error inside a void operation is kept (the first one) and reported by
// status() and by every later Synchronize on stderr: a failed launch leaves the stream unusable.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"

struct CUstream_st;

namespace iris::kernels::cuda {

class CudaDevice final : public Device {
 public:
  // "cuda:<ordinal>": FAILED_PRECONDITION when no usable GPU is there (no driver, a driver older
  // than this build's runtime, a GPU busy in exclusive mode, compute capability below 8.0 — bf16
  // needs Ampere or later), INVALID_ARGUMENT for an ordinal past the GPUs present.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string Describe() const override { return description_; }

  absl::StatusOr<core::Tensor> Allocate(core::DType dtype, std::vector<int64_t> shape) override;
  absl::StatusOr<core::Tensor> AllocateStaging(core::DType dtype, std::vector<int64_t> shape) override;
  absl::StatusOr<core::Tensor> Mirror(const core::Tensor& host) override;

  void CopyToDevice(const void* host, void* device, size_t bytes) override;
  void CopyToHost(const void* device, void* host, size_t bytes) override;
  void Synchronize() override;
  void AttachThread() override;

  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<DeviceGraph>> EndCapture() override;

  // The first CUDA error of a void operation, or OK.
  absl::Status status() const override;
  // Keeps a launch's cudaError_t value (0: success) as the device's first error, named by `op`:
  // the ops' dispatch points pass every cuda_kernels.h launch through it.
  void Check(int cuda_error, const char* op);

  int ordinal() const { return ordinal_; }
  CUstream_st* stream() const;

 private:
  struct State;
  CudaDevice(int ordinal, std::shared_ptr<State> state, std::string description);

  int ordinal_;
  // Shared with every tensor this device allocated: memory freed after the device object is
  // gone still goes back through the stream and pool it came from.
  std::shared_ptr<State> state_;
  std::string description_;
};

// The CUDA device behind a Device of kind kCuda (the dispatch points' counterpart of cpu::AsCpu).
inline CudaDevice& AsCuda(Device& device) { return static_cast<CudaDevice&>(device); }

// "cuda" -> 0, "cuda:N" -> N; INVALID_ARGUMENT for anything else.
absl::StatusOr<int> ParseCudaOrdinal(const std::string& name);

}  // namespace iris::kernels::cuda
