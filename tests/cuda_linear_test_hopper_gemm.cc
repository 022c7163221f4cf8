// iris's Hopper GEMM on a GPU, part of cuda_linear_test (label gpu; compute capability 9.0 only,
// skipped elsewhere; built into that binary: tests/CMakeLists.txt says why): the
// real copy engine, tensor maps, transaction barriers and warpgroup MMAs on the SIMT suite's odd
// sizes and on the 3b vision tower's shapes, against the double reference; and the Linear's
// paths that use it (CudaDevice::SetHopperGemm) against cuBLASLt's: the gated MLP with the fused
// SiLU·mul, f32 rows with bias and residual add, bf16 rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/gated_mlp.h"
#include "kernels/linear.h"
#include "kernels/qkv_bf16.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/hopper_gemm.h"
#include "kernels/cuda/hopper_probes.h"
#endif
#include "tests/hopper_gemm_cases.h"
#include "tests/kernel_cases.h"
#include "tests/test_util.h"

namespace iris::kernels::cuda {
namespace {

#ifdef IRIS_HAVE_CUDA

using testing::HopperCase;

// The GPU, or null where it is not compute capability 9.0 (the test then skips).
std::unique_ptr<testing::Gpu> HopperGpu() {
  std::unique_ptr<testing::Gpu> g = testing::MakeGpu();
  if (g == nullptr || !g->cuda().SetHopperGemm(CudaDevice::HopperGemmUse::kAll).ok()) return nullptr;
  EXPECT_TRUE(g->cuda().SetHopperGemm(CudaDevice::HopperGemmUse::kOff).ok());
  return g;
}

// First, each primitive alone (hopper_probes.cuh), so that a GEMM that fails says why: the copy
// engine's box as it lands (tensor map, swizzle, zero fill), then one warpgroup MMA on tiles
// written by hand (descriptor, K step, accumulator fragment, accumulate off).
TEST(CudaHopperGemm, ProbeTheCopyEnginesBox) {
  std::unique_ptr<testing::Gpu> gpu = HopperGpu();
  if (gpu == nullptr) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  constexpr int64_t kRows = 100, kCols = 90, kLd = 96;
  const std::vector<uint16_t> m = testing::Bf16Normal(kRows * kLd, 3);
  const uint16_t* dm = gpu->Up(m);
  for (const auto& [x, y] : {std::pair{0, 0}, std::pair{64, 50}}) {
    unsigned char* out = gpu->Up(std::vector<unsigned char>(8192, 0xAB));
    ASSERT_EQ(LaunchTmaBoxProbe(gpu->cuda().stream(), dm, kRows, kCols, kLd, x, y, out), 0);
    testing::ExpectSwizzledBox(m, kRows, kCols, kLd, x, y, gpu->Down(out, 8192), [](int r, int b) {
      return r * 128 + (((b / 16) ^ (r % 8)) * 16) + b % 16;
    });
  }
}

TEST(CudaHopperGemm, ProbeOneWarpgroupMma) {
  std::unique_ptr<testing::Gpu> gpu = HopperGpu();
  if (gpu == nullptr) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  const std::vector<uint16_t> a = testing::Bf16Normal(64 * 64, 4), b = testing::Bf16Normal(128 * 64, 5);
  const uint16_t* da = gpu->Up(a);
  const uint16_t* db = gpu->Up(b);
  for (int kk = 0; kk < 4; ++kk) {
    float* d = gpu->Up(std::vector<float>(64 * 128, 7.f));
    ASSERT_EQ(LaunchWgmmaProbe(gpu->cuda().stream(), da, db, kk, d), 0);
    testing::ExpectWgmmaProbe(a, b, kk, gpu->Down(d, 64 * 128));
  }
}

// A bf16 [out][in] weight of normal values (sd 0.03), as a checkpoint holds it.
core::Tensor Bf16Weight(int64_t out, int64_t in, uint32_t seed) {
  core::Tensor t = core::Tensor::Empty(core::DType::kBF16, {out, in});
  const std::vector<float> v = testing::RandomNormal(out * in, seed, 0.03f);
  for (int64_t i = 0; i < out * in; ++i) t.data<uint16_t>()[i] = core::FloatToBf16(v[i]);
  return t;
}
// An f32 [n] tensor: offset + normal values of sd `scale`.
core::Tensor F32Vector(int64_t n, uint32_t seed, float scale, float offset = 0.f) {
  core::Tensor t = core::Tensor::Empty(core::DType::kF32, {n});
  const std::vector<float> v = testing::RandomNormal(n, seed, scale);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = offset + v[i];
  return t;
}
// cos/sin tables [rows][head_dim / 2] of random angles on the GPU, as QkvRotary takes them.
QkvRotary RandomRotaryOnGpu(testing::Gpu& gpu, int64_t rows, int heads, int head_dim, uint32_t seed) {
  const std::vector<float> angle = testing::RandomNormal(rows * head_dim / 2, seed, 3.f);
  std::vector<float> cos_t, sin_t;
  for (const float t : angle) {
    cos_t.push_back(std::cos(t));
    sin_t.push_back(std::sin(t));
  }
  return QkvRotary{heads, head_dim, gpu.Up(cos_t), gpu.Up(sin_t)};
}

void RunOnGpu(testing::Gpu& gpu, const HopperCase& c, uint32_t seed, int tile_n, int max_blocks) {
  SCOPED_TRACE(c.Name() + " tile " + std::to_string(tile_n) + " max blocks " + std::to_string(max_blocks));
  const testing::HopperData d = testing::MakeHopperData(c, seed);
  constexpr float kPad = 12345.f;
  HopperGemm g = testing::HopperGemmOf(c, d, tile_n);
  g.max_blocks = max_blocks;
  g.a = gpu.Up(d.a);  // the device's copies
  g.b = gpu.Up(d.b);
  g.bias = c.bias ? gpu.Up(d.bias) : nullptr;
  if (c.epilogue == HopperEpilogue::kBf16Rotary) {
    g.cos = gpu.Up(d.cos);
    g.sin = gpu.Up(d.sin);
  }
  if (c.row_parts > 0) g.row_partials = gpu.Up(d.row_partials);
  testing::HopperNormOut norm;
  uint16_t* norm_rows = nullptr;
  float* norm_partials = nullptr;
  if (c.norm_out) {
    norm = testing::HopperStartingNormOut(c, d, tile_n, kPad);
    testing::HopperAttachNormOut(d, norm, g);
    g.norm_rows = norm_rows = gpu.Up(norm.rows);
    g.norm_partials = norm_partials = gpu.Up(norm.partials);
    g.norm_weight = gpu.Up(d.norm_weight);
  }
  std::vector<float> y_f32;
  std::vector<uint16_t> y_bf16;
  if (c.epilogue == HopperEpilogue::kF32) {
    y_f32 = testing::HopperStartingF32(c, d, kPad);
    float* y = gpu.Up(y_f32);
    g.y = y;
    ASSERT_TRUE(HopperGemmTakes(g));
    ASSERT_EQ(LaunchHopperGemm(gpu.cuda().stream(), g), 0);
    y_f32 = gpu.Down(y, y_f32.size());
  } else {
    y_bf16 = testing::HopperStartingBf16(c, d, kPad);
    uint16_t* y = gpu.Up(y_bf16);
    g.y = y;
    ASSERT_TRUE(HopperGemmTakes(g));
    ASSERT_EQ(LaunchHopperGemm(gpu.cuda().stream(), g), 0);
    y_bf16 = gpu.Down(y, y_bf16.size());
  }
  testing::ExpectHopperResult(c, d, y_f32, y_bf16, kPad);
  if (c.norm_out) {
    norm.rows = gpu.Down(norm_rows, norm.rows.size());
    norm.partials = gpu.Down(norm_partials, norm.partials.size());
    testing::ExpectHopperNormOut(c, d, y_f32, norm, tile_n, kPad);
  }
}

// The odd sizes, one test per form of the kernel, in the order of their hand-offs' complexity
// (a broken one traps and ends the process: gpu_session.sh runs each test on its own, so the
// test that trapped is named): both warpgroups on each 256-wide tile; the 128-wide ping-pong; the
// rotary's 240-wide tiles. Each a block per tile, then 3 blocks taking the tiles in turn.
TEST(CudaHopperGemm, MatchesTheDefinitionOnOddSizesCooperative256) {
  std::unique_ptr<testing::Gpu> gpu = HopperGpu();
  if (gpu == nullptr) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  for (const int max_blocks : {0, 3}) {
    for (const HopperCase& c : testing::HopperCases()) RunOnGpu(*gpu, c, 23, 256, max_blocks);
  }
}

TEST(CudaHopperGemm, MatchesTheDefinitionOnOddSizesPingPong128) {
  std::unique_ptr<testing::Gpu> gpu = HopperGpu();
  if (gpu == nullptr) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  for (const int max_blocks : {0, 3}) {
    for (const HopperCase& c : testing::HopperCases()) RunOnGpu(*gpu, c, 23, 128, max_blocks);
  }
}

TEST(CudaHopperGemm, MatchesTheDefinitionOnOddSizesRotary240) {
  std::unique_ptr<testing::Gpu> gpu = HopperGpu();
  if (gpu == nullptr) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  for (const int max_blocks : {0, 3}) {
    for (const HopperCase& c : testing::HopperRotaryCases()) RunOnGpu(*gpu, c, 29, kHopperRotaryTileN, max_blocks);
  }
}

// The RMSNorm hand-off between GEMMs (as simt_hopper_gemm_test's): f32 rows handing the next
// norm's input on, and every epilogue applying a handed-on norm's row factor.
TEST(CudaHopperGemm, MatchesTheDefinitionWithTheRmsNormHandoff) {
  std::unique_ptr<testing::Gpu> gpu = HopperGpu();
  if (gpu == nullptr) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  for (const HopperCase& c : testing::HopperNormCases()) {
    for (const int tile_n : testing::HopperTileWidths(c)) {
      for (const int max_blocks : {0, 3}) RunOnGpu(*gpu, c, 31, tile_n, max_blocks);
    }
  }
}

// The 3b tower's four matmuls (qkv to bf16 — also with the rotary —, o and down into the residual, gate_up with SwiGLU),
// on a few hundred rows: many column blocks, 20-54 K slices (the ring goes round many times).
TEST(CudaHopperGemm, MatchesTheDefinitionOnTheVisionTowersShapes) {
  std::unique_ptr<testing::Gpu> gpu = HopperGpu();
  if (gpu == nullptr) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  using E = HopperEpilogue;
  const HopperCase cases[] = {
      {E::kBf16, 300, 3840, 1280, 0, true, false},
      {E::kF32, 257, 1280, 1280, 0, true, true},
      {E::kSwiGluBf16, 200, 3420, 1280, 0, true, false},
      {E::kF32, 130, 1280, 3420, 4, true, true},
  };
  // Persistent over the SMs (as the Linear launches it), and a block per tile at one width.
  const int sms = gpu->cuda().sm_count();
  for (const int tile_n : {128, 256}) {
    uint32_t seed = 40;
    for (const HopperCase& c : cases) RunOnGpu(*gpu, c, seed++, tile_n, sms);
  }
  for (const HopperCase& c : cases) RunOnGpu(*gpu, c, 45, 128, 0);
  // qkv with the rotary of q's and k's 32 heads in its epilogue.
  RunOnGpu(*gpu, {E::kBf16Rotary, 300, 3840, 1280, 0, true, false, false, 32}, 50, kHopperRotaryTileN, sms);
}

// iris-server's --hopper-gemm: the device option sets it on a compute capability 9.0 GPU and is a
// clear startup error on any other.
TEST(CudaHopperGemm, TheDeviceOptionSetsItOrSaysWhyNot) {
  DeviceOptions options;
  options.name = "cuda:0";
  options.hopper_gemm = "swiglu";
  absl::StatusOr<std::unique_ptr<Device>> d = CreateDevice(options);
  if (HopperGpu() != nullptr) {
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(AsCuda(**d).hopper_gemm(), CudaDevice::HopperGemmUse::kSwiGlu);
  } else {
    ASSERT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
    EXPECT_NE(d.status().message().find("compute capability 9.0"), std::string::npos) << d.status();
  }
}

// kernels::GatedMlp with the SiLU·mul fused into gate_up's Hopper GEMM against cuBLASLt's bf16
// hand-off: the fused path rounds only the product silu(g)·u to bf16 (the hand-off also rounds g
// and u), so the two agree to the bf16 hand-off's own tolerance; and every other matmul on the
// Hopper GEMM (kAll) against cuBLASLt: f32 rows with bias and residual add, bf16 rows.
TEST(CudaHopperGemm, TheLinearsPathsAgreeWithCublasLt) {
  std::unique_ptr<testing::Gpu> gpu = HopperGpu();
  if (gpu == nullptr) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  Device& dev = *gpu->dev;
  CudaDevice& cuda = gpu->cuda();
  const int64_t h = 1280, inter = 3420, m = 300;
  const core::Tensor gu_w = Bf16Weight(2 * inter, h, 1), dn_w = Bf16Weight(h, inter, 2),
                     gu_b = F32Vector(2 * inter, 3, 0.1f), dn_b = F32Vector(h, 4, 0.1f), norm = F32Vector(h, 5, 0.1f);
  auto gate_up = Linear::Create(dev, gu_w, &gu_b, ComputeType::kBF16);
  auto down = Linear::Create(dev, dn_w, &dn_b, ComputeType::kBF16);
  ASSERT_TRUE(gate_up.ok() && down.ok());
  const std::vector<float> x = testing::RandomNormal(m * h, 6, 1.f), y0 = testing::RandomNormal(m * h, 7, 1.f);
  float* dx = gpu->Up(x);
  float* dnorm = gpu->Up(std::vector<float>(norm.data<float>(), norm.data<float>() + h));
  float* staging = gpu->Up(std::vector<float>(m * h, 0.f));
  float* gu_out = gpu->Up(std::vector<float>(m * 2 * inter, 0.f));
  float* act = gpu->Up(std::vector<float>(m * inter, 0.f));
  const LinearInput in = LinearInput::RmsNorm(dx, dnorm, 1e-6f, staging);
  const auto mlp = [&](CudaDevice::HopperGemmUse use) {
    EXPECT_TRUE(cuda.SetHopperGemm(use).ok());
    float* dy = gpu->Up(y0);
    GatedMlp(dev, **gate_up, **down, in, m, {gu_out, act}, dy);
    return gpu->Down(dy, static_cast<size_t>(m * h));
  };
  EXPECT_FALSE(cuda.SetHopperGemmTileN(192).ok());
  for (const int tile_n : {128, 256}) {
    SCOPED_TRACE(::testing::Message() << "tile " << tile_n);
    ASSERT_TRUE(cuda.SetHopperGemmTileN(tile_n).ok());
    const std::vector<float> ref = mlp(CudaDevice::HopperGemmUse::kOff);
    const std::vector<float> swiglu = mlp(CudaDevice::HopperGemmUse::kSwiGlu);
    const std::vector<float> all = mlp(CudaDevice::HopperGemmUse::kAll);
    EXPECT_NE(swiglu, ref) << "the fused path's rounding should show";
    const auto rel_l2 = [](const std::vector<float>& a, const std::vector<float>& b) {
      return testing::RelativeL2(a.data(), b.data(), static_cast<int64_t>(b.size()));
    };
    EXPECT_LT(rel_l2(swiglu, ref), 5e-3) << "gated MLP: SwiGLU fused vs cuBLASLt's hand-off";
    EXPECT_LT(rel_l2(all, swiglu), 1e-4) << "gated MLP: down on the Hopper GEMM too";
    // A tile's sums do not depend on which block computes it, or after which other tile.
    cuda.SetHopperGemmPersistent(false);
    EXPECT_EQ(mlp(CudaDevice::HopperGemmUse::kAll), all) << "a block per tile vs persistent";
    cuda.SetHopperGemmPersistent(true);

    // f32 rows with bias and the residual add; bf16 rows.
    float* down_in = gpu->Up(testing::RandomNormal(m * inter, 8, 1.f));
    for (const bool to_bf16 : {false, true}) {
      std::vector<float> got[2];
      for (const auto use : {CudaDevice::HopperGemmUse::kOff, CudaDevice::HopperGemmUse::kAll}) {
        ASSERT_TRUE(cuda.SetHopperGemm(use).ok());
        const int i = use == CudaDevice::HopperGemmUse::kOff ? 0 : 1;
        if (to_bf16) {
          const int64_t ldy = inter * 2 + 8;
          uint16_t* y = gpu->Up(std::vector<uint16_t>(m * ldy, 0));
          LinearForwardToBf16(dev, **gate_up, LinearInput::Plain(dx), m, y, ldy);
          const std::vector<uint16_t> bits = gpu->Down(y, static_cast<size_t>(m * ldy));
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t c = 0; c < 2 * inter; ++c) got[i].push_back(core::Bf16ToFloat(bits[r * ldy + c]));
            for (int64_t c = 2 * inter; c < ldy; ++c) ASSERT_EQ(bits[r * ldy + c], 0) << "padding written";
          }
        } else {
          float* y = gpu->Up(y0);
          LinearForward(dev, **down, LinearInput::Plain(down_in), m, y, Epilogue::kAccumulate);
          got[i] = gpu->Down(y, static_cast<size_t>(m * h));
        }
      }
      EXPECT_LT(rel_l2(got[1], got[0]), to_bf16 ? 4e-3 : 1e-5) << (to_bf16 ? "bf16 rows" : "f32 rows + residual");
    }
  }
  ASSERT_TRUE(cuda.SetHopperGemmTileN(128).ok());
  ASSERT_TRUE(cuda.SetHopperGemm(CudaDevice::HopperGemmUse::kOff).ok());
  EXPECT_TRUE(cuda.status().ok()) << cuda.status();
}

