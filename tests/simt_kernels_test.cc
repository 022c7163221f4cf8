// iris's CUDA kernels' device code, run by the SIMT harness (kernels/cuda/simt.h) on the CPU and
// checked against the CPU kernels on odd sizes: no GPU needed, so CI checks the kernels' logic
// (indexing, reductions, shuffles, barriers). The same source runs on a GPU in cuda_kernels_test (label gpu).
// (Not named cuda_*: that prefix means label gpu, and this suite is for machines without one.)
#include "kernels/cuda/kernels.cuh"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/tensor.h"
#include "kernels/device.h"
#include "kernels/elementwise.h"
#include "kernels/logit_edits.h"
#include "kernels/paged_attention.h"
#include "kernels/patch_rows.h"
#include "kernels/qkv_pad.h"
#include "kernels/rotary.h"
#include "kernels/rows.h"
#include "tests/kernel_cases.h"
#include "tests/simt_sanitized.h"

namespace iris::kernels::cuda {
namespace {

using testing::ActivationInputs;
using testing::ExpectCloseRel;
using testing::ExpectSameBits;
using testing::RandomNormal;

// --- the harness itself ---

IRIS_GLOBAL void NeighbourKernel(int* out) {
  IRIS_SHARED int slots[96];
  const int t = static_cast<int>(threadIdx.x);
  slots[t] = static_cast<int>(blockIdx.x) * 1000 + t;
  SyncThreads();
  out[blockIdx.x * blockDim.x + t] = slots[(t + 1) % blockDim.x];
}

TEST(SimtHarnessTest, SyncThreadsMakesEveryWriteVisibleAndBlocksKeepTheirOwnShared) {
  std::vector<int> out(5 * 96, -1);
  Launch(Dim3(5), Dim3(96), NeighbourKernel, out.data());
  for (int b = 0; b < 5; ++b) {
    for (int t = 0; t < 96; ++t) EXPECT_EQ(out[b * 96 + t], b * 1000 + (t + 1) % 96) << b << "," << t;
  }
}

IRIS_GLOBAL void WarpSumKernel(const float* in, float* out) {
  float v = in[threadIdx.x];
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v += ShflXor(v, m);
  out[threadIdx.x] = v;
}

TEST(SimtHarnessTest, ShflXorIsAButterflyWithinEachWarp) {
  std::vector<float> in(64), out(64);
  for (int i = 0; i < 64; ++i) in[i] = static_cast<float>(i);
  Launch(Dim3(1), Dim3(64), WarpSumKernel, in.data(), out.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], 31 * 32 / 2) << i;            // 0 + ... + 31
  for (int i = 32; i < 64; ++i) EXPECT_EQ(out[i], (32 + 63) * 32 / 2) << i;  // 32 + ... + 63
}

IRIS_GLOBAL void IndexKernel(int* out) {
  const int block = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const int thread = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  out[block * blockDim.x * blockDim.y * blockDim.z + thread] += 1;
}

TEST(SimtHarnessTest, EveryThreadOfEveryBlockRunsOnceIn3D) {
  std::vector<int> out(3 * 2 * 2 * 32 * 2 * 1, 0);
  Launch(Dim3(3, 2, 2), Dim3(32, 2, 1), IndexKernel, out.data());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], 1) << i;
}

// --- the kernels against the CPU ops ---

TEST(CudaKernelsOnSimtTest, RmsNormMatchesTheCpuKernel) {
  Device& cpu = DefaultCpuDevice();
  for (const auto& [rows, dim, threads] : {std::tuple{3, 1, 32}, {5, 77, 64}, {2, 1280, 128}, {4, 2051, 256}}) {
    const std::vector<float> x = RandomNormal(static_cast<size_t>(rows) * dim, 1 + dim), w = RandomNormal(dim, 2 + dim);
    std::vector<float> want(x.size()), got(x.size());
    RmsNorm(cpu, x.data(), w.data(), rows, dim, 1e-6f, want.data());
    Launch(Dim3(rows), Dim3(threads), RmsNormKernel<F32Rows>, x.data(), w.data(), int64_t{dim}, 1e-6f,
           F32Rows{got.data(), dim});
    ExpectCloseRel(got, want, 2e-6f, "rms_norm");
  }
}

// The register-kept form, where rows are whole 16-byte vectors: a block of fewer threads than
// vectors (several per thread), the decoder's hidden size in one warp-rounded block, a dim whose
// last thread has a partial share, and the limit of 1024 threads; unaligned or ragged rows are
// refused (the strided kernel takes them). In place as the model calls it.
TEST(CudaKernelsOnSimtTest, RmsNormVecMatchesTheCpuKernel) {
  Device& cpu = DefaultCpuDevice();
  for (const auto& [rows, dim] : {std::pair{3, 4}, {2, 2048}, {4, 1284}, {1, 16384}}) {
    std::vector<float> x = RandomNormal(static_cast<size_t>(rows) * dim, 5 + dim);
    const std::vector<float> w = RandomNormal(dim, 6 + dim);
    std::vector<float> want(x.size());
    RmsNorm(cpu, x.data(), w.data(), rows, dim, 1e-6f, want.data());
    const int threads = RmsNormVecThreads(x.data(), w.data(), x.data(), dim);
    ASSERT_GT(threads, 0) << dim;
    EXPECT_EQ(threads % kWarpSize, 0);
    EXPECT_GE(threads * 4 * kRmsNormVecs, dim);
    Launch(Dim3(rows), Dim3(threads), RmsNormVecKernel<F32Rows>, x.data(), w.data(), int64_t{dim}, 1e-6f,
           F32Rows{x.data(), dim});
    ExpectCloseRel(x, want, 2e-6f, "rms_norm vec");
  }
  std::vector<float> buf(64);
  EXPECT_EQ(RmsNormVecThreads(buf.data() + 1, buf.data(), buf.data(), 8), 0) << "unaligned x";
  EXPECT_EQ(RmsNormVecThreads(buf.data(), buf.data(), buf.data(), 10), 0) << "ragged row";
  EXPECT_EQ(RmsNormVecThreads(buf.data(), buf.data(), buf.data(), 16384 + 4), 0) << "past 1024 threads";
}

TEST(CudaKernelsOnSimtTest, SiluMulRowsMatchesTheCpuKernel) {
  Device& cpu = DefaultCpuDevice();
  for (const auto& [rows, inter] : {std::pair{1, 1}, {3, 37}, {7, 3420}, {2, 64}}) {
    const std::vector<float> gu = RandomNormal(static_cast<size_t>(rows) * 2 * inter, 3 + inter, 3.f);
    std::vector<float> want(static_cast<size_t>(rows) * inter), got(want.size());
    SiluMulRows(cpu, gu.data(), rows, inter, want.data());
    Launch(Dim3(5), Dim3(64), SiluMulRowsKernel<F32In, F32Rows>, F32In{gu.data(), 2 * inter}, int64_t{rows},
           int64_t{inter}, F32Rows{got.data(), inter});
    ExpectCloseRel(got, want, 2e-6f, "silu_mul");
    if (inter % 4 == 0) {  // malloc'd storage is 16-byte aligned: the 4-wide kernel, bit for bit
      std::vector<float> got4(want.size(), NAN);
      Launch(Dim3(3, 2), Dim3(32), SiluMulRows4Kernel<F32In, F32Rows>, F32In{gu.data(), 2 * inter}, int64_t{rows},
             int64_t{inter}, F32Rows{got4.data(), inter});
      EXPECT_EQ(got4, got);
    }
  }
}

