// engine::StepBudget: the decoder's cost line learned from steps, and the slices it hands out.
#include "engine/step_budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace iris::engine {
namespace {

// A decoder whose forward costs fixed + token·tokens + logit·logit_rows ms, plus noise.
struct FakeDecoder {
  double fixed, token, logit;
  double Ms(int64_t tokens, int64_t logit_rows) const { return fixed + token * tokens + logit * logit_rows; }
};

TEST(StepBudgetTest, LearnsPrefillRowsApartFromDecodeRows) {
  const FakeDecoder dec{20, 0.5, 2.0};
  StepBudget budget(StepBudgetOptions{});
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> decode(1, 4), prefill(0, 96);
  for (int i = 0; i < 60; ++i) {
    const int d = decode(rng), p = prefill(rng);
    std::normal_distribution<double> noise(0, 0.2);
    budget.ObserveDecoder(d + p, d, dec.Ms(d + p, d) + noise(rng));
  }
  const DecoderCost c = budget.decoder_cost();
  EXPECT_NEAR(c.fixed_ms, 20, 0.5);
  EXPECT_NEAR(c.token_ms, 0.5, 0.02);
  EXPECT_NEAR(c.logit_row_ms, 2.0, 0.1);

  // Two decode rows: a 25 ms decode step, auto target 50 ms; with only prefill pending all 25 ms
  // spare goes to prefill rows at 0.5 ms each.
  const StepSlices s = budget.Next(2, /*prefill_pending=*/true, /*encoder_pending=*/false);
  EXPECT_NEAR(s.target_ms, 50, 1.0);
  EXPECT_NEAR(static_cast<double>(s.prefill_tokens), 50, 3);
  EXPECT_EQ(s.encoder_flops, 0);  // the encoder's rate is not measured yet
}

TEST(StepBudgetTest, DecodeOnlyStepsCostPrefillRowsLikeDecodeRows) {
  // Every row samples: tokens and logit rows cannot be told apart, so a prefill row is costed
  // like a decode row (the upper bound), as a single line in rows.
  StepBudget budget(StepBudgetOptions{});
  for (int i = 0; i < 40; ++i) {
    const int d = 1 + i % 4;
    budget.ObserveDecoder(d, d, 20 + 2.5 * d);
  }
  const DecoderCost c = budget.decoder_cost();
  EXPECT_NEAR(c.fixed_ms, 20, 1e-6);
  EXPECT_NEAR(c.decode_row_ms(), 2.5, 1e-6);
  EXPECT_NEAR(c.token_ms, 2.5, 1e-6);
  const StepSlices s = budget.Next(2, true, false);  // decode 25 ms, target 50, 25 ms spare
  EXPECT_EQ(s.prefill_tokens, 32);                   // 10 rows fit: the minimum slice
}

TEST(StepBudgetTest, NothingDecodingOrNothingMeasuredIsUnbounded) {
  StepBudget budget(StepBudgetOptions{});
  StepSlices s = budget.Next(3, true, true);  // nothing measured
  EXPECT_EQ(s.target_ms, 0);
  EXPECT_EQ(s.prefill_tokens, INT64_MAX);
  EXPECT_TRUE(std::isinf(s.encoder_flops));
  budget.ObserveDecoder(4, 4, 30);
  s = budget.Next(0, true, true);  // nobody to delay
  EXPECT_EQ(s.target_ms, 0);
  EXPECT_TRUE(std::isinf(s.encoder_flops));
}

TEST(StepBudgetTest, SplitsTheSpareBetweenEncoderAndPrefillWithAFixedTarget) {
  StepBudget budget(StepBudgetOptions{.step_budget_ms = 100});
  for (int i = 0; i < 30; ++i) {
    const int d = 1 + i % 3, p = 16 * (i % 5);
    budget.ObserveDecoder(d + p, d, 10 + 1.0 * (d + p) + 3.0 * d);
  }
  budget.ObserveEncoder(1e9, 5.0);  // 5 ms per GFLOP
  // One decode row: 14 ms; 86 ms spare, 43 to each side.
  const StepSlices s = budget.Next(1, true, true);
  EXPECT_DOUBLE_EQ(s.target_ms, 100);
  EXPECT_NEAR(static_cast<double>(s.prefill_tokens), 43, 1);
  EXPECT_NEAR(s.encoder_flops, 43.0 / 5.0 * 1e9, 0.2e9);
  // Only the encoder pending: all of it.
  EXPECT_NEAR(budget.Next(1, false, true).encoder_flops, 86.0 / 5.0 * 1e9, 0.3e9);
}

TEST(StepBudgetTest, ATightTargetStillGivesEachSideItsMinimum) {
  StepBudget budget(StepBudgetOptions{.step_budget_ms = 1e-3});
  budget.ObserveDecoder(2, 2, 30);
  budget.ObserveDecoder(3, 3, 40);
  const StepSlices s = budget.Next(2, true, true);
  EXPECT_EQ(s.prefill_tokens, 32);
  EXPECT_EQ(s.encoder_flops, 0);  // one piece: Advance always runs at least one
}

}  // namespace
}  // namespace iris::engine
