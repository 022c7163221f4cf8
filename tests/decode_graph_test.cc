// Decode graphs on the CPU, where no graph is recorded but the padded steps a graph would replay
// run directly: the sizes and the steps that qualify, the padding's layout, and a decoder whose
// decode steps run padded against one whose steps run as given (the tiny model, f32 and bf16).
#include "llm/decode_graph.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/model_config.h"
#include "core/safetensors.h"
#include "kernels/paged_attention.h"
#include "tests/decode_graph_cases.h"
#include "tests/test_util.h"

namespace iris::llm {
namespace {

TEST(DecodeGraphSizesTest, PowersOfTwoThenMultiplesOfEightUpToTheMaximum) {
  EXPECT_EQ(DecodeGraphBatchSizes(1), (std::vector<int>{1}));
  EXPECT_EQ(DecodeGraphBatchSizes(3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(DecodeGraphBatchSizes(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(DecodeGraphBatchSizes(20), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(DecodeGraphBatchSizes(32), (std::vector<int>{1, 2, 4, 8, 16, 24, 32}));
  EXPECT_EQ(DecodeGraphBatchSizes(256).size(), 35u);
  EXPECT_TRUE(DecodeGraphBatchSizes(0).empty());
}

TEST(DecodeGraphSizesTest, AStepTakesTheSmallestSizeThatHoldsIt) {
  const std::vector<int> sizes = {1, 2, 4, 8, 16};
  EXPECT_EQ(DecodeGraphSize(sizes, 1), 1);
  EXPECT_EQ(DecodeGraphSize(sizes, 3), 4);
  EXPECT_EQ(DecodeGraphSize(sizes, 8), 8);
  EXPECT_EQ(DecodeGraphSize(sizes, 9), 16);
  EXPECT_EQ(DecodeGraphSize(sizes, 17), 0);
}

// Two decoding sequences with 2 and 3 blocks of 4 tokens.
DecoderBatch TwoDecodes() {
  DecoderBatch b;
  b.Clear(3);
  BlockTable t0{{5, 2}, 6}, t1{{7, 1, 9}, 11};
  EXPECT_TRUE(b.AddSequence(t0, 4, 1, true).ok());
  EXPECT_TRUE(b.AddSequence(t1, 4, 1, true).ok());
  b.token_ids = {11, 12};
  for (auto& axis : b.positions) axis = {5, 10};
  return b;
}

TEST(DecodeGraphBatchTest, OnlyDecodeStepsThatFitTheTablesQualify) {
  EXPECT_TRUE(IsGraphableDecode(TwoDecodes(), 3));
  EXPECT_FALSE(IsGraphableDecode(TwoDecodes(), 2)) << "a sequence with more blocks than the graphs' tables";
  DecoderBatch empty;
  empty.Clear(3);
  EXPECT_FALSE(IsGraphableDecode(empty, 3));

  DecoderBatch prefill;
  prefill.Clear(3);
  BlockTable t{{5, 2}, 6};
  ASSERT_TRUE(prefill.AddSequence(t, 4, 2, true).ok());
  EXPECT_FALSE(IsGraphableDecode(prefill, 3)) << "two rows of one sequence";

  DecoderBatch no_logits;
  no_logits.Clear(3);
  ASSERT_TRUE(no_logits.AddSequence(t, 4, 1, false).ok());
  EXPECT_FALSE(IsGraphableDecode(no_logits, 3)) << "a row without logits";

  DecoderBatch image = TwoDecodes();
  image.embed_rows = {1};
  EXPECT_FALSE(IsGraphableDecode(image, 3)) << "a given embedding";
}

TEST(DecodeGraphBatchTest, PaddingSequencesWriteNowhereAndReadBlockZero) {
  const DecoderBatch b = TwoDecodes();
  DecoderBatch p;
  p.token_ids = {99};  // what was there is replaced
  PadDecodeBatch(b, 4, 5, &p);
  EXPECT_EQ(p.num_seqs(), 4);
  EXPECT_EQ(p.num_rows(), 4);
  EXPECT_EQ(p.token_ids, (std::vector<int32_t>{11, 12, 0, 0}));
  for (const auto& axis : p.positions) EXPECT_EQ(axis, (std::vector<int64_t>{5, 10, 0, 0}));
  EXPECT_EQ(p.slot_mapping, (std::vector<int64_t>{2 * 4 + 1, 9 * 4 + 2, kernels::kPadSlot, kernels::kPadSlot}));
  EXPECT_EQ(p.query_start, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(p.context_lens, (std::vector<int32_t>{6, 11, 1, 1}));
  EXPECT_EQ(p.max_blocks_per_seq, 5);
  EXPECT_EQ(p.block_tables, (std::vector<int32_t>{5, 2, 0, 0, 0, 7, 1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(p.logit_rows, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_FALSE(p.picks_only);
  DecoderBatch greedy = b;
  greedy.picks_only = true;
  PadDecodeBatch(greedy, 2, 3, &p);
  EXPECT_TRUE(p.picks_only);
  EXPECT_EQ(p.block_tables, b.block_tables);
}

std::unique_ptr<Decoder> LoadTiny(kernels::ComputeType compute) {
  absl::StatusOr<core::ModelConfig> config = core::LoadModelConfig(testing::ModelPath("tiny"));
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<core::Checkpoint> ckpt = core::Checkpoint::Open(testing::ModelPath("tiny"));
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  if (!config.ok() || !ckpt.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<Decoder>> dec =
      Decoder::Load(kernels::DefaultCpuDevice(), *ckpt, config->text, DecoderOptions{compute});
  EXPECT_TRUE(dec.ok()) << dec.status();
  return dec.ok() ? std::move(*dec) : nullptr;
}

TEST(DecodeGraphDecoderTest, RefusesWhatItCannotServe) {
  std::unique_ptr<Decoder> dec = LoadTiny(kernels::ComputeType::kF32);
  ASSERT_NE(dec, nullptr);
  EXPECT_EQ(dec->EnableDecodeGraphs(testing::WorkloadGraphOptions(/*capture=*/true)).code(),
            absl::StatusCode::kUnimplemented)
      << "the CPU records no graphs";
  DecodeGraphOptions o = testing::WorkloadGraphOptions(false);
  o.batch_sizes = {1, 4, 2};
  EXPECT_EQ(dec->EnableDecodeGraphs(o).code(), absl::StatusCode::kInvalidArgument);
  o.batch_sizes = {1, 1000};
  const absl::Status too_big = dec->EnableDecodeGraphs(o);
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.message().find("max_logit_rows"), std::string::npos) << too_big;
  o.batch_sizes = {1, 2};
  o.max_blocks_per_seq = 0;
  EXPECT_EQ(dec->EnableDecodeGraphs(o).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dec->decode_graph_steps(), 0);
  // The default sizes fit a step's rows where those are fewer than its logit rows.
  ASSERT_TRUE(dec->ReserveActivations(/*max_tokens=*/5, /*max_logit_rows=*/64).ok());
  o.batch_sizes.clear();
  o.max_blocks_per_seq = 4;
  EXPECT_TRUE(dec->EnableDecodeGraphs(o).ok());
}

class DecodeGraphWorkloadTest : public ::testing::TestWithParam<kernels::ComputeType> {};

// Padding a decode step to a graph size changes nothing for its real sequences: their logits and
// picks are those of the step as given, and the cache holds the same entries (padding rows wrote
// none). Steps with a sequence wider than the graphs' tables ran as given.
TEST_P(DecodeGraphWorkloadTest, PaddedStepsEqualStepsAsGiven) {
  const bool bf16 = GetParam() == kernels::ComputeType::kBF16;
  std::unique_ptr<Decoder> plain = LoadTiny(GetParam()), padded = LoadTiny(GetParam());
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(padded, nullptr);
  ASSERT_TRUE(padded->EnableDecodeGraphs(testing::WorkloadGraphOptions(/*capture=*/false)).ok());
  kernels::Device& cpu = kernels::DefaultCpuDevice();
  const core::DType kv = bf16 ? core::DType::kBF16 : core::DType::kF32;
  const testing::DecodeRun want = testing::RunDecodeWorkload(*plain, cpu, kv);
  const testing::DecodeRun got = testing::RunDecodeWorkload(*padded, cpu, kv);
  EXPECT_EQ(plain->decode_graph_steps(), 0);
  EXPECT_EQ(padded->decode_graph_steps(), testing::kWorkloadGraphSteps);
  EXPECT_EQ(padded->decode_graphs(), 0) << "nothing is recorded on the CPU";
  testing::ExpectSameRun(got, want, bf16 ? 1e-3f : 1e-5f, bf16 ? "bf16" : "f32");
}

INSTANTIATE_TEST_SUITE_P(Compute, DecodeGraphWorkloadTest,
                         ::testing::Values(kernels::ComputeType::kF32, kernels::ComputeType::kBF16),
                         [](const auto& info) { return info.param == kernels::ComputeType::kF32 ? "f32" : "bf16"; });

}  // namespace
}  // namespace iris::llm
