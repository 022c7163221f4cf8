#include "kernels/cpu/cpu_device.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace iris::kernels::cpu {

struct CpuDevice::Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

CpuDevice::CpuDevice(int threads, CpuIsa isa)
    : threads_(threads > 0 ? threads : std::max(1, omp_get_max_threads())),
      active_threads_(threads_),
      isa_(isa),
      dnnl_(std::make_unique<Dnnl>()),
      scratch_(static_cast<size_t>(kNumSlots) * threads_) {}

CpuDevice::~CpuDevice() = default;

std::string CpuDevice::Describe() const {
  const CpuFeatures& f = DetectCpuFeatures();
  // Where oneDNN has no bf16 matmul, bf16 compute runs bf16 weights on f32 arithmetic (the same
  // probe that picks that Linear).
  return absl::StrCat("cpu: ", f.brand, ", ", threads_, " threads, kernels ", CpuIsaName(isa_),
                      f.amx ? ", AMX (oneDNN)" : "", HasBf16Matmul() ? "" : ", bf16 matmuls on f32 (no AVX-512)");
}

absl::StatusOr<core::Tensor> CpuDevice::Allocate(core::DType dtype, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError("Allocate: negative dimension");
    n *= d;
  }
  try {
    return core::Tensor::Empty(dtype, std::move(shape));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory allocating ", n * static_cast<int64_t>(core::DTypeSize(dtype)), " bytes"));
  }
}

absl::StatusOr<core::Tensor> CpuDevice::AllocateStaging(core::DType dtype, std::vector<int64_t> shape) {
  return Allocate(dtype, std::move(shape));
}

absl::StatusOr<core::Tensor> CpuDevice::Mirror(const core::Tensor& host) { return host; }

void CpuDevice::CopyToDevice(const void* host, void* device, size_t bytes) {
  if (bytes > 0 && host != device) std::memcpy(device, host, bytes);
}

void CpuDevice::CopyToHost(const void* device, void* host, size_t bytes) {
  if (bytes > 0 && host != device) std::memcpy(host, device, bytes);
}

dnnl::engine& CpuDevice::dnnl_engine() { return dnnl_->engine; }
dnnl::stream& CpuDevice::dnnl_stream() { return dnnl_->stream; }

void CpuDevice::AttachThread() { omp_set_num_threads(active_threads_); }

absl::StatusOr<std::shared_ptr<ComputeShare>> CpuDevice::NewComputeShare() const {
  return std::make_shared<ComputeShare>(threads_);
}

absl::Status CpuDevice::ShareCompute(std::shared_ptr<ComputeShare> share, ComputeShare::Side side) {
  if (share == nullptr || share->cores() != threads_) {
    return absl::InvalidArgumentError(absl::StrCat("a CPU device of ", threads_, " threads cannot share ",
                                                   share == nullptr ? 0 : share->cores(),
                                                   " cores: both teams must be as large as the cores they share"));
  }
  share_ = std::move(share);
  side_ = side;
  return absl::OkStatus();
}

void CpuDevice::Rebalance() {
  if (share_ == nullptr) return;
  const int n = std::clamp(share_->ThreadsFor(side_), 1, threads_);
  if (n == active_threads_) return;
  active_threads_ = n;
  omp_set_num_threads(n);  // oneDNN's regions follow the thread's OpenMP setting
}

void* CpuDevice::Scratch(Slot slot, int thread, size_t bytes) {
  Buffer& b = scratch_[static_cast<size_t>(slot) * threads_ + thread];
  if (bytes > b.bytes) {
    b.bytes = std::max(bytes, b.bytes * 2);
    b.data = core::AllocateAligned(b.bytes);
  }
  return b.data.get();
}

}  // namespace iris::kernels::cpu
