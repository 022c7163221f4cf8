#include "kernels/cuda/cuda_memory_bandwidth.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>

#include "kernels/cuda/linear_kernels.h"
#include "kernels/cuda/stream_timer.h"

namespace iris::kernels::cuda {

double MeasureMemoryReadBandwidth(CudaDevice& dev, int64_t bytes, int repeats) {
  const int64_t n = std::max<int64_t>(4, bytes / 16 * 4);  // floats, a whole number of 16-byte loads
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev.ordinal()) != cudaSuccess || sms <= 0) return 0;
  // 8 blocks of 256 threads per SM: 2048 threads, a full SM on Ampere and Hopper, so that enough
  // loads are in flight to cover the memory latency.
  const int blocks = sms * 8;
  absl::StatusOr<core::Tensor> buffer = dev.Allocate(core::DType::kF32, {n});
  absl::StatusOr<core::Tensor> partials = dev.Allocate(core::DType::kF32, {blocks});
  if (!buffer.ok() || !partials.ok()) return 0;
  cudaStream_t stream = dev.stream();
  // Filled once (0x3C3C3C3C is about 0.0115): the passes read defined values and the sums stay finite.
  dev.Check(cudaMemsetAsync(buffer->raw(), 0x3C, buffer->nbytes(), stream), "MeasureMemoryReadBandwidth: memset");
  StreamTimer timer(stream);
  if (!timer.ok()) return 0;
  double best = std::numeric_limits<double>::infinity();
  int launch = LaunchReadSum(stream, buffer->data<float>(), n, blocks, partials->data<float>());  // warm-up
  for (int r = 0; r < std::max(1, repeats) && launch == 0; ++r) {
    const std::optional<double> t = timer.Time([&] {
      launch = LaunchReadSum(stream, buffer->data<float>(), n, blocks, partials->data<float>());
      return launch == 0;
    });
    if (t.has_value() && *t > 0) best = std::min(best, *t);
  }
  dev.Check(launch, "MeasureMemoryReadBandwidth: read-sum kernel");
  dev.Synchronize();
  if (launch != 0 || best == std::numeric_limits<double>::infinity()) return 0;
  return static_cast<double>(n) * sizeof(float) / best;
}

}  // namespace iris::kernels::cuda
