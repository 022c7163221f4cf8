// The host side of cuBLASLt matmul tuning (kernels/cuda/matmul_tuning.h): which candidate is
// kept from a set of timings, and the row buckets and table the choice is shared through. The
// timing itself, and cuBLASLt's acceptance of a reused choice, are checked on a GPU
// (cuda_linear_test).
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/matmul_tuning.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace iris::kernels::cuda {
namespace {

TEST(MatmulRowBucketTest, RoundsUpToAPowerOfTwo) {
  const std::vector<std::pair<int64_t, int64_t>> cases = {{1, 1},       {2, 2},       {3, 4},       {256, 256},
                                                          {257, 512},   {1000, 1024}, {4096, 4096}, {4097, 8192},
                                                          {8192, 8192}, {8193, 16384}};
  for (const auto& [m, bucket] : cases) EXPECT_EQ(MatmulRowBucket(m), bucket) << m;
}

// An engine's warm-up with tuning on: one forward per bucket, so that none is timed in a request.
TEST(MatmulTuneWarmUpRowsTest, CoversEveryBucketUpToTheBudgetOnce) {
  EXPECT_EQ(MatmulTuneWarmUpRows(2048), (std::vector<int64_t>{256, 512, 1024, 2048}));
  EXPECT_EQ(MatmulTuneWarmUpRows(3000), (std::vector<int64_t>{256, 512, 1024, 2048, 3000}));
  EXPECT_EQ(MatmulTuneWarmUpRows(257), (std::vector<int64_t>{256, 257}));
  EXPECT_EQ(MatmulTuneWarmUpRows(256), (std::vector<int64_t>{256}));
  EXPECT_EQ(MatmulTuneWarmUpRows(100), (std::vector<int64_t>{100}));
  for (const int64_t budget : {int64_t{300}, int64_t{4096}, int64_t{16384}, int64_t{20000}}) {
    const std::vector<int64_t> rows = MatmulTuneWarmUpRows(budget);
    for (int64_t m = kMatmulTuneMinRows; m <= budget; m += 37) {
      const bool covered = std::any_of(rows.begin(), rows.end(),
                                       [&](int64_t r) { return MatmulRowBucket(r) == MatmulRowBucket(m); });
      EXPECT_TRUE(covered) << m << " of " << budget;
    }
  }
}

// A scripted clock: candidate i's r-th timing is times[i][r] (nullopt: it failed to run), and
// the order in which candidates were timed is recorded.
struct ScriptedTimes {
  explicit ScriptedTimes(std::vector<std::vector<std::optional<double>>> t) : times(std::move(t)) {}
  std::vector<std::vector<std::optional<double>>> times;
  std::vector<int> order;
  std::map<int, int> calls;
  std::optional<double> operator()(int i) {
    order.push_back(i);
    return times[i][calls[i]++];
  }
};

TEST(PickFastestCandidateTest, KeepsTheLowestMedianNotTheLowestSingleTime) {
  // Candidate 1 has the fastest single run (an outlier); candidate 2 is fastest by median.
  ScriptedTimes t{{{3.0, 3.1, 2.9}, {0.5, 4.0, 4.2}, {2.0, 2.2, 2.1}}};
  const std::optional<TunedChoice> c =
      PickFastestCandidate(3, 3, [&](int i) { return t(i); });
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->index, 2);
  ASSERT_EQ(c->medians.size(), 3u);
  EXPECT_DOUBLE_EQ(c->medians[0], 3.0);
  EXPECT_DOUBLE_EQ(c->medians[1], 4.0);
  EXPECT_DOUBLE_EQ(c->medians[2], 2.1);
}

TEST(PickFastestCandidateTest, TimesTheCandidatesInterleavedRoundByRound) {
  ScriptedTimes t{{{1, 1}, {2, 2}, {3, 3}}};
  ASSERT_TRUE(PickFastestCandidate(3, 2, [&](int i) { return t(i); }).has_value());
  EXPECT_EQ(t.order, (std::vector<int>{0, 1, 2, 0, 1, 2}));
}

TEST(PickFastestCandidateTest, TiesGoToTheHeuristicsEarlierCandidate) {
  ScriptedTimes t{{{2.0, 2.0}, {1.0, 1.0}, {1.0, 1.0}}};
  const std::optional<TunedChoice> c = PickFastestCandidate(3, 2, [&](int i) { return t(i); });
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->index, 1);
}

