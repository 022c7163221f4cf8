// The CUDA Linear's own kernels (kernels/cuda/linear_kernels.cuh) on the SIMT harness, so CI
// checks them without a GPU: the f32 -> bf16 rounding bit for bit against the CPU's
// (core::FloatToBf16) and against hand-worked values (ties, NaN, infinities, subnormals), the
// bias + erf GELU against the CPU kernel, the small-batch GEMV against a double reference on the
// bf16-rounded inputs (every row count, aligned and unaligned x, ragged last blocks, bias,
// accumulate), and the bandwidth probe's sum. Odd sizes and grids
// smaller than the work, so the grid-stride loops go round.
// (Not named cuda_*: that prefix means label gpu, and this suite is for machines without one.)
#include "kernels/cuda/gemv_streamed.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/linear_kernels.cuh"
#include "kernels/cuda/linear_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "kernels/device.h"
#include "kernels/elementwise.h"
#include "tests/kernel_cases.h"
#include "tests/simt_sanitized.h"

namespace iris::kernels::cuda {
namespace {

using testing::ExpectCloseRel;
using testing::RandomNormal;

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Bit patterns with the bf16 each must become, worked out by hand (the CPU's rounding is checked
// separately below: this list does not trust it).
struct Rounding {
  uint32_t f32;
  uint16_t bf16;
};
constexpr Rounding kHandWorked[] = {
    {0x3F800000u, 0x3F80u},  // 1.0: exact
    {0x3F808000u, 0x3F80u},  // 1 + 2^-8: a tie, kept half even -> stays
    {0x3F818000u, 0x3F82u},  // a tie, kept half odd -> up to even
    {0x3F808001u, 0x3F81u},  // just above the tie -> up
    {0x3F807FFFu, 0x3F80u},  // just below the tie -> down
    {0xBF818000u, 0xBF82u},  // negative tie: magnitude rounds the same way
    {0x7F800000u, 0x7F80u},  // +inf
    {0xFF800000u, 0xFF80u},  // -inf
    {0x7F7FFFFFu, 0x7F80u},  // FLT_MAX rounds up to +inf
    {0x7F7F7FFFu, 0x7F7Fu},  // the largest that stays finite
    {0x7FC00000u, 0x7FC0u},  // quiet NaN
    {0x7F800001u, 0x7FC0u},  // signalling NaN, payload only in the dropped half: still NaN, quiet
    {0xFFA50000u, 0xFFE5u},  // negative NaN keeps its sign and top payload, made quiet
    {0x00000000u, 0x0000u},  // +0
    {0x80000000u, 0x8000u},  // -0
    {0x00000001u, 0x0000u},  // smallest subnormal -> 0 (rounded, not flushed: see the next ones)
    {0x00008000u, 0x0000u},  // subnormal tie, even -> down
    {0x00018000u, 0x0002u},  // subnormal tie, odd -> up
    {0x00008001u, 0x0001u},  // above the tie -> the smallest bf16 subnormal
    {0x007FFFFFu, 0x0080u},  // largest subnormal rounds up to the smallest normal
    {0x80018000u, 0x8002u},  // negative subnormal tie
};

TEST(LinearKernelsOnSimtTest, ToBf16RoundsLikeTheCpuIncludingTiesNansInfinitiesAndSubnormals) {
  for (const auto& [rows, cols, ld] : {std::tuple{7, 37, 40}, {1, 1, 8}, {3, 80, 80}, {5, 131, 136}, {4, 1280, 1288}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " ld " << ld);
    std::vector<float> x = RandomNormal(static_cast<int64_t>(rows) * cols, 20 + cols, 100.f);
    // Spread the hand-worked patterns over the rows (and so over threads and blocks).
    for (size_t i = 0; i < std::size(kHandWorked) && i < x.size(); ++i) {
      x[(i * 7919) % x.size()] = FromBits(kHandWorked[i].f32);
    }
    // Every 16-bit tail around the halfway point for a few kept halves.
    for (size_t i = std::size(kHandWorked); i < x.size(); i += 3) {
      x[i] = FromBits((0x3F80u + static_cast<uint32_t>(i % 4)) << 16 | (0x7FFEu + static_cast<uint32_t>(i % 5)));
    }
    const uint16_t kUntouched = 0xDEAD;
    std::vector<uint16_t> out(static_cast<size_t>(rows) * ld, kUntouched);
    Launch(Dim3(2, 3), Dim3(32), ToBf16RowsKernel, x.data(), int64_t{rows}, int64_t{cols}, int64_t{ld}, out.data());
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < ld; ++c) {
        const uint16_t got = out[static_cast<size_t>(r) * ld + c];
        if (c >= cols) {
          ASSERT_EQ(got, kUntouched) << "padding written at row " << r << " col " << c;
          continue;
        }
        const float v = x[static_cast<size_t>(r) * cols + c];
        ASSERT_EQ(got, core::FloatToBf16(v)) << "row " << r << " col " << c << " value " << v;
      }
    }
    // Whole 16-byte chunks (malloc'd storage is 16-byte aligned): the 8-wide kernel, bit for bit.
    if (cols % 8 == 0 && ld % 8 == 0) {
      std::vector<uint16_t> out8(out.size(), kUntouched);
      Launch(Dim3(2, 3), Dim3(32), ToBf16Rows8Kernel, static_cast<const float*>(x.data()), int64_t{rows}, int64_t{cols},
             int64_t{ld}, out8.data());
      EXPECT_EQ(out8, out) << "8 values a thread";
    }
  }
  // The hand-worked values themselves, in one row.
  std::vector<float> x;
  for (const Rounding& h : kHandWorked) x.push_back(FromBits(h.f32));
  std::vector<uint16_t> out(x.size());
  const auto n = static_cast<int64_t>(x.size());
  Launch(Dim3(1), Dim3(32), ToBf16RowsKernel, x.data(), int64_t{1}, n, n, out.data());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(out[i], kHandWorked[i].bf16) << std::hex << "f32 bits 0x" << kHandWorked[i].f32;
  }
}

