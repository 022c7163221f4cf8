// iris's flash varlen-attention kernels on the SIMT harness: the f32 one
// (kernels/cuda/attention_kernels.cuh) against the CPU kernel and a double-precision reference,
// the tensor-core one (flash_mma.cuh) against the definition on bf16-rounded inputs, and the
// tensor-core product's scalar twin against its documented fragment layout. Sequences shorter
// than, equal to and longer than a block's rows and a key tile, GQA, odd and padded head dims,
// causal or not, and query rows clipped to a range (the encoder's resumable pieces). Runs in CI
// without a GPU.
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/flash_mma.cuh"
#include "kernels/cuda/flash_varlen_args.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/bf16.h"
#include "tests/attention_cases.h"
#include "tests/kernel_cases.h"
#include "tests/simt_sanitized.h"

namespace iris::kernels::cuda {
namespace {

using testing::ExpectCloseRel;
using testing::ExpectRowsOfWholeAndRestUntouched;
using testing::VarlenCase;
using testing::VarlenShape;

// The case's kernel parameters for query rows [q_begin, q_end), into `out`.
FlashVarlenParams HarnessParams(const VarlenCase& c, std::vector<float>& out, int64_t q_begin, int64_t q_end,
                                bool bf16) {
  out.assign(static_cast<size_t>(c.rows) * c.out_stride(), NAN);
  AttentionArgs a = c.Args(c.qkv.data(), c.cu.data(), out.data());
  a.q_begin = q_begin;
  a.q_end = q_end;
  a.bf16 = bf16;
  return FlashVarlenParamsOf(a);
}

// The kernel as LaunchFlashVarlen runs it, on the harness.
std::vector<float> RunOnHarness(const VarlenCase& c, int64_t q_begin = 0, int64_t q_end = -1) {
  std::vector<float> out;
  const FlashVarlenParams p = HarnessParams(c, out, q_begin, q_end, /*bf16=*/false);
  Launch(Dim3(p.num_seqs, (p.max_seqlen + kFlashRows - 1) / kFlashRows, p.num_heads), Dim3(kFlashWarps * kWarpSize),
         FlashVarlenKernel, p);
  return out;
}

// The tensor-core kernel as LaunchFlashVarlenMma runs it.
std::vector<float> RunMmaOnHarness(const VarlenCase& c, int64_t q_begin = 0, int64_t q_end = -1) {
  std::vector<float> out;
  const FlashVarlenParams p = HarnessParams(c, out, q_begin, q_end, /*bf16=*/true);
  const Dim3 grid(p.num_seqs, (p.max_seqlen + kMmaFlashRows - 1) / kMmaFlashRows, p.num_heads);
  WithMmaFlashDim(p.head_dim, [&](auto dim) {
    Launch(grid, Dim3(kMmaFlashWarps * kWarpSize), FlashVarlenMmaKernel<decltype(dim)::value>, p);
  });
  return out;
}

// The case's qkv rows in bf16 (its values are bf16-exact), and params reading q, k, v from them.
std::vector<uint16_t> Bf16Rows(const VarlenCase& c) {
  std::vector<uint16_t> rows(c.qkv.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = core::FloatToBf16(c.qkv[i]);
  return rows;
}
void ReadBf16Rows(const VarlenCase& c, const std::vector<uint16_t>& rows, FlashVarlenParams& p) {
  const int64_t k_at = int64_t{c.heads} * c.head_stride, v_at = k_at + int64_t{c.kv_heads} * c.head_stride;
  p.q_bf16 = rows.data();
  p.k_bf16 = rows.data() + k_at;
  p.v_bf16 = rows.data() + v_at;
  p.q = p.k = p.v = nullptr;
}

// Two runs of the tensor-core kernels over case c's query rows [q_begin, q_end), with f32 and
// then with bf16 rows out, that must give the same bits: setup(a, b) makes the two runs' params
// (from the case's f32 rows; both bf16-mode), launch(grid, bf16_out, a, b) runs them.
template <typename Setup, typename LaunchBoth>
void ExpectTwoRunsBitEqual(const VarlenCase& c, int64_t q_begin, int64_t q_end, Setup setup, LaunchBoth launch) {
  for (const bool bf16_out : {false, true}) {
    const std::string what = "head dim " + std::to_string(c.head_dim) + (bf16_out ? ", bf16 rows out" : ", f32 out");
    SCOPED_TRACE(what);
    const int64_t width = c.out_stride(), ld = width + 8, rows = q_end - q_begin;
    std::vector<float> out_a, out_b;
    std::vector<uint16_t> rows_a(static_cast<size_t>(rows * ld), 0), rows_b(rows_a.size(), 0);
    FlashVarlenParams a = HarnessParams(c, out_a, q_begin, q_end, /*bf16=*/true);
    FlashVarlenParams b = HarnessParams(c, out_b, q_begin, q_end, /*bf16=*/true);
    setup(a, b);
    if (::testing::Test::HasFatalFailure()) return;
    if (bf16_out) {
      a.out_bf16 = rows_a.data();
      b.out_bf16 = rows_b.data();
      a.out_bf16_ld = b.out_bf16_ld = ld;
    }
    launch(Dim3(a.num_seqs, (a.max_seqlen + kMmaFlashRows - 1) / kMmaFlashRows, a.num_heads), bf16_out, a, b);
    if (bf16_out) {
      EXPECT_EQ(rows_b, rows_a);
    } else {
      ASSERT_EQ(out_b.size(), out_a.size());
      EXPECT_EQ(0, std::memcmp(out_b.data(), out_a.data(), out_a.size() * sizeof(float)));
      // (The rows past the range stay NaN in both; memcmp compares their bits too.)
      EXPECT_FALSE(std::isnan(out_b[q_begin * width]));
    }
  }
}

// One warp: A (16x16) and B (16x8) packed into fragments by the layout MmaBf16 documents, D = A·B
// written back by the same layout.
IRIS_GLOBAL void MmaLayoutKernel(const float* a, const float* b, float* d) {
  const int lane = static_cast<int>(threadIdx.x), group = lane / 4, t = lane % 4;
  const auto pack = [](float lo, float hi) { return PackBf16x2(lo, hi); };
  const uint32_t af[4] = {pack(a[group * 16 + 2 * t], a[group * 16 + 2 * t + 1]),
                          pack(a[(group + 8) * 16 + 2 * t], a[(group + 8) * 16 + 2 * t + 1]),
                          pack(a[group * 16 + 2 * t + 8], a[group * 16 + 2 * t + 9]),
                          pack(a[(group + 8) * 16 + 2 * t + 8], a[(group + 8) * 16 + 2 * t + 9])};
  const uint32_t bf[2] = {pack(b[(2 * t) * 8 + group], b[(2 * t + 1) * 8 + group]),
                          pack(b[(2 * t + 8) * 8 + group], b[(2 * t + 9) * 8 + group])};
  float acc[4] = {1.f, 2.f, 3.f, 4.f};  // accumulates onto what is there
  MmaBf16(acc, af, bf);
  d[group * 8 + 2 * t] = acc[0];
  d[group * 8 + 2 * t + 1] = acc[1];
  d[(group + 8) * 8 + 2 * t] = acc[2];
  d[(group + 8) * 8 + 2 * t + 1] = acc[3];
}

TEST(MmaBf16OnSimtTest, TheTwinMultipliesTheDocumentedFragments) {
  std::vector<float> a = testing::RandomNormal(16 * 16, 5), b = testing::RandomNormal(16 * 8, 6);
  for (float& x : a) x = core::Bf16ToFloat(core::FloatToBf16(x));  // exact in the fragments
  for (float& x : b) x = core::Bf16ToFloat(core::FloatToBf16(x));
  std::vector<float> d(16 * 8, NAN);
  Launch(Dim3(1), Dim3(kWarpSize), MmaLayoutKernel, a.data(), b.data(), d.data());
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 8; ++c) {
      double want = 1 + (r >= 8 ? 2 : 0) + c % 2;
      for (int k = 0; k < 16; ++k) want += double{a[r * 16 + k]} * b[k * 8 + c];
      ASSERT_NEAR(d[r * 8 + c], want, 1e-5 * (1 + std::fabs(want))) << "D[" << r << "][" << c << "]";
    }
  }
}

TEST(FlashVarlenMmaOnSimtTest, MatchesTheDefinitionOnBf16Inputs) {
  const VarlenShape shapes[] = {
      {{1, 5, 16, 17, 63, 64, 65, 130}, 4, 2, 80, 80, false},  // the vision tower's head dim, GQA, tile edges
      {{1, 17, 64, 65, 130}, 4, 2, 80, 80, true},
      {{33, 2}, 2, 2, 17, 24, false},  // an odd head dim inside a padded head stride (instantiated at 32)
      {{70}, 2, 1, 128, 128, true},    // the largest head dim, several key tiles
      {{1, 77, 300}, 16, 2, 128, 128, true},  // the GPU suite's decoder prefill: causal rows of 2 keys
      {{9, 40}, 3, 3, 8, 8, false},    // the smallest instantiation
  };
  // Under a sanitizer: GQA with tile edges, causal over several key tiles, the padded head dim.
  for (const VarlenShape& s : testing::SimtCases(shapes, {1, 2, 3})) {
    const VarlenCase c = s.Case();
    const std::vector<float> got = RunMmaOnHarness(c);
    // Against the definition on the same bf16 inputs: what is left is the probabilities' rounding
    // to bf16 before P·V and the order of f32 sums.
    testing::ExpectWithinBf16ProbabilityRounding(got, c, "mma flash vs bf16-input definition");
    // And the bf16 path really ran: f32 inputs differ by more than f32 rounding.
    const std::vector<float> exact = c.DoubleReference();
    const double l2 = testing::RelativeL2(got.data(), exact.data(), static_cast<int64_t>(got.size()));
    EXPECT_LE(l2, 1e-2);
    EXPECT_GE(l2, 1e-5);
  }
}

TEST(FlashVarlenMmaOnSimtTest, ClippedRowsEqualTheWholeCallAndLeaveTheRestUntouched) {
  for (const bool causal : {false, true}) {
    const VarlenCase c({9, 70, 20}, 2, 1, 80, 80, causal);
    const std::vector<float> whole = RunMmaOnHarness(c);
    const int64_t q_begin = 7, q_end = 75;  // from inside the first sequence into the third
    const std::vector<float> piece = RunMmaOnHarness(c, q_begin, q_end);
    ExpectRowsOfWholeAndRestUntouched(c, whole, piece, q_begin, q_end);
  }
}

// The hand-off to the projection (kernels::AttendAndProject on a GPU): with out_bf16 set, the
// query rows [q_begin, q_end) land as bf16 rows from row 0, at a padded stride, each value the
// f32 output's rounded (core::FloatToBf16) bit for bit; the padding columns, the rows past the
// range and the f32 output are left as they were.
TEST(FlashVarlenMmaOnSimtTest, Bf16RowsForTheProjectionAreTheF32OutputRounded) {
  static constexpr uint16_t kUntouched = 0xABCD;
  for (const auto& [s, q_begin, q_end] : {std::tuple{VarlenShape{{9, 70, 20}, 2, 1, 80, 80, false}, 7, 75},
                                          {VarlenShape{{33, 2}, 2, 2, 17, 24, true}, 0, 35}}) {
    const VarlenCase c = s.Case();
    const std::vector<float> f32 = RunMmaOnHarness(c, q_begin, q_end);
    const int64_t width = c.out_stride(), ld = width + 6, rows = q_end - q_begin;
    std::vector<uint16_t> got(static_cast<size_t>((rows + 2) * ld), kUntouched);
    std::vector<float> out;
    FlashVarlenParams p = HarnessParams(c, out, q_begin, q_end, /*bf16=*/true);
    p.out_bf16 = got.data();
    p.out_bf16_ld = ld;
    const Dim3 grid(p.num_seqs, (p.max_seqlen + kMmaFlashRows - 1) / kMmaFlashRows, p.num_heads);
    WithMmaFlashDim(p.head_dim, [&](auto dim) {
      Launch(grid, Dim3(kMmaFlashWarps * kWarpSize), FlashVarlenMmaKernel<decltype(dim)::value, true>, p);
    });
    std::vector<uint16_t> want(got.size(), kUntouched);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t e = 0; e < width; ++e) want[r * ld + e] = core::FloatToBf16(f32[(q_begin + r) * width + e]);
    }
    EXPECT_EQ(got, want) << "head dim " << c.head_dim;
    for (const float v : out) ASSERT_TRUE(std::isnan(v)) << "the f32 output was written";
  }
}

