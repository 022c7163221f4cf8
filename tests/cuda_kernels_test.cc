// iris's own CUDA kernels on a real GPU (label gpu: scripts/test.sh runs it only where nvidia-smi
// works), against the CPU kernels on odd sizes — the same device code simt_kernels_test runs on
// the host harness in CI.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/elementwise.h"
#include "kernels/paged_attention.h"
#include "kernels/patch_rows.h"
#include "kernels/qkv_pad.h"
#include "kernels/logit_edits.h"
#include "kernels/rotary.h"
#include "kernels/rows.h"
#include "kernels/row_draw.h"
#include "kernels/sample_rows.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_kernels.h"
#endif
#include "tests/draw_cases.h"
#include "tests/kernel_cases.h"

namespace iris::kernels {
namespace {

#ifdef IRIS_HAVE_CUDA

using testing::ActivationInputs;
using testing::ExpectCloseRel;
using testing::ExpectSameBits;
using testing::RandomNormal;

using testing::MakeGpu;

TEST(CudaKernelsTest, RmsNormAndSiluMulMatchTheCpuKernels) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& cpu = DefaultCpuDevice();
  for (const auto& [rows, dim] : {std::pair{3, 1}, {5, 77}, {33, 1280}, {4, 2051}}) {
    const std::vector<float> x = RandomNormal(static_cast<size_t>(rows) * dim, 1 + dim), w = RandomNormal(dim, 2 + dim);
    std::vector<float> want(x.size());
    RmsNorm(cpu, x.data(), w.data(), rows, dim, 1e-6f, want.data());
    float* y = g->Up(std::vector<float>(x.size()));
    ASSERT_EQ(cuda::LaunchRmsNorm(g->cuda().stream(), g->Up(x), g->Up(w), rows, dim, 1e-6f, y), 0);
    ExpectCloseRel(g->Down(y, x.size()), want, 2e-6f, "rms_norm");
  }
  for (const auto& [rows, inter] : {std::pair{1, 1}, {3, 37}, {7, 3420}}) {
    const std::vector<float> gu = RandomNormal(static_cast<size_t>(rows) * 2 * inter, 3 + inter, 3.f);
    std::vector<float> want(static_cast<size_t>(rows) * inter);
    SiluMulRows(cpu, gu.data(), rows, inter, want.data());
    float* out = g->Up(std::vector<float>(want.size()));
    ASSERT_EQ(cuda::LaunchSiluMulRows(g->cuda().stream(), g->Up(gu), rows, inter, out), 0);
    ExpectCloseRel(g->Down(out, want.size()), want, 4e-6f, "silu_mul");  // expf vs the CPU's exp
  }
}

// Past 65536 blocks of 256 threads: the flat kernels' grid-stride loops go round more than once.
constexpr int64_t kFlatSizes[] = {1, 77, 2051, (int64_t{1} << 24) + 77};

TEST(CudaKernelsTest, ActivationsAndAddMatchTheCpuKernels) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& cpu = DefaultCpuDevice();
  for (const int64_t n : kFlatSizes) {
    const std::vector<float> x = ActivationInputs(n, 20 + static_cast<uint32_t>(n % 1000)), b = RandomNormal(n, 21);
    float* dx = g->Up(x);
    float* db = g->Up(b);
    float* dy = g->Up(std::vector<float>(n, NAN));
    std::vector<float> want(n);
    SiluMul(cpu, x.data(), b.data(), n, want.data());
    ASSERT_EQ(cuda::LaunchSiluMul(g->cuda().stream(), dx, db, n, dy), 0);
    ExpectCloseRel(g->Down(dy, n), want, 4e-6f, "silu_mul");  // expf vs the CPU's exp
    GeluErf(cpu, x.data(), n, want.data());
    ASSERT_EQ(cuda::LaunchGeluErf(g->cuda().stream(), dx, n, dy), 0);
    ExpectCloseRel(g->Down(dy, n), want, 2e-6f, "gelu_erf");  // erfcf vs the CPU's erfc fit
    QuickGelu(cpu, x.data(), n, want.data());
    ASSERT_EQ(cuda::LaunchQuickGelu(g->cuda().stream(), dx, n, dy), 0);
    ExpectCloseRel(g->Down(dy, n), want, 4e-6f, "quick_gelu");
    Add(cpu, x.data(), b.data(), n, want.data());
    ASSERT_EQ(cuda::LaunchAdd(g->cuda().stream(), dx, db, n, dy), 0);
    testing::ExpectSameValues(g->Down(dy, n), want, "add");
  }
}