TEST(LinearKernelsOnSimtTest, BiasGeluErfMatchesTheCpuGeluOnTheBiasedValues) {
  Device& cpu = DefaultCpuDevice();
  for (const auto& [rows, cols] : {std::pair{5, 1003}, {1, 3}, {33, 80}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols);
    const int64_t n = static_cast<int64_t>(rows) * cols;
    std::vector<float> y = RandomNormal(n, 30 + cols, 3.f);
    // The tails and the middle: large negatives (a tiny result: erfc keeps its digits), large
    // positives (y itself), zero.
    const float specials[] = {-12.f, -7.5f, -3.f, -0.25f, 0.f, 1e-20f, 0.5f, 4.f, 9.f};
    for (size_t i = 0; i < std::size(specials) && i * 2 < y.size(); ++i) y[i * 2] = specials[i];
    const std::vector<float> bias = RandomNormal(cols, 40 + cols, 0.5f);
    for (const bool with_bias : {true, false}) {
      SCOPED_TRACE(with_bias ? "bias" : "no bias");
      std::vector<float> biased(y);
      if (with_bias) {
        for (int64_t e = 0; e < n; ++e) biased[e] += bias[e % cols];
      }
      std::vector<float> want(n);
      GeluErf(cpu, biased.data(), n, want.data());
      std::vector<float> got(y);
      Launch(Dim3(3, 2), Dim3(64), BiasGeluErfKernel, got.data(), int64_t{rows}, int64_t{cols},
             with_bias ? bias.data() : static_cast<const float*>(nullptr));
      ExpectCloseRel(got, want, 1e-6f, "bias + gelu_erf vs the CPU");
      // And relative to the exact value even where the result is tiny (the CPU check is absolute
      // below 1): 0.5 v erfc(-v / sqrt 2) in double. In the negative tail the result's relative
      // sensitivity to the f32 rounding of v / sqrt 2 grows like v^2 (erfc(z) ~ exp(-z^2)).
      for (int64_t e = 0; e < n; ++e) {
        const double v = biased[e];
        const double exact = 0.5 * v * std::erfc(-v / std::sqrt(2.0));
        ASSERT_NEAR(got[e], exact, 1e-6 * (2 + v * v) * std::fabs(exact) + 1e-38) << "at " << e << ", v = " << v;
      }
    }
  }
}

// The GEMV's layout: bf16 weight rows of stride ld (a multiple of 8, zero past `in`) in 16-byte
// aligned storage, as the CUDA Linear holds them.
struct GemvCase {
  int rows;
  int64_t in, out;
  int x_offset;  // floats x starts past a 16-byte boundary: 0 takes the two-Float4 loads
  bool bias, accumulate;
};

// Which GEMV a case runs, and for the streamed one its grid (any grid gives the same y).
struct SimtGemv {
  GemvKernel kernel;
  int stream_blocks = 1;
};
std::string Name(const SimtGemv& g) {
  switch (g.kernel) {
    case GemvKernel::kCudaCores: return "CUDA cores";
    case GemvKernel::kCudaCoresPipelined: return "CUDA cores pipelined";
    case GemvKernel::kCudaCoresStreamed: return "CUDA cores streamed, " + std::to_string(g.stream_blocks) + " blocks";
    case GemvKernel::kTensorCores: return "tensor cores";
  }
  return "?";
}
// The kernels every GEMV case runs: the streamed one on grids of one block (every group in turn),
// two and three (groups strided over blocks), and more blocks than groups. The pipelined one last:
// BothGemvs... compares it with the first bit for bit.
const SimtGemv kSimtGemvs[] = {{GemvKernel::kCudaCores},
                               {GemvKernel::kCudaCoresStreamed, 1},
                               {GemvKernel::kCudaCoresStreamed, 2},
                               {GemvKernel::kCudaCoresStreamed, 3},
                               {GemvKernel::kCudaCoresStreamed, 40},
                               {GemvKernel::kTensorCores},
                               {GemvKernel::kCudaCoresPipelined}};