// The vision blocks' qkv rows held in bf16 (FlashVarlenParams::q_bf16, k_bf16, v_bf16, as the
// CUDA device's qkv chain leaves them): the output, f32 or bf16 rows, equals the kernel's output
// on the same values widened to f32 bit for bit. Cases: the vector tile load (head dim 80, rows of
// whole 16-byte vectors; GQA, causal, a clipped range) and the element one (an odd head dim in a
// padded stride; a head dim of whole vectors in a stride that is not).
TEST(FlashVarlenMmaOnSimtTest, Bf16InputsGiveTheWidenedInputsResultBitForBit) {
  const std::tuple<VarlenShape, int64_t, int64_t> cases[] = {
      {VarlenShape{{9, 70, 20, 130}, 4, 2, 80, 80, false}, 0, 229},
      {VarlenShape{{9, 70, 20}, 2, 1, 80, 80, true}, 7, 75},
      {VarlenShape{{33, 2}, 2, 2, 17, 24, true}, 0, 35},
      {VarlenShape{{40, 3}, 2, 1, 16, 20, false}, 5, 43},
  };
  // Under a sanitizer: one case of each tile load.
  for (const auto& [s, q_begin, q_end] : testing::SimtCases(cases, {1, 3})) {
    const VarlenCase c = s.Case().RoundedToBf16();
    const std::vector<uint16_t> qkv16 = Bf16Rows(c);
    // a: the f32 rows (widened bf16 values); b: the bf16 rows.
    ExpectTwoRunsBitEqual(
        c, q_begin, q_end, [&](FlashVarlenParams&, FlashVarlenParams& b) { ReadBf16Rows(c, qkv16, b); },
        [&](const Dim3& grid, bool bf16_out, const FlashVarlenParams& a, const FlashVarlenParams& b) {
          WithMmaFlashDim(c.head_dim, [&](auto dim) {
            constexpr int kDim = decltype(dim)::value;
            if (bf16_out) {
              Launch(grid, Dim3(kMmaFlashThreads), FlashVarlenMmaKernel<kDim, true, false>, a);
              Launch(grid, Dim3(kMmaFlashThreads), FlashVarlenMmaKernel<kDim, true, true>, b);
            } else {
              Launch(grid, Dim3(kMmaFlashThreads), FlashVarlenMmaKernel<kDim, false, false>, a);
              Launch(grid, Dim3(kMmaFlashThreads), FlashVarlenMmaKernel<kDim, false, true>, b);
            }
          });
        });
  }
}