// Written as a matmul's bf16 input rows (Bf16Rows, a padded stride): each value the f32 kernel's
// output rounded by FloatToBf16, bit for bit, in both the strided and the vector kernels; the
// padding columns are left as they were.
TEST(CudaKernelsOnSimtTest, RmsNormAndSiluMulWriteBf16RowsAsTheF32KernelsRounded) {
  static constexpr uint16_t kUntouched = 0xABCD;
  const auto rounded = [](const std::vector<float>& f32, int64_t rows, int64_t cols, int64_t ld) {
    std::vector<uint16_t> out(static_cast<size_t>(rows * ld), kUntouched);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[r * ld + c] = FloatToBf16(f32[r * cols + c]);
    }
    return out;
  };
  for (const auto& [rows, dim, ld] : {std::tuple{3, 1280, 1288}, {2, 2048, 2048}, {4, 76, 80}}) {
    const std::vector<float> x = RandomNormal(static_cast<size_t>(rows) * dim, 7 + dim), w = RandomNormal(dim, 8 + dim);
    std::vector<float> f32(x.size());
    const int threads = RmsNormVecThreads(x.data(), w.data(), x.data(), dim);
    ASSERT_GT(threads, 0);
    Launch(Dim3(rows), Dim3(threads), RmsNormVecKernel<F32Rows>, x.data(), w.data(), int64_t{dim}, 1e-6f,
           F32Rows{f32.data(), dim});
    std::vector<uint16_t> got(static_cast<size_t>(rows * ld), kUntouched);
    Launch(Dim3(rows), Dim3(threads), RmsNormVecKernel<Bf16Rows>, x.data(), w.data(), int64_t{dim}, 1e-6f,
           Bf16Rows{got.data(), ld});
    EXPECT_EQ(got, rounded(f32, rows, dim, ld)) << "vector rms_norm, dim " << dim;
    Launch(Dim3(rows), Dim3(64), RmsNormKernel<F32Rows>, x.data(), w.data(), int64_t{dim}, 1e-6f,
           F32Rows{f32.data(), dim});
    std::fill(got.begin(), got.end(), kUntouched);
    Launch(Dim3(rows), Dim3(64), RmsNormKernel<Bf16Rows>, x.data(), w.data(), int64_t{dim}, 1e-6f,
           Bf16Rows{got.data(), ld});
    EXPECT_EQ(got, rounded(f32, rows, dim, ld)) << "strided rms_norm, dim " << dim;

    const int64_t inter = dim;
    const std::vector<float> gu = RandomNormal(static_cast<size_t>(rows) * 2 * inter, 9 + dim, 3.f);
    std::vector<float> act(static_cast<size_t>(rows * inter));
    Launch(Dim3(5), Dim3(64), SiluMulRowsKernel<F32In, F32Rows>, F32In{gu.data(), 2 * inter}, int64_t{rows}, inter,
           F32Rows{act.data(), inter});
    std::fill(got.begin(), got.end(), kUntouched);
    Launch(Dim3(3, 2), Dim3(32), SiluMulRows4Kernel<F32In, Bf16Rows>, F32In{gu.data(), 2 * inter}, int64_t{rows}, inter,
           Bf16Rows{got.data(), ld});
    EXPECT_EQ(got, rounded(act, rows, inter, ld)) << "4-wide silu_mul, inter " << inter;
    std::fill(got.begin(), got.end(), kUntouched);
    Launch(Dim3(5), Dim3(64), SiluMulRowsKernel<F32In, Bf16Rows>, F32In{gu.data(), 2 * inter}, int64_t{rows}, inter,
           Bf16Rows{got.data(), ld});
    EXPECT_EQ(got, rounded(act, rows, inter, ld)) << "silu_mul, inter " << inter;
  }
}

// From bf16 gate/up rows (the GPU's gated MLP hands gate_up's output over in bf16, strided rows
// of a matmul's output) to bf16 rows: each value is the f32 kernel's on the widened inputs,
// rounded, bit for bit, in the element, the 4-wide and (the vision tower's padded 3456, and 64)
// the 8-wide kernels; padding columns untouched.
TEST(CudaKernelsOnSimtTest, SiluMulFromBf16RowsIsTheF32KernelOnTheWidenedValues) {
  static constexpr uint16_t kUntouched = 0xABCD;
  int eight_wide = 0;
  for (const auto& [rows, inter, gu_ld, ld] :
       {std::tuple{3, int64_t{3420}, int64_t{6840}, int64_t{3424}}, {2, 64, 136, 64}, {5, 37, 75, 40},
        {3, 3456, 6912, 3456}}) {
    const std::vector<float> src = RandomNormal(static_cast<size_t>(rows * gu_ld), 11 + inter, 3.f);
    std::vector<uint16_t> gu(src.size());
    std::vector<float> widened(static_cast<size_t>(rows * 2 * inter));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < gu_ld; ++c) gu[r * gu_ld + c] = FloatToBf16(src[r * gu_ld + c]);
      for (int64_t c = 0; c < 2 * inter; ++c) widened[r * 2 * inter + c] = Bf16ToFloat(gu[r * gu_ld + c]);
    }
    std::vector<float> act(static_cast<size_t>(rows * inter));
    Launch(Dim3(5), Dim3(64), SiluMulRowsKernel<F32In, F32Rows>, F32In{widened.data(), 2 * inter}, int64_t{rows},
           inter, F32Rows{act.data(), inter});
    std::vector<uint16_t> want(static_cast<size_t>(rows * ld), kUntouched);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < inter; ++c) want[r * ld + c] = FloatToBf16(act[r * inter + c]);
    }
    std::vector<uint16_t> got(want.size(), kUntouched);
    Launch(Dim3(5), Dim3(64), SiluMulRowsKernel<Bf16In, Bf16Rows>, Bf16In{gu.data(), gu_ld}, int64_t{rows}, inter,
           Bf16Rows{got.data(), ld});
    EXPECT_EQ(got, want) << "silu_mul from bf16, inter " << inter;
    if (inter % 4 == 0 && gu_ld % 4 == 0) {
      std::fill(got.begin(), got.end(), kUntouched);
      Launch(Dim3(3, 2), Dim3(32), SiluMulRows4Kernel<Bf16In, Bf16Rows>, Bf16In{gu.data(), gu_ld}, int64_t{rows}, inter,
             Bf16Rows{got.data(), ld});
      EXPECT_EQ(got, want) << "4-wide silu_mul from bf16, inter " << inter;
    }
    if (SiluMulBf16Rows8Fits(gu.data(), gu_ld, inter, got.data(), ld)) {
      std::fill(got.begin(), got.end(), kUntouched);
      Launch(Dim3(3, 2), Dim3(32), SiluMulBf16Rows8Kernel, static_cast<const uint16_t*>(gu.data()), gu_ld,
             int64_t{rows}, inter, got.data(), ld);
      EXPECT_EQ(got, want) << "8-wide silu_mul from bf16, inter " << inter;
      ++eight_wide;
    }
  }
  EXPECT_EQ(eight_wide, 2) << "the 8-wide kernel takes 64 and 3456";
}