template <int kRows, GemvX kOp>
void LaunchSimtGemvRows(const SimtGemv& g, bool vec, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                        const GemvInput& x, const float* bias, float beta, float* y) {
  const int blocks = static_cast<int>((out + kGemvSimtOutPerBlock - 1) / kGemvSimtOutPerBlock);
  const bool early = kOp != GemvX::kPlain;  // either value of the flag, on the way
  if (g.kernel == GemvKernel::kCudaCoresStreamed && vec) {
    Launch(Dim3(g.stream_blocks), Dim3(kGemvSimtThreads), GemvStreamKernel<kRows, kOp>, w, ld, in, out, x, bias, beta,
           y, early);
  } else if (g.kernel == GemvKernel::kCudaCoresPipelined) {
    if constexpr (kOp == GemvX::kPlain) {
      Launch(Dim3(blocks), Dim3(kGemvSimtThreads),
             vec ? GemvSimtKernel<kRows, true, kOp, true> : GemvSimtKernel<kRows, false, kOp, true>, w, ld, in, out, x,
             bias, beta, y, early);
    } else {
      Launch(Dim3(blocks), Dim3(kGemvSimtThreads), GemvSimtKernel<kRows, true, kOp, true>, w, ld, in, out, x, bias,
             beta, y, early);
    }
  } else if constexpr (kOp == GemvX::kPlain) {
    Launch(Dim3(blocks), Dim3(kGemvSimtThreads), vec ? GemvSimtKernel<kRows, true> : GemvSimtKernel<kRows, false>,
           w, ld, in, out, x, bias, beta, y, early);
  } else {
    Launch(Dim3(blocks), Dim3(kGemvSimtThreads), GemvSimtKernel<kRows, true, kOp>, w, ld, in, out, x, bias, beta, y,
           early);
  }
}
template <GemvX kOp>
void LaunchSimtGemvOp(const SimtGemv& g, int rows, bool vec, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                      const GemvInput& x, const float* bias, float beta, float* y) {
  switch (rows) {
    case 1: return LaunchSimtGemvRows<1, kOp>(g, vec, w, ld, in, out, x, bias, beta, y);
    case 2: return LaunchSimtGemvRows<2, kOp>(g, vec, w, ld, in, out, x, bias, beta, y);
    case 3: return LaunchSimtGemvRows<3, kOp>(g, vec, w, ld, in, out, x, bias, beta, y);
    case 4: return LaunchSimtGemvRows<4, kOp>(g, vec, w, ld, in, out, x, bias, beta, y);
    case 5: return LaunchSimtGemvRows<5, kOp>(g, vec, w, ld, in, out, x, bias, beta, y);
    case 6: return LaunchSimtGemvRows<6, kOp>(g, vec, w, ld, in, out, x, bias, beta, y);
    case 7: return LaunchSimtGemvRows<7, kOp>(g, vec, w, ld, in, out, x, bias, beta, y);
    default: return LaunchSimtGemvRows<8, kOp>(g, vec, w, ld, in, out, x, bias, beta, y);
  }
}
// A GEMV (the tensor cores', or a CUDA-cores one for `rows`), with x's op. The streamed kernel
// takes only whole 16-byte vectors of x (vec); otherwise the one-pass kernel runs, as on a GPU.
void LaunchSimtGemv(const SimtGemv& g, int rows, bool vec, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                    const GemvInput& x, const float* bias, float beta, float* y) {
  if (g.kernel == GemvKernel::kTensorCores) {
    const int blocks = static_cast<int>((out + kGemvMmaOutPerBlock - 1) / kGemvMmaOutPerBlock);
    const Dim3 grid(blocks), block(kGemvMmaThreads);
    switch (x.op) {
      case GemvX::kPlain:
        Launch(grid, block, vec ? GemvMmaKernel<true> : GemvMmaKernel<false>, w, ld, in, out, x, rows, bias, beta, y,
               false);
        return;
      case GemvX::kRmsNorm:
        Launch(grid, block, GemvMmaKernel<true, GemvX::kRmsNorm>, w, ld, in, out, x, rows, bias, beta, y, true);
        return;
      case GemvX::kSiluMul:
        Launch(grid, block, GemvMmaKernel<true, GemvX::kSiluMul>, w, ld, in, out, x, rows, bias, beta, y, true);
        return;
    }
  }
  switch (x.op) {
    case GemvX::kPlain: return LaunchSimtGemvOp<GemvX::kPlain>(g, rows, vec, w, ld, in, out, x, bias, beta, y);
    case GemvX::kRmsNorm: return LaunchSimtGemvOp<GemvX::kRmsNorm>(g, rows, vec, w, ld, in, out, x, bias, beta, y);
    case GemvX::kSiluMul: return LaunchSimtGemvOp<GemvX::kSiluMul>(g, rows, vec, w, ld, in, out, x, bias, beta, y);
  }
}

// bf16 weight rows [out, ld] (zero past `in`) in 16-byte aligned storage, from N(0, 1) values.
std::vector<Chunk16> GemvWeight(int64_t out, int64_t in, int64_t ld, uint32_t seed) {
  std::vector<Chunk16> store(static_cast<size_t>(out * ld / 8));
  uint16_t* w = reinterpret_cast<uint16_t*>(store.data());
  const std::vector<float> wv = RandomNormal(out * in, seed);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t c = 0; c < ld; ++c) w[o * ld + c] = c < in ? core::FloatToBf16(wv[o * in + c]) : 0;
  }
  return store;
}

