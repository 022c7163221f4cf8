// The encoder worker on the tiny model's vision tower, on a CPU device of its own: a job's
// embeddings are those of VisionEncoder::ForwardRgb on a second device alike, bit for bit where the
// matmuls are split-invariant (else to rounding), whether they are waited for or polled; one job is held at a time; an abandoned job's result is never
// given, the next one's is; errors come back as the job's result; the ready callback fires once
// per result; and the worker can go with a job in flight.
#include "engine/encoder_worker.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/linear.h"
#include "tests/test_util.h"

namespace iris::engine {
namespace {

using core::Tensor;
using vision::GridThw;

// One thread each, so that the two devices' results are bit-identical.
const kernels::DeviceOptions kOneThread = [] {
  kernels::DeviceOptions d;
  d.threads = 1;
  return d;
}();

struct Encoder {
  std::unique_ptr<kernels::Device> device;
  std::unique_ptr<vision::VisionEncoder> encoder;
};

Encoder LoadTinyEncoder() {
  Encoder e;
  const std::string dir = testing::ModelPath("tiny");
  auto config = core::LoadModelConfig(dir);
  auto ckpt = core::Checkpoint::Open(dir);
  auto device = kernels::CreateDevice(kOneThread);
  EXPECT_TRUE(config.ok() && ckpt.ok() && device.ok());
  if (!config.ok() || !ckpt.ok() || !device.ok()) return e;
  e.device = std::move(*device);
  vision::EncoderOptions options;
  options.compute = kernels::ComputeType::kF32;
  auto enc = vision::VisionEncoder::Load(*e.device, *ckpt, config->vision, options);
  EXPECT_TRUE(enc.ok()) << enc.status();
  if (enc.ok()) e.encoder = std::move(*enc);
  return e;
}

struct Job {
  Tensor rgb;  // the images' bytes, packed (VisionEncoder::ForwardRgb's input)
  std::vector<GridThw> grids;
};

// Random images for `grids` (the tiny tower's patches are 14 pixels a side).
Job MakeJob(std::vector<GridThw> grids, uint32_t seed) {
  int64_t bytes = 0;
  for (const GridThw& g : grids) bytes += g[0] * g[1] * 14 * g[2] * 14 * 3;
  Job job{Tensor::Empty(core::DType::kU8, {bytes}), std::move(grids)};
  const std::vector<float> v = testing::RandomFloats(bytes, seed);
  for (int64_t i = 0; i < bytes; ++i) job.rgb.data<uint8_t>()[i] = static_cast<uint8_t>(std::fabs(v[i]) * 97.f);
  return job;
}

// CLIP's normalization (the checkpoints' preprocessor_config).
const vision::PixelNormalization kNormalization{{0.48145466f, 0.4578275f, 0.40821073f},
                                                {0.26862954f, 0.26130258f, 0.27577711f}};

class EncoderWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    worker_side_ = LoadTinyEncoder();
    reference_ = LoadTinyEncoder();
    ASSERT_NE(worker_side_.encoder, nullptr);
    ASSERT_NE(reference_.encoder, nullptr);
    auto worker = EncoderWorker::Start(worker_side_.encoder.get(), worker_side_.device.get(), {});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = std::move(*worker);
  }

  // What ForwardRgb gives for `job` on the reference device.
  Tensor Expected(const Job& job) {
    auto out = reference_.encoder->ForwardRgb(job.rgb, job.grids, kNormalization);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : Tensor();
  }

  absl::Status Submit(const Job& job) { return worker_->Submit(job.rgb, job.grids, kNormalization); }

  // Bit for bit where the matmuls are split-invariant (the worker runs the forward in pieces);
  // to f32 rounding elsewhere.
  // `got`, one tensor per image (the worker's result), against the forward's whole output for
  // `job`: each image its merged tokens' rows (a quarter of its patches), in order.
  void ExpectBitEqual(const std::vector<Tensor>& got, const Job& job) {
    const Tensor want = Expected(job);
    ASSERT_EQ(got.size(), job.grids.size());
    int64_t row = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const Tensor& image = got[i];
      ASSERT_EQ(image.rank(), 2);
      ASSERT_EQ(image.dim(0), job.grids[i][0] * job.grids[i][1] * job.grids[i][2] / 4) << "image " << i;
      ASSERT_EQ(image.dim(1), want.dim(1));
      ASSERT_LE(row + image.dim(0), want.dim(0));
      EXPECT_TRUE(testing::SameUnderRowSplits(image.data<float>(), want.data<float>() + row * want.dim(1),
                                              image.numel(), kernels::MatmulRowsSplitInvariant(*reference_.device),
                                              1e-5))
          << "image at row " << row;
      row += image.dim(0);
    }
    EXPECT_EQ(row, want.dim(0));
  }

  Encoder worker_side_, reference_;
  std::unique_ptr<EncoderWorker> worker_;  // declared last: goes first
};