// The flat kernels run on 3 blocks of 64 threads: every size below needs the grid-stride loop.
constexpr unsigned kFlatBlocks = 3, kFlatThreads = 64;
constexpr int64_t kFlatSizes[] = {1, 77, 1280, 2051};

TEST(CudaKernelsOnSimtTest, SiluMulMatchesTheCpuKernel) {
  Device& cpu = DefaultCpuDevice();
  for (const int64_t n : kFlatSizes) {
    const std::vector<float> gate = ActivationInputs(n, 20 + n), up = RandomNormal(n, 21 + n);
    std::vector<float> want(n), got(n, NAN);
    SiluMul(cpu, gate.data(), up.data(), n, want.data());
    Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), SiluMulKernel, gate.data(), up.data(), n, got.data());
    ExpectCloseRel(got, want, 2e-6f, "silu_mul");
    std::vector<float> in_place = gate;  // out aliasing gate
    Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), SiluMulKernel, in_place.data(), up.data(), n, in_place.data());
    ExpectSameBits(in_place, got, "silu_mul in place");
  }
}

TEST(CudaKernelsOnSimtTest, GeluErfMatchesTheCpuKernel) {
  Device& cpu = DefaultCpuDevice();
  for (const int64_t n : kFlatSizes) {
    const std::vector<float> x = ActivationInputs(n, 22 + n);
    std::vector<float> want(n), got(n, NAN);
    GeluErf(cpu, x.data(), n, want.data());
    Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), GeluErfKernel, x.data(), n, got.data());
    ExpectCloseRel(got, want, 1e-6f, "gelu_erf");
  }
}

TEST(CudaKernelsOnSimtTest, QuickGeluMatchesTheCpuKernel) {
  Device& cpu = DefaultCpuDevice();
  for (const int64_t n : kFlatSizes) {
    const std::vector<float> x = ActivationInputs(n, 23 + n);
    std::vector<float> want(n), got(n, NAN);
    QuickGelu(cpu, x.data(), n, want.data());
    Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), QuickGeluKernel, x.data(), n, got.data());
    ExpectCloseRel(got, want, 2e-6f, "quick_gelu");
  }
}

TEST(CudaKernelsOnSimtTest, AddMatchesTheCpuKernelExactly) {
  Device& cpu = DefaultCpuDevice();
  for (const int64_t n : kFlatSizes) {
    const std::vector<float> a = ActivationInputs(n, 24 + n), b = RandomNormal(n, 25 + n);
    std::vector<float> want(n), got(n, NAN);
    Add(cpu, a.data(), b.data(), n, want.data());
    Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), AddKernel, a.data(), b.data(), n, got.data());
    ExpectSameBits(got, want, "add");
  }
}

TEST(CudaKernelsOnSimtTest, LayerNormMatchesTheCpuKernel) {
  Device& cpu = DefaultCpuDevice();
  for (const auto& [rows, dim, threads] : {std::tuple{3, 1, 32}, {5, 77, 64}, {2, 1280, 128}, {4, 2051, 256}}) {
    // Off-centre rows (mean 3): the variance is taken around the mean, not as E[x^2] - mean^2.
    std::vector<float> x = RandomNormal(static_cast<int64_t>(rows) * dim, 26 + dim, 2.f);
    for (float& v : x) v += 3.f;
    const std::vector<float> w = RandomNormal(dim, 27 + dim), b = RandomNormal(dim, 28 + dim);
    std::vector<float> want(x.size()), got(x.size(), NAN);
    LayerNorm(cpu, x.data(), w.data(), b.data(), rows, dim, 1e-6f, want.data());
    Launch(Dim3(rows), Dim3(threads), LayerNormKernel, x.data(), w.data(), b.data(), int64_t{dim}, 1e-6f, got.data());
    ExpectCloseRel(got, want, 2e-6f, "layer_norm");
    std::vector<float> in_place = x;  // y aliasing x
    Launch(Dim3(rows), Dim3(threads), LayerNormKernel, in_place.data(), w.data(), b.data(), int64_t{dim}, 1e-6f,
           in_place.data());
    ExpectSameBits(in_place, got, "layer_norm in place");
  }
}

TEST(CudaKernelsOnSimtTest, RotaryOfOneTensorMatchesTheCpuKernel) {
  Device& cpu = DefaultCpuDevice();
  // Strided heads (3 of them in a row of 4 heads' room), odd row count; an odd head_dim leaves its
  // last dim alone on both.
  for (const int hd : {2, 77, 80, 128}) {
    const int rows = 13, heads = 3, half = hd / 2;
    const int64_t stride = int64_t{heads + 1} * hd;
    const std::vector<float> x = RandomNormal(rows * stride, 30 + hd);
    const std::vector<float> cos = RandomNormal(rows * half, 31), sin = RandomNormal(rows * half, 32);
    std::vector<float> want = x, got = x;
    Rotary(cpu, HeadsView{want.data(), stride, heads}, rows, hd, cos.data(), sin.data());
    Launch(Dim3(rows), Dim3(64), RotaryQKKernel<float>, got.data(), stride, heads, static_cast<float*>(nullptr), int64_t{0}, 0,
           hd, cos.data(), sin.data());
    ExpectCloseRel(got, want, 1e-6f, "rotary");
    for (int r = 0; r < rows; ++r) {
      for (int64_t e = int64_t{heads} * hd; e < stride; ++e) ASSERT_EQ(got[r * stride + e], x[r * stride + e]);
    }
  }
}