// The vision blocks' qkv with the rotary in the Hopper GEMM's epilogue (kAll) against cuBLASLt's
// bf16 rows and the rotary launch (kOff): the fused path rounds once, after the rotary, the other
// before and after it; v's columns and the padding past the output as the reference has them.
TEST(CudaHopperGemm, TheQkvRotaryEpilogueAgreesWithTheRotaryLaunch) {
  std::unique_ptr<testing::Gpu> gpu = HopperGpu();
  if (gpu == nullptr) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  Device& dev = *gpu->dev;
  CudaDevice& cuda = gpu->cuda();
  const int64_t h = 1280, m = 300, ldy = 3 * h + 8;
  const int heads = 16, hd = 80;
  const core::Tensor w = Bf16Weight(3 * h, h, 11), bias = F32Vector(3 * h, 12, 0.1f);
  auto qkv = Linear::Create(dev, w, &bias, ComputeType::kBF16);
  ASSERT_TRUE(qkv.ok()) << qkv.status();
  const QkvRotary rotary = RandomRotaryOnGpu(*gpu, m, heads, hd, 13);
  float* dx = gpu->Up(testing::RandomNormal(m * h, 14, 1.f));
  float* dnorm = gpu->Up(testing::RandomNormal(h, 15, 0.1f));
  float* staging = gpu->Up(std::vector<float>(m * h, 0.f));
  const LinearInput in = LinearInput::RmsNorm(dx, dnorm, 1e-6f, staging);
  std::vector<uint16_t> got[2];
  for (const auto use : {CudaDevice::HopperGemmUse::kOff, CudaDevice::HopperGemmUse::kAll}) {
    ASSERT_TRUE(cuda.SetHopperGemm(use).ok());
    uint16_t* y = gpu->Up(std::vector<uint16_t>(m * ldy, 0x7FC0));  // a NaN where nothing may write
    LinearForwardToBf16Rotary(dev, **qkv, in, m, y, ldy, rotary);
    got[use == CudaDevice::HopperGemmUse::kOff ? 0 : 1] = gpu->Down(y, static_cast<size_t>(m * ldy));
  }
  double e = 0, r = 0;
  for (int64_t row = 0; row < m; ++row) {
    for (int64_t c = 0; c < ldy; ++c) {
      const uint16_t ref = got[0][row * ldy + c], fused = got[1][row * ldy + c];
      if (c >= 3 * h) {
        ASSERT_EQ(fused, 0x7FC0) << "padding written at row " << row << " col " << c;
        continue;
      }
      const double a = core::Bf16ToFloat(fused), b = core::Bf16ToFloat(ref);
      e += (a - b) * (a - b);
      r += b * b;
    }
  }
  EXPECT_LT(std::sqrt(e / r), 4e-3) << "qkv + rotary: the epilogue vs the rotary launch";
  EXPECT_NE(got[0], got[1]) << "the fused path's single rounding should show";
  ASSERT_TRUE(cuda.SetHopperGemm(CudaDevice::HopperGemmUse::kOff).ok());
  EXPECT_TRUE(cuda.status().ok()) << cuda.status();
}