// The pipelined kernel (FlashVarlenMmaPipelinedKernel: K/V tiles copied to shared memory while
// the warps compute, fragments by ldmatrix) equals the kernel it stands in for,
// FlashVarlenMmaKernel<kDim, kBf16Out, true>, bit for bit, f32 and bf16 rows out: several tiles
// per sequence (the double buffer turns over), GQA, causal, clipped ranges, a head dim with zero
// padding dims (72 in the 80 instantiation) and the small instantiations. The harness lands a
// copy only at the wait that retires it, so a tile read before its wait reads the old buffer.
// Both as one head a block and as two (kHeads = 2: a block walks two heads' tiles as one
// sequence of items, the next head's first tile copied while this head's last computes; an odd
// head count leaves the last block one). Then the calls it refuses, which LaunchFlashVarlenMma
// gives to the other kernel.
TEST(FlashVarlenMmaOnSimtTest, PipelinedKernelIsTheKernelItReplacesBitForBit) {
  const std::tuple<VarlenShape, int64_t, int64_t> cases[] = {
      {VarlenShape{{9, 70, 20, 130}, 4, 2, 80, 80, false}, 0, 229},
      {VarlenShape{{9, 70, 200}, 2, 1, 80, 80, true}, 7, 275},
      {VarlenShape{{100, 64}, 2, 1, 72, 80, false}, 5, 150},
      {VarlenShape{{65, 3}, 2, 2, 64, 64, true}, 0, 68},
      {VarlenShape{{40, 129}, 3, 1, 16, 24, false}, 0, 169},
  };
  // Under a sanitizer: causal over a clipped range with the double buffer turning over, zero
  // padding dims, and an odd head count (the two-heads block's lone last head).
  for (const auto& [s, q_begin, q_end] : testing::SimtCases(cases, {1, 2, 4})) {
    const VarlenCase c = s.Case().RoundedToBf16();
    const std::vector<uint16_t> qkv16 = Bf16Rows(c);
    // a: the first kernel; b: the pipelined one, on the same bf16 rows, one or two heads a block.
    for (const int heads : {1, 2}) {
      SCOPED_TRACE(heads == 1 ? "one head a block" : "two heads a block");
      ExpectTwoRunsBitEqual(
          c, q_begin, q_end,
          [&](FlashVarlenParams& a, FlashVarlenParams& b) {
            ReadBf16Rows(c, qkv16, a);
            ReadBf16Rows(c, qkv16, b);
            b.pipeline = true;
            b.heads_per_block = heads;
            ASSERT_TRUE(MmaFlashPipelinedTakes(b));
          },
          [&](const Dim3& grid, bool bf16_out, const FlashVarlenParams& a, const FlashVarlenParams& b) {
            const Dim3 b_grid(grid.x, grid.y, (grid.z + heads - 1) / heads);
            WithMmaFlashDim(c.head_dim, [&](auto dim) {
              constexpr int kDim = decltype(dim)::value;
              if constexpr (kDim <= kMmaFlashPipelinedMaxHeadDim) {
                const auto both = [&]<bool kBf16Out>() {
                  Launch(grid, Dim3(kMmaFlashThreads), FlashVarlenMmaKernel<kDim, kBf16Out, true>, a);
                  if (heads == 1) {
                    Launch(b_grid, Dim3(kMmaFlashThreads), FlashVarlenMmaPipelinedKernel<kDim, kBf16Out>, b);
                  } else {
                    Launch(b_grid, Dim3(kMmaFlashThreads), FlashVarlenMmaPipelinedHeadsKernel<kDim, kBf16Out, 2>, b);
                  }
                };
                if (bf16_out) {
                  both.template operator()<true>();
                } else {
                  both.template operator()<false>();
                }
              }
            });
          });
    }
  }

  // Refused: f32 inputs, a head dim past 80 or not a multiple of 8, K/V strides or addresses that
  // are not whole 16-byte vectors.
  const VarlenCase c = VarlenShape{{20}, 2, 1, 80, 80, false}.Case();
  std::vector<uint16_t> qkv16(c.qkv.size() + 8);
  std::vector<float> out;
  FlashVarlenParams ok = HarnessParams(c, out, 0, -1, /*bf16=*/true);
  ok.q_bf16 = qkv16.data();
  ok.k_bf16 = qkv16.data() + 160;
  ok.v_bf16 = qkv16.data() + 240;
  ASSERT_TRUE(MmaFlashPipelinedTakes(ok));
  FlashVarlenParams p = ok;
  p.q_bf16 = p.k_bf16 = p.v_bf16 = nullptr;
  EXPECT_FALSE(MmaFlashPipelinedTakes(p)) << "f32 inputs";
  p = ok;
  p.head_dim = 96;
  EXPECT_FALSE(MmaFlashPipelinedTakes(p)) << "head dim 96";
  p = ok;
  p.head_dim = 76;
  EXPECT_FALSE(MmaFlashPipelinedTakes(p)) << "head dim 76";
  p = ok;
  p.v_row_stride = 324;
  EXPECT_FALSE(MmaFlashPipelinedTakes(p)) << "V row stride 324";
  p = ok;
  p.k_head_stride = 84;
  EXPECT_FALSE(MmaFlashPipelinedTakes(p)) << "K head stride 84";
  p = ok;
  p.k_bf16 += 4;
  EXPECT_FALSE(MmaFlashPipelinedTakes(p)) << "K 8 bytes off";
  p = ok;
  p.max_seqlen = (1 << 30) / 80;
  EXPECT_FALSE(MmaFlashPipelinedTakes(p)) << "32-bit row offsets";
}

TEST(FlashVarlenOnSimtTest, MatchesTheCpuKernelAndTheDefinition) {
  const VarlenShape shapes[] = {
      {{1, 5, 16, 17, 40}, 4, 2, 80, 80, false},  // the vision tower's head dim, GQA
      {{1, 5, 16, 17, 40}, 4, 2, 80, 80, true},
      {{33, 2}, 2, 2, 17, 24, false},             // an odd head dim inside a padded head stride
      {{70}, 2, 1, 128, 128, true},               // the largest head dim, several key tiles
  };
  for (const VarlenShape& s : shapes) {
    const VarlenCase c = s.Case();
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
    ExpectRowsOfWholeAndRestUntouched(c, whole, piece, q_begin, q_end);
  }
}

}  // namespace
}  // namespace iris::kernels::cuda
