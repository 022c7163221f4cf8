// Sampler (greedy, HF repetition penalty, temperature, top-k, top-p, seeds) against hand-computed
// cases and empirical frequencies, SamplingParams::Validate messages, and the StopChecker's
// stop ids / stop strings / max_tokens rules.
#include "llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/logit_edits.h"
#include "kernels/logit_scan.h"
#include "kernels/rows.h"
#include "kernels/sample_rows.h"
#include "tests/draw_cases.h"
#include "tests/test_util.h"

namespace iris::llm {
namespace {

using ::testing::HasSubstr;

SamplingParams Sampled(float temperature, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

// Draws `n` tokens with a fresh copy of `logits` each time (Sample modifies them in place).
std::vector<int32_t> Draw(Sampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<int32_t> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    std::vector<float> copy = logits;
    out.push_back(sampler.Sample(copy.data(), static_cast<int64_t>(copy.size())));
  }
  return out;
}

std::vector<double> Frequencies(const std::vector<int32_t>& draws, size_t vocab) {
  std::vector<double> f(vocab, 0.0);
  for (int32_t t : draws) {
    EXPECT_GE(t, 0);
    EXPECT_LT(static_cast<size_t>(t), vocab);
    if (t >= 0 && static_cast<size_t>(t) < vocab) f[t] += 1.0;
  }
  for (double& x : f) x /= static_cast<double>(draws.size());
  return f;
}

std::vector<double> Softmax(const std::vector<double>& x) {
  const double m = *std::max_element(x.begin(), x.end());
  std::vector<double> p(x.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += p[i] = std::exp(x[i] - m);
  for (double& v : p) v /= s;
  return p;
}

// ---- greedy ----

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(SamplingParams{}, {});
  std::vector<float> logits = {1.f, 3.f, 3.f, 2.f, -5.f};
  EXPECT_EQ(s.Sample(logits.data(), 5), 1);
  std::vector<float> last = {0.f, 0.f, 0.f, 7.f};
  EXPECT_EQ(s.Sample(last.data(), 4), 3);
  std::vector<float> all_equal(10, -2.f);
  EXPECT_EQ(s.Sample(all_equal.data(), 10), 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> with_nan = {nan, -1.f, 4.f, nan};
  EXPECT_EQ(s.Sample(with_nan.data(), 4), 2);
}

TEST(SamplerTest, TopKOneIsGreedyAtAnyTemperature) {
  SamplingParams p = Sampled(1.5f, 7);
  p.top_k = 1;
  EXPECT_TRUE(p.greedy());
  Sampler s(p, {});
  std::vector<float> logits = {0.f, 2.f, 2.f, 1.9f};
  for (int32_t t : Draw(s, logits, 200)) ASSERT_EQ(t, 1);
}

// ---- repetition penalty (HF: score < 0 ? score * p : score / p, for prompt + generated ids) ----

TEST(SamplerTest, RepetitionPenaltyDividesPositiveScores) {
  SamplingParams p;
  p.repetition_penalty = 1.2f;
  const std::vector<int32_t> prompt = {0, 0, 3};
  Sampler s(p, prompt);
  // 2.0 / 1.2 = 1.667 < 1.9: the decision flips from 0 to 1.
  std::vector<float> logits = {2.0f, 1.9f, 1.0f, 0.5f};
  EXPECT_EQ(s.Sample(logits.data(), 4), 1);
  EXPECT_EQ(logits[0], 2.0f / 1.2f);  // applied once although 0 occurs twice
  EXPECT_EQ(logits[1], 1.9f);
  EXPECT_EQ(logits[3], 0.5f / 1.2f);
}

TEST(SamplerTest, RepetitionPenaltyMultipliesNegativeScores) {
  SamplingParams p;
  p.repetition_penalty = 1.2f;
  Sampler s(p, std::vector<int32_t>{0});
  // -1.0 * 1.2 = -1.2 < -1.1 -> 1 wins. (Dividing would give -0.83 and keep 0.)
  std::vector<float> logits = {-1.0f, -1.1f, -3.0f};
  EXPECT_EQ(s.Sample(logits.data(), 3), 1);
  EXPECT_EQ(logits[0], -1.0f * 1.2f);
}

TEST(SamplerTest, RepetitionPenaltyBelowOneFavoursSeenTokens) {
  SamplingParams p;
  p.repetition_penalty = 0.5f;
  Sampler s(p, std::vector<int32_t>{0, 2});
  std::vector<float> logits = {1.0f, 1.5f, -1.0f};  // 1.0 / 0.5 = 2.0 > 1.5
  EXPECT_EQ(s.Sample(logits.data(), 3), 0);
  EXPECT_EQ(logits[2], -0.5f);
}

TEST(SamplerTest, RepetitionPenaltyCoversGeneratedTokens) {
  SamplingParams p;
  p.repetition_penalty = 1.2f;
  Sampler s(p, std::vector<int32_t>{100000});  // an id outside the vocab is ignored
  const std::vector<float> logits = {2.0f, 1.9f, 1.0f};
  // 1st: nothing seen -> 0. 2nd: 0 -> 1.667 < 1.9 -> 1. 3rd: 0 -> 1.667, 1 -> 1.583 -> 0.
  EXPECT_EQ(Draw(s, logits, 3), (std::vector<int32_t>{0, 1, 0}));
}

TEST(SamplerTest, RepetitionPenaltyOffLeavesLogits) {
  Sampler s(SamplingParams{}, std::vector<int32_t>{0, 1});
  std::vector<float> logits = {2.0f, -1.0f};
  EXPECT_EQ(s.Sample(logits.data(), 2), 0);
  EXPECT_EQ(logits, (std::vector<float>{2.0f, -1.0f}));
}

// ---- seeds ----

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  const std::vector<float> flat(1000, 0.f);
  Sampler a(Sampled(1.f, 1234), {}), b(Sampled(1.f, 1234), {}), c(Sampled(1.f, 1235), {});
  const auto ta = Draw(a, flat, 50), tb = Draw(b, flat, 50), tc = Draw(c, flat, 50);
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  // Not a constant sequence either.
  EXPECT_GT(std::set<int32_t>(ta.begin(), ta.end()).size(), 30u);
}

TEST(SamplerTest, SeededDrawsArePortable) {
  // mt19937_64 and the (rng() >> 11) * 2^-53 formula are fully specified: with seed 5489 (the
  // standard's default) the first u is 14514284786278117030 >> 11 * 2^-53 = 0.78682..., which on a
  // flat 1000-token distribution is token 786. Pins the draw so a library change cannot alter it.
  std::mt19937_64 ref(5489);
  ASSERT_EQ(ref(), 14514284786278117030ull);
  Sampler s(Sampled(1.f, 5489), {});
  std::vector<float> flat(1000, 0.f);
  EXPECT_EQ(s.Sample(flat.data(), 1000), 786);
}

TEST(SamplerTest, UnseededSamplersDiffer) {
  const std::vector<float> flat(1000, 0.f);
  SamplingParams p;
  p.temperature = 1.f;
  Sampler a(p, {}), b(p, {});
  EXPECT_NE(Draw(a, flat, 50), Draw(b, flat, 50));
}

// ---- distributions ----

TEST(SamplerTest, EmpiricalDistributionMatchesSoftmax) {
  const std::vector<double> x = {1.0, 0.0, -1.0, 2.0, 0.5, -3.0};
  const std::vector<float> logits(x.begin(), x.end());
  const auto want = Softmax(x);
  Sampler s(Sampled(1.f, 99), {});
  const int n = 20000;
  const auto f = Frequencies(Draw(s, logits, n), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double sigma = std::sqrt(want[i] * (1 - want[i]) / n);
    EXPECT_NEAR(f[i], want[i], 5 * sigma + 1e-4) << "token " << i;
  }
}

TEST(SamplerTest, TemperatureScalesLogits) {
  const std::vector<float> logits = {1.f, 0.f};
  const int n = 20000;
  for (const float t : {0.5f, 1.f, 2.f}) {
    Sampler s(Sampled(t, 5), {});
    std::vector<float> once = logits;
    s.Sample(once.data(), 2);
    EXPECT_FLOAT_EQ(once[0], 1.f / t);  // divided in place
    const auto f = Frequencies(Draw(s, logits, n), 2);
    const double want = 1.0 / (1.0 + std::exp(-1.0 / t));  // 0.881, 0.731, 0.622
    EXPECT_NEAR(f[0], want, 0.015) << "temperature " << t;
  }
}

TEST(SamplerTest, TopKNeverLeavesTheTopK) {
  SamplingParams p = Sampled(1.f, 3);
  p.top_k = 2;
  Sampler s(p, {});
  const std::vector<float> logits = {0.1f, 0.5f, 0.4f, 0.3f, 0.45f, -1.f};  // top 2: ids 1, 4
  const auto f = Frequencies(Draw(s, logits, 5000), logits.size());
  EXPECT_EQ(f[0] + f[2] + f[3] + f[5], 0.0);
  // Renormalized over the two kept: e^0.5 / (e^0.5 + e^0.45) = 0.5125.
  EXPECT_NEAR(f[1], 1.0 / (1.0 + std::exp(-0.05)), 0.03);
}

TEST(SamplerTest, TopKKeepsTiesWithTheKthValue) {
  // HF/vLLM mask only values below the k-th largest: with k = 2 and a tie for second place,
  // all three tied-or-better tokens stay.
  SamplingParams p = Sampled(1.f, 4);
  p.top_k = 2;
  Sampler s(p, {});
  const auto f = Frequencies(Draw(s, {1.f, 0.f, 0.f, -0.5f}, 4000), 4);
  EXPECT_GT(f[1], 0.1);
  EXPECT_GT(f[2], 0.1);
  EXPECT_EQ(f[3], 0.0);
}

std::vector<float> LogProbs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double v : p) out.push_back(static_cast<float>(std::log(v)));
  return out;
}

