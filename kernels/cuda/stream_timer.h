// GPU time of work enqueued on one stream, by a pair of CUDA events around it: the measuring
// probes (the GEMM rate, the memory bandwidth) and matmul tuning share it.
#pragma once

#include <functional>
#include <optional>

struct CUstream_st;
struct CUevent_st;

namespace iris::kernels::cuda {

class StreamTimer {
 public:
  explicit StreamTimer(CUstream_st* stream);
  ~StreamTimer();
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;

  // Whether the events could be made (else Time answers nothing).
  bool ok() const { return start_ != nullptr && stop_ != nullptr; }

  // Records the start, calls enqueue(), records the stop and waits for it on the host: the
  // seconds between the two on the GPU. Nullopt where enqueue() returns false (its work failed)
  // or an event call failed (error() then says which CUDA error).
  std::optional<double> Time(const std::function<bool()>& enqueue);

  // The last event call's CUDA error (a cudaError_t; 0: none).
  int error() const { return error_; }

 private:
  CUstream_st* stream_;
  CUevent_st* start_ = nullptr;
  CUevent_st* stop_ = nullptr;
  int error_ = 0;
};

}  // namespace iris::kernels::cuda