TEST(CudaKernelsOnSimtTest, PadOneOfQkvAndUnpadHeadsMatchTheCpuKernelsExactly) {
  Device& cpu = DefaultCpuDevice();
  for (const auto& [rows, heads, hd, padded] : {std::tuple{11, 3, 80, 96}, {1, 1, 1, 1}, {7, 16, 64, 64}}) {
    const std::vector<float> qkv = RandomNormal(int64_t{rows} * 3 * heads * hd, 33 + hd);
    const size_t n = static_cast<size_t>(heads) * rows * padded;
    for (int which = 0; which < 3; ++which) {
      std::vector<float> want(n), got(n, NAN);
      PadOneOfQkv(cpu, qkv.data(), rows, heads, hd, padded, which, want.data());
      Launch(Dim3(rows), Dim3(64), PadOneOfQkvKernel, qkv.data(), int64_t{rows}, heads, hd, padded, which, got.data());
      ExpectSameBits(got, want, "pad_one_of_qkv");
    }
    // Unpad an attention output [rows, heads, padded] back to [rows, heads * hd].
    const std::vector<float> attn = RandomNormal(int64_t{rows} * heads * padded, 34 + hd);
    std::vector<float> want(static_cast<size_t>(rows) * heads * hd), got(want.size(), NAN);
    UnpadHeads(cpu, attn.data(), rows, heads, hd, padded, want.data());
    Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), UnpadHeadsKernel, attn.data(), int64_t{rows}, heads, hd, padded,
           got.data());
    ExpectSameBits(got, want, "unpad_heads");
  }
}

TEST(CudaKernelsOnSimtTest, GatherAndScatterRowsMatchTheCpuKernelsExactly) {
  Device& cpu = DefaultCpuDevice();
  for (const auto& [rows, width] : {std::pair{1, int64_t{1}}, {13, int64_t{77}}, {9, int64_t{1280}}}) {
    const std::vector<float> src = RandomNormal(rows * width, 35 + rows);
    std::vector<int32_t> index = testing::Shuffled(rows, 36);
    index.resize((rows + 1) / 2);  // a subset: scatter leaves the other rows alone
    const int64_t n = static_cast<int64_t>(index.size());
    std::vector<float> want(n * width), got(want.size(), NAN);
    GatherRows(cpu, src.data(), width, index, want.data());
    Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), GatherRowsKernel, src.data(), width, index.data(), n, got.data());
    ExpectSameBits(got, want, "gather_rows");
    std::vector<float> scattered(src.size(), 7.f), got_scattered(src.size(), 7.f);
    ScatterRows(cpu, want.data(), width, index, scattered.data());
    Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), ScatterRowsKernel, want.data(), width, index.data(), n,
           got_scattered.data());
    ExpectSameBits(got_scattered, scattered, "scatter_rows");
  }
}

// Patch rows of odd images and layouts (patch 3, 5 and 14; 1 to 3 frames; merge 1 and 2), over
// row ranges that start and end inside merge groups, against the CPU op bit for bit.
TEST(CudaKernelsOnSimtTest, PatchRowsMatchTheCpuOpBitForBit) {
  Device& cpu = DefaultCpuDevice();
  using testing::PatchRowsCase;
  for (const PatchRowsCase& c : {PatchRowsCase{{3, 2, 2, 12, 18}, 0, 24}, PatchRowsCase{{3, 3, 1, 9, 6}, 1, 5},
                                 PatchRowsCase{{14, 2, 2, 56, 84}, 3, 22}, PatchRowsCase{{5, 1, 2, 10, 30}, 5, 12}}) {
    const std::vector<uint8_t> rgb = c.Bytes();
    const std::vector<float> table = c.Table();
    std::vector<float> want(c.values()), got(want.size(), NAN);
    PatchRows(cpu, rgb.data(), c.grid, table.data(), c.r0, c.r1, want.data());
    Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), PatchRowsKernel, rgb.data(), c.grid, table.data(), c.r0,
           c.r1 - c.r0, got.data());
    ExpectSameBits(got, want, "patch_rows");
  }
}

// Every f16 and bf16 bit pattern (subnormals, infinities, NaN payloads) widened exactly as the
// CPU op widens it; an f32 table copied bit for bit (NaNs included).
TEST(CudaKernelsOnSimtTest, EmbeddingLookupMatchesTheCpuOpBitForBitOnEveryTableDtype) {
  Device& cpu = DefaultCpuDevice();
  const int64_t vocab = 256, width = 256;
  std::vector<uint16_t> halves = testing::AllHalfBits();
  std::vector<uint32_t> f32_bits(vocab * width);
  for (size_t i = 0; i < f32_bits.size(); ++i) f32_bits[i] = static_cast<uint32_t>(i) * 0x9E3779B1u;  // all exponents
  const std::vector<int32_t> ids = testing::AllHalfBitsIds();
  const int64_t n = static_cast<int64_t>(ids.size());
  for (const core::DType dtype : {core::DType::kF32, core::DType::kBF16, core::DType::kF16}) {
    void* data = dtype == core::DType::kF32 ? static_cast<void*>(f32_bits.data()) : halves.data();
    const core::Tensor table = core::Tensor::View(data, dtype, {vocab, width}, nullptr);
    std::vector<float> want(n * width), got(want.size(), 0.f);
    EmbeddingLookup(cpu, table, ids, want.data());
    if (dtype == core::DType::kF32) {
      Launch(Dim3(8), Dim3(128), EmbeddingLookupKernel<F32Table>, reinterpret_cast<const float*>(f32_bits.data()),
             vocab, width, ids.data(), n, got.data());
    } else if (dtype == core::DType::kBF16) {
      Launch(Dim3(8), Dim3(128), EmbeddingLookupKernel<Bf16Table>, static_cast<const uint16_t*>(halves.data()), vocab,
             width, ids.data(), n, got.data());
    } else {
      Launch(Dim3(8), Dim3(128), EmbeddingLookupKernel<F16Table>, static_cast<const uint16_t*>(halves.data()), vocab,
             width, ids.data(), n, got.data());
    }
    ExpectSameBits(got, want, core::DTypeName(dtype));
  }
}

TEST(CudaKernelsOnSimtTest, EmbeddingLookupGivesNanRowsForIdsOutsideTheTable) {
  const int64_t vocab = 3, width = 5;
  const std::vector<float> table = RandomNormal(vocab * width, 37);
  const std::vector<int32_t> ids = {2, -1, 3, 0};
  std::vector<float> got(ids.size() * width, 0.f);
  Launch(Dim3(1), Dim3(32), EmbeddingLookupKernel<F32Table>, table.data(), vocab, width, ids.data(),
         static_cast<int64_t>(ids.size()), got.data());
  for (int64_t j = 0; j < width; ++j) {
    EXPECT_EQ(got[j], table[2 * width + j]);
    EXPECT_TRUE(std::isnan(got[width + j]));
    EXPECT_TRUE(std::isnan(got[2 * width + j]));
    EXPECT_EQ(got[3 * width + j], table[j]);
  }
}

// Shuffled slots, strided rows; bf16 pools get ties, NaNs and overflow rounded as the CPU rounds.
template <typename T>
void CheckWritePagedKv(T marker) {
  const testing::PagedWriteCase c(38);
  const auto [want_k, want_v] = c.template Reference<T>(marker);
  std::vector<T> k(c.pool_elems(), marker), v(c.pool_elems(), marker);
  Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), WritePagedKvKernel<T>, c.k(), c.stride(), c.v(), c.stride(),
         c.slots.data(), c.rows, c.row(), c.num_slots(), k.data(), v.data());
  ExpectSameBits(k, want_k, "k pool");
  ExpectSameBits(v, want_v, "v pool");
}

