// The decoder and the encoder's worker on shared CPU cores (kernels/compute_share.h): the split
// while both are busy and the whole while one is idle, a CPU device's team following it at each
// Rebalance (its own kernels and oneDNN's, through the thread's OpenMP setting), the refusal of a
// share of another size, and a Linear giving the same result whatever team the share left it.
#include "kernels/compute_share.h"

#include <omp.h>

#include <memory>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/linear.h"
#include "tests/test_util.h"

namespace iris::kernels {
namespace {

using cpu::CpuDevice;
using cpu::CpuIsa;

TEST(ComputeShareTest, SplitsWhileBothAreBusyAndGivesEverythingToTheOneThatIs) {
  struct Case {
    int cores;
    int decoder_split, encoder_split;
  };
  for (const Case& c : {Case{1, 1, 1}, Case{2, 1, 1}, Case{3, 1, 2}, Case{8, 4, 4}, Case{9, 4, 5}}) {
    SCOPED_TRACE(c.cores);
    ComputeShare share(c.cores);
    EXPECT_EQ(share.ThreadsFor(ComputeShare::kDecoder), c.cores);  // neither busy
    EXPECT_EQ(share.ThreadsFor(ComputeShare::kEncoder), c.cores);
    share.SetBusy(ComputeShare::kDecoder, true);
    EXPECT_EQ(share.ThreadsFor(ComputeShare::kDecoder), c.cores) << "the encoder is idle";
    EXPECT_EQ(share.ThreadsFor(ComputeShare::kEncoder), c.encoder_split);
    share.SetBusy(ComputeShare::kEncoder, true);
    EXPECT_EQ(share.ThreadsFor(ComputeShare::kDecoder), c.decoder_split);
    EXPECT_EQ(share.ThreadsFor(ComputeShare::kEncoder), c.encoder_split);
    EXPECT_LE(c.decoder_split + c.encoder_split, std::max(c.cores, 2)) << "the split oversubscribes";
    share.SetBusy(ComputeShare::kDecoder, false);
    EXPECT_EQ(share.ThreadsFor(ComputeShare::kEncoder), c.cores) << "the decoder is idle";
    EXPECT_EQ(share.ThreadsFor(ComputeShare::kDecoder), c.decoder_split);
  }
}

TEST(ComputeShareTest, CpuDeviceTeamFollowsTheShareAtEachRebalance) {
  CpuDevice decoder(4, CpuIsa::kAvx2), encoder(4, CpuIsa::kAvx2);
  auto share = std::make_shared<ComputeShare>(4);
  ASSERT_TRUE(decoder.ShareCompute(share, ComputeShare::kDecoder).ok());
  ASSERT_TRUE(encoder.ShareCompute(share, ComputeShare::kEncoder).ok());
  // Each device on a thread of its own, as the engine thread and the encoder worker.
  std::thread([&] {
    decoder.AttachThread();
    EXPECT_EQ(decoder.threads(), 4);
    share->SetBusy(ComputeShare::kEncoder, true);
    EXPECT_EQ(decoder.threads(), 4) << "changed between ops, not under one";
    decoder.Rebalance();
    EXPECT_EQ(decoder.threads(), 2);
    EXPECT_EQ(decoder.max_threads(), 4);
    EXPECT_EQ(omp_get_max_threads(), 2) << "oneDNN's regions follow the thread's OpenMP setting";
    share->SetBusy(ComputeShare::kEncoder, false);
    decoder.Rebalance();
    EXPECT_EQ(decoder.threads(), 4);
    EXPECT_EQ(omp_get_max_threads(), 4);
  }).join();
  std::thread([&] {
    encoder.AttachThread();
    share->SetBusy(ComputeShare::kDecoder, true);
    encoder.Rebalance();
    EXPECT_EQ(encoder.threads(), 2);
    EXPECT_EQ(omp_get_max_threads(), 2);
  }).join();
  EXPECT_EQ(decoder.threads(), 4) << "the other device's Rebalance does not touch this one";
}

TEST(ComputeShareTest, RefusesAShareOfAnotherSize) {
  CpuDevice device(2, CpuIsa::kAvx2);
  const absl::Status s = device.ShareCompute(std::make_shared<ComputeShare>(3), ComputeShare::kEncoder);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("2 threads"), std::string::npos) << s;
  EXPECT_EQ(device.ShareCompute(nullptr, ComputeShare::kEncoder).code(), absl::StatusCode::kInvalidArgument);
  device.Rebalance();  // no share: nothing changes
  EXPECT_EQ(device.threads(), 2);
}

// A Linear created and run under one team size and then another (its oneDNN primitives are made
// per team size) computes the same products: within f32 summation order of each other.
TEST(ComputeShareTest, LinearAgreesWhateverTeamTheShareLeavesIt) {
  CpuDevice device(2, CpuIsa::kAvx2);
  auto share = std::make_shared<ComputeShare>(2);
  ASSERT_TRUE(device.ShareCompute(share, ComputeShare::kDecoder).ok());
  const int64_t m = 200, k = 96, n = 72;  // rows past the few-row kernels
  core::Tensor w = core::Tensor::Empty(core::DType::kF32, {n, k});
  const std::vector<float> wv = testing::RandomFloats(n * k, 11);
  std::copy(wv.begin(), wv.end(), w.data<float>());
  const std::vector<float> x = testing::RandomFloats(m * k, 12);
  for (ComputeType compute : {ComputeType::kF32, ComputeType::kBF16}) {
    SCOPED_TRACE(compute == ComputeType::kF32 ? "f32" : "bf16");
    std::vector<float> y[2];
    std::thread([&] {
      device.AttachThread();
      auto lin = Linear::Create(device, w, nullptr, compute);
      ASSERT_TRUE(lin.ok()) << lin.status();
      for (int i = 0; i < 2; ++i) {
        share->SetBusy(ComputeShare::kEncoder, i == 1);
        device.Rebalance();
        ASSERT_EQ(device.threads(), 2 - i);
        y[i].assign(m * n, 0.f);
        (*lin)->Forward(x.data(), m, y[i].data());
      }
    }).join();
    EXPECT_LT(testing::RelativeL2(y[1].data(), y[0].data(), m * n), 1e-6);
  }
}

}  // namespace
}  // namespace iris::kernels
