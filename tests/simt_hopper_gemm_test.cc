// iris's Hopper GEMM (kernels/cuda/hopper_gemm.cuh) on the SIMT harness: the kernel's own code —
// its ring of stages, the producer's and consumers' barrier phases, the descriptors' K steps, the
// epilogues and their edges — against a double reference on the bf16 inputs, with the copy
// engine, the transaction barriers and the warpgroup MMAs twinned as the PTX ISA describes them
// (simt.h). The twins' swizzle is checked against the ISA's pattern on its own. What only the
// hardware can say (the descriptor's bit fields, the tensor map's encoding) is
// cuda_linear_test's CudaHopperGemm tests, on a GPU (tests/cuda_linear_test_hopper_gemm.cc).
// (Not named cuda_*: that prefix means label gpu, and this suite is for machines without one.)
#include "kernels/cuda/hopper_gemm.cuh"
#include "kernels/cuda/hopper_probes.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tests/hopper_gemm_cases.h"
#include "tests/simt_sanitized.h"

namespace iris::kernels::cuda {
namespace {

using testing::HopperCase;
using testing::HopperData;

// The 128-byte swizzle as the CUDA programming guide's TMA swizzle table draws it: within each
// 1024-byte span of 8 rows of 128 bytes, row r's 16-byte chunk c is stored at chunk c XOR r.
TEST(SimtHopperTwins, SwizzleIsTheXorOfChunkAndRow) {
  alignas(1024) static unsigned char tile[1024];
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 8; ++c) {
      const unsigned char* p = simt::Swizzle128(tile + 128 * r + 16 * c + 5);
      EXPECT_EQ(p - tile, 128 * r + 16 * (c ^ r) + 5) << "row " << r << " chunk " << c;
    }
  }
}

// A box landed by the copy engine's twin reads back, through a wgmma descriptor's twin, as the
// matrix it came from (zeros past its edges), at every K step of the descriptor.
TEST(SimtHopperTwins, TmaBoxReadsBackThroughTheDescriptor) {
  constexpr int kRows = 70, kCols = 100, kLd = 104;
  std::vector<uint16_t> m(kRows * kLd);
  for (int i = 0; i < kRows * kLd; ++i) m[i] = core::FloatToBf16(static_cast<float>(i % 251) - 125.f);
  TmaMap2d map{m.data(), kCols, kRows, kLd * 2, 64, 64};
  alignas(1024) static unsigned char box[64 * 128];
  alignas(8) static uint64_t bar;
  MBarrierInit(&bar, 1);
  MBarrierArriveExpectTx(&bar, sizeof(box));
  TmaLoad2d(box, &map, 64, 40, &bar);  // rows 40..103 (70.. are past), columns 64..127 (100.. are past)
  MBarrierWait(&bar, 0);
  for (int kk = 0; kk < 4; ++kk) {
    const WgmmaDesc d = WgmmaDescAdvance(WgmmaDescSw128(box), 32 * kk);
    for (int r = 0; r < 64; ++r) {
      for (int k = 0; k < 16; ++k) {
        const int gr = 40 + r, gc = 64 + 16 * kk + k;
        const float want = gr < kRows && gc < kCols ? core::Bf16ToFloat(m[gr * kLd + gc]) : 0.f;
        ASSERT_EQ(simt::SwizzledAt(d, r, k), want) << "row " << r << " k " << 16 * kk + k;
      }
    }
  }
}

// The barrier's phases: a fresh barrier's "previous" phase (parity 1) counts as complete; a phase
// completes on its last arrival with every announced byte landed, and not before.
TEST(SimtHopperTwins, TransactionBarrierCompletesOnArrivalsAndBytes) {
  alignas(8) uint64_t bar;
  MBarrierInit(&bar, 2);
  MBarrierWait(&bar, 1);  // returns at once
  MBarrierArriveExpectTx(&bar, 64);
  MBarrierArrive(&bar);
  EXPECT_EQ(bar >> 63, 0u) << "complete with 64 bytes still expected";
  simt::BarrierUpdate(&bar, 0, -64);  // the copy engine's bytes
  EXPECT_EQ(bar >> 63, 1u);
  MBarrierWait(&bar, 0);  // phase 0 done
  MBarrierArrive(&bar);
  MBarrierArrive(&bar);
  EXPECT_EQ(bar >> 63, 0u) << "phase 1 completes on its two arrivals";
  MBarrierWaitPhase(&bar, 1);  // the last completed phase
}

// A wait by parity for a phase the parity cannot name (two ahead of the barrier, or two behind)
// fails on the twin, as it happens, instead of returning at once or waiting for the wrong phase.
TEST(SimtHopperTwinsDeathTest, WaitForAPhaseTheParityCannotNameFails) {
  alignas(8) static uint64_t bar;
  MBarrierInit(&bar, 1);
  MBarrierWaitPhase(&bar, -1);  // a fresh barrier's phase before
  EXPECT_DEATH(MBarrierWaitPhase(&bar, 1), "two or more ahead");
  MBarrierArrive(&bar);
  MBarrierArrive(&bar);
  MBarrierArrive(&bar);  // phases 0-2 done, 3 current
  EXPECT_DEATH(MBarrierWaitPhase(&bar, 1), "two or more behind");
  MBarrierWaitPhase(&bar, 2);
}