TEST(CudaKernelsOnSimtTest, WritePagedKvMatchesTheCpuOpOnF32Pools) { CheckWritePagedKv<float>(-7.f); }

TEST(CudaKernelsOnSimtTest, WritePagedKvRoundsToBf16AsTheCpuOp) { CheckWritePagedKv<uint16_t>(0xDEAD); }

TEST(CudaKernelsOnSimtTest, WritePagedKvSkipsSlotsOutsideThePool) {
  const testing::PagedWriteCase c(39);
  const std::vector<int64_t> slots = {-1, c.num_slots(), 5};
  std::vector<float> k(c.pool_elems(), -7.f), v(c.pool_elems(), -7.f);
  Launch(Dim3(1), Dim3(32), WritePagedKvKernel<float>, c.k(), c.stride(), c.v(), c.stride(), slots.data(), int64_t{3},
         c.row(), c.num_slots(), k.data(), v.data());
  for (int64_t i = 0; i < c.pool_elems(); ++i) {
    const bool written = i / c.row() == 5;
    const int64_t d = i % c.row();
    ASSERT_EQ(testing::Bits(k[i]), testing::Bits(written ? c.k()[2 * c.stride() + d] : -7.f)) << i;
    ASSERT_EQ(testing::Bits(v[i]), testing::Bits(written ? c.v()[2 * c.stride() + d] : -7.f)) << i;
  }
}

TEST(CudaKernelsOnSimtTest, FusedRotaryMatchesTheCpuKernelInTheQkvBuffer) {
  Device& cpu = DefaultCpuDevice();
  // q and k side by side in one qkv row (as the projection writes them): 16 q heads, 2 k heads
  // and 2 v heads of 80 (the vision tower's head dim), odd row count.
  const int rows = 13, qh = 16, kh = 2, hd = 80, half = hd / 2;
  const int64_t stride = static_cast<int64_t>(qh + 2 * kh) * hd;
  const std::vector<float> qkv = RandomNormal(rows * stride, 4);
  const std::vector<float> cos = RandomNormal(rows * half, 5), sin = RandomNormal(rows * half, 6);
  std::vector<float> want = qkv, got = qkv;
  RotaryQK(cpu, HeadsView{want.data(), stride, qh}, HeadsView{want.data() + qh * hd, stride, kh}, rows, hd,
           cos.data(), sin.data());
  Launch(Dim3(rows), Dim3(96), RotaryQKKernel<float>, got.data(), stride, qh, got.data() + qh * hd, stride, kh, hd,
         cos.data(), sin.data());
  ExpectCloseRel(got, want, 1e-6f, "rotary");
  // v untouched by both.
  for (int r = 0; r < rows; ++r) {
    for (int64_t e = (qh + kh) * hd; e < stride; ++e) ASSERT_EQ(got[r * stride + e], qkv[r * stride + e]);
  }
}

// The qkv rows held in bf16 (the CUDA device's qkv chain): the bf16 instantiation rotates each
// pair as the f32 one does on the widened values and rounds the results (core::FloatToBf16), bit
// for bit; v, the padding past the heads and an odd head dim's last dim are left as they are.
TEST(CudaKernelsOnSimtTest, FusedRotaryOnBf16RowsIsTheF32KernelOnTheWidenedValuesRounded) {
  for (const int hd : {80, 7}) {
    const int rows = 11, qh = 3, kh = 2, half = hd / 2;
    const int64_t stride = static_cast<int64_t>(qh + 2 * kh) * hd + 5;  // a padded row
    std::vector<uint16_t> bf16(static_cast<size_t>(rows * stride));
    std::vector<float> widened(bf16.size());
    const std::vector<float> x = RandomNormal(rows * stride, 40 + hd);
    for (size_t i = 0; i < bf16.size(); ++i) {
      bf16[i] = core::FloatToBf16(x[i]);
      widened[i] = core::Bf16ToFloat(bf16[i]);
    }
    const std::vector<float> cos = RandomNormal(rows * half, 41), sin = RandomNormal(rows * half, 42);
    Launch(Dim3(rows), Dim3(64), RotaryQKKernel<float>, widened.data(), stride, qh, widened.data() + qh * hd, stride,
           kh, hd, cos.data(), sin.data());
    std::vector<uint16_t> got = bf16;
    Launch(Dim3(rows), Dim3(64), RotaryQKKernel<uint16_t>, got.data(), stride, qh, got.data() + qh * hd, stride, kh,
           hd, cos.data(), sin.data());
    std::vector<uint16_t> want(bf16.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = core::FloatToBf16(widened[i]);  // untouched: exact
    EXPECT_EQ(got, want) << "head dim " << hd;
    EXPECT_NE(got, bf16) << "head dim " << hd;  // it rotated something
  }
}

// The four-pairs-a-thread bf16 rotary (the launch's pick where RotaryQKBf16Vec4Fits): bit for bit
// the one-block-a-row kernel, over a grid-stride loop of a few blocks, with and without k.
TEST(CudaKernelsOnSimtTest, Bf16RotaryFourPairsAThreadIsTheRowKernelBitForBit) {
  for (const int hd : {80, 128}) {
    for (const int kh : {2, 0}) {
      const int rows = 13, qh = 3, half = hd / 2;
      const int64_t stride = static_cast<int64_t>(qh + 2 * 2) * hd + 8;  // a padded row, 4-value aligned
      std::vector<uint16_t> bf16(static_cast<size_t>(rows * stride));
      const std::vector<float> x = RandomNormal(rows * stride, 50 + hd);
      for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = core::FloatToBf16(x[i]);
      const std::vector<float> cos = RandomNormal(rows * half, 51), sin = RandomNormal(rows * half, 52);
      uint16_t* no_k = nullptr;
      std::vector<uint16_t> want = bf16, got = bf16;
      Launch(Dim3(rows), Dim3(64), RotaryQKKernel<uint16_t>, want.data(), stride, qh,
             kh > 0 ? want.data() + qh * hd : no_k, stride, kh, hd, cos.data(), sin.data());
      ASSERT_TRUE(RotaryQKBf16Vec4Fits(got.data(), stride, qh, kh > 0 ? got.data() + qh * hd : no_k, stride, kh, hd,
                                       rows, cos.data(), sin.data()));
      Launch(Dim3(3), Dim3(64), RotaryQKBf16Vec4Kernel, got.data(), stride, qh, kh > 0 ? got.data() + qh * hd : no_k,
             stride, kh, hd, int64_t{rows}, cos.data(), sin.data());
      EXPECT_EQ(got, want) << "head dim " << hd << ", k heads " << kh;
      EXPECT_NE(got, bf16) << "head dim " << hd;
    }
  }
  // What it does not take: an odd head dim, a row stride off 4 values, a misaligned table.
  std::vector<uint16_t> rows(4096);
  std::vector<float> table(256);
  EXPECT_FALSE(RotaryQKBf16Vec4Fits(rows.data(), 560, 3, rows.data() + 210, 560, 2, 70, 4, table.data(), table.data()));
  EXPECT_FALSE(RotaryQKBf16Vec4Fits(rows.data(), 562, 3, rows.data() + 240, 562, 2, 80, 4, table.data(), table.data()));
  EXPECT_FALSE(
      RotaryQKBf16Vec4Fits(rows.data(), 560, 3, rows.data() + 240, 560, 2, 80, 4, table.data() + 1, table.data()));
  EXPECT_TRUE(RotaryQKBf16Vec4Fits(rows.data(), 560, 3, rows.data() + 240, 560, 2, 80, 4, table.data(), table.data()));
}

// The decode step's rotary and KV write in one launch: q and k rotated in the qkv buffer and the
// pools written exactly as RotaryQKKernel then WritePagedKvKernel leave them, f32 and bf16 pools,
// with a padding row (kPadSlot: rotated, not stored) and shuffled slots; blocks of fewer threads
// than a row's work.
template <typename T>
void CheckRotaryQKWriteKv(T marker) {
  for (const auto& [rows, qh, kh, hd] : {std::tuple{7, 16, 2, 128}, {3, 12, 3, 64}}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows, " << qh << "/" << kh << " heads of " << hd);
    const int half = hd / 2;
    const int64_t stride = static_cast<int64_t>(qh + 2 * kh) * hd, width = static_cast<int64_t>(kh) * hd;
    const int64_t num_slots = 3 * rows;
    const std::vector<float> qkv = RandomNormal(rows * stride, 40 + hd, 100.f);
    const std::vector<float> cos = RandomNormal(rows * half, 41), sin = RandomNormal(rows * half, 42);
    std::vector<int64_t> slots(rows);
    for (int r = 0; r < rows; ++r) slots[r] = (5 * r + 2) % num_slots;
    slots[1] = kPadSlot;
    std::vector<float> want = qkv;
    std::vector<T> want_k(num_slots * width, marker), want_v = want_k;
    float* wq = want.data();
    Launch(Dim3(rows), Dim3(96), RotaryQKKernel<float>, wq, stride, qh, wq + qh * hd, stride, kh, hd, cos.data(), sin.data());
    Launch(Dim3(kFlatBlocks), Dim3(kFlatThreads), WritePagedKvKernel<T>, static_cast<const float*>(wq + qh * hd),
           stride, static_cast<const float*>(wq + (qh + kh) * hd), stride, static_cast<const int64_t*>(slots.data()),
           int64_t{rows}, width, num_slots, want_k.data(), want_v.data());
    // One block a row, and a row's work split over 3 blocks (as the launch splits it).
    for (int slices : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << slices << " blocks a row");
      std::vector<float> got = qkv;
      std::vector<T> got_k(num_slots * width, marker), got_v = got_k;
      float* gq = got.data();
      Launch(Dim3(rows, slices), Dim3(96), RotaryQKWriteKvKernel<T>, gq, stride, qh, gq + qh * hd, stride, kh, hd,
             cos.data(), sin.data(), static_cast<const float*>(gq + (qh + kh) * hd), stride,
             static_cast<const int64_t*>(slots.data()), num_slots, got_k.data(), got_v.data());
      ExpectSameBits(got, want, "qkv");
      ExpectSameBits(got_k, want_k, "k pool");
      ExpectSameBits(got_v, want_v, "v pool");
      EXPECT_NE(got, qkv);
    }
  }
}