TEST(CudaKernelsTest, LayerNormMatchesTheCpuKernel) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& cpu = DefaultCpuDevice();
  for (const auto& [rows, dim] : {std::pair{3, 1}, {5, 77}, {33, 1280}, {4, 2051}}) {
    std::vector<float> x = RandomNormal(static_cast<int64_t>(rows) * dim, 26 + dim, 2.f);
    for (float& v : x) v += 3.f;  // off-centre rows
    const std::vector<float> w = RandomNormal(dim, 27 + dim), b = RandomNormal(dim, 28 + dim);
    std::vector<float> want(x.size());
    LayerNorm(cpu, x.data(), w.data(), b.data(), rows, dim, 1e-6f, want.data());
    float* y = g->Up(std::vector<float>(x.size(), NAN));
    ASSERT_EQ(cuda::LaunchLayerNorm(g->cuda().stream(), g->Up(x), g->Up(w), g->Up(b), rows, dim, 1e-6f, y), 0);
    ExpectCloseRel(g->Down(y, x.size()), want, 4e-6f, "layer_norm");
  }
}

TEST(CudaKernelsTest, RotaryPadOneOfQkvAndUnpadHeadsMatchTheCpuKernels) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& cpu = DefaultCpuDevice();
  for (const int hd : {2, 77, 80, 128}) {
    const int rows = 13, heads = 3, half = hd / 2;
    const int64_t stride = int64_t{heads + 1} * hd;  // strided heads: the 4th head's room untouched
    const std::vector<float> x = RandomNormal(rows * stride, 30 + hd);
    const std::vector<float> cos = RandomNormal(rows * half, 31), sin = RandomNormal(rows * half, 32);
    std::vector<float> want = x;
    Rotary(cpu, HeadsView{want.data(), stride, heads}, rows, hd, cos.data(), sin.data());
    float* d = g->Up(x);
    ASSERT_EQ(cuda::LaunchRotary(g->cuda().stream(), d, stride, heads, rows, hd, g->Up(cos), g->Up(sin)), 0);
    ExpectCloseRel(g->Down(d, x.size()), want, 1e-6f, "rotary");
  }
  for (const auto& [rows, heads, hd, padded] : {std::tuple{11, 3, 80, 96}, {1, 1, 1, 1}, {300, 16, 80, 128}}) {
    const std::vector<float> qkv = RandomNormal(int64_t{rows} * 3 * heads * hd, 33 + hd);
    const size_t n = static_cast<size_t>(heads) * rows * padded;
    const float* dqkv = g->Up(qkv);
    for (int which = 0; which < 3; ++which) {
      std::vector<float> want(n);
      PadOneOfQkv(cpu, qkv.data(), rows, heads, hd, padded, which, want.data());
      float* out = g->Up(std::vector<float>(n, NAN));
      ASSERT_EQ(cuda::LaunchPadOneOfQkv(g->cuda().stream(), dqkv, rows, heads, hd, padded, which, out), 0);
      ExpectSameBits(g->Down(out, n), want, "pad_one_of_qkv");
    }
    const std::vector<float> attn = RandomNormal(int64_t{rows} * heads * padded, 34 + hd);
    std::vector<float> want(static_cast<size_t>(rows) * heads * hd);
    UnpadHeads(cpu, attn.data(), rows, heads, hd, padded, want.data());
    float* out = g->Up(std::vector<float>(want.size(), NAN));
    ASSERT_EQ(cuda::LaunchUnpadHeads(g->cuda().stream(), g->Up(attn), rows, heads, hd, padded, out), 0);
    ExpectSameBits(g->Down(out, want.size()), want, "unpad_heads");
  }
}

