#include "engine/encoder_worker.h"

#include <pthread.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/cpu_affinity.h"

namespace iris::engine {
namespace {

// On the CPU a job runs as about this many Advance calls: an abandoned job stops within one of
// them. A GPU's ops only enqueue, so a stop could not reach work already queued: there the
// forward is issued in one call (and attention runs over whole sequences, never row pieces).
constexpr double kCpuPiecesPerJob = 32;

}  // namespace

absl::StatusOr<std::unique_ptr<EncoderWorker>> EncoderWorker::Start(vision::VisionEncoder* encoder,
                                                                    kernels::Device* device,
                                                                    const std::vector<int>& cpus,
                                                                    std::shared_ptr<kernels::ComputeShare> share) {
  if (encoder == nullptr || device == nullptr) return absl::InvalidArgumentError("EncoderWorker: no encoder or device");
  std::unique_ptr<EncoderWorker> worker(new EncoderWorker(encoder, device));
  worker->share_ = std::move(share);
  worker->thread_ = std::thread([w = worker.get()] {
    w->device_->AttachThread();
    w->Loop();
  });
  // Named and pinned before any job reaches it, so before its first parallel region starts the
  // team (whose threads inherit both).
  pthread_setname_np(worker->thread_.native_handle(), "iris-encoder");
  if (!cpus.empty()) {
    // On failure the destructor stops and joins the thread.
    if (absl::Status s = core::PinThread(worker->thread_.native_handle(), cpus, "encoder thread"); !s.ok()) return s;
  }
  return worker;
}

EncoderWorker::EncoderWorker(vision::VisionEncoder* encoder, kernels::Device* device)
    : encoder_(encoder), device_(device) {}

EncoderWorker::~EncoderWorker() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    held_ = 0;
    queued_.reset();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status EncoderWorker::Submit(core::Tensor rgb, std::vector<vision::GridThw> grids,
                                   const vision::PixelNormalization& normalization) {
  absl::MutexLock lock(&mu_);
  if (held_ != 0) {
    return absl::FailedPreconditionError("EncoderWorker::Submit: a job is in flight (Poll its result or Abandon it)");
  }
  held_ = ++last_id_;
  ready_ = false;
  queued_ = Job{held_, std::move(rgb), std::move(grids), normalization};
  return absl::OkStatus();
}

EncoderWorker::Result EncoderWorker::TakeResult() {
  Result r{std::vector<core::Tensor>(), ms_};
  if (status_.ok()) {
    r.images = std::move(images_);
  } else {
    r.images = std::move(status_);
  }
  images_.clear();
  status_ = absl::OkStatus();
  ready_ = false;
  held_ = 0;
  return r;
}

std::optional<EncoderWorker::Result> EncoderWorker::Poll() {
  absl::MutexLock lock(&mu_);
  if (held_ == 0 || !ready_) return std::nullopt;
  return TakeResult();
}

EncoderWorker::Result EncoderWorker::Wait() {
  absl::MutexLock lock(&mu_);
  if (held_ == 0) return Result{absl::FailedPreconditionError("EncoderWorker::Wait: no job in flight"), 0};
  mu_.Await(absl::Condition(+[](EncoderWorker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->ready_; }, this));
  return TakeResult();
}

void EncoderWorker::Abandon() {
  absl::MutexLock lock(&mu_);
  held_ = 0;
  ready_ = false;
  images_.clear();
  status_ = absl::OkStatus();
  queued_.reset();
}

void EncoderWorker::set_on_ready(std::function<void()> on_ready) {
  absl::MutexLock lock(&mu_);
  on_ready_ = std::move(on_ready);
}

bool EncoderWorker::busy() const {
  absl::MutexLock lock(&mu_);
  return held_ != 0;
}

int64_t EncoderWorker::jobs_finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

int64_t EncoderWorker::jobs_stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

bool EncoderWorker::Held(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  return held_ == id && !stopping_;
}

void EncoderWorker::Loop() {
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](EncoderWorker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->stopping_ || w->queued_.has_value(); },
          this));
      if (stopping_) return;
      job = std::move(*queued_);
      queued_.reset();
    }
    const absl::Time t0 = absl::Now();
    std::optional<absl::StatusOr<std::vector<core::Tensor>>> out = RunJob(job);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    job.rgb = core::Tensor();  // the input's memory goes back before the result is handed over
    std::function<void()> on_ready;
    {
      absl::MutexLock lock(&mu_);
      if (!out.has_value()) {
        ++stopped_;
      } else {
        ++finished_;
        if (held_ == job.id) {
          if (out->ok()) {
            images_ = std::move(**out);
          } else {
            status_ = out->status();
          }
          ms_ = ms;
          ready_ = true;
          on_ready = on_ready_;
        }
      }
    }
    if (on_ready) on_ready();
  }
}

std::optional<absl::StatusOr<std::vector<core::Tensor>>> EncoderWorker::RunJob(const Job& job) {
  if (share_ != nullptr) share_->SetBusy(kernels::ComputeShare::kEncoder, true);
  absl::Cleanup idle = [this] {
    if (share_ != nullptr) share_->SetBusy(kernels::ComputeShare::kEncoder, false);
  };
  device_->Rebalance();
  if (absl::Status s = encoder_->BeginRgb(job.rgb, job.grids, job.normalization); !s.ok()) {
    return absl::StatusOr<std::vector<core::Tensor>>(s);
  }
  const double piece = device_->kind() == kernels::DeviceKind::kCpu
                           ? std::max(encoder_->remaining_flops() / kCpuPiecesPerJob, 1.0)
                           : std::numeric_limits<double>::infinity();
  while (!encoder_->done()) {
    if (!Held(job.id)) {
      encoder_->Abandon();
      return std::nullopt;
    }
    device_->Rebalance();  // the decoder's rows may have come or gone since the last piece
    if (absl::StatusOr<double> ran = encoder_->Advance(piece); !ran.ok()) {
      encoder_->Abandon();
      return absl::StatusOr<std::vector<core::Tensor>>(ran.status());
    }
  }
  absl::StatusOr<std::vector<core::Tensor>> out = encoder_->FinishImages();
  // Ops report their failures on the device (a GPU's launches and copies), not through Finish.
  if (absl::Status s = device_->status(); out.ok() && !s.ok()) {
    return absl::StatusOr<std::vector<core::Tensor>>(
        absl::Status(s.code(), absl::StrCat("encoder device: ", s.message())));
  }
  return out;
}

}  // namespace iris::engine