TEST(SamplerTest, TopPKeepsExactlyTheNucleus) {
  // Shuffled so the sort matters: probabilities 0.15, 0.5, 0.05, 0.3.
  const auto logits = LogProbs({0.15, 0.5, 0.05, 0.3});
  const int n = 10000;
  {
    SamplingParams p = Sampled(1.f, 11);
    p.top_p = 0.8f;  // 0.5 + 0.3 reaches 0.8: ids 1 and 3 only
    Sampler s(p, {});
    const auto f = Frequencies(Draw(s, logits, n), 4);
    EXPECT_EQ(f[0], 0.0);
    EXPECT_EQ(f[2], 0.0);
    EXPECT_NEAR(f[1], 0.5 / 0.8, 0.02);
    EXPECT_NEAR(f[3], 0.3 / 0.8, 0.02);
  }
  {
    SamplingParams p = Sampled(1.f, 12);
    p.top_p = 0.81f;  // needs the third: 0.95
    Sampler s(p, {});
    const auto f = Frequencies(Draw(s, logits, n), 4);
    EXPECT_EQ(f[2], 0.0);
    EXPECT_NEAR(f[0], 0.15 / 0.95, 0.015);
    EXPECT_NEAR(f[1], 0.5 / 0.95, 0.02);
    EXPECT_NEAR(f[3], 0.3 / 0.95, 0.02);
  }
  {
    SamplingParams p = Sampled(1.f, 13);
    p.top_p = 0.01f;  // at least one token: the most likely
    Sampler s(p, {});
    for (int32_t t : Draw(s, logits, 500)) ASSERT_EQ(t, 1);
  }
}

