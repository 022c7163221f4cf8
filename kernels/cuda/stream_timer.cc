#include "kernels/cuda/stream_timer.h"

#include <cuda_runtime.h>

namespace iris::kernels::cuda {

StreamTimer::StreamTimer(cudaStream_t stream) : stream_(stream) {
  if (cudaEventCreate(&start_) != cudaSuccess || cudaEventCreate(&stop_) != cudaSuccess) {
    cudaGetLastError();  // not sticky
    if (start_ != nullptr) cudaEventDestroy(start_);
    start_ = stop_ = nullptr;
  }
}

StreamTimer::~StreamTimer() {
  if (start_ != nullptr) cudaEventDestroy(start_);
  if (stop_ != nullptr) cudaEventDestroy(stop_);
}

std::optional<double> StreamTimer::Time(const std::function<bool()>& enqueue) {
  if (!ok()) return std::nullopt;
  if (const cudaError_t e = cudaEventRecord(start_, stream_); e != cudaSuccess) {
    error_ = e;
    return std::nullopt;
  }
  const bool enqueued = enqueue();
  cudaError_t e = cudaEventRecord(stop_, stream_);
  if (e == cudaSuccess) e = cudaEventSynchronize(stop_);
  float ms = 0.f;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start_, stop_);
  error_ = e;
  if (e != cudaSuccess || !enqueued) return std::nullopt;
  return ms * 1e-3;
}

}  // namespace iris::kernels::cuda