TEST(LinearKernelsOnSimtTest, BothGemvsMatchADoubleReferenceOnTheBf16RoundedInputs) {
  const GemvCase cases[] = {
      {1, 2048, 19, 0, true, false},  // one pass of the block's warps, a ragged last block
      {1, 4104, 8, 0, false, true},   // more than one pass of either kernel's warps (513 chunks)
      {2, 4104, 21, 0, true, false},  // streamed: several groups of several passes each
      {2, 40, 3, 0, true, true},      // fewer outputs than a block owns
      {3, 1000, 17, 1, false, false}, // x not 16-byte aligned: element loads
      {3, 4100, 9, 1, false, false},  // element loads over three passes, the last one chunk, partly past `in`
      {5, 13, 9, 0, true, true},      // in % 8 != 0: the last chunk is partly past `in`
      {7, 64, 16, 0, false, false},
      {8, 2056, 33, 0, true, true},
      {8, 21, 5, 3, true, false},
  };
  uint32_t seed = 700;
  // Under a sanitizer: one pass with a ragged last block, streamed passes, fewer outputs than a
  // block owns, element loads over three passes, a chunk past `in`, eight rows off alignment.
  for (const GemvCase& k : testing::SimtCases(cases, {0, 2, 3, 5, 6, 9})) {
    SCOPED_TRACE(::testing::Message() << "rows " << k.rows << ", in " << k.in << ", out " << k.out << ", x offset "
                                      << k.x_offset << (k.bias ? ", bias" : "") << (k.accumulate ? ", accumulate" : ""));
    const int64_t ld = (k.in + 7) / 8 * 8;
    const std::vector<Chunk16> w_store = GemvWeight(k.out, k.in, ld, seed++);
    const uint16_t* w = reinterpret_cast<const uint16_t*>(w_store.data());
    std::vector<Float4> x_store(static_cast<size_t>((k.rows * k.in + k.x_offset + 3) / 4));
    float* x = reinterpret_cast<float*>(x_store.data()) + k.x_offset;
    const std::vector<float> xv = RandomNormal(k.rows * k.in, seed++);
    std::copy(xv.begin(), xv.end(), x);
    const std::vector<float> bias = RandomNormal(k.out, seed++);
    std::vector<float> y0 = RandomNormal(k.rows * k.out, seed++);
    const float* b = k.bias ? bias.data() : nullptr;
    const float beta = k.accumulate ? 1.f : 0.f;
    const bool vec = k.in % 8 == 0 && k.x_offset % 4 == 0;
    std::vector<float> cuda_cores_y;
    for (const SimtGemv& g : kSimtGemvs) {
      SCOPED_TRACE(Name(g));
      // Without accumulate, y holds NaNs the kernel must not read.
      std::vector<float> y = k.accumulate ? y0 : std::vector<float>(y0.size(), NAN);
      LaunchSimtGemv(g, k.rows, vec, w, ld, k.in, k.out, GemvInput{x}, b, beta, y.data());
      // Pipelining moves the loads, not the products: the CUDA-core kernel's y exactly.
      if (g.kernel == GemvKernel::kCudaCores) cuda_cores_y = y;
      if (g.kernel == GemvKernel::kCudaCoresPipelined) {
        EXPECT_EQ(y, cuda_cores_y);
      }
      for (int r = 0; r < k.rows; ++r) {
        for (int64_t o = 0; o < k.out; ++o) {
          double dot = 0, scale = 0;
          for (int64_t c = 0; c < k.in; ++c) {
            const double p = static_cast<double>(core::Bf16ToFloat(core::FloatToBf16(xv[r * k.in + c]))) *
                             core::Bf16ToFloat(w[o * ld + c]);
            dot += p;
            scale += std::fabs(p);
          }
          if (k.bias) dot += bias[o], scale += std::fabs(bias[o]);
          if (k.accumulate) dot += y0[r * k.out + o], scale += std::fabs(y0[r * k.out + o]);
          ASSERT_NEAR(y[r * k.out + o], dot, 3e-6 * scale) << "row " << r << ", output " << o;
        }
      }
    }
  }
}

// What a GEMV block of `blockDim.x` threads reads as x after its prologue, written out in f32
// (before the bf16 rounding, where a one-ulp change of the norm's statistics shows).
template <GemvX kOp>
IRIS_GLOBAL void GemvXReadKernel(GemvInput x, int rows, int64_t in, float* out) {
  IRIS_SHARED float partials[kGemvNormPartials];
  IRIS_SHARED float inv[kGemvMaxRows];
  GemvPrologue<kOp>(x, rows, in, partials, inv);
  for (int r = 0; r < rows; ++r) {
    for (int64_t c = threadIdx.x; c < in / 8; c += blockDim.x) {
      float v[8];
      GemvXLoad<true, kOp>(x, r, c, in, inv, v);
      for (int e = 0; e < 8; ++e) out[r * in + 8 * c + e] = v[e];
    }
  }
  SyncThreads();  // the shared slots are read before a next block (harness) reuses them
}