// Patch rows made on the GPU (odd layouts, ranges inside merge groups, and a 1344x1008 image's
// 6912 rows of Qwen2.5-VL's layout) against the CPU op, bit for bit.
TEST(CudaKernelsTest, PatchRowsMatchTheCpuOp) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& cpu = DefaultCpuDevice();
  using testing::PatchRowsCase;
  for (const PatchRowsCase& c : {PatchRowsCase{{3, 3, 1, 9, 6}, 1, 5}, PatchRowsCase{{14, 2, 2, 56, 84}, 3, 22},
                                 PatchRowsCase{{14, 2, 2, 1008, 1344}, 0, 6912}, PatchRowsCase{{16, 2, 2, 64, 96}, 7, 24}}) {
    const std::vector<uint8_t> rgb = c.Bytes();
    const std::vector<float> table = c.Table();
    std::vector<float> want(c.values());
    PatchRows(cpu, rgb.data(), c.grid, table.data(), c.r0, c.r1, want.data());
    float* out = g->Up(std::vector<float>(want.size(), NAN));
    PatchRows(*g->dev, g->Up(rgb), c.grid, g->Up(table), c.r0, c.r1, out);
    ExpectSameBits(g->Down(out, want.size()), want, "patch_rows");
  }
}

TEST(CudaKernelsTest, RowMovesMatchTheCpuKernels) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& cpu = DefaultCpuDevice();
  for (const auto& [rows, width] : {std::pair{1, int64_t{1}}, {13, int64_t{77}}, {4096, int64_t{1280}}}) {
    const std::vector<float> src = RandomNormal(rows * width, 35 + rows);
    std::vector<int32_t> index = testing::Shuffled(rows, 36);
    index.resize((rows + 1) / 2);  // a subset: scatter leaves the other rows alone
    const int64_t n = static_cast<int64_t>(index.size());
    std::vector<float> gathered(n * width), scattered(src.size(), 7.f);
    GatherRows(cpu, src.data(), width, index, gathered.data());
    ScatterRows(cpu, gathered.data(), width, index, scattered.data());
    const int32_t* dindex = g->Up(index);
    float* dg = g->Up(std::vector<float>(gathered.size(), NAN));
    float* ds = g->Up(std::vector<float>(src.size(), 7.f));
    ASSERT_EQ(cuda::LaunchGatherRows(g->cuda().stream(), g->Up(src), width, dindex, n, dg), 0);
    ASSERT_EQ(cuda::LaunchScatterRows(g->cuda().stream(), dg, width, dindex, n, ds), 0);
    ExpectSameBits(g->Down(dg, gathered.size()), gathered, "gather_rows");
    ExpectSameBits(g->Down(ds, scattered.size()), scattered, "scatter_rows");
  }

  // Every f16 and bf16 bit pattern widened as the CPU op widens it; f32 bits copied as they are.
  const int64_t vocab = 256, width = 256;
  const std::vector<uint16_t> halves = testing::AllHalfBits();
  std::vector<uint32_t> f32_bits(vocab * width);
  for (size_t i = 0; i < f32_bits.size(); ++i) f32_bits[i] = static_cast<uint32_t>(i) * 0x9E3779B1u;
  std::vector<int32_t> ids = testing::AllHalfBitsIds();
  const int64_t n = static_cast<int64_t>(ids.size());
  const int32_t* dids = g->Up(ids);
  for (const core::DType dtype : {core::DType::kF32, core::DType::kBF16, core::DType::kF16}) {
    const bool f32 = dtype == core::DType::kF32;
    const void* host = f32 ? static_cast<const void*>(f32_bits.data()) : halves.data();
    std::vector<float> want(n * width);
    EmbeddingLookup(cpu, core::Tensor::View(const_cast<void*>(host), dtype, {vocab, width}, nullptr), ids,
                    want.data());
    const void* table = f32 ? static_cast<const void*>(g->Up(f32_bits)) : static_cast<const void*>(g->Up(halves));
    const cuda::EmbeddingDType kind = f32 ? cuda::EmbeddingDType::kF32
                                      : dtype == core::DType::kBF16 ? cuda::EmbeddingDType::kBf16
                                                                    : cuda::EmbeddingDType::kF16;
    float* out = g->Up(std::vector<float>(want.size(), 0.f));
    ASSERT_EQ(cuda::LaunchEmbeddingLookup(g->cuda().stream(), table, kind, vocab, width, dids, n, out), 0);
    ExpectSameBits(g->Down(out, want.size()), want, core::DTypeName(dtype));
  }
}