// The probes a GPU's first run starts from (cuda_linear_test_hopper_gemm.cc), on the twins: they
// must pass here, or their GPU verdicts would mean nothing.
TEST(SimtHopperProbes, TheBoxLandsSwizzledWithZerosPastTheEdges) {
  constexpr int64_t kRows = 100, kCols = 90, kLd = 96;
  const std::vector<uint16_t> m = testing::Bf16Normal(kRows * kLd, 3);
  const TmaMap2d map{m.data(), kCols, kRows, kLd * 2, 64, 64};
  for (const auto& [x, y] : {std::pair{0, 0}, std::pair{64, 50}}) {
    std::vector<unsigned char> out(kProbeBoxBytes, 0xAB);
    LaunchShared(Dim3(1), Dim3(128), kProbeSharedBytes, TmaBoxProbeKernel, map, int32_t{x}, int32_t{y}, out.data());
    testing::ExpectSwizzledBox(m, kRows, kCols, kLd, x, y, out, Swizzled128Offset);
  }
}

TEST(SimtHopperProbes, OneWarpgroupMmaAtEachKStep) {
  const std::vector<uint16_t> a = testing::Bf16Normal(64 * 64, 4), b = testing::Bf16Normal(128 * 64, 5);
  for (int kk = 0; kk < 4; ++kk) {
    std::vector<float> d(64 * 128, 7.f);
    LaunchShared(Dim3(1), Dim3(128), kProbeSharedBytes, WgmmaProbeKernel, a.data(), b.data(), kk, d.data());
    testing::ExpectWgmmaProbe(a, b, kk, d);
  }
}

// The kernel that runs g on the harness, chosen as the launcher chooses it (WithHopperKernel).
void LaunchTwin(const HopperGemm& g, const TmaMap2d& a, const TmaMap2d& b) {
  const HopperGemmParams p = HopperGemmParamsOf(g);
  const bool chosen = WithHopperKernel(g, [&](auto kernel) {
    using K = decltype(kernel);
    LaunchShared(Dim3(HopperGemmGrid(g).blocks), Dim3(kHopperThreads), HopperTile<K::kWidth>::kSharedBytes,
                 HopperGemmKernel<K::kEpilogue, K::kWidth>, a, b, p);
  });
  ASSERT_TRUE(chosen) << "no kernel for epilogue " << static_cast<int>(g.epilogue) << " at width " << g.tile_n;
}

void RunCase(const HopperCase& c, int tile_n, int max_blocks) {
  SCOPED_TRACE(c.Name() + " tile " + std::to_string(tile_n) + " max blocks " + std::to_string(max_blocks));
  const HopperData d = testing::MakeHopperData(c, 17);
  constexpr float kPad = 12345.f;
  std::vector<float> y_f32;
  std::vector<uint16_t> y_bf16;
  HopperGemm g = testing::HopperGemmOf(c, d, tile_n);
  g.max_blocks = max_blocks;
  if (c.epilogue == HopperEpilogue::kF32) {
    y_f32 = testing::HopperStartingF32(c, d, kPad);
    g.y = y_f32.data();
  } else {
    y_bf16 = testing::HopperStartingBf16(c, d, kPad);
    g.y = y_bf16.data();
  }
  const TmaMap2d a{g.a, static_cast<uint64_t>(c.k), static_cast<uint64_t>(c.m), static_cast<uint64_t>(d.lda * 2),
                   64, kHopperTileRows};
  const TmaMap2d b{g.b, static_cast<uint64_t>(c.k), static_cast<uint64_t>(HopperGemmBRows(g)),
                   static_cast<uint64_t>(d.ldb * 2), 64, static_cast<uint32_t>(tile_n / 2)};
  testing::HopperNormOut norm;
  if (c.norm_out) {
    norm = testing::HopperStartingNormOut(c, d, tile_n, kPad);
    testing::HopperAttachNormOut(d, norm, g);
  }
  ASSERT_TRUE(HopperGemmTakes(g));
  LaunchTwin(g, a, b);
  testing::ExpectHopperResult(c, d, y_f32, y_bf16, kPad);
  if (c.norm_out) testing::ExpectHopperNormOut(c, d, y_f32, norm, tile_n, kPad);
}

// Every epilogue on odd sizes, with B tiles of 128 (ping-pong) and of 256 rows; a block per tile,
// one block taking every tile, and 3 blocks taking the tiles in turn (persistent: a block's ring
// and barrier phases run on from one tile into the next — at 128, from one warpgroup's tile into
// the other's — and tiles do not divide evenly among the blocks). Under a sanitizer: the ring
// going round (case 0), the f32 accumulate with bias (1), SwiGLU's edges (3), the one-by-one
// stores (6) and the long K (7) — every path between them.
TEST(SimtHopperGemm, MatchesTheDefinitionOnOddSizes) {
  const std::vector<HopperCase> cases = testing::HopperCases();
  for (const int tile_n : {128, 256}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      if (testing::kSimtSanitized && i != 0 && i != 1 && i != 3 && i != 6 && i != 7) continue;
      for (const int max_blocks : {0, 1, 3}) RunCase(cases[i], tile_n, max_blocks);
    }
  }
}