TEST(CudaKernelsOnSimtTest, RotaryAndKvWriteInOneLaunchEqualTheTwoKernelsF32) { CheckRotaryQKWriteKv<float>(-7.f); }

TEST(CudaKernelsOnSimtTest, RotaryAndKvWriteInOneLaunchEqualTheTwoKernelsBf16) {
  CheckRotaryQKWriteKv<uint16_t>(0xDEAD);
}

TEST(CudaKernelsOnSimtTest, PadQkvMatchesTheCpuKernelExactly) {
  Device& cpu = DefaultCpuDevice();
  const int rows = 11, heads = 3, hd = 80, padded = 96;
  const std::vector<float> qkv = RandomNormal(static_cast<size_t>(rows) * 3 * heads * hd, 7);
  const size_t n = static_cast<size_t>(heads) * rows * padded;
  std::vector<float> q(n), k(n), v(n), gq(n, NAN), gk(n, NAN), gv(n, NAN);
  PadQkv(cpu, qkv.data(), rows, heads, hd, padded, q.data(), k.data(), v.data());
  Launch(Dim3(rows, 3), Dim3(64), PadQkvKernel, qkv.data(), int64_t{rows}, heads, hd, padded, gq.data(), gk.data(),
         gv.data());
  EXPECT_EQ(gq, q);
  EXPECT_EQ(gk, k);
  EXPECT_EQ(gv, v);
}

// The greedy pick's edits (a penalty on seen ids, masked end ids) on the harness against the CPU
// op: more ids than threads, an id both masked and penalized, ids outside the vocabulary, a row
// with no edits, negative and positive scores.
TEST(CudaKernelsOnSimtTest, EditLogitRowsIsTheCpuOp) {
  const int64_t vocab = 301;
  LogitEdits edits;
  std::vector<int32_t> many;
  for (int32_t id = 0; id < vocab; id += 2) many.push_back(id);
  edits.AddRow(1.3f, many, std::vector<int32_t>{4, 7, 7, 300});
  edits.AddRow(1.f, {}, {});
  edits.AddRow(0.7f, std::vector<int32_t>{-1, 0, 150, 301, 299}, std::vector<int32_t>{-5, 150, 1000});
  edits.AddRow(2.f, std::vector<int32_t>{9}, {});
  const int64_t rows = edits.rows();
  std::vector<int32_t> packed(static_cast<size_t>(edits.PackedSize()));
  edits.Pack(packed.data());
  const std::vector<float> logits = RandomNormal(rows * vocab, 41);
  std::vector<float> want = logits;
  EditLogitRows(DefaultCpuDevice(), want.data(), rows, vocab, edits.View(packed.data()));
  EXPECT_EQ(want[4], -std::numeric_limits<float>::infinity());  // masked (and penalized)
  EXPECT_NE(want[2 * vocab], logits[2 * vocab]);
  for (const int threads : {32, 256}) {
    std::vector<float> got = logits;
    Launch(Dim3(static_cast<unsigned>(rows)), Dim3(threads), EditLogitRowsKernel, got.data(), vocab, edits.View(packed.data()));
    ExpectSameBits(got, want, "edited logits");
  }
}