// The ops a GEMV folds into its read of x (RMSNorm before qkv and gate_up, SiLU·mul before down)
// give the same y, bit for bit, as the op's own kernel writing f32 rows and the plain GEMV reading
// them (and the x a block reads is the op's f32 output exactly, before its rounding): every row
// count of both GEMVs; hidden sizes whose norm kernel is one warp (64), four
// (2048), seven (3584: this block's warps take several (row, warp) pairs) and eleven (5120,
// fewer warps in the GEMV block than in the norm's); several blocks and a ragged last one.
TEST(LinearKernelsOnSimtTest, FoldedOpsGiveTheOpKernelThenTheGemvBitForBit) {
  struct Case {
    int rows;
    int64_t in, out;
  };
  const Case cases[] = {{1, 2048, 9}, {2, 64, 17}, {3, 3584, 9}, {4, 5120, 8}, {5, 1280, 16},
                        {6, 64, 17}, {7, 2048, 5}, {8, 3584, 12}};
  uint32_t seed = 900;
  // Under a sanitizer: one pass, fewer columns than a block's lanes, two passes, six rows.
  for (const Case& k : testing::SimtCases(cases, {0, 1, 2, 5})) {
    SCOPED_TRACE(::testing::Message() << "rows " << k.rows << ", in " << k.in << ", out " << k.out);
    const std::vector<Chunk16> w_store = GemvWeight(k.out, k.in, k.in, seed++);
    const uint16_t* w = reinterpret_cast<const uint16_t*>(w_store.data());
    const std::vector<float> x = RandomNormal(k.rows * k.in, seed++, 2.f), norm_w = RandomNormal(k.in, seed++);
    const std::vector<float> gu = RandomNormal(k.rows * 2 * k.in, seed++, 3.f), bias = RandomNormal(k.out, seed++);
    const std::vector<float> y0 = RandomNormal(k.rows * k.out, seed++);
    const float eps = 1e-6f;

    const int norm_threads = RmsNormVecThreads(x.data(), norm_w.data(), x.data(), k.in);
    ASSERT_GT(norm_threads, 0);
    std::vector<float> normed(x.size()), act(static_cast<size_t>(k.rows * k.in));
    Launch(Dim3(k.rows), Dim3(norm_threads), RmsNormVecKernel<F32Rows>, x.data(), norm_w.data(), k.in, eps,
           F32Rows{normed.data(), k.in});
    Launch(Dim3(3, 2), Dim3(64), SiluMulRows4Kernel<F32In, F32Rows>, F32In{gu.data(), 2 * k.in}, int64_t{k.rows},
           k.in, F32Rows{act.data(), k.in});
    const GemvInput folded_norm{x.data(), GemvX::kRmsNorm, norm_w.data(), eps, norm_threads};
    const GemvInput folded_silu{gu.data(), GemvX::kSiluMul};
    for (const int threads : {kGemvSimtThreads, kGemvMmaThreads}) {  // the x each block reads, in f32
      std::vector<float> read(x.size(), NAN);
      Launch(Dim3(1), Dim3(threads), GemvXReadKernel<GemvX::kRmsNorm>, folded_norm, k.rows, k.in, read.data());
      EXPECT_EQ(read, normed) << "normalised x read by a block of " << threads;
      Launch(Dim3(1), Dim3(threads), GemvXReadKernel<GemvX::kSiluMul>, folded_silu, k.rows, k.in, read.data());
      EXPECT_EQ(read, act) << "silu_mul x read by a block of " << threads;
    }
    // One grid of the streamed kernel here: BothGemvs... above runs the others.
    for (const SimtGemv& g : {kSimtGemvs[0], kSimtGemvs[3], kSimtGemvs[5], kSimtGemvs[6]}) {
      SCOPED_TRACE(Name(g));
      for (const auto& [unfolded, folded, name] :
           {std::tuple{GemvInput{normed.data()}, folded_norm, "rms_norm"}, {GemvInput{act.data()}, folded_silu, "silu_mul"}}) {
        std::vector<float> want = y0, got = y0;
        LaunchSimtGemv(g, k.rows, true, w, k.in, k.in, k.out, unfolded, bias.data(), 1.f, want.data());
        LaunchSimtGemv(g, k.rows, true, w, k.in, k.in, k.out, folded, bias.data(), 1.f, got.data());
        EXPECT_EQ(got, want) << name;
        EXPECT_NE(got, y0) << name;
      }
    }
  }
}

// The qkv GEMV with the decode step's rotary and KV write as its epilogue gives what the GEMV then
// RotaryQKWriteKvKernel give, bit for bit: y (q and k rotated in place, v as the GEMV wrote it)
// and both pools, for every row count it takes, x plain and RMSNorm-folded, the one-pass and the
// pipelined loop, with and without bias, a padding row (kPadSlot: rotated, nothing stored) and
// shuffled slots; head dims 8 (one block a head), 16, 24 and 128, GQA 2/1, 3/1 and 4/2, inputs of
// one pass and of two (3584 columns: 448 chunks over 256 lanes).
struct RotaryGemvCase {
  int rows, q_heads, k_heads, head_dim;
  int64_t in;
};

