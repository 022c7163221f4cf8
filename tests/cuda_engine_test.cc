// The engine on a GPU (label gpu): the 32-request mixed workload (text only, one and two images,
// repeated images, short and long prompts) submitted at once gives each request the greedy tokens
// it gives alone on the same GPU, with the default budgets and with a KV cache too small for all
// of them at once (preemption and recompute), with decode graphs off, and with the encoder on a
// stream of its own; and the CPU's tokens where the tiny model's f32 logits leave no near-tie.
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "tests/engine_cases.h"

namespace iris::engine {
namespace {

#ifdef IRIS_HAVE_CUDA

using namespace testing_engine;  // NOLINT: the shared workload and drivers

const kernels::DeviceOptions kGpu = [] {
  kernels::DeviceOptions d;
  d.name = "cuda";
  return d;
}();

class CudaEngineTest : public MixedWorkloadTest<kGpu> {};

TEST_F(CudaEngineTest, ConcurrentEqualsAlone) {
  EngineStats stats;
  RunConcurrent(*specs_, EngineOptions{}, *alone_, &stats, kGpu);
  EXPECT_EQ(stats.requests_finished, 32);
  EXPECT_EQ(stats.images_encoded, 4);  // 4 distinct images: the rest are encoder cache hits
  EXPECT_GT(stats.decode_graph_steps, 0) << "decode graphs are on by default on a GPU";
}

// Alone ran its decode steps from graphs (the default here); without them, the same tokens.
TEST_F(CudaEngineTest, ConcurrentWithoutDecodeGraphsEqualsAlone) {
  EngineOptions o;
  o.decode_graphs = false;
  EngineStats stats;
  RunConcurrent(*specs_, o, *alone_, &stats, kGpu);
  EXPECT_EQ(stats.requests_finished, 32);
  EXPECT_EQ(stats.decode_graph_steps, 0);
}

// The encoder on a stream of its own (a second CudaDevice on the same GPU, as iris-server's
// --encoder-stream default), its jobs issued by the encoder worker's thread while the engine
// thread steps the decodes: the same tokens as alone, every image encoded by the worker.
TEST_F(CudaEngineTest, ConcurrentWithTheEncoderOnItsOwnStreamEqualsAlone) {
  for (const EngineOptions& o : {EngineOptions{}, TooSmallCacheOptions()}) {
    EngineStats stats;
    RunConcurrent(*specs_, o, *alone_, &stats, kGpu, kGpu);
    ExpectEveryImageEncodedByTheWorker(stats);
  }
}

TEST_F(CudaEngineTest, ConcurrentWithPreemptionEqualsAlone) {
  EngineStats stats;
  RunConcurrent(*specs_, TooSmallCacheOptions(), *alone_, &stats, kGpu);
  EXPECT_EQ(stats.kv_blocks_total, kTooSmallCacheBlocks);
  EXPECT_GT(stats.preemptions, 0) << "the cache was meant to be too small";
  EXPECT_EQ(stats.requests_finished, 32);
}

// The same requests alone on the CPU: f32 on both devices, so the tokens agree unless two logits
// tie within f32 rounding; at most a few requests may part, and only after their first tokens.
TEST_F(CudaEngineTest, AloneMatchesTheCpu) {
  const std::vector<std::vector<int32_t>> cpu = RunAlone(*specs_);
  int parted = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] == (*alone_)[i]) continue;
    ++parted;
    ASSERT_FALSE(cpu[i].empty());
    EXPECT_EQ(cpu[i][0], (*alone_)[i][0]) << "request " << i << " parts at its first token";
  }
  EXPECT_LE(parted, 2) << "requests whose GPU tokens differ from the CPU's";
}

// Not fixtures of CudaEngineTest (gtest refuses TEST beside TEST_F in one suite: the first GPU run
// of these two failed so). Greedy requests with a repetition penalty, now picked on the GPU after their edits (the logits
// stay there): concurrent equals alone, and alone on the GPU matches the CPU as above.
TEST(CudaEngineSamplingTest, PenalizedGreedyPicksOnTheGpuMatchTheCpu) {
  std::vector<Spec> specs = MixedWorkload(8);
  for (size_t i = 0; i < specs.size(); ++i) specs[i].repetition_penalty = 1.5f + 0.5f * static_cast<float>(i % 3);
  const auto gpu_alone = RunAlone(specs, kGpu);
  EngineStats stats;
  RunConcurrent(specs, EngineOptions{}, gpu_alone, &stats, kGpu);
  const auto cpu = RunAlone(specs);
  int parted = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] == gpu_alone[i]) continue;
    ++parted;
    ASSERT_FALSE(cpu[i].empty());
    EXPECT_EQ(cpu[i][0], gpu_alone[i][0]) << "request " << i << " parts at its first token";
  }
  EXPECT_LE(parted, 1) << "requests whose GPU tokens differ from the CPU's";
}

// Sampled requests on the GPU: drawn on the device (the default there, kernels::SampleRows) and
// drawn by the host samplers from the logits copied back, one by one on the same GPU (the same
// logits bit for bit), pick the same tokens; and all at once, drawn on the device.
TEST(CudaEngineSamplingTest, SampledDrawsOnTheGpuEqualTheHostSamplers) {
  const std::vector<Spec> specs = SampledWorkload(12);
  EngineOptions host_draws;
  host_draws.sample_on_device = false;
  const auto host = RunAlone(specs, kGpu, host_draws);
  EXPECT_EQ(RunAlone(specs, kGpu), host);
  EngineStats stats;
  RunConcurrent(specs, EngineOptions{}, host, &stats, kGpu);
  EXPECT_EQ(stats.requests_finished, 12);
}

#else
TEST(CudaEngineTest, NeedsTheCudaBackend) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif

}  // namespace
}  // namespace iris::engine