// A vision block's chain on the Hopper GEMM (kAll) with the RMSNorm handed on against the norm
// kernel (the hand-off off): an MLP writing the residual stream hands the next norm on to a
// second MLP's gate_up (SwiGLU), whose down hands the next to the qkv projection with its rotary.
// The stream's f32 rows are the same bits either way (the hand-off only adds outputs); the bf16
// results differ only in where a rounding falls (bf16(x w) r against bf16(x r w)).
TEST(CudaHopperGemm, TheRmsNormHandoffAgreesWithTheNormKernel) {
  std::unique_ptr<testing::Gpu> gpu = HopperGpu();
  if (gpu == nullptr) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  Device& dev = *gpu->dev;
  CudaDevice& cuda = gpu->cuda();
  const int64_t h = 1280, inter = 3420, m = 300, ldy = 3 * h;
  const int heads = 16, hd = 80;
  const float eps = 1e-6f;
  const core::Tensor gu_w = Bf16Weight(2 * inter, h, 21), dn_w = Bf16Weight(h, inter, 22),
                     qkv_w = Bf16Weight(3 * h, h, 23);
  const core::Tensor gu_b = F32Vector(2 * inter, 24, 0.1f), dn_b = F32Vector(h, 25, 0.1f),
                     qkv_b = F32Vector(3 * h, 26, 0.1f);
  auto gate_up = Linear::Create(dev, gu_w, &gu_b, ComputeType::kBF16);
  auto down = Linear::Create(dev, dn_w, &dn_b, ComputeType::kBF16);
  auto qkv = Linear::Create(dev, qkv_w, &qkv_b, ComputeType::kBF16);
  ASSERT_TRUE(gate_up.ok() && down.ok() && qkv.ok());
  // The norms' weights: the first MLP's (applied by the norm kernel), then the handed-on two.
  float* const norm_a = gpu->Up(testing::RandomNormal(h, 27, 0.2f));
  float* norm_w[2];
  for (int i = 0; i < 2; ++i) {
    const core::Tensor w = F32Vector(h, 28 + i, 0.2f, 1.f);
    norm_w[i] = gpu->Up(std::vector<float>(w.data<float>(), w.data<float>() + h));
  }
  float* const norm_b = norm_w[0];
  float* const norm_c = norm_w[1];
  const QkvRotary rotary = RandomRotaryOnGpu(*gpu, m, heads, hd, 30);
  const std::vector<float> x0 = testing::RandomNormal(m * h, 31, 1.f);
  float* staging = gpu->Up(std::vector<float>(m * h, 0.f));
  float* gu_out = gpu->Up(std::vector<float>(m * 2 * inter, 0.f));
  float* act = gpu->Up(std::vector<float>(m * inter, 0.f));
  uint16_t* hand_rows = gpu->Up(std::vector<uint16_t>(m * h, 0));
  float* hand_partials = gpu->Up(std::vector<float>(m * 16, 0.f));
  const auto handoff = [&](const float* w) {
    RmsNormHandoff n;
    n.weight = w;
    n.eps = eps;
    n.rows = hand_rows;
    n.ld = h;
    n.partials = hand_partials;
    n.max_parts = 16;
    return n;
  };
  struct Result {
    std::vector<float> stream;
    std::vector<uint16_t> qkv;
    int parts[2];
  };
  const auto chain = [&](bool on) {
    cuda.SetRmsNormHandoff(on);
    Result res;
    float* x = gpu->Up(x0);
    RmsNormHandoff b = handoff(norm_b);
    GatedMlp(dev, **gate_up, **down, LinearInput::RmsNorm(x, norm_a, eps, staging), m, {gu_out, act}, x, &b);
    res.parts[0] = b.parts;
    RmsNormHandoff c = handoff(norm_c);
    GatedMlp(dev, **gate_up, **down, LinearInput::RmsNorm(x, norm_b, eps, staging, &b), m, {gu_out, act}, x, &c);
    res.parts[1] = c.parts;
    uint16_t* y = gpu->Up(std::vector<uint16_t>(m * ldy, 0));
    LinearForwardToBf16Rotary(dev, **qkv, LinearInput::RmsNorm(x, norm_c, eps, staging, &c), m, y, ldy, rotary);
    res.stream = gpu->Down(x, static_cast<size_t>(m * h));
    res.qkv = gpu->Down(y, static_cast<size_t>(m * ldy));
    return res;
  };
  ASSERT_TRUE(cuda.SetHopperGemm(CudaDevice::HopperGemmUse::kAll).ok());
  for (const int tile_n : {128, 256}) {
    SCOPED_TRACE(::testing::Message() << "tile " << tile_n);
    ASSERT_TRUE(cuda.SetHopperGemmTileN(tile_n).ok());
    const Result off = chain(false), on = chain(true);
    EXPECT_EQ(off.parts[0], 0);
    EXPECT_EQ(off.parts[1], 0);
    EXPECT_EQ(on.parts[0], h / tile_n) << "down hands the norm on";
    EXPECT_EQ(on.parts[1], h / tile_n);
    const auto widen = [](const std::vector<uint16_t>& bits) {
      std::vector<float> v(bits.size());
      for (size_t i = 0; i < bits.size(); ++i) v[i] = core::Bf16ToFloat(bits[i]);
      return v;
    };
    const std::vector<float> qkv_on = widen(on.qkv), qkv_off = widen(off.qkv);
    EXPECT_LT(testing::RelativeL2(qkv_on.data(), qkv_off.data(), static_cast<int64_t>(qkv_off.size())), 4e-3)
        << "qkv after two handed-on norms vs the norm kernel";
    EXPECT_NE(on.qkv, off.qkv) << "the hand-off's rounding should show";
    // The second MLP read its handed-on norm: the stream after it differs by a rounding's worth.
    EXPECT_LT(testing::RelativeL2(on.stream.data(), off.stream.data(), static_cast<int64_t>(off.stream.size())), 1e-3)
        << "the residual stream";
  }
  cuda.SetRmsNormHandoff(true);
  ASSERT_TRUE(cuda.SetHopperGemmTileN(128).ok());
  ASSERT_TRUE(cuda.SetHopperGemm(CudaDevice::HopperGemmUse::kOff).ok());
  EXPECT_TRUE(cuda.status().ok()) << cuda.status();
}

#else

TEST(CudaHopperGemm, NeedsTheCudaBackend) { GTEST_SKIP() << "this build has no CUDA backend"; }

#endif

}  // namespace
}  // namespace iris::kernels::cuda