template <int kRows, GemvX kOp, bool kPipelined, typename T>
void CheckGemvRotaryKvRows(const RotaryGemvCase& k, T marker, bool with_bias, uint32_t seed) {
  const int hd = k.head_dim, half = hd / 2;
  const int64_t out = static_cast<int64_t>(k.q_heads + 2 * k.k_heads) * hd, width = int64_t{k.k_heads} * hd;
  const int64_t num_slots = 3 * kRows + 1;
  const std::vector<Chunk16> w_store = GemvWeight(out, k.in, k.in, seed);
  const uint16_t* w = reinterpret_cast<const uint16_t*>(w_store.data());
  std::vector<Float4> x_store(static_cast<size_t>(kRows * k.in / 4));
  float* x = reinterpret_cast<float*>(x_store.data());
  const std::vector<float> xv = RandomNormal(kRows * k.in, seed + 1, 2.f);
  std::copy(xv.begin(), xv.end(), x);
  std::vector<Float4> norm_store(static_cast<size_t>(k.in / 4));
  const std::vector<float> nv = RandomNormal(k.in, seed + 2);
  std::copy(nv.begin(), nv.end(), reinterpret_cast<float*>(norm_store.data()));
  const float* norm_w = reinterpret_cast<const float*>(norm_store.data());
  const std::vector<float> bias = RandomNormal(out, seed + 3);
  const float* b = with_bias ? bias.data() : nullptr;
  const std::vector<float> cos = RandomNormal(kRows * half, seed + 4), sin = RandomNormal(kRows * half, seed + 5);
  std::vector<int64_t> slots(kRows);
  for (int r = 0; r < kRows; ++r) slots[r] = (3 * r + 2) % num_slots;  // distinct: 3 and 3 kRows + 1 are coprime
  if (kRows > 1) slots[1] = kPadSlot;
  GemvInput gx{x};
  if constexpr (kOp == GemvX::kRmsNorm) {
    gx = GemvInput{x, GemvX::kRmsNorm, norm_w, 1e-6f, RmsNormVecThreads(x, norm_w, x, k.in)};
    ASSERT_GT(gx.norm_threads, 0);
  }
  const bool early = kRows % 2 == 0;  // either value of the flag, on the way

  // The GEMV, then the separate rotary + KV write (a row's work over 3 blocks of 96).
  std::vector<float> want(static_cast<size_t>(kRows * out), NAN);
  std::vector<T> want_k(static_cast<size_t>(num_slots * width), marker), want_v = want_k;
  Launch(Dim3(static_cast<int>((out + kGemvSimtOutPerBlock - 1) / kGemvSimtOutPerBlock)), Dim3(kGemvSimtThreads),
         GemvSimtKernel<kRows, true, kOp, kPipelined>, w, k.in, k.in, out, gx, b, 0.f, want.data(), early);
  float* wq = want.data();
  Launch(Dim3(kRows, 3), Dim3(96), RotaryQKWriteKvKernel<T>, wq, out, k.q_heads, wq + k.q_heads * hd, out, k.k_heads,
         hd, cos.data(), sin.data(), static_cast<const float*>(wq + (k.q_heads + k.k_heads) * hd), out,
         static_cast<const int64_t*>(slots.data()), num_slots, want_k.data(), want_v.data());

  std::vector<float> got(want.size(), NAN);
  std::vector<T> got_k(want_k.size(), marker), got_v = got_k;
  GemvRotaryKv rot;
  rot.q_heads = k.q_heads;
  rot.k_heads = k.k_heads;
  rot.head_dim = hd;
  rot.cos = cos.data();
  rot.sin = sin.data();
  rot.slots = slots.data();
  rot.num_slots = num_slots;
  rot.k_pool = got_k.data();
  rot.v_pool = got_v.data();
  rot.bf16_pool = sizeof(T) == 2;
  Launch(Dim3(static_cast<int>(GemvRotaryKvBlocks(rot))), Dim3(kGemvSimtThreads),
         GemvSimtRotaryKvKernel<kRows, kOp, kPipelined>, w, k.in, k.in, out, gx, b, got.data(), early, rot);
  EXPECT_EQ(got, want) << "qkv rows";
  EXPECT_EQ(got_k, want_k) << "k pool";
  EXPECT_EQ(got_v, want_v) << "v pool";
  EXPECT_NE(got_k, std::vector<T>(got_k.size(), marker)) << "some k stored";
}

template <GemvX kOp, bool kPipelined, typename T>
void CheckGemvRotaryKvOp(const RotaryGemvCase& k, T marker, bool with_bias, uint32_t seed) {
  static_assert(kGemvRotaryKvMaxRows == 4, "a case per row count");
  switch (k.rows) {
    case 1: return CheckGemvRotaryKvRows<1, kOp, kPipelined>(k, marker, with_bias, seed);
    case 2: return CheckGemvRotaryKvRows<2, kOp, kPipelined>(k, marker, with_bias, seed);
    case 3: return CheckGemvRotaryKvRows<3, kOp, kPipelined>(k, marker, with_bias, seed);
    default: return CheckGemvRotaryKvRows<4, kOp, kPipelined>(k, marker, with_bias, seed);
  }
}