TEST(CudaKernelsOnSimtTest, ArgmaxPicksTheSameIdAsTheCpuSamplerWithTiesNansAndInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t vocab = 1003;
  std::vector<std::vector<float>> rows;
  rows.push_back(RandomNormal(vocab, 8));
  std::vector<float> ties(vocab, 0.5f);  // all equal: the first
  rows.push_back(ties);
  std::vector<float> late = RandomNormal(vocab, 9);
  late[vocab - 1] = 100.f;
  late[700] = 100.f;  // two maxima: the lower id
  rows.push_back(late);
  std::vector<float> nans(vocab, NAN);
  nans[500] = -3.f;
  rows.push_back(nans);
  rows.push_back(std::vector<float>(vocab, -inf));  // nothing above -inf: 0
  std::vector<float> infs = RandomNormal(vocab, 10);
  infs[33] = inf;
  infs[900] = inf;
  rows.push_back(infs);
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  for (const int threads : {32, 128, 256}) {
    std::vector<int32_t> got(rows.size(), -1);
    Launch(Dim3(static_cast<unsigned>(rows.size())), Dim3(threads), ArgmaxKernel, flat.data(), vocab, got.data());
    for (size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(got[r], testing::CpuGreedyToken(rows[r].data(), vocab)) << "row " << r << ", " << threads << " threads";
    }
  }
  // Split over slices merged by the row's last block: ties across slices, and more slices than a
  // warp's lanes (the merge loops).
  for (const int slices : {3, 40}) {
    const size_t n = rows.size();
    std::vector<int32_t> got(n, -1);
    std::vector<float> part_v(n * slices, NAN);
    std::vector<int32_t> part_i(n * slices, -1);
    std::vector<int> counters(n, 0);
    Launch(Dim3(static_cast<unsigned>(n), static_cast<unsigned>(slices)), Dim3(64), ArgmaxSplitKernel,
           static_cast<const float*>(flat.data()), vocab, part_v.data(), part_i.data(), counters.data(), got.data());
    for (size_t r = 0; r < n; ++r) {
      EXPECT_EQ(got[r], testing::CpuGreedyToken(rows[r].data(), vocab)) << "row " << r << ", " << slices << " slices";
    }
    EXPECT_EQ(counters, std::vector<int>(n, 0));
  }
}


// A step of decodes and a prefill over shuffled pages, f32 and bf16 pools, GQA, head_dim 80 (K
// read 16 bytes at a time) and 77 (element by element): decodes over 1, 17 and 70 tokens (tiles of
// 32 keys: partial last tiles), a 3-row prefill chunk over 40, a decode over exactly two blocks;
// whole, and with the keys split over 3 blocks (some of them empty) whose partials the last of
// them merges. The kernel compiled for the V layout (PagedVChunks), as the launch picks it; where
// V is whole chunks, the lean kernel (two blocks an SM, V rows 8 at a time) too: the same output
// bit for bit.
template <typename T>
void CheckPagedAttention(int head_dim, int splits) {
  SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim << ", " << splits << " splits");
  constexpr bool kBf16 = sizeof(T) == 2;
  const testing::PagedCase c(/*kv_heads=*/2, /*heads=*/4, head_dim, /*num_blocks=*/40,
                             {{1, 1}, {17, 1}, {40, 3}, {70, 1}, {32, 1}}, /*block_step=*/17, /*block_offset=*/5);
  std::vector<float> got(c.q.size(), NAN);
  // Whole 16-byte chunks take the chunked V path: make sure the pool's alignment does not hide it.
  const bool whole_chunks = head_dim % kPerChunk16<T> == 0 && head_dim / kPerChunk16<T> <= kWarpSize;
  ASSERT_EQ(PagedVChunks(static_cast<const T*>(c.v(kBf16)), head_dim) > 0, whole_chunks);
  // The partials' end: the index row `rows` would start at.
  std::vector<float> partials(splits > 1 ? PagedPartialIndex(c.rows, 0, c.heads, 0, splits, head_dim) : 0, NAN);
  float* partials_or_null = splits > 1 ? partials.data() : nullptr;
  std::vector<int> counters(static_cast<size_t>(c.rows * c.heads), 0);
  const auto attend = [&](auto kernel, std::vector<float>* out) {
    Launch(Dim3(c.rows, c.heads, splits), Dim3(kPagedWarps * kWarpSize), kernel, c.q.data(), c.row_stride(),
           out->data(), c.row_stride(), c.heads, c.scale(), static_cast<const T*>(c.k(kBf16)),
           static_cast<const T*>(c.v(kBf16)), c.block_size, c.kv_heads, c.head_dim, c.meta.query_start.data(),
           c.meta.context_lens.data(), c.meta.block_tables.data(), c.meta.max_blocks_per_seq, c.meta.num_seqs,
           int64_t{0}, partials_or_null, counters.data(), PagedDecodeRotary{});
    // The last split of each (row, head) merged the partials and left its counter zero again.
    EXPECT_EQ(counters, std::vector<int>(counters.size(), 0));
  };
  attend(whole_chunks ? PagedAttentionKernel<T, false, true> : PagedAttentionKernel<T, false, false>, &got);
  ExpectCloseRel(got, c.Reference(kBf16), 2e-5f, "paged_attention");
  if (whole_chunks) {
    std::vector<float> lean(c.q.size(), NAN);
    attend(PagedAttentionKernel<T, false, true, true>, &lean);
    ExpectSameBits(lean, got, "the lean kernel");
  }
}

