// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on a GPU, iris's CUDA kernels through kernels/cuda/cuda_kernels.h, launched on the device's stream).
#include "kernels/rows.h"

#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/cpu_ops.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace iris::kernels {
#ifdef IRIS_HAVE_CUDA
namespace {

// The GPU kernel's element type for an embedding table: F32, BF16 or F16, as the CPU op reads.
cuda::EmbeddingDType GpuTableDType(core::DType dtype) {
  switch (dtype) {
    case core::DType::kF32: return cuda::EmbeddingDType::kF32;
    case core::DType::kBF16: return cuda::EmbeddingDType::kBf16;
    case core::DType::kF16: return cuda::EmbeddingDType::kF16;
    default:
      std::fprintf(stderr, "iris EmbeddingLookup: the table must be F32, BF16 or F16, not %s\n",
                   core::DTypeName(dtype));
      std::abort();
  }
}

}  // namespace
#endif

void GatherRows(Device& device, const float* src, int64_t width, std::span<const int32_t> index, float* dst) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::GatherRows(cpu::AsCpu(device), src, width, index, dst);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(
          cuda::LaunchGatherRows(gpu.stream(), src, width, index.data(), static_cast<int64_t>(index.size()), dst),
          "GatherRows");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "GatherRows");
}

void ArgmaxRows(Device& device, const float* logits, int64_t rows, int64_t vocab, int32_t* out) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::ArgmaxRows(cpu::AsCpu(device), logits, rows, vocab, out);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      // A few rows: each split over many blocks, their pairs in the activation scratch (nothing
      // else uses it during the launch), arrivals in the device's split counters.
      const int slices = cuda::ArgmaxSlices(rows, vocab, gpu.sm_count());
      float* part_v = nullptr;
      int32_t* part_i = nullptr;
      if (slices > 1) {
        const size_t pairs = static_cast<size_t>(rows) * slices;
        part_v = static_cast<float*>(gpu.ActivationScratch(pairs * (sizeof(float) + sizeof(int32_t))));
        if (part_v == nullptr) return;  // the device keeps the error
        part_i = reinterpret_cast<int32_t*>(part_v + pairs);
      }
      return gpu.Check(cuda::LaunchArgmax(gpu.stream(), logits, rows, vocab, out, slices, part_v, part_i,
                                          gpu.paged_split_counters()),
                       "ArgmaxRows");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "ArgmaxRows");
}

void ScatterRows(Device& device, const float* src, int64_t width, std::span<const int32_t> index, float* dst) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::ScatterRows(cpu::AsCpu(device), src, width, index, dst);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(
          cuda::LaunchScatterRows(gpu.stream(), src, width, index.data(), static_cast<int64_t>(index.size()), dst),
          "ScatterRows");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "ScatterRows");
}

void EmbeddingLookup(Device& device, const core::Tensor& table, std::span<const int32_t> ids, float* out) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::EmbeddingLookup(cpu::AsCpu(device), table, ids, out);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      // The ids are device memory: a bad one gives a NaN row where the CPU stops (cuda_kernels.h).
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchEmbeddingLookup(gpu.stream(), table.raw(), GpuTableDType(table.dtype()),
                                                   table.dim(0), table.dim(1), ids.data(),
                                                   static_cast<int64_t>(ids.size()), out),
                       "EmbeddingLookup");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "EmbeddingLookup");
}

}  // namespace iris::kernels