// Shuffled slots, strided rows, bf16 rounding (ties, NaNs, overflow) as the CPU op rounds; a slot
// outside the pool is skipped.
TEST(CudaKernelsTest, WritePagedKvMatchesTheCpuOp) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  const testing::PagedWriteCase c(38);
  const float* dqkv = g->Up(c.qkv);
  const int64_t* dslots = g->Up(c.slots);
  {
    const auto [want_k, want_v] = c.Reference<float>(-7.f);
    float* k = g->Up(std::vector<float>(c.pool_elems(), -7.f));
    float* v = g->Up(std::vector<float>(c.pool_elems(), -7.f));
    ASSERT_EQ(cuda::LaunchWritePagedKv(g->cuda().stream(), dqkv + c.row(), c.stride(), dqkv + 2 * c.row(), c.stride(),
                                       dslots, c.rows, c.row(), c.num_slots(), k, v, /*bf16_pool=*/false),
              0);
    ExpectSameBits(g->Down(k, c.pool_elems()), want_k, "f32 k pool");
    ExpectSameBits(g->Down(v, c.pool_elems()), want_v, "f32 v pool");
  }
  {
    const auto [want_k, want_v] = c.Reference<uint16_t>(0xDEAD);
    uint16_t* k = g->Up(std::vector<uint16_t>(c.pool_elems(), 0xDEAD));
    uint16_t* v = g->Up(std::vector<uint16_t>(c.pool_elems(), 0xDEAD));
    ASSERT_EQ(cuda::LaunchWritePagedKv(g->cuda().stream(), dqkv + c.row(), c.stride(), dqkv + 2 * c.row(), c.stride(),
                                       dslots, c.rows, c.row(), c.num_slots(), k, v, /*bf16_pool=*/true),
              0);
    ExpectSameBits(g->Down(k, c.pool_elems()), want_k, "bf16 k pool");
    ExpectSameBits(g->Down(v, c.pool_elems()), want_v, "bf16 v pool");
  }
  {
    const std::vector<int64_t> bad = {-1, c.num_slots()};
    const std::vector<float> marker(c.pool_elems(), -7.f);
    float* k = g->Up(marker);
    float* v = g->Up(marker);
    ASSERT_EQ(cuda::LaunchWritePagedKv(g->cuda().stream(), dqkv + c.row(), c.stride(), dqkv + 2 * c.row(), c.stride(),
                                       g->Up(bad), 2, c.row(), c.num_slots(), k, v, /*bf16_pool=*/false),
              0);
    ExpectSameBits(g->Down(k, c.pool_elems()), marker, "k pool after bad slots");
    ExpectSameBits(g->Down(v, c.pool_elems()), marker, "v pool after bad slots");
  }
}

TEST(CudaKernelsTest, FusedRotaryAndPaddingMatchTheCpuKernels) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& cpu = DefaultCpuDevice();
  const int rows = 13, qh = 16, kh = 2, hd = 80, half = hd / 2;
  const int64_t stride = static_cast<int64_t>(qh + 2 * kh) * hd;
  const std::vector<float> qkv = RandomNormal(rows * stride, 4);
  const std::vector<float> cos = RandomNormal(rows * half, 5), sin = RandomNormal(rows * half, 6);
  std::vector<float> want = qkv;
  RotaryQK(cpu, HeadsView{want.data(), stride, qh}, HeadsView{want.data() + qh * hd, stride, kh}, rows, hd,
           cos.data(), sin.data());
  float* d = g->Up(qkv);
  ASSERT_EQ(cuda::LaunchRotaryQK(g->cuda().stream(), d, stride, qh, d + qh * hd, stride, kh, rows, hd, g->Up(cos),
                                 g->Up(sin)),
            0);
  ExpectCloseRel(g->Down(d, qkv.size()), want, 1e-6f, "rotary");

  const int heads = 3, phd = 80, padded = 96;
  const std::vector<float> packed = RandomNormal(static_cast<size_t>(rows) * 3 * heads * phd, 7);
  const size_t n = static_cast<size_t>(heads) * rows * padded;
  std::vector<float> q(n), k(n), v(n);
  PadQkv(cpu, packed.data(), rows, heads, phd, padded, q.data(), k.data(), v.data());
  float* gq = g->Up(std::vector<float>(n, NAN));
  float* gk = g->Up(std::vector<float>(n, NAN));
  float* gv = g->Up(std::vector<float>(n, NAN));
  ASSERT_EQ(cuda::LaunchPadQkv(g->cuda().stream(), g->Up(packed), rows, heads, phd, padded, gq, gk, gv), 0);
  EXPECT_EQ(g->Down(gq, n), q);
  EXPECT_EQ(g->Down(gk, n), k);
  EXPECT_EQ(g->Down(gv, n), v);
}

