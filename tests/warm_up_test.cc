// The engine's start-up warm-up (engine/warm_up.h) on the tiny model on the CPU (where the engine
// leaves it off by default): it runs its decoder step and encoder forward, leaves every KV block
// free and nothing in the prefix cache, and a step and an encoder forward after it give exactly
// what they gave before it.
#include "engine/warm_up.h"

#include <memory>
#include <vector>

#include "engine/model.h"
#include "gtest/gtest.h"
#include "llm/decoder.h"
#include "llm/kv_cache.h"
#include "tests/test_util.h"
#include "vision/encoder_plan.h"
#include "vision/vision_encoder.h"

namespace iris::engine {
namespace {

// One decoder step of a 20-token text prompt on a fresh table: its last row's logits.
std::vector<float> PromptLogits(llm::Decoder& decoder, llm::KvCache& cache) {
  llm::BlockTable table;
  EXPECT_TRUE(cache.Reserve(&table, 20).ok());
  llm::DecoderBatch batch;
  batch.Clear(static_cast<int>(table.blocks.size()));
  EXPECT_TRUE(batch.AddSequence(table, cache.shape().block_size, 20, true).ok());
  for (int i = 0; i < 20; ++i) {
    batch.token_ids.push_back(100 + 37 * i);
    for (auto& axis : batch.positions) axis.push_back(i);
  }
  auto logits = decoder.Forward(batch, &cache);
  EXPECT_TRUE(logits.ok()) << logits.status();
  std::vector<float> out(logits->data<float>(), logits->data<float>() + logits->numel());
  cache.Release(&table);
  return out;
}

std::vector<float> EncoderRows(vision::VisionEncoder& encoder, const core::VisionConfig& config) {
  const vision::GridThw grid = {1, 8, 12};
  const int64_t patch_dim = int64_t{config.in_channels} * config.temporal_patch_size * config.patch_size * config.patch_size;
  const std::vector<float> values = testing::RandomNormal(96 * patch_dim, 7);
  core::Tensor pixels = core::Tensor::Zeros(core::DType::kF32, {96, patch_dim});
  std::copy(values.begin(), values.end(), pixels.data<float>());
  auto out = encoder.Forward(pixels, std::span<const vision::GridThw>(&grid, 1));
  EXPECT_TRUE(out.ok()) << out.status();
  return std::vector<float>(out->data<float>(), out->data<float>() + out->numel());
}

TEST(WarmUpTest, RunsAndLeavesNoTrace) {
  auto model = LoadModel(testing::ModelPath("tiny"), ModelOptions{kernels::ComputeType::kF32, {}, {}, {}});
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  ASSERT_TRUE(m.decoder->ReserveActivations(256, 4).ok());
  ASSERT_TRUE(m.encoder->ReserveActivations(1024).ok());
  auto cache = llm::KvCache::Create(m.decoder->CacheShape(40, 16), *m.device);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::vector<float> logits_before = PromptLogits(*m.decoder, *cache);
  const std::vector<float> rows_before = EncoderRows(*m.encoder, m.config.vision);

  // The reserved step (256 rows, within the cache's 640) and the encoder's whole reservation.
  ASSERT_TRUE(WarmUp(m, *cache).ok());
  EXPECT_EQ(cache->allocator().num_free(), 40);
  EXPECT_EQ(cache->allocator().num_cached(), 0);
  EXPECT_EQ(PromptLogits(*m.decoder, *cache), logits_before);
  EXPECT_EQ(EncoderRows(*m.encoder, m.config.vision), rows_before);

  // A cache smaller than the step budget: the step shrinks to what it holds.
  auto small = llm::KvCache::Create(m.decoder->CacheShape(3, 16), *m.device);
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(WarmUp(m, *small).ok());
  EXPECT_EQ(small->allocator().num_free(), 3);
}

}  // namespace
}  // namespace iris::engine