TEST_F(EncoderWorkerTest, WaitGivesTheEmbeddingsOfForward) {
  const Job job = MakeJob({{1, 8, 12}, {1, 4, 4}}, 1);
  ASSERT_TRUE(Submit(job).ok());
  EXPECT_TRUE(worker_->busy());
  EncoderWorker::Result r = worker_->Wait();
  ASSERT_TRUE(r.images.ok()) << r.images.status();
  EXPECT_GT(r.ms, 0);
  ExpectBitEqual(*r.images, job);
  EXPECT_FALSE(worker_->busy());
  EXPECT_EQ(worker_->jobs_finished(), 1);
  EXPECT_EQ(worker_->jobs_stopped(), 0);
}

TEST_F(EncoderWorkerTest, PollReturnsNothingUntilTheResultThenTheResultOnce) {
  const Job job = MakeJob({{1, 16, 16}}, 2);
  EXPECT_FALSE(worker_->Poll().has_value()) << "no job held";
  ASSERT_TRUE(Submit(job).ok());
  std::optional<EncoderWorker::Result> r;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!(r = worker_->Poll()).has_value() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(r.has_value()) << "no result within 60 s";
  ASSERT_TRUE(r->images.ok()) << r->images.status();
  ExpectBitEqual(*r->images, job);
  EXPECT_FALSE(worker_->Poll().has_value()) << "a result is given once";
  EXPECT_FALSE(worker_->busy());
}

TEST_F(EncoderWorkerTest, HoldsOneJobAtATime) {
  const Job job = MakeJob({{1, 4, 8}}, 3);
  ASSERT_TRUE(Submit(job).ok());
  const absl::Status second = Submit(job);
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
  ASSERT_TRUE(worker_->Wait().images.ok());
  ASSERT_TRUE(Submit(job).ok()) << "free again once the result is taken";
  ASSERT_TRUE(worker_->Wait().images.ok());
  EXPECT_EQ(worker_->jobs_finished(), 2);
  const EncoderWorker::Result none = worker_->Wait();
  EXPECT_EQ(none.images.status().code(), absl::StatusCode::kFailedPrecondition);
}

// A large job abandoned at once, then a small different one: the result given is the second's.
// The first either never started, or stopped after a piece, or (if it raced to its end) was
// dropped: never handed over.
TEST_F(EncoderWorkerTest, AnAbandonedJobsResultIsNeverGivenTheNextOnesIs) {
  const Job large = MakeJob({{1, 64, 64}, {1, 32, 48}}, 4);
  const Job small = MakeJob({{1, 8, 8}}, 5);
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(Submit(large).ok());
    if (round > 0) absl::SleepFor(absl::Milliseconds(2 * round));  // abandoned while it runs
    worker_->Abandon();
    EXPECT_FALSE(worker_->busy());
    ASSERT_TRUE(Submit(small).ok());
    EncoderWorker::Result r = worker_->Wait();
    ASSERT_TRUE(r.images.ok()) << r.images.status();
    ExpectBitEqual(*r.images, small);
  }
  // Every small job ran to its end; each large one that started was stopped or dropped.
  EXPECT_GE(worker_->jobs_finished(), 3);
  EXPECT_LE(worker_->jobs_finished() + worker_->jobs_stopped(), 6);
}

TEST_F(EncoderWorkerTest, AFailedForwardIsTheJobsResultAndTheWorkerGoesOn) {
  Job bad = MakeJob({{1, 4, 4}}, 6);
  bad.grids = {{1, 4, 8}};  // 32 patches named, the bytes of 16 given
  ASSERT_TRUE(Submit(bad).ok());
  EncoderWorker::Result r = worker_->Wait();
  ASSERT_FALSE(r.images.ok());
  EXPECT_EQ(r.images.status().code(), absl::StatusCode::kInvalidArgument) << r.images.status();
  const Job good = MakeJob({{1, 4, 4}}, 7);
  ASSERT_TRUE(Submit(good).ok());
  r = worker_->Wait();
  ASSERT_TRUE(r.images.ok()) << r.images.status();
  ExpectBitEqual(*r.images, good);
}

TEST_F(EncoderWorkerTest, TheReadyCallbackFiresOncePerResult) {
  std::atomic<int> calls{0};
  auto ready = std::make_shared<absl::Notification>();
  worker_->set_on_ready([&calls, ready] {
    if (calls.fetch_add(1) == 1) ready->Notify();  // the second result
  });
  const Job job = MakeJob({{1, 8, 8}}, 8);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Submit(job).ok());
    ASSERT_TRUE(worker_->Wait().images.ok());
  }
  ASSERT_TRUE(ready->WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(calls.load(), 2);
  worker_->set_on_ready({});
}

TEST_F(EncoderWorkerTest, GoesWithAJobInFlight) {
  const Job large = MakeJob({{1, 64, 64}}, 9);
  ASSERT_TRUE(Submit(large).ok());
  absl::SleepFor(absl::Milliseconds(1));
  worker_.reset();  // stops the job after its current piece and joins
  SUCCEED();
}

}  // namespace
}  // namespace iris::engine