TEST(CudaKernelsTest, ArgmaxPicksTheCpuSamplersToken) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  const int64_t vocab = 151936;
  const int rows = 5;
  std::vector<float> logits = RandomNormal(static_cast<size_t>(rows) * vocab, 8);
  logits[1 * vocab + 7] = 50.f;  // two maxima: the lower id
  logits[1 * vocab + 90000] = 50.f;
  for (int64_t i = 0; i < vocab; ++i) logits[2 * vocab + i] = NAN;  // no number: 0
  logits[3 * vocab + vocab - 1] = std::numeric_limits<float>::infinity();
  const float* dl = g->Up(logits);
  // One block per row, and each row split over 7 and 75 blocks merged by the last of them.
  for (const int slices : {1, 7, 75}) {
    SCOPED_TRACE(::testing::Message() << slices << " slices");
    int32_t* out = g->Up(std::vector<int32_t>(rows, -1));
    float* part_v = g->Up(std::vector<float>(rows * slices, NAN));
    int32_t* part_i = g->Up(std::vector<int32_t>(rows * slices, -1));
    int* counters = g->Up(std::vector<int>(rows, 0));
    ASSERT_EQ(cuda::LaunchArgmax(g->cuda().stream(), dl, rows, vocab, out, slices, part_v, part_i, counters), 0);
    const std::vector<int32_t> got = g->Down(out, rows);
    for (int r = 0; r < rows; ++r) {
      EXPECT_EQ(got[r], testing::CpuGreedyToken(logits.data() + r * vocab, vocab)) << "row " << r;
    }
    EXPECT_EQ(g->Down(counters, rows), std::vector<int>(rows, 0));
  }
}


// A greedy pick's edits on the GPU (a penalty on 2000 seen ids, masked end ids) through the device
// op, then the argmax: the CPU op's rows bit for bit, and the CPU's picks.
TEST(CudaKernelsTest, EditedLogitsPickTheCpusToken) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  const int64_t vocab = 151936;
  const int rows = 3;
  std::vector<float> logits = RandomNormal(static_cast<size_t>(rows) * vocab, 12);
  kernels::LogitEdits edits;
  std::vector<int32_t> seen;
  for (int32_t id = 0; id < 2000; ++id) seen.push_back(id * 71 % static_cast<int32_t>(vocab));
  logits[seen[5]] = 40.f;  // row 0's favourite is seen: the penalty moves the pick unless masked
  edits.AddRow(1.5f, seen, std::vector<int32_t>{151643, 151645});
  edits.AddRow(1.f, {}, {});
  edits.AddRow(0.9f, seen, std::vector<int32_t>{seen[7]});
  std::vector<int32_t> packed(static_cast<size_t>(edits.PackedSize()));
  edits.Pack(packed.data());
  std::vector<float> want = logits;
  kernels::EditLogitRows(kernels::DefaultCpuDevice(), want.data(), rows, vocab, edits.View(packed.data()));
  float* dl = g->Up(logits);
  const int32_t* dp = g->Up(packed);
  kernels::EditLogitRows(*g->dev, dl, rows, vocab, edits.View(dp));
  int32_t* out = g->Up(std::vector<int32_t>(rows, -1));
  kernels::ArgmaxRows(*g->dev, dl, rows, vocab, out);
  ASSERT_TRUE(g->cuda().status().ok()) << g->cuda().status();
  EXPECT_EQ(g->Down(dl, want.size()), want);
  const std::vector<int32_t> got = g->Down(out, rows);
  for (int r = 0; r < rows; ++r) EXPECT_EQ(got[r], testing::CpuGreedyToken(want.data() + r * vocab, vocab)) << "row " << r;
}