// Each pool type runs two of the four (op, loop) pairs, the first also without bias: between them,
// every pair on some pool, and both ops and both loops on each pool.
template <typename T>
void CheckGemvRotaryKv(T marker) {
  const RotaryGemvCase cases[] = {{1, 2, 1, 128, 2048}, {2, 3, 1, 8, 64}, {3, 4, 2, 24, 3584}, {4, 2, 1, 16, 1280}};
  constexpr bool kBf16 = sizeof(T) == 2;
  // The one-pass loop's op, and the pipelined loop's (the other one).
  constexpr GemvX kOnePassOp = kBf16 ? GemvX::kRmsNorm : GemvX::kPlain;
  constexpr GemvX kPipelinedOp = kBf16 ? GemvX::kPlain : GemvX::kRmsNorm;
  uint32_t seed = kBf16 ? 1500 : 1100;
  for (const RotaryGemvCase& k : cases) {
    for (const bool with_bias : {true, false}) {
      if (!with_bias && testing::kSimtSanitized) continue;  // the same loads and barriers, one branch fewer
      SCOPED_TRACE(::testing::Message() << k.rows << " rows, " << k.q_heads << "/" << k.k_heads << " heads of "
                                        << k.head_dim << ", in " << k.in << (with_bias ? ", bias" : ""));
      {
        SCOPED_TRACE(kBf16 ? "rms_norm x, one pass at a time" : "plain x, one pass at a time");
        CheckGemvRotaryKvOp<kOnePassOp, false>(k, marker, with_bias, seed += 10);
      }
      if (!with_bias) continue;
      SCOPED_TRACE(kBf16 ? "plain x, pipelined" : "rms_norm x, pipelined");
      CheckGemvRotaryKvOp<kPipelinedOp, true>(k, marker, with_bias, seed += 10);
    }
  }
}

TEST(LinearKernelsOnSimtTest, QkvGemvWithRotaryEpilogueEqualsTheGemvThenTheRotaryBitForBitF32Pool) {
  CheckGemvRotaryKv<float>(-7.f);
}

TEST(LinearKernelsOnSimtTest, QkvGemvWithRotaryEpilogueEqualsTheGemvThenTheRotaryBitForBitBf16Pool) {
  CheckGemvRotaryKv<uint16_t>(uint16_t{0x7F7F});
}

#ifdef IRIS_HAVE_CUDA
// What the rotary GEMV takes: the CUDA-core kernels, 1..4 rows, head dims of whole 8s, the qkv
// layout, plain or RMSNorm-folded whole-vector x, and every table.
TEST(LinearKernelsTest, GemvRotaryKvTakesOnlyItsLayout) {
  alignas(16) static float x[64];
  alignas(16) static float norm[64];
  alignas(16) static uint16_t w[64 * 64];
  static float table[8];
  static int64_t slots[4];
  static uint16_t pool[64];
  GemvRotaryKv rot;
  rot.q_heads = 4;
  rot.k_heads = 2;
  rot.head_dim = 8;
  rot.cos = rot.sin = table;
  rot.slots = slots;
  rot.num_slots = 4;
  rot.k_pool = rot.v_pool = pool;
  const int64_t out = 64;
  const GemvInput plain{x};
  EXPECT_TRUE(GemvRotaryKvTakes(GemvKernel::kCudaCores, w, 64, 64, out, plain, 1, rot));
  EXPECT_TRUE(GemvRotaryKvTakes(GemvKernel::kCudaCoresPipelined, w, 64, 64, out, plain, 4, rot));
  EXPECT_TRUE(GemvRotaryKvTakes(GemvKernel::kCudaCores, w, 64, 64, out,
                                GemvInput{x, GemvX::kRmsNorm, norm, 1e-6f}, 2, rot));
  EXPECT_FALSE(GemvRotaryKvTakes(GemvKernel::kTensorCores, w, 64, 64, out, plain, 1, rot));
  EXPECT_FALSE(GemvRotaryKvTakes(GemvKernel::kCudaCoresStreamed, w, 64, 64, out, plain, 1, rot));
  EXPECT_FALSE(GemvRotaryKvTakes(GemvKernel::kCudaCores, w, 64, 64, out, plain, 5, rot)) << "rows";
  EXPECT_FALSE(GemvRotaryKvTakes(GemvKernel::kCudaCores, w, 64, 64, out, plain, 0, rot)) << "rows";
  EXPECT_FALSE(GemvRotaryKvTakes(GemvKernel::kCudaCores, w, 64, 64, out - 8, plain, 1, rot)) << "out";
  EXPECT_FALSE(GemvRotaryKvTakes(GemvKernel::kCudaCores, w, 64, 64, out, GemvInput{x, GemvX::kSiluMul}, 1, rot));
  EXPECT_FALSE(GemvRotaryKvTakes(GemvKernel::kCudaCores, w, 64, 64, out, GemvInput{x + 1}, 1, rot)) << "x alignment";
  EXPECT_FALSE(GemvRotaryKvTakes(GemvKernel::kCudaCores, w, 64, 60, out, plain, 1, rot)) << "in % 8";
  GemvRotaryKv odd = rot;
  odd.head_dim = 4;
  odd.q_heads = 8;
  odd.k_heads = 4;  // out still 64, but a head dim of 4 is half a block's four pairs
  EXPECT_FALSE(GemvRotaryKvTakes(GemvKernel::kCudaCores, w, 64, 64, out, plain, 1, odd));
  GemvRotaryKv no_slots = rot;
  no_slots.slots = nullptr;
  EXPECT_FALSE(GemvRotaryKvTakes(GemvKernel::kCudaCores, w, 64, 64, out, plain, 1, no_slots));
}