// The RMSNorm hand-off between GEMMs: f32 rows (the residual stream) handing the next norm's
// input on — its bf16 rows times the weight and each tile's partial sums of squares — and every
// epilogue scaling a row by the norm's factor from such partials before its bias. Under a
// sanitizer: the norm out with its last partial tile (case 0) and SwiGLU's factor (3).
TEST(SimtHopperGemm, HandsAnRmsNormOnAndAppliesIt) {
  const std::vector<HopperCase> cases = testing::HopperNormCases();
  for (size_t i = 0; i < cases.size(); ++i) {
    if (testing::kSimtSanitized && i != 0 && i != 3) continue;
    for (const int tile_n : testing::HopperTileWidths(cases[i])) {
      for (const int max_blocks : {0, 3}) RunCase(cases[i], tile_n, max_blocks);
    }
  }
}

// The launcher's check, on the host: what the copy engine cannot read, and the rotary epilogue's
// own terms.
TEST(SimtHopperGemm, RefusesWhatItCannotRead) {
  HopperGemm g;
  alignas(16) static uint16_t a[64], b[64];
  static float y[64];
  g.a = a;
  g.b = b;
  g.y = y;
  g.m = g.n = 4;
  g.k = 8;
  g.lda = g.ldb = 8;
  g.ldy = 4;
  EXPECT_TRUE(HopperGemmTakes(g));
  HopperGemm bad = g;
  bad.lda = 12;  // rows not whole 16-byte vectors
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = g;
  bad.a = a + 1;  // misaligned
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = g;
  bad.ldy = 3;
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = g;
  bad.k = 16;  // past the rows' stride
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = g;
  bad.tile_n = kHopperRotaryTileN;  // the rotary's width only
  EXPECT_FALSE(HopperGemmTakes(bad));

  static float table[40];
  HopperGemm rot = g;
  rot.epilogue = HopperEpilogue::kBf16Rotary;
  rot.n = rot.ldy = 160;
  rot.tile_n = kHopperRotaryTileN;
  rot.head_dim = kHopperRotaryHeadDim;
  rot.rotary_heads = 2;
  rot.cos = rot.sin = table;
  EXPECT_TRUE(HopperGemmTakes(rot));
  bad = rot;
  bad.rotary_heads = 3;  // past n
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = rot;
  bad.head_dim = 64;  // not the heads its tiles hold
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = rot;
  bad.tile_n = 256;
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = rot;
  bad.sin = nullptr;
  EXPECT_FALSE(HopperGemmTakes(bad));

  // The norm hand-off: out from f32 rows only, into even rows; a factor from at least one partial.
  alignas(16) static uint16_t norm_rows[64];
  static float partials[64];
  HopperGemm out = g;
  out.norm_rows = norm_rows;
  out.norm_ld = 4;
  out.norm_weight = partials;
  out.norm_partials = partials;
  out.partials_ld = 1;
  EXPECT_TRUE(HopperGemmTakes(out));
  bad = out;
  bad.n = bad.ldy = bad.norm_ld = 130;  // two tile columns: no room for the second partial
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = out;
  bad.norm_ld = 5;
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = out;
  bad.norm_rows = norm_rows + 1;  // 2-byte aligned
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = out;
  bad.norm_partials = nullptr;
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = out;
  bad.epilogue = HopperEpilogue::kBf16;
  EXPECT_FALSE(HopperGemmTakes(bad));
  HopperGemm in = rot;
  in.row_partials = partials;
  in.row_parts = 2;
  in.partials_ld = 2;
  in.norm_width = 1280;
  EXPECT_TRUE(HopperGemmTakes(in));
  bad = in;
  bad.row_parts = 0;
  EXPECT_FALSE(HopperGemmTakes(bad));
  bad = in;
  bad.partials_ld = 1;
  EXPECT_FALSE(HopperGemmTakes(bad));
}

// The qkv projection with the rotary in its epilogue, on tiles of three heads. Under a
// sanitizer: the mixed tile with its ragged rows (case 0) and the odd stride (2).
TEST(SimtHopperGemm, RotaryEpilogueTurnsQAndKHeadsAsTheRotaryDoes) {
  const std::vector<HopperCase> cases = testing::HopperRotaryCases();
  for (size_t i = 0; i < cases.size(); ++i) {
    if (testing::kSimtSanitized && i == 1) continue;
    for (const int max_blocks : {0, 1, 3}) RunCase(cases[i], kHopperRotaryTileN, max_blocks);
  }
}

}  // namespace
}  // namespace iris::kernels::cuda