// Sampled draws on the GPU pick the CPU op's tokens: every row kind and setting of
// tests/draw_cases.h on Qwen's vocabulary, 48 rows in one launch (one block each).
TEST(CudaKernelsTest, SampledDrawsPickTheCpuOpsToken) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  const int64_t vocab = 151936;
  std::vector<float> logits;
  std::vector<kernels::RowDraw> draws;
  int n = 0;
  for (int kind = 0; kind < testing::kDrawRowKinds; ++kind) {
    for (kernels::RowDraw d : testing::DrawCaseSettings()) {
      const std::vector<float> row = testing::DrawCaseRow(kind, vocab, 300 + static_cast<uint32_t>(n));
      logits.insert(logits.end(), row.begin(), row.end());
      d.uniform = (n * 0.37) - static_cast<int>(n * 0.37);
      draws.push_back(d);
      ++n;
    }
  }
  const int64_t rows = static_cast<int64_t>(draws.size());
  std::vector<float> cpu_rows = logits;
  std::vector<int32_t> want(static_cast<size_t>(rows));
  kernels::SampleRows(kernels::DefaultCpuDevice(), cpu_rows.data(), rows, vocab, draws.data(), want.data());
  float* dl = g->Up(logits);
  std::vector<int32_t> draw_words(draws.size() * sizeof(kernels::RowDraw) / sizeof(int32_t));
  std::memcpy(draw_words.data(), draws.data(), draws.size() * sizeof(kernels::RowDraw));
  const auto* dd = reinterpret_cast<const kernels::RowDraw*>(g->Up(draw_words));
  int32_t* out = g->Up(std::vector<int32_t>(static_cast<size_t>(rows), -1));
  kernels::SampleRows(*g->dev, dl, rows, vocab, dd, out);
  ASSERT_TRUE(g->cuda().status().ok()) << g->cuda().status();
  EXPECT_EQ(g->Down(out, rows), want);
}

// Decodes and a prefill chunk over shuffled pages, f32 and bf16 pools, GQA, head_dim 80 and 128
// (16-byte K loads) and 77 (element loads); whole and with each row's keys split over 5 and 16
// blocks (merged by the last of them).
TEST(CudaKernelsTest, PagedAttentionMatchesTheCpuKernel) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  for (const int hd : {77, 80, 128}) {
    const testing::PagedCase c(/*kv_heads=*/2, /*heads=*/12, hd, /*num_blocks=*/200,
                               {{1, 1}, {17, 1}, {300, 7}, {1000, 1}, {32, 1}, {513, 1}}, /*block_step=*/37,
                               /*block_offset=*/3);
    const std::vector<int32_t> qs(c.meta.query_start.begin(), c.meta.query_start.end());
    const std::vector<int32_t> cl(c.meta.context_lens.begin(), c.meta.context_lens.end());
    const std::vector<int32_t> bt(c.meta.block_tables.begin(), c.meta.block_tables.end());
    for (const bool bf16 : {false, true}) {
      for (const auto& [splits, early] : {std::pair{1, false}, {5, false}, {16, false}, {1, true}, {5, true}}) {
        if (early && !g->cuda().SetEarlyStart(true).ok()) continue;  // below sm_90
        SCOPED_TRACE(::testing::Message() << "head_dim " << hd << ", " << splits << " splits, early start " << early);
        // q written by the kernel just ahead (q + 0), which an early-start launch must wait for.
        float* q = g->Up(std::vector<float>(c.q.size(), NAN));
        ASSERT_EQ(cuda::LaunchAdd(g->cuda().stream(), g->Up(c.q), g->Up(std::vector<float>(c.q.size(), 0.f)),
                                  static_cast<int64_t>(c.q.size()), q),
                  0);
        float* out = g->Up(std::vector<float>(c.q.size(), NAN));
        float* partials = g->Up(std::vector<float>(
            cuda::PagedAttentionPartialBytes(c.rows, c.heads, hd, splits) / sizeof(float), NAN));
        int* counters = g->Up(std::vector<int>(c.rows * c.heads, 0));
        const void* kd = bf16 ? static_cast<const void*>(g->Up(c.kb)) : static_cast<const void*>(g->Up(c.kf));
        const void* vd = bf16 ? static_cast<const void*>(g->Up(c.vb)) : static_cast<const void*>(g->Up(c.vf));
        ASSERT_EQ(cuda::LaunchPagedAttention(g->cuda().stream(), q, c.row_stride(), out, c.row_stride(), c.heads,
                                             c.scale(), kd, vd, bf16, c.block_size, c.kv_heads, hd, g->Up(qs),
                                             g->Up(cl), g->Up(bt), c.meta.max_blocks_per_seq, c.meta.num_seqs, 0,
                                             c.rows, splits, partials, counters, early),
                  0);
        ExpectCloseRel(g->Down(out, c.q.size()), c.Reference(bf16), 2e-5f, bf16 ? "paged bf16" : "paged f32");
        // The last split of each (row, head) left its counter zero for the next launch.
        EXPECT_EQ(g->Down(counters, c.rows * c.heads), std::vector<int>(c.rows * c.heads, 0));
      }
    }
  }
}

#else
TEST(CudaKernelsTest, NeedsTheCudaBackend) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif

}  // namespace
}  // namespace iris::kernels