// A step of decode rows only with its rotary and KV write done by the attention (kRotary): the
// same output and the same pools, bit for bit, as RotaryQKWriteKvKernel then the attention without
// it. The fused launch reads pools whose new slots still hold stale values and writes into copies
// of them, so a row's own key or value read back from the pool, not from the qkv rows, would show;
// a padding row (kPadSlot) writes nothing. GQA, f32 and bf16 pools, head dims read 16 bytes at a
// time (128, 80) and element by element (76, 78), keys split over blocks.
template <typename T>
void CheckFusedRotaryAttention(int kv_heads, int heads, int head_dim, int splits) {
  SCOPED_TRACE(::testing::Message() << heads << "/" << kv_heads << " heads of " << head_dim << ", " << splits
                                    << " splits");
  constexpr bool kBf16 = sizeof(T) == 2;
  const testing::PagedCase c(kv_heads, heads, head_dim, /*num_blocks=*/40, {{1, 1}, {17, 1}, {40, 1}, {70, 1}, {33, 1}},
                             /*block_step=*/17, /*block_offset=*/5);
  const testing::DecodeRotaryCase d(c, /*pad_row=*/3, 50 + head_dim);
  const int rows = c.rows;
  const int64_t stride = d.stride, width = static_cast<int64_t>(kv_heads) * head_dim, num_slots = d.num_slots();
  const T* k0 = static_cast<const T*>(c.k(kBf16));
  const T* v0 = static_cast<const T*>(c.v(kBf16));
  const std::vector<T> k_pool(k0, k0 + num_slots * width), v_pool(v0, v0 + num_slots * width);
  const auto attend = [&](const float* q, std::vector<float>* out, const std::vector<T>& kp, const std::vector<T>& vp,
                          PagedDecodeRotary rotary, auto kernel) {
    std::vector<float> partials(splits > 1 ? PagedPartialIndex(rows, 0, heads, 0, splits, head_dim) : 0, NAN);
    std::vector<int> counters(static_cast<size_t>(rows * heads), 0);
    Launch(Dim3(rows, heads, splits), Dim3(kPagedWarps * kWarpSize), kernel, q, stride, out->data(),
           c.row_stride(), heads, c.scale(), kp.data(), vp.data(), c.block_size, kv_heads, head_dim,
           c.meta.query_start.data(), c.meta.context_lens.data(), c.meta.block_tables.data(),
           c.meta.max_blocks_per_seq, c.meta.num_seqs, int64_t{0}, splits > 1 ? partials.data() : nullptr,
           counters.data(), rotary);
    EXPECT_EQ(counters, std::vector<int>(counters.size(), 0));
  };

  // The two launches.
  std::vector<float> qkv_a = d.qkv;
  std::vector<T> k_a = k_pool, v_a = v_pool;
  std::vector<float> want(static_cast<size_t>(rows) * c.row_stride(), NAN);
  float* qa = qkv_a.data();
  Launch(Dim3(rows, 2), Dim3(96), RotaryQKWriteKvKernel<T>, qa, stride, heads, qa + d.k_offset(), stride, kv_heads,
         head_dim, d.cos.data(), d.sin.data(), static_cast<const float*>(qa + d.v_offset()), stride,
         static_cast<const int64_t*>(d.slots.data()), num_slots, k_a.data(), v_a.data());
  const bool chunked = PagedVChunks(v_a.data(), head_dim) > 0;  // the launch's pick of instantiation
  attend(qa, &want, k_a, v_a, PagedDecodeRotary{},
         chunked ? PagedAttentionKernel<T, false, true> : PagedAttentionKernel<T, false, false>);

  // One launch: q, k, v as the qkv projection left them; the pools read (stale at the new slots)
  // and the pools written (copies) apart.
  std::vector<T> k_b = k_pool, v_b = v_pool;
  std::vector<float> got(want.size(), NAN);
  attend(d.qkv.data(), &got, k_pool, v_pool,
         d.Rotary(d.qkv.data(), d.cos.data(), d.sin.data(), d.slots.data(), k_b.data(), v_b.data()),
         chunked ? PagedAttentionKernel<T, true, true> : PagedAttentionKernel<T, true, false>);

  ExpectSameBits(k_b, k_a, "k pool");
  ExpectSameBits(v_b, v_a, "v pool");
  EXPECT_NE(k_b, k_pool);  // it stored something
  d.ExpectSameRowsButPadding(got, want);
}

TEST(CudaKernelsOnSimtTest, DecodeAttentionWithTheRotaryAndKvWriteEqualsTheTwoLaunches) {
  CheckFusedRotaryAttention<uint16_t>(2, 4, 128, 1);
  CheckFusedRotaryAttention<uint16_t>(2, 4, 80, 3);
  CheckFusedRotaryAttention<float>(2, 4, 128, 3);
  // kv head 1's rows of 76 bf16 values start off 16-byte lines: summed element by element, which
  // the row's own key (in aligned shared memory) must follow.
  CheckFusedRotaryAttention<uint16_t>(2, 4, 76, 1);
  CheckFusedRotaryAttention<float>(2, 4, 78, 1);
  if (testing::kSimtSanitized) return;  // the cases above take every path: splits or not, both pools and V loads
  CheckFusedRotaryAttention<uint16_t>(2, 16, 128, 8);  // the 3b at batch 1's splits
}

#ifdef IRIS_HAVE_CUDA
// The launch shapes the dispatch points pick (host code): paged attention's splits fit one wave
// (the kernel holds an SM) and exist only where the device's sm_count split counters cover every
// (row, head); argmax splits only up to sm_count rows, and fills about twice the SMs.
TEST(CudaLaunchShapesTest, SplitsFitOneWaveAndTheDevicesCounters) {
  EXPECT_EQ(PagedAttentionSplits(1, 16, 132), 8);  // 3b batch 1: 128 blocks, one wave
  EXPECT_EQ(PagedAttentionSplits(8, 16, 132), 1);  // 128 (row, head) pairs fill it alone
  EXPECT_EQ(PagedAttentionSplits(1, 16, 132, 4), 4);  // a lower cap (CudaDevice's max splits)
  EXPECT_EQ(PagedAttentionSplits(1, 2, 132, 1), 1);
  EXPECT_EQ(PagedAttentionSplits(1, 2, 132, 99), 16);  // never past the kernel's own cap
  for (const int sms : {1, 78, 108, 132}) {
    for (int64_t rows = 1; rows <= 64; ++rows) {
      for (const int heads : {1, 2, 12, 16, 28}) {
        const int splits = PagedAttentionSplits(rows, heads, sms);
        ASSERT_GE(splits, 1);
        ASSERT_LE(splits, 16);
        if (splits > 1) {
          ASSERT_LE(rows * heads * splits, sms) << rows << " rows, " << heads << " heads, " << sms << " SMs";
          ASSERT_LE(rows * heads, sms);
        }
      }
      const int slices = ArgmaxSlices(rows, 151936, sms);
      ASSERT_GE(slices, 1);
      if (slices > 1) {
        ASSERT_LE(rows, sms);
        ASSERT_LE(rows * slices, 2 * sms);
      }
    }
  }
  EXPECT_EQ(ArgmaxSlices(1, 151936, 132), 75);  // ~2048 logits a block
  EXPECT_EQ(ArgmaxSlices(133, 151936, 132), 1);  // more rows than counters: one block a row
}
#endif

TEST(CudaKernelsOnSimtTest, PagedAttentionMatchesTheCpuKernelOnF32Pages) {
  CheckPagedAttention<float>(80, 1);
  CheckPagedAttention<float>(77, 1);
  CheckPagedAttention<float>(80, 3);
  CheckPagedAttention<float>(128, 1);  // 32 chunks: one key per load, two batches per tile
}

TEST(CudaKernelsOnSimtTest, PagedAttentionMatchesTheCpuKernelOnBf16Pages) {
  CheckPagedAttention<uint16_t>(80, 1);   // V in 16-byte chunks: 10 per row, 3 keys per load, 2 lanes idle
  CheckPagedAttention<uint16_t>(77, 1);   // element by element
  CheckPagedAttention<uint16_t>(77, 3);
  CheckPagedAttention<uint16_t>(128, 1);  // the models' head dim: 2 keys per load
  CheckPagedAttention<uint16_t>(128, 3);
  CheckPagedAttention<uint16_t>(64, 3);   // 4 keys per load, split
  CheckPagedAttention<uint16_t>(256, 1);  // the largest: one key per load, two batches per tile
}

}  // namespace
}  // namespace iris::kernels::cuda