TEST(SamplerTest, TopPAppliesAfterTopK) {
  // Top-k 3 keeps 0.5, 0.3, 0.15, renormalized to 0.526, 0.316, 0.158. Top-p 0.82 on those
  // needs two (0.842); on the raw probabilities it would need three (0.8 < 0.82).
  const auto logits = LogProbs({0.15, 0.5, 0.05, 0.3});
  SamplingParams p = Sampled(1.f, 21);
  p.top_k = 3;
  p.top_p = 0.82f;
  Sampler s(p, {});
  auto f = Frequencies(Draw(s, logits, 5000), 4);
  EXPECT_EQ(f[0] + f[2], 0.0);
  EXPECT_GT(f[3], 0.3);
  p.top_p = 0.85f;  // now all three top-k survivors, never the fourth
  Sampler s2(p, {});
  f = Frequencies(Draw(s2, logits, 5000), 4);
  EXPECT_GT(f[0], 0.1);
  EXPECT_EQ(f[2], 0.0);
}

// Full-size vocabulary: every draw must lie in the nucleus computed the slow way (full sort).
TEST(SamplerTest, LargeVocabDrawsStayInReferenceSet) {
  const int64_t vocab = 151936;
  auto base = testing::RandomFloats(vocab, 77, -8.f, 8.f);
  base[5] = 14.f;  // a few dominant tokens, as in real logits
  base[77777] = 13.5f;
  base[151935] = 13.f;
  for (int64_t i = 1000; i < 1100; ++i) base[i] = 9.f;  // ties that straddle some boundaries
  struct Case { int top_k; float top_p; float temperature; };
  for (const Case c : {Case{50, 1.f, 1.f}, Case{0, 0.9f, 1.f}, Case{0, 0.95f, 2.f}, Case{40, 0.7f, 0.8f},
                       Case{0, 0.999f, 1.f}, Case{0, 0.5f, 1.f}, Case{60, 1.f, 1.f}, Case{0, 0.3f, 0.5f},
                       Case{100000, 1.f, 1.f}, Case{2000, 0.9f, 1.f}, Case{1024, 1.f, 3.f}, Case{0, 0.99f, 0.3f}}) {
    // Reference nucleus.
    std::vector<std::pair<double, int32_t>> sorted;
    for (int64_t i = 0; i < vocab; ++i) sorted.emplace_back(base[i] / c.temperature, static_cast<int32_t>(i));
    std::sort(sorted.begin(), sorted.end(),
              [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    if (c.top_k > 0) {  // ties with the k-th value stay
      const double kth = sorted[c.top_k - 1].first;
      sorted.erase(std::find_if(sorted.begin(), sorted.end(), [kth](auto& e) { return e.first < kth; }),
                   sorted.end());
    }
    double z = 0;
    for (auto& e : sorted) z += std::exp(e.first - sorted[0].first);
    std::set<int32_t> allowed;
    double cum = 0;
    for (auto& e : sorted) {
      allowed.insert(e.second);
      cum += std::exp(e.first - sorted[0].first) / z;
      if (cum >= c.top_p) break;
    }
    SamplingParams p = Sampled(c.temperature, 8);
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    Sampler s(p, {});
    std::set<int32_t> drawn;
    for (int32_t t : Draw(s, base, 100)) {
      ASSERT_TRUE(allowed.count(t)) << "token " << t << " top_k " << c.top_k << " top_p " << c.top_p;
      drawn.insert(t);
    }
    if (allowed.size() > 1) {
      EXPECT_GT(drawn.size(), 1u);
    }
  }
}

// Without top-k and top-p, a draw is the token where the cumulative mass in id order passes
// u * total: the sampler steps over whole chunks by their sums (kernels/logit_scan.h), and must land on
// the token a walk of every value lands on.
TEST(SamplerTest, FullVocabDrawIsTheCumulativeWalkOfItsUniform) {
  const int64_t vocab = 151936;
  auto logits = testing::RandomFloats(vocab, 91, -8.f, 8.f);
  logits[300] = 12.f;
  logits[140000] = 11.f;
  logits[77] = std::numeric_limits<float>::quiet_NaN();
  const uint64_t seed = 17;
  Sampler s(Sampled(1.f, seed), {});
  std::mt19937_64 rng(seed);
  const float max_value = kernels::RowMax(logits.data(), vocab);
  std::vector<double> probs(vocab);
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += probs[i] = kernels::Exp(kernels::NanAsNegInf(logits[i]) - max_value);
  std::set<int32_t> distinct;
  for (int draw = 0; draw < 300; ++draw) {
    const double target = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
    double cum = 0.0;
    int32_t want = -1;
    for (int64_t i = 0; i < vocab && want < 0; ++i) {
      cum += probs[i];
      if (probs[i] != 0.0 && target < cum) want = static_cast<int32_t>(i);
    }
    std::vector<float> copy = logits;
    ASSERT_EQ(s.Sample(copy.data(), vocab), want) << "draw " << draw;
    distinct.insert(want);
  }
  EXPECT_GT(distinct.size(), 100u);  // draws spread over the vocabulary, not only the peaks
}

// Top-p on a flat row (its likely tokens do not carry the mass): the nucleus is every token above
// the last one the mass needs, then that value's ties in id order; the draw walks them in that
// order. Against the nucleus listed the slow way (a full sort) and walked value by value.
TEST(SamplerTest, FlatTopPDrawIsTheWalkOfTheSortedNucleus) {
  const int64_t vocab = 151936;
  // A flat spread, and the same row quantized to 64 levels (ties straddle the nucleus's edge).
  std::vector<float> flat = testing::RandomFloats(vocab, 93, -1.5f, 1.5f);
  std::vector<float> levels = flat;
  for (float& v : levels) v = std::round(v * 20.f) / 20.f;
  for (const auto& [logits, top_p] : {std::pair{flat, 0.9f}, std::pair{levels, 0.5f}, std::pair{levels, 0.97f}}) {
    const uint64_t seed = 23;
    SamplingParams p = Sampled(1.f, seed);
    p.top_p = top_p;
    Sampler s(p, {});
    std::mt19937_64 rng(seed);
    std::vector<float> probs(vocab);
    std::vector<double> chunks;
    const double total = kernels::ExpShiftedRow(logits.data(), vocab, kernels::RowMax(logits.data(), vocab),
                                                probs.data(), chunks);
    std::vector<std::pair<float, int32_t>> sorted;
    for (int64_t i = 0; i < vocab; ++i) sorted.emplace_back(probs[i], static_cast<int32_t>(i));
    std::sort(sorted.begin(), sorted.end(),
              [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    const double need = (static_cast<double>(top_p) - 1e-6) * total;
    size_t kept = 0;
    for (double cum = 0.0; kept < sorted.size() && cum < need; ++kept) cum += sorted[kept].first;
    const float edge = sorted[kept - 1].first;
    // The walk's order: above the edge in id order, then the kept ties in id order.
    std::vector<int32_t> order;
    for (size_t k = 0; k < kept; ++k) {
      if (sorted[k].first > edge) order.push_back(sorted[k].second);
    }
    std::sort(order.begin(), order.end());
    for (size_t k = 0; k < kept; ++k) {
      if (sorted[k].first == edge) order.push_back(sorted[k].second);
    }
    double mass = 0.0;
    for (const int32_t id : order) mass += probs[id];
    ASSERT_GT(order.size(), 5000u) << "a flat row's nucleus";
    for (int draw = 0; draw < 200; ++draw) {
      const double target = static_cast<double>(rng() >> 11) * 0x1.0p-53 * mass;
      double cum = 0.0;
      int32_t want = order.back();
      for (const int32_t id : order) {
        cum += probs[id];
        if (target < cum) {
          want = id;
          break;
        }
      }
      std::vector<float> copy = logits;
      ASSERT_EQ(s.Sample(copy.data(), vocab), want) << "top_p " << top_p << " draw " << draw;
    }
  }
}

TEST(SamplerTest, TopPOnTiesTakesLowestIdsFirst) {
  // A flat distribution: the descending order breaks ties by id, so top_p 0.25 keeps the first
  // quarter of the vocabulary (ids < 37984) and top_k 1000 the first 1000.
  const int64_t vocab = 151936;
  const std::vector<float> flat(vocab, 0.5f);
  SamplingParams p = Sampled(1.f, 31);
  p.top_p = 0.25f;
  Sampler s(p, {});
  int32_t max_id = 0;
  for (int32_t t : Draw(s, flat, 200)) max_id = std::max(max_id, t);
  EXPECT_LT(max_id, 37984);
  EXPECT_GT(max_id, 30000);
  // With top-k the k-th value ties with everything, and HF keeps ties: the whole vocabulary.
  p.top_p = 1.f;
  p.top_k = 1000;
  Sampler k(p, {});
  max_id = 0;
  for (int32_t t : Draw(k, flat, 200)) max_id = std::max(max_id, t);
  EXPECT_GT(max_id, 100000);
}

TEST(SamplerTest, DegenerateRows) {
  const float inf = std::numeric_limits<float>::infinity();
  Sampler s(Sampled(1.f, 1), {});
  std::vector<float> one_inf = {0.f, inf, 3.f};
  EXPECT_EQ(s.Sample(one_inf.data(), 3), 1);
  std::vector<float> masked = {-inf, -inf, 0.f, -inf};
  for (int i = 0; i < 20; ++i) {
    std::vector<float> copy = masked;
    ASSERT_EQ(s.Sample(copy.data(), 4), 2);
  }
}

// ---- Validate ----

TEST(SamplingParamsTest, DefaultsAreValid) { EXPECT_TRUE(SamplingParams{}.Validate().ok()); }

void ExpectInvalid(const SamplingParams& p, const std::string& field, const std::string& range) {
  const absl::Status st = p.Validate();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_THAT(std::string(st.message()), HasSubstr(field));
  EXPECT_THAT(std::string(st.message()), HasSubstr(range));
}

TEST(SamplingParamsTest, MessagesNameTheFieldAndRange) {
  SamplingParams p;
  p.temperature = -0.1f;
  ExpectInvalid(p, "temperature", "[0, 100]");
  p.temperature = 101.f;
  ExpectInvalid(p, "temperature", "got 101");
  p.temperature = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(p, "temperature", "[0, 100]");
  p = {};
  p.top_k = -1;
  ExpectInvalid(p, "top_k", ">= 0");
  p = {};
  p.top_p = 1.5f;
  ExpectInvalid(p, "top_p", "(0, 1], got 1.5");
  p.top_p = 0.f;
  ExpectInvalid(p, "top_p", "(0, 1]");
  p = {};
  p.repetition_penalty = 0.f;
  ExpectInvalid(p, "repetition_penalty", "(0, 10]");
  p.repetition_penalty = 10.5f;
  ExpectInvalid(p, "repetition_penalty", "(0, 10]");
  p = {};
  p.max_tokens = 0;
  ExpectInvalid(p, "max_tokens", ">= 1");
  p = {};
  p.stop_token_ids = {2, -3};
  ExpectInvalid(p, "stop_token_ids[1]", ">= 0");
  p = {};
  p.stop_strings = {"a", ""};
  ExpectInvalid(p, "stop_strings[1]", "empty");
  p = {};
  p.stop_strings.assign(17, "x");
  ExpectInvalid(p, "stop_strings", "16");
  p.stop_strings.assign(16, "x");
  EXPECT_TRUE(p.Validate().ok());
  p.stop_strings[3] = std::string(257, 'y');
  ExpectInvalid(p, "stop_strings[3]", "256 bytes");
  p.stop_strings[3] = std::string(256, 'y');
  EXPECT_TRUE(p.Validate().ok());
  p = {};
  p.temperature = 100.f;
  p.top_p = 1.f;
  p.repetition_penalty = 10.f;
  p.max_tokens = 1;
  EXPECT_TRUE(p.Validate().ok());
}

TEST(FinishReasonTest, Names) {
  EXPECT_STREQ(FinishReasonName(FinishReason::kNone), "");
  EXPECT_STREQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_STREQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_STREQ(FinishReasonName(FinishReason::kCancelled), "cancelled");
  EXPECT_STREQ(FinishReasonName(FinishReason::kError), "error");
}

// ---- StopChecker ----

constexpr int32_t kEos = 151645;

SamplingParams WithStops(std::vector<std::string> stops, int64_t max_tokens = 100) {
  SamplingParams p;
  p.stop_strings = std::move(stops);
  p.max_tokens = max_tokens;
  return p;
}

TEST(StopCheckerTest, StopStringAcrossThreePushesIsNeverEmitted) {
  StopChecker c(WithStops({"STOP"}), {kEos});
  auto s1 = c.Push(1, "Hello S", 1);
  EXPECT_EQ(s1.text, "Hello ");
  EXPECT_EQ(s1.finish, FinishReason::kNone);
  auto s2 = c.Push(2, "TO", 2);
  EXPECT_EQ(s2.text, "");
  EXPECT_EQ(s2.finish, FinishReason::kNone);
  auto s3 = c.Push(3, "P world", 3);
  EXPECT_EQ(s3.text, "");
  EXPECT_EQ(s3.finish, FinishReason::kStop);
  EXPECT_EQ(s3.matched_stop, "STOP");
  EXPECT_EQ(c.Flush(), "");
}

TEST(StopCheckerTest, StopStringInsideOnePush) {
  StopChecker c(WithStops({"\n\n", "###"}), {});
  EXPECT_EQ(c.Push(1, "ab", 1).text, "ab");
  auto s = c.Push(2, "c###d\n\ne", 2);
  EXPECT_EQ(s.text, "c");
  EXPECT_EQ(s.finish, FinishReason::kStop);
  EXPECT_EQ(s.matched_stop, "###");
}

TEST(StopCheckerTest, EarliestStopStringWins) {
  StopChecker c(WithStops({"world", "lo"}), {});
  auto s = c.Push(1, "hello world", 1);
  EXPECT_EQ(s.text, "hel");
  EXPECT_EQ(s.matched_stop, "lo");
}

TEST(StopCheckerTest, HeldPrefixReleasedWhenItDoesNotMatch) {
  StopChecker c(WithStops({"abc"}), {});
  auto s1 = c.Push(1, "xa", 1);
  EXPECT_EQ(s1.text, "x");
  auto s2 = c.Push(2, "b", 2);
  EXPECT_EQ(s2.text, "");
  auto s3 = c.Push(3, "d", 3);
  EXPECT_EQ(s3.text, "abd");
  EXPECT_EQ(s3.finish, FinishReason::kNone);
  EXPECT_EQ(c.Flush(), "");
}

TEST(StopCheckerTest, OverlappingPrefixReleasesOnlyWhatCannotMatch) {
  // Full text "aaab" with stop "aab": the stop starts at 1, so only "a" may ever be emitted.
  StopChecker c(WithStops({"aab"}), {});
  std::string emitted;
  emitted += c.Push(1, "aa", 1).text;
  EXPECT_EQ(emitted, "");
  emitted += c.Push(2, "a", 2).text;
  EXPECT_EQ(emitted, "a");
  auto s = c.Push(3, "b", 3);
  emitted += s.text;
  EXPECT_EQ(emitted, "a");
  EXPECT_EQ(s.finish, FinishReason::kStop);
}

TEST(StopCheckerTest, EosStopsUnlessIgnored) {
  {
    StopChecker c(WithStops({}), {kEos, 151643});
    EXPECT_EQ(c.Push(10, "hi", 1).text, "hi");
    auto s = c.Push(151643, "<|endoftext|>", 2);
    EXPECT_EQ(s.finish, FinishReason::kStop);
    EXPECT_EQ(s.text, "");
    EXPECT_EQ(s.matched_stop, "");
  }
  {
    SamplingParams p;
    p.ignore_eos = true;
    p.stop_token_ids = {7};
    StopChecker c(p, {kEos});
    auto s = c.Push(kEos, "<|im_end|>", 1);
    EXPECT_EQ(s.finish, FinishReason::kNone);
    EXPECT_EQ(s.text, "<|im_end|>");
    auto s7 = c.Push(7, "seven", 2);  // stop_token_ids stop even with ignore_eos
    EXPECT_EQ(s7.finish, FinishReason::kStop);
    EXPECT_EQ(s7.text, "");
  }
}

TEST(StopCheckerTest, StopIdNotEmittedButHeldTextIs) {
  SamplingParams p = WithStops({"END"});
  p.stop_token_ids = {42};
  StopChecker c(p, {});
  auto s1 = c.Push(1, "the E", 1);
  EXPECT_EQ(s1.text, "the ");
  auto s2 = c.Push(42, "<stop>", 2);
  EXPECT_EQ(s2.finish, FinishReason::kStop);
  EXPECT_EQ(s2.text, "E");
  EXPECT_EQ(s2.matched_stop, "");
  EXPECT_EQ(c.Flush(), "");
}

TEST(StopCheckerTest, MaxTokensFinishesWithLengthAndFlushesHeldText) {
  StopChecker c(WithStops({"END"}, 3), {});
  EXPECT_EQ(c.Push(1, "a", 1).text, "a");
  auto s2 = c.Push(2, " E", 2);
  EXPECT_EQ(s2.text, " ");
  EXPECT_EQ(s2.finish, FinishReason::kNone);
  auto s3 = c.Push(3, "N", 3);
  EXPECT_EQ(s3.finish, FinishReason::kLength);
  EXPECT_EQ(s3.text, "EN");
  EXPECT_EQ(s3.matched_stop, "");
  EXPECT_EQ(c.Flush(), "");
}

TEST(StopCheckerTest, StopBeatsLengthOnTheLastToken) {
  StopChecker c(WithStops({"END"}, 2), {kEos});
  c.Push(1, "xE", 1);
  auto s = c.Push(2, "ND", 2);
  EXPECT_EQ(s.finish, FinishReason::kStop);
  EXPECT_EQ(s.matched_stop, "END");
  EXPECT_EQ(s.text, "");
  StopChecker d(WithStops({}, 1), {kEos});
  EXPECT_EQ(d.Push(kEos, "", 1).finish, FinishReason::kStop);
}

TEST(StopCheckerTest, FlushReturnsHeldTextOnce) {
  StopChecker c(WithStops({"</answer>"}), {});
  EXPECT_EQ(c.Push(1, "42 </ans", 1).text, "42 ");
  EXPECT_EQ(c.Flush(), "</ans");
  EXPECT_EQ(c.Flush(), "");
}

TEST(StopCheckerTest, NoStopStringsEmitsEverything) {
  StopChecker c(WithStops({}), {});
  EXPECT_EQ(c.Push(1, "abc", 1).text, "abc");
  EXPECT_EQ(c.Push(2, "", 2).text, "");
  EXPECT_EQ(c.Flush(), "");
}

TEST(StopCheckerTest, MultiByteStopString) {
  StopChecker c(WithStops({"。\n"}), {});  // 3 + 1 bytes
  auto s1 = c.Push(1, "好。", 1);
  EXPECT_EQ(s1.text, "好");
  auto s2 = c.Push(2, "\n下", 2);
  EXPECT_EQ(s2.text, "");
  EXPECT_EQ(s2.matched_stop, "。\n");
}

// min_tokens (vLLM's): the end ids are masked until that many tokens are out, then sampling is
// back to normal; compared with the same logits and no min_tokens.
TEST(SamplerTest, MinTokensMasksEndIdsUntilReached) {
  SamplingParams p;
  p.min_tokens = 2;
  p.max_tokens = 8;
  p.stop_token_ids = {3};
  const std::vector<int32_t> eos = {1};
  Sampler with_min(p, {}, eos);
  Sampler without(SamplingParams{}, {}, eos);
  auto eos_first = [] { return std::vector<float>{0.f, 9.f, 1.f, 8.f, 2.f}; };  // EOS, then stop id 3
  for (int i = 0; i < 2; ++i) {
    std::vector<float> a = eos_first(), b = eos_first();
    EXPECT_EQ(with_min.Sample(a.data(), 5), 4) << "token " << i;  // EOS and stop id masked: 4 is next
    EXPECT_EQ(without.Sample(b.data(), 5), 1);
  }
  std::vector<float> a = eos_first();
  EXPECT_EQ(with_min.Sample(a.data(), 5), 1);  // the third token may end
}

// A greedy pick, with or without a penalty or masked end ids, is an argmax a device may make once
// the row's edits are applied (Accept records it); a temperature needs the logits.
TEST(SamplerTest, PicksByArgmaxWheneverGreedy) {
  EXPECT_TRUE(Sampler(SamplingParams{}, {}).PicksByArgmax());
  SamplingParams warm;
  warm.temperature = 0.7f;
  EXPECT_FALSE(Sampler(warm, {}).PicksByArgmax());
  warm.top_k = 1;
  EXPECT_TRUE(Sampler(warm, {}).PicksByArgmax());
  SamplingParams penalty;
  penalty.repetition_penalty = 1.2f;
  EXPECT_TRUE(Sampler(penalty, {}).PicksByArgmax());
  kernels::LogitEdits edits;
  Sampler(SamplingParams{}, {1, 2}).AddEdits(edits);
  EXPECT_TRUE(edits.empty()) << "plain greedy: nothing to edit";
  EXPECT_EQ(edits.rows(), 1);
}

// A row's ids go in once each (sorted), however often they are given: an id repeated is edited
// once (HF's penalty gathers and scatters the same value), and no two threads of a device's edit
// launch write one logit (the SIMT racecheck build would report it).
TEST(SamplerTest, LogitEditsKeepEachIdOfARowOnce) {
  kernels::LogitEdits edits;
  edits.AddRow(1.2f, std::vector<int32_t>{9, 3, 9, 3, 1}, std::vector<int32_t>{7, 7, 2});
  edits.AddRow(1.f, std::vector<int32_t>{4, 4}, std::vector<int32_t>{5, 5, 5});  // penalty 1: none penalized
  edits.AddRow(0.5f, std::vector<int32_t>{3}, std::vector<int32_t>{2});  // repeats across rows stay
  EXPECT_EQ(edits.penalized, (std::vector<int32_t>{1, 3, 9, 3}));
  EXPECT_EQ(edits.penalized_begin, (std::vector<int32_t>{0, 3, 3, 4}));
  EXPECT_EQ(edits.masked, (std::vector<int32_t>{2, 7, 5, 2}));
  EXPECT_EQ(edits.masked_begin, (std::vector<int32_t>{0, 2, 3, 4}));
  // Applied: the same row as each id given once.
  const int64_t vocab = 12;
  std::vector<float> logits = testing::RandomFloats(3 * vocab, 77, -2.f, 2.f), want = logits;
  std::vector<int32_t> packed(static_cast<size_t>(edits.PackedSize()));
  edits.Pack(packed.data());
  kernels::EditLogitRows(kernels::DefaultCpuDevice(), logits.data(), 3, vocab, edits.View(packed.data()));
  for (const int32_t id : {1, 3, 9}) want[id] = want[id] < 0.f ? want[id] * 1.2f : want[id] / 1.2f;
  want[2] = want[7] = -std::numeric_limits<float>::infinity();
  want[vocab + 5] = -std::numeric_limits<float>::infinity();
  want[2 * vocab + 2] = -std::numeric_limits<float>::infinity();
  want[2 * vocab + 3] = want[2 * vocab + 3] < 0.f ? want[2 * vocab + 3] * 0.5f : want[2 * vocab + 3] / 0.5f;
  EXPECT_EQ(logits, want);
}

// Two samplers in lockstep over many steps: one picks on the host (Sample), the other as a device
// would (AddEdits, EditLogitRows, ArgmaxRows, then Accept). Penalties either side of 1, the prompt
// and every generated id penalized, end ids masked until min_tokens: the same tokens.
TEST(SamplerTest, DeviceEditsAndArgmaxPickWhatSamplePicks) {
  kernels::Device& cpu = kernels::DefaultCpuDevice();
  const int64_t vocab = 997;
  const std::vector<int32_t> prompt = {5, 17, 17, 400, 996, 3};
  const std::vector<int32_t> eos = {7, 11};
  for (const float penalty : {1.f, 1.05f, 1.5f, 0.8f}) {
    for (const int64_t min_tokens : {0, 6}) {
      SamplingParams p;
      p.repetition_penalty = penalty;
      p.min_tokens = min_tokens;
      p.max_tokens = 64;
      p.stop_token_ids = {13};
      Sampler host(p, prompt, eos), device(p, prompt, eos);
      int changed = 0;
      for (int step = 0; step < 40; ++step) {
        std::vector<float> logits = testing::RandomFloats(vocab, 1000 + static_cast<uint32_t>(step), -3.f, 3.f);
        // Favourites that the penalty and masks must move off: an end id, then a prompt id.
        logits[7] = 3.6f;
        logits[17] = 3.5f;
        logits[13] = 3.4f;
        logits[static_cast<size_t>(step * 31 % vocab)] = -3.6f;  // a negative seen id later
        std::vector<float> a = logits, b = logits;
        const int32_t want = host.Sample(a.data(), vocab);
        changed += want != 7 ? 1 : 0;  // the unedited argmax
        kernels::LogitEdits edits;
        device.AddEdits(edits);
        std::vector<int32_t> packed(static_cast<size_t>(edits.PackedSize()));
        edits.Pack(packed.data());
        kernels::EditLogitRows(cpu, b.data(), 1, vocab, edits.View(packed.data()));
        EXPECT_EQ(b, a) << "penalty " << penalty << " step " << step;  // the same edited row, bit for bit
        int32_t got = -1;
        kernels::ArgmaxRows(cpu, b.data(), 1, vocab, &got);
        device.Accept(got);
        ASSERT_EQ(got, want) << "penalty " << penalty << " min_tokens " << min_tokens << " step " << step;
      }
      // The masks (the end id 7 while min_tokens is not reached) and a strong penalty (7 once
      // seen) move the pick; 1.05 alone and 0.8 (which favours seen ids) leave it.
      if (penalty >= 1.5f || min_tokens > 0) {
        EXPECT_GT(changed, 0) << "penalty " << penalty << " min_tokens " << min_tokens;
      }
    }
  }
}

// A device's draw (AddEdits' edits, NextDraw's settings and uniform, kernels::SampleRows, then
// Accept) picks what Sample picks, step after step with one seed: the same uniforms, the same
// candidates and nucleus, the same walk. Every row kind and setting, with and without a penalty
// (whose seen set grows with the picks), on a small vocabulary and on Qwen's (whose flat rows
// take Sample's radix-select path).
TEST(SamplerTest, DeviceDrawsPickWhatSamplePicks) {
  kernels::Device& cpu = kernels::DefaultCpuDevice();
  const std::vector<int32_t> prompt = {5, 17, 400};
  for (const int64_t vocab : {int64_t{997}, int64_t{151936}}) {
    const int steps = vocab > 10000 ? 3 : 12;
    for (const kernels::RowDraw& setting : testing::DrawCaseSettings()) {
      for (const float penalty : {1.f, 1.3f}) {
        SamplingParams p;
        p.temperature = setting.temperature;
        p.top_k = setting.top_k;
        p.top_p = setting.top_p;
        p.repetition_penalty = penalty;
        p.seed = 77;
        p.max_tokens = 100;
        Sampler host(p, prompt), device(p, prompt);
        std::set<int32_t> picked;
        for (int step = 0; step < steps * testing::kDrawRowKinds; ++step) {
          const std::vector<float> logits =
              testing::DrawCaseRow(step % testing::kDrawRowKinds, vocab, 500 + static_cast<uint32_t>(step));
          std::vector<float> a = logits, b = logits;
          const int32_t want = host.Sample(a.data(), vocab);
          kernels::LogitEdits edits;
          device.AddEdits(edits);
          std::vector<int32_t> packed(static_cast<size_t>(edits.PackedSize()));
          edits.Pack(packed.data());
          kernels::EditLogitRows(cpu, b.data(), 1, vocab, edits.View(packed.data()));
          const kernels::RowDraw d = device.NextDraw();
          int32_t got = -1;
          kernels::SampleRows(cpu, b.data(), 1, vocab, &d, &got);
          device.Accept(got);
          ASSERT_EQ(got, want) << "vocab " << vocab << " t " << p.temperature << " k " << p.top_k << " p "
                               << p.top_p << " penalty " << penalty << " step " << step;
          picked.insert(got);
        }
        if (!setting.greedy() && setting.top_p > 0.01f) {  // a draw, not one certain token
          EXPECT_GT(picked.size(), 2u) << "vocab " << vocab << " t " << p.temperature << " k " << p.top_k;
        }
      }
    }
  }
}

// A greedy request's draw is its argmax and takes no uniform: its generator does not move (the
// same as Sample, which draws none for a greedy pick).
TEST(SamplerTest, NextDrawOfAGreedyRequestIsTheArgmaxAndDrawsNothing) {
  SamplingParams p;
  p.top_k = 1;
  p.temperature = 0.8f;
  Sampler s(p, {});
  const kernels::RowDraw d = s.NextDraw();
  EXPECT_TRUE(d.greedy());
  EXPECT_EQ(d.uniform, 0.0);
  SamplingParams q = Sampled(0.9f, 5);
  q.top_p = 0.7f;
  q.top_k = 9;
  Sampler a(q, {}), b(q, {});
  const kernels::RowDraw da = a.NextDraw();
  EXPECT_EQ(da.temperature, 0.9f);
  EXPECT_EQ(da.top_k, 9);
  EXPECT_EQ(da.top_p, 0.7f);
  // b's Sample takes the same uniform: a second NextDraw of a equals b's after one Sample.
  std::vector<float> row = {0.f, 1.f, 2.f};
  b.Sample(row.data(), 3);
  EXPECT_EQ(a.NextDraw().uniform, b.NextDraw().uniform);
}

TEST(SamplerTest, MinTokensKeepsEosWhenIgnoreEos) {
  SamplingParams p;
  p.min_tokens = 1;
  p.ignore_eos = true;
  Sampler s(p, {}, std::vector<int32_t>{1});
  std::vector<float> logits = {0.f, 9.f, 1.f};
  EXPECT_EQ(s.Sample(logits.data(), 3), 1);  // with ignore_eos, EOS is an ordinary token
}

TEST(SamplingParamsTest, MinTokensRange) {
  SamplingParams p;
  p.max_tokens = 4;
  p.min_tokens = 5;
  EXPECT_EQ(p.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.Validate().message()), ::testing::HasSubstr("min_tokens"));
  p.min_tokens = 4;
  EXPECT_TRUE(p.Validate().ok());
}

TEST(StopCheckerTest, MinTokensDefersStopIdsAndStrings) {
  SamplingParams p = WithStops({"STOP"});
  p.min_tokens = 2;
  p.stop_token_ids = {7};
  StopChecker c(p, {kEos});
  auto s1 = c.Push(7, "", 1);  // a stop id before min_tokens: ordinary
  EXPECT_EQ(s1.finish, FinishReason::kNone);
  auto s2 = c.Push(2, "xSTOPy", 2);  // the min_tokens-th token: stop strings are looked for
  EXPECT_EQ(s2.finish, FinishReason::kStop);
  EXPECT_EQ(s2.text, "x");
  StopChecker early(p, {kEos});
  EXPECT_EQ(early.Push(2, "aSTOPb", 1).finish, FinishReason::kNone);  // before min_tokens: not yet
  EXPECT_EQ(early.Push(kEos, "", 3).finish, FinishReason::kStop);     // past it: EOS ends
}

}  // namespace
}  // namespace iris::llm
