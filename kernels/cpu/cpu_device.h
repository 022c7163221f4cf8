// The CPU device: what used to be process-global in the CPU kernels — oneDNN's engine and
// stream, per-thread scratch, the thread team's size — and the instruction-set tier its ops
// dispatch on. Used by one thread at a time (the engine thread, or the encoder's worker for an
// encoder device of its own), like a GPU stream.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/device.h"

namespace dnnl {
struct engine;
struct stream;
}  // namespace dnnl

namespace iris::kernels::cpu {

class CpuDevice final : public Device {
 public:
  CpuDevice(int threads, CpuIsa isa);
  ~CpuDevice() override;

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string Describe() const override;
  void AttachThread() override;
  absl::StatusOr<core::Tensor> Allocate(core::DType dtype, std::vector<int64_t> shape) override;
  absl::StatusOr<core::Tensor> AllocateStaging(core::DType dtype, std::vector<int64_t> shape) override;
  absl::StatusOr<core::Tensor> Mirror(const core::Tensor& host) override;
  void CopyToDevice(const void* host, void* device, size_t bytes) override;
  void CopyToHost(const void* device, void* host, size_t bytes) override;
  void Synchronize() override {}  // ops return when done
  void Rebalance() override;

  // The team size ops use now: max_threads(), or the part of the cores a ComputeShare gives.
  int threads() const { return active_threads_; }
  int max_threads() const { return threads_; }
  // A share of max_threads() cores.
  absl::StatusOr<std::shared_ptr<ComputeShare>> NewComputeShare() const override;
  // The team size follows the share (whose cores must be max_threads()), taken at each Rebalance.
  absl::Status ShareCompute(std::shared_ptr<ComputeShare> share, ComputeShare::Side side) override;
  CpuIsa isa() const { return isa_; }
  bool native_bf16() const { return isa_ >= CpuIsa::kAvx512Bf16; }

  dnnl::engine& dnnl_engine();
  dnnl::stream& dnnl_stream();

  // Workspace that grows to the largest request and stays (64-byte aligned). `thread` is the
  // team member (omp_get_thread_num() inside a parallel region, 0 outside); `slot` separates
  // buffers one op uses at the same time. Contents are not kept between calls.
  enum Slot { kSlotBf16Activations, kSlotPackedKeys, kSlotTile, kSlotWeightPanel, kNumSlots };
  void* Scratch(Slot slot, int thread, size_t bytes);

 private:
  struct Dnnl;
  struct Buffer {
    std::shared_ptr<void> data;
    size_t bytes = 0;
  };
  const int threads_;
  int active_threads_;  // changed only by the issuing thread (Rebalance), between ops
  std::shared_ptr<ComputeShare> share_;
  ComputeShare::Side side_ = ComputeShare::kDecoder;
  const CpuIsa isa_;
  std::unique_ptr<Dnnl> dnnl_;
  std::vector<Buffer> scratch_;  // [slot * threads + thread]
};

// The CPU device behind a Device the caller knows is one (the dispatch points do).
inline CpuDevice& AsCpu(Device& device) { return static_cast<CpuDevice&>(device); }

}  // namespace iris::kernels::cpu
