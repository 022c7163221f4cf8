// The vision encoder on a thread of its own, issuing to a device of its own (on a GPU a second
// stream on the same GPU; on the CPU a compute team on cores of its own), so that an image being
// encoded holds up no engine step: the engine thread submits a job and keeps stepping the running
// requests, and picks the embeddings up by polling once they are in host memory. Nothing the
// engine thread does waits for the encoder.
//
// One job at a time (the scheduler plans the next only when the last has ended). On the CPU the
// thread runs a job as the resumable forward's pieces (VisionEncoder::Begin / Advance), so that an
// abandoned job (every request it was for has gone) stops after its current piece and frees the
// thread; on a GPU, whose ops only enqueue, it issues the forward in one call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/tensor.h"
#include "kernels/compute_share.h"
#include "kernels/device.h"
#include "vision/encoder_plan.h"
#include "vision/vision_encoder.h"

namespace iris::engine {

class EncoderWorker {
 public:
  struct Result {
    // Host F32, one tensor per image of the job: [its merged tokens, out_hidden], as
    // VisionEncoder::FinishImages makes them (on the worker thread: the engine copies nothing).
    absl::StatusOr<std::vector<core::Tensor>> images;
    double ms = 0;  // on the worker, from the job's start to its embeddings in host memory
  };

  // `encoder` was loaded on `device`, and only this worker issues work to either while it lives.
  // `cpus` non-empty: the worker thread, and the compute team it starts, run only on these.
  // `share` set: the device shares its compute with the decoder's as ComputeShare::kEncoder; the
  // worker marks itself busy for each job and rebalances the device between the job's pieces.
  static absl::StatusOr<std::unique_ptr<EncoderWorker>> Start(vision::VisionEncoder* encoder,
                                                              kernels::Device* device,
                                                              const std::vector<int>& cpus,
                                                              std::shared_ptr<kernels::ComputeShare> share = nullptr);
  ~EncoderWorker();  // abandons the job in flight and joins the thread

  EncoderWorker(const EncoderWorker&) = delete;
  EncoderWorker& operator=(const EncoderWorker&) = delete;

  // Hands the worker a forward over the images' bytes `rgb` (U8, resized to `grids`, packed), as
  // VisionEncoder::ForwardRgb's arguments. FAILED_PRECONDITION while a job is held (submitted and
  // its result not yet taken).
  absl::Status Submit(core::Tensor rgb, std::vector<vision::GridThw> grids,
                      const vision::PixelNormalization& normalization);
  // The held job's result once ready (the job is then no longer held); nullopt while it runs or
  // when none is held. Never blocks on the job.
  std::optional<Result> Poll();
  // Blocks until the held job's result is ready and takes it (the warm-up, tests).
  // FAILED_PRECONDITION in the result when no job is held.
  Result Wait();
  // Drops the held job: the thread stops it after its current piece and its result is never
  // given. A new job may be submitted at once; it starts when the thread is free.
  void Abandon();
  bool busy() const;  // a job held
  // Called on the worker thread each time a job's result becomes ready (never for an abandoned
  // job), so that a waiting engine wakes; it must return quickly.
  void set_on_ready(std::function<void()> on_ready);

  // Jobs the thread has run to the end (results given or dropped) and stopped early (abandoned).
  int64_t jobs_finished() const;
  int64_t jobs_stopped() const;

 private:
  struct Job {
    uint64_t id = 0;
    core::Tensor rgb;
    std::vector<vision::GridThw> grids;
    vision::PixelNormalization normalization;
  };

  EncoderWorker(vision::VisionEncoder* encoder, kernels::Device* device);
  void Loop();
  // Runs `job` in pieces; nullopt when it was abandoned on the way.
  std::optional<absl::StatusOr<std::vector<core::Tensor>>> RunJob(const Job& job);
  bool Held(uint64_t id) const;
  // Hands the ready result over and releases the held job.
  Result TakeResult() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  vision::VisionEncoder* encoder_;
  kernels::Device* device_;
  std::shared_ptr<kernels::ComputeShare> share_;

  mutable absl::Mutex mu_;
  std::function<void()> on_ready_ ABSL_GUARDED_BY(mu_);
  std::optional<Job> queued_ ABSL_GUARDED_BY(mu_);       // submitted, not yet taken by the thread
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;               // id of the held job (0: none)
  uint64_t last_id_ ABSL_GUARDED_BY(mu_) = 0;
  // The held job's result, once ready (kept as its parts: GCC 12 misreads moves of an optional
  // StatusOr as reads of uninitialised memory).
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<core::Tensor> images_ ABSL_GUARDED_BY(mu_);
  double ms_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t stopped_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace iris::engine
