// iris's flash varlen-attention kernel (kernels/cuda/attention_kernels.cuh) on the SIMT harness,
// against the CPU kernel and a double-precision reference: sequences shorter than, equal to and
// longer than a block's rows and a key tile, GQA, odd and padded head dims, causal or not, and
// query rows clipped to a range (the encoder's resumable pieces). Runs in CI without a GPU.
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/flash_varlen_args.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/attention_cases.h"
#include "tests/kernel_cases.h"

namespace iris::kernels::cuda {
namespace {

using testing::ExpectCloseRel;
using testing::VarlenCase;

// The kernel as LaunchFlashVarlen runs it, on the harness.
std::vector<float> RunOnHarness(const VarlenCase& c, int64_t q_begin = 0, int64_t q_end = -1) {
  std::vector<float> out(static_cast<size_t>(c.rows) * c.out_stride(), NAN);
  AttentionArgs a = c.Args(c.qkv.data(), c.cu.data(), out.data());
  a.q_begin = q_begin;
  a.q_end = q_end;
  const FlashVarlenParams p = FlashVarlenParamsOf(a);
  Launch(Dim3(p.num_seqs, (p.max_seqlen + kFlashRows - 1) / kFlashRows, p.num_heads), Dim3(kFlashWarps * kWarpSize),
         FlashVarlenKernel, p);
  return out;
}

TEST(FlashVarlenOnSimtTest, MatchesTheCpuKernelAndTheDefinition) {
  // (lengths, heads, kv heads, head dim, head stride, causal)
  struct Shape {
    std::vector<int> lengths;
    int heads, kv_heads, head_dim, head_stride;
    bool causal;
  };
  const Shape shapes[] = {
      {{1, 5, 16, 17, 40}, 4, 2, 80, 80, false},  // the vision tower's head dim, GQA
      {{1, 5, 16, 17, 40}, 4, 2, 80, 80, true},
      {{33, 2}, 2, 2, 17, 24, false},             // an odd head dim inside a padded head stride
      {{70}, 2, 1, 128, 128, true},               // the largest head dim, several key tiles
  };
  for (const Shape& s : shapes) {
    const VarlenCase c(s.lengths, s.heads, s.kv_heads, s.head_dim, s.head_stride, s.causal);
    const std::vector<float> got = RunOnHarness(c);
    ExpectCloseRel(got, c.CpuReference(), 2e-5f, "flash vs cpu");
    ExpectCloseRel(got, c.DoubleReference(), 2e-5f, "flash vs double");
  }
}

TEST(FlashVarlenOnSimtTest, ClippedRowsEqualTheWholeCallAndLeaveTheRestUntouched) {
  for (const bool causal : {false, true}) {
    const VarlenCase c({9, 30, 20}, 2, 1, 80, 80, causal);
    const std::vector<float> whole = RunOnHarness(c);
    const int64_t q_begin = 7, q_end = 41;  // from inside the first sequence into the third
    const std::vector<float> piece = RunOnHarness(c, q_begin, q_end);
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t i = 0; i < c.out_stride(); ++i) {
        const float v = piece[r * c.out_stride() + i];
        if (r >= q_begin && r < q_end) {
          ASSERT_EQ(v, whole[r * c.out_stride() + i]) << "row " << r;  // the same arithmetic, bit for bit
        } else {
          ASSERT_TRUE(std::isnan(v)) << "row " << r << " outside the range was written";
        }
      }
    }
  }
}

}  // namespace
}  // namespace iris::kernels::cuda