TEST(PickFastestCandidateTest, ACandidateThatFailsIsDroppedAndNotTimedAgain) {
  // Candidate 1 is fastest in round 0 but fails in round 1: it must not be kept, and it is not
  // asked again in round 2.
  ScriptedTimes t{{{3.0, 3.0, 3.0}, {0.1, std::nullopt, 0.1}, {2.0, 2.5, 2.0}}};
  const std::optional<TunedChoice> c = PickFastestCandidate(3, 3, [&](int i) { return t(i); });
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->index, 2);
  EXPECT_TRUE(std::isinf(c->medians[1]));
  EXPECT_EQ(t.calls[1], 2);
  EXPECT_EQ(t.order, (std::vector<int>{0, 1, 2, 0, 1, 2, 0, 2}));
}

TEST(PickFastestCandidateTest, TheHeuristicsFirstCanFailAndAnotherIsKept) {
  ScriptedTimes t{{{std::nullopt}, {5.0, 4.0}}};
  const std::optional<TunedChoice> c = PickFastestCandidate(2, 2, [&](int i) { return t(i); });
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->index, 1);
  EXPECT_DOUBLE_EQ(c->medians[1], 4.5);  // the median of an even count: the mean of the middle two
  EXPECT_TRUE(std::isinf(c->medians[0]));
}

TEST(PickFastestCandidateTest, NothingIsChosenWhenNoCandidateRuns) {
  ScriptedTimes t{{{std::nullopt}, {std::nullopt}}};
  EXPECT_FALSE(PickFastestCandidate(2, 3, [&](int i) { return t(i); }).has_value());
  EXPECT_FALSE(PickFastestCandidate(0, 3, [](int) { return std::optional<double>(1.0); }).has_value());
  EXPECT_FALSE(PickFastestCandidate(2, 0, [](int) { return std::optional<double>(1.0); }).has_value());
}

TEST(MatmulAlgoTableTest, AChoiceIsFoundUnderItsOwnKeyOnly) {
  MatmulAlgoTable table;
  MatmulTuneKey qkv{.a_type = 14, .d_type = 0, .m = 3840, .k = 1280, .lda = 1280, .ldb = 1280, .ldd = 3840,
                    .row_bucket = 8192, .bias = true, .align_a = 256, .align_b = 256, .align_d = 256};
  TunedMatmul tuned{.key = qkv, .algo = {1, 2, 3, 4, 5, 6, 7, 8}, .rows = 8192, .candidates = 8, .chosen = 3,
                    .first_s = 2e-4, .chosen_s = 1.5e-4};
  EXPECT_FALSE(table.Find(qkv).has_value());
  table.Store(tuned);
  ASSERT_TRUE(table.Find(qkv).has_value());
  EXPECT_EQ(*table.Find(qkv), tuned.algo);
  // Another bucket, another alignment, the bias epilogue off, a bf16 output: each a key of its own.
  for (auto change : {+[](MatmulTuneKey& k) { k.row_bucket = 4096; }, +[](MatmulTuneKey& k) { k.align_b = 128; },
                      +[](MatmulTuneKey& k) { k.bias = false; }, +[](MatmulTuneKey& k) { k.d_type = 14; },
                      +[](MatmulTuneKey& k) { k.ldb = 1288; }}) {
    MatmulTuneKey other = qkv;
    change(other);
    EXPECT_FALSE(table.Find(other).has_value());
  }
  // Storing again replaces; Entries lists each key once.
  tuned.algo[0] = 42;
  table.Store(tuned);
  ASSERT_EQ(table.Entries().size(), 1u);
  EXPECT_EQ(table.Entries()[0].algo[0], 42u);
  EXPECT_EQ(table.Entries()[0].chosen, 3);
}

}  // namespace
}  // namespace iris::kernels::cuda
#endif  // IRIS_HAVE_CUDA