// The H200's measurements as a rule (linear_kernels.h): one row always on the CUDA cores (the
// 3b's down too: streamed, its step was slower); more rows only for
// small weights (the 3b's qkv 10.5 MB, not its gate_up 90 MB), the tensor cores past 4 rows;
// never past the limit.
TEST(LinearKernelsTest, PickGemvFollowsRowsAndWeightShape) {
  GemvKernel k = GemvKernel::kTensorCores;
  ASSERT_TRUE(PickGemv(1, 22016, 2048, 8, &k));  // gate_up
  EXPECT_EQ(k, GemvKernel::kCudaCores);
  ASSERT_TRUE(PickGemv(1, 2048, 2048, 8, &k));  // o
  EXPECT_EQ(k, GemvKernel::kCudaCores);
  ASSERT_TRUE(PickGemv(1, 2048, 11008, 8, &k));  // down
  EXPECT_EQ(k, GemvKernel::kCudaCores);
  ASSERT_TRUE(PickGemv(4, 2560, 2048, 8, &k));  // qkv
  EXPECT_EQ(k, GemvKernel::kCudaCores);
  ASSERT_TRUE(PickGemv(5, 2560, 2048, 8, &k));
  EXPECT_EQ(k, GemvKernel::kTensorCores);
  EXPECT_FALSE(PickGemv(5, 2048, 11008, 8, &k));  // down: 45 MB, past 32 MiB
  EXPECT_FALSE(PickGemv(2, 22016, 2048, 8, &k));
  EXPECT_FALSE(PickGemv(9, 2560, 2048, 8, &k));
  EXPECT_FALSE(PickGemv(1, 2560, 2048, 0, &k));
  EXPECT_FALSE(PickGemv(5, 2560, 2048, 4, &k));
}
#endif

// The weight prefetch asks for every byte of its range once, in pieces the bulk instruction takes
// (16-byte aligned starts, sizes multiples of 16 up to the piece size), whatever the grid: one
// piece or less, a piece and a bit, more pieces than threads (the loop goes round).
TEST(LinearKernelsOnSimtTest, PrefetchAsksForEveryByteOnceInPiecesTheInstructionTakes) {
  const int64_t piece = kPrefetchPieceBytes;
  std::vector<Chunk16> store(static_cast<size_t>(40 * piece / 16 + 1));
  const char* base = reinterpret_cast<const char*>(store.data());
  simt::PrefetchLog& log = simt::Prefetches();
  for (const int64_t bytes : {int64_t{16}, int64_t{4096}, piece, piece + 16, 5 * piece + 48, 40 * piece}) {
    for (const auto& [blocks, threads] : {std::pair{1, 32}, {2, 32}, {3, 64}}) {
      SCOPED_TRACE(::testing::Message() << bytes << " bytes, " << blocks << " x " << threads);
      {
        std::lock_guard<std::mutex> lock(log.mu);
        log.ranges.clear();
      }
      log.on = true;
      Launch(Dim3(blocks), Dim3(threads), PrefetchL2Kernel, base + 16, bytes);
      log.on = false;
      std::vector<simt::PrefetchRange> got = log.ranges;
      std::sort(got.begin(), got.end(), [](const auto& a, const auto& b) { return a.p < b.p; });
      const char* next = base + 16;
      for (const simt::PrefetchRange& r : got) {
        ASSERT_EQ(static_cast<const char*>(r.p), next) << "gap or overlap";
        ASSERT_EQ(reinterpret_cast<uintptr_t>(r.p) % 16, 0u);
        ASSERT_GT(r.bytes, 0u);
        ASSERT_EQ(r.bytes % 16, 0u);
        ASSERT_LE(static_cast<int64_t>(r.bytes), piece);
        next += r.bytes;
      }
      EXPECT_EQ(next, base + 16 + bytes);
    }
  }
}

TEST(LinearKernelsOnSimtTest, ReadSumAddsEveryElementOnce) {
  // Values in quarters: every partial sum is exact in f32, so the total must be exact too.
  for (const auto& [n4, blocks, threads] : {std::tuple{1001, 3, 64}, {5, 2, 32}, {4096, 4, 128}}) {
    SCOPED_TRACE(::testing::Message() << n4 << " float4s, " << blocks << " blocks of " << threads);
    std::vector<Float4> x(n4);
    double want = 0;
    for (int i = 0; i < n4; ++i) {
      x[i] = Float4{0.25f * (i % 8), 0.5f, 0.25f * (i % 3), 1.f};
      want += x[i].x + x[i].y + x[i].z + x[i].w;
    }
    std::vector<float> partials(blocks, NAN);
    Launch(Dim3(blocks), Dim3(threads), ReadSumKernel, static_cast<const Float4*>(x.data()), int64_t{n4},
           partials.data());
    double got = 0;
    for (float p : partials) got += p;
    EXPECT_EQ(got, want);
  }
}

}  // namespace
}  // namespace iris::kernels::cuda
