// The sampled draw's CUDA kernel (kernels/cuda/sample_rows.cuh), run by the SIMT harness on the
// CPU, against the CPU op (kernels::SampleRows on the CPU device, the draw's definition written
// plainly): every row kind and setting of tests/draw_cases.h, uniforms across [0, 1), odd
// vocabularies, rows with nothing finite, and a vocabulary past 256 * 1024 values (larger
// chunks). The same source runs on a GPU in cuda_kernels_test (label gpu).
#include "kernels/cuda/sample_rows.cuh"

#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <vector>

#include "kernels/device.h"
#include "kernels/sample_rows.h"
#include "tests/draw_cases.h"
#include "tests/simt_sanitized.h"

namespace iris::kernels::cuda {
namespace {

struct Batch {
  std::vector<float> logits;
  std::vector<RowDraw> draws;
};

void AddRow(Batch& b, const std::vector<float>& row, RowDraw d, double uniform) {
  d.uniform = uniform;
  b.logits.insert(b.logits.end(), row.begin(), row.end());
  b.draws.push_back(d);
}

// The kernel's picks at `threads` a block against the CPU op's.
void ExpectKernelPicksTheCpuOps(const Batch& b, int64_t vocab, int threads, const char* what) {
  const int64_t rows = static_cast<int64_t>(b.draws.size());
  std::vector<float> cpu_rows = b.logits, gpu_rows = b.logits;
  std::vector<int32_t> want(rows, -1), got(rows, -1);
  SampleRows(DefaultCpuDevice(), cpu_rows.data(), rows, vocab, b.draws.data(), want.data());
  Launch(Dim3(static_cast<unsigned>(rows)), Dim3(threads), SampleRowsKernel, gpu_rows.data(), vocab, b.draws.data(),
         got.data());
  for (int64_t r = 0; r < rows; ++r) {
    const RowDraw& d = b.draws[r];
    EXPECT_EQ(got[r], want[r]) << what << ", vocab " << vocab << ", " << threads << " threads, row " << r << ": t "
                               << d.temperature << " k " << d.top_k << " p " << d.top_p << " u " << d.uniform;
  }
}

TEST(SampleRowsOnSimtTest, EveryRowKindAndSettingPicksTheCpuOpsToken) {
  const double uniforms[] = {0.0, 0.013, 0.25, 0.5, 0.77, 0.999999};
  for (const int64_t vocab : {int64_t{1003}, int64_t{4999}}) {
    if (vocab > 2000 && testing::kSimtSanitized) continue;  // the same walk at fewer threads a block
    Batch b;
    std::set<int32_t> distinct;
    int n = 0;
    for (int kind = 0; kind < testing::kDrawRowKinds; ++kind) {
      const std::vector<RowDraw> settings = testing::DrawCaseSettings();
      for (size_t i = 0; i < settings.size(); ++i) {
        // Under a sanitizer: top-p alone, top-k with top-p, a top-k past the vocabulary, a top-p
        // of one token, greedy.
        if (testing::kSimtSanitized && i != 1 && i != 3 && i != 4 && i != 7 && i != 11) continue;
        const RowDraw& setting = settings[i];
        const uint32_t seed = 900 + static_cast<uint32_t>(n);
        AddRow(b, testing::DrawCaseRow(kind, vocab, seed), setting, uniforms[n % 6]);
        ++n;
      }
    }
    ExpectKernelPicksTheCpuOps(b, vocab, vocab > 2000 ? 64 : 128, "row kinds x settings");
    std::vector<int32_t> picks(b.draws.size());
    std::vector<float> rows = b.logits;
    SampleRows(DefaultCpuDevice(), rows.data(), static_cast<int64_t>(b.draws.size()), vocab, b.draws.data(), picks.data());
    distinct.insert(picks.begin(), picks.end());
    EXPECT_GT(distinct.size(), b.draws.size() / 3) << "vocab " << vocab;  // draws, not one favourite
  }
}

TEST(SampleRowsOnSimtTest, OneRowUnderManyUniforms) {
  // One row and setting, the uniform swept: every boundary of the walk's chunks is crossed.
  const int64_t vocab = 2053;
  for (const int kind : {0, 1, 2}) {
    Batch b;
    RowDraw d;
    d.temperature = 0.9f;
    d.top_p = kind == 1 ? 0.6f : 1.f;
    d.top_k = kind == 2 ? 300 : 0;
    const std::vector<float> row = testing::DrawCaseRow(kind, vocab, 31);
    const int n = testing::kSimtSanitized ? 4 : 16;  // the sweep is about values: fewer rows under a sanitizer
    for (int i = 0; i < n; ++i) AddRow(b, row, d, (i + 0.5) / n);
    ExpectKernelPicksTheCpuOps(b, vocab, kind == 1 ? 256 : 64, "uniform sweep");
  }
}

TEST(SampleRowsOnSimtTest, RowsWithoutAFiniteMaximumAreTheArgmax) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t vocab = 301;
  RowDraw d;
  d.temperature = 1.f;
  d.top_p = 0.9f;
  Batch b;
  AddRow(b, std::vector<float>(vocab, -inf), d, 0.5);  // nothing above -inf: 0
  AddRow(b, std::vector<float>(vocab, nan), d, 0.5);
  std::vector<float> infs = testing::RandomNormal(vocab, 3);
  infs[40] = inf;
  infs[200] = inf;  // the first +inf
  AddRow(b, infs, d, 0.9);
  std::vector<float> one(vocab, -inf);
  one[250] = 1.f;  // one finite value: it
  AddRow(b, one, d, 0.99);
  d.temperature = 1e-30f;  // finite logits over a tiny temperature: +inf, the argmax
  AddRow(b, testing::RandomNormal(vocab, 4), d, 0.3);
  ExpectKernelPicksTheCpuOps(b, vocab, 64, "degenerate rows");
  std::vector<int32_t> picks(b.draws.size());
  std::vector<float> rows = b.logits;
  SampleRows(DefaultCpuDevice(), rows.data(), static_cast<int64_t>(b.draws.size()), vocab, b.draws.data(), picks.data());
  EXPECT_EQ(picks[0], 0);
  EXPECT_EQ(picks[1], 0);
  EXPECT_EQ(picks[2], 40);
  EXPECT_EQ(picks[3], 250);
}

TEST(SampleRowsOnSimtTest, AVocabularyPastAThousandChunksWalksLargerChunks) {
  const int64_t vocab = 256 * kMaxDrawChunks + 777;
  ASSERT_EQ(DrawChunk(vocab), 512);
  Batch b;
  RowDraw d;
  d.temperature = 1.f;
  AddRow(b, testing::DrawCaseRow(1, vocab, 5), d, 0.61);  // flat: the walk crosses many chunks
  d.top_p = 0.9f;
  AddRow(b, testing::DrawCaseRow(0, vocab, 6), d, 0.2);
  ExpectKernelPicksTheCpuOps(b, vocab, 256, "large vocabulary");
}

}  // namespace
}  // namespace iris::kernels::cuda
