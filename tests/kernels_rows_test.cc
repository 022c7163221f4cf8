// The row ops and the device seam: GatherRows / ScatterRows against direct indexing (and as each
// other's inverse), EmbeddingLookup against the dtype conversions, ArgmaxRows against greedy
// decoding's rule, UnpadHeads as the inverse of the padding layout; CreateDevice's answers for
// names it does not serve.
#include "kernels/rows.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/qkv_pad.h"

namespace iris::kernels {
namespace {

Device& dev = DefaultCpuDevice();

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(RowsTest, GatherAndScatterAreInversePermutations) {
  // Wide enough that the CPU device splits the copy over its threads.
  for (const auto& [rows, width] : std::vector<std::pair<int, int64_t>>{{7, 3}, {1000, 80}, {4096, 1280}}) {
    const std::vector<float> src = Random(static_cast<size_t>(rows) * width, rows);
    std::vector<int32_t> index(rows);
    std::iota(index.begin(), index.end(), 0);
    std::shuffle(index.begin(), index.end(), std::mt19937(rows));
    std::vector<float> gathered(src.size(), -1.f), back(src.size(), -1.f);
    GatherRows(dev, src.data(), width, index, gathered.data());
    for (int i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < width; ++j) ASSERT_EQ(gathered[i * width + j], src[index[i] * width + j]);
    }
    ScatterRows(dev, gathered.data(), width, index, back.data());
    EXPECT_EQ(back, src) << rows << "x" << width;
  }
}

TEST(RowsTest, ScatterLeavesOtherRowsAlone) {
  const int64_t width = 5;
  const std::vector<float> src = Random(2 * width, 1);
  std::vector<float> dst(6 * width, 7.f);
  const std::vector<int32_t> index = {4, 1};
  ScatterRows(dev, src.data(), width, index, dst.data());
  for (int r = 0; r < 6; ++r) {
    for (int64_t j = 0; j < width; ++j) {
      const float want = r == 4 ? src[j] : r == 1 ? src[width + j] : 7.f;
      ASSERT_EQ(dst[r * width + j], want) << r;
    }
  }
}

TEST(RowsTest, EmbeddingLookupConvertsEachDtype) {
  const int64_t vocab = 50, width = 37;
  const std::vector<float> f32 = Random(vocab * width, 3);
  core::Tensor t32 = core::Tensor::Empty(core::DType::kF32, {vocab, width});
  core::Tensor tb16 = core::Tensor::Empty(core::DType::kBF16, {vocab, width});
  core::Tensor tf16 = core::Tensor::Empty(core::DType::kF16, {vocab, width});
  std::mt19937 rng(4);
  for (int64_t i = 0; i < vocab * width; ++i) {
    t32.data<float>()[i] = f32[i];
    tb16.data<uint16_t>()[i] = core::FloatToBf16(f32[i]);
    uint16_t h = static_cast<uint16_t>(rng());
    if ((h & 0x7C00) == 0x7C00) h &= 0xBFFF;  // finite halves only (subnormals included)
    tf16.data<uint16_t>()[i] = h;
  }
  const std::vector<int32_t> ids = {0, 49, 7, 7, 23};
  for (const core::Tensor* table : {&t32, &tb16, &tf16}) {
    std::vector<float> out(ids.size() * width);
    EmbeddingLookup(dev, *table, ids, out.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t j = 0; j < width; ++j) {
        const int64_t at = ids[i] * width + j;
        const float want = table == &t32    ? f32[at]
                           : table == &tb16 ? core::Bf16ToFloat(tb16.data<uint16_t>()[at])
                                            : core::F16ToFloat(tf16.data<uint16_t>()[at]);
        ASSERT_EQ(out[i * width + j], want) << core::DTypeName(table->dtype()) << " id " << ids[i];
      }
    }
  }
}

// Greedy decoding's rule (llm::Sampler's): the lowest id among equal maxima, NaN never wins, 0 for
// a row with nothing but NaN and -inf; +inf wins.
TEST(RowsTest, ArgmaxRowsPicksTheFirstLargestAndSkipsNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int64_t vocab = 5;
  const std::vector<float> logits = {
      1.f, 3.f, 3.f, 2.f, -5.f,     // tie: 1
      nan, -1.f, 4.f, nan, 4.f,     // NaN first, tie after it: 2
      nan, nan, nan, nan, nan,      // 0
      -inf, -inf, -inf, -inf, -inf, // 0
      -inf, nan, 2.f, inf, inf,     // +inf: 3
      -7.f, -7.f, -7.f, -7.f, -6.f, // the last: 4
  };
  const int64_t rows = static_cast<int64_t>(logits.size()) / vocab;
  std::vector<int32_t> out(rows, -1);
  ArgmaxRows(dev, logits.data(), rows, vocab, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 0, 0, 3, 4}));
  // Rows longer than the kernel's 16-value vector body: ties, NaN and the largest value placed in
  // the body, across its blocks, and in the tail.
  for (const int64_t n : {16, 17, 31, 37, 64, 100}) {
    for (const int64_t first : {int64_t{0}, int64_t{5}, int64_t{15}, n / 2, n - 1}) {
      std::vector<float> row = Random(static_cast<size_t>(n), static_cast<uint32_t>(n * 131 + first));
      for (int64_t i = 3; i < n; i += 7) row[i] = nan;
      row[first] = 9.f;
      if (first + 16 < n) row[first + 16] = 9.f;  // a tie in a later block: the first still wins
      if (first + 1 < n) row[first + 1] = 9.f;    // and right after it
      int32_t got = -1;
      ArgmaxRows(dev, row.data(), 1, n, &got);
      EXPECT_EQ(got, first) << "n " << n;
    }
    std::vector<float> all_nan(static_cast<size_t>(n), nan), all_neg_inf(static_cast<size_t>(n), -inf);
    int32_t got = -1;
    ArgmaxRows(dev, all_nan.data(), 1, n, &got);
    EXPECT_EQ(got, 0) << "n " << n;
    all_neg_inf[n - 1] = nan;
    ArgmaxRows(dev, all_neg_inf.data(), 1, n, &got);
    EXPECT_EQ(got, 0) << "n " << n;
  }
  // Large rows (the parallel path): against std::max_element, which keeps the first maximum.
  const int64_t big_vocab = 151936;
  const std::vector<float> big = Random(static_cast<size_t>(4 * big_vocab), 9);
  std::vector<int32_t> picks(4, -1);
  ArgmaxRows(dev, big.data(), 4, big_vocab, picks.data());
  for (int64_t r = 0; r < 4; ++r) {
    const float* row = big.data() + r * big_vocab;
    EXPECT_EQ(picks[r], std::max_element(row, row + big_vocab) - row) << "row " << r;
  }
}

TEST(RowsTest, UnpadHeadsUndoesThePadding) {
  const int64_t rows = 33;
  const int heads = 3, head_dim = 80, padded = 96;
  const std::vector<float> attn = Random(rows * heads * head_dim, 5);
  // Row-major [rows, heads, padded] with garbage in the padding, as attention at 96 writes it.
  std::vector<float> po(rows * heads * padded, 1e30f);
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      std::copy_n(attn.begin() + (r * heads + h) * head_dim, head_dim, po.begin() + (r * heads + h) * padded);
  std::vector<float> out(attn.size(), -1.f);
  UnpadHeads(dev, po.data(), rows, heads, head_dim, padded, out.data());
  EXPECT_EQ(out, attn);
}

TEST(DeviceTest, CreateDeviceAnswersForEveryName) {
  auto cpu = CreateDevice(DeviceOptions{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->kind(), DeviceKind::kCpu);
  EXPECT_NE((*cpu)->Describe().find("cpu: "), std::string::npos) << (*cpu)->Describe();
  DeviceOptions cuda;
  cuda.name = "cuda";
#ifdef IRIS_HAVE_CUDA
  // A CUDA build: a device where a GPU is usable (tests/cuda_device_test.cc, label gpu), else
  // FAILED_PRECONDITION saying why (no driver, no GPU, ...) and which CUDA the build wants.
  auto gpu = CreateDevice(cuda);
  if (gpu.ok()) {
    EXPECT_EQ((*gpu)->kind(), DeviceKind::kCuda);
  } else {
    EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition) << gpu.status();
    EXPECT_NE(gpu.status().message().find("cuda:0"), std::string::npos) << gpu.status();
    EXPECT_NE(gpu.status().message().find("this build's runtime is CUDA"), std::string::npos) << gpu.status();
  }
  for (const char* name : {"cuda:", "cuda:x", "cuda:-1", "cuda:1a", "cuda:0:1"}) {
    DeviceOptions bad_ordinal;
    bad_ordinal.name = name;
    auto d = CreateDevice(bad_ordinal);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << name << ": " << d.status();
  }
#else
  EXPECT_EQ(CreateDevice(cuda).status().code(), absl::StatusCode::kUnimplemented);
#endif
  DeviceOptions tpu;
  tpu.name = "tpu";
  auto bad = CreateDevice(tpu);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tpu"), std::string::npos);
  DeviceOptions isa;
  isa.cpu_isa = "sse2";
  EXPECT_EQ(CreateDevice(isa).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*cpu)->BeginCapture().code(), absl::StatusCode::kUnimplemented);
}

TEST(DeviceTest, CpuMemoryIsAlignedAndMirrorsShareStorage) {
  auto t = dev.Allocate(core::DType::kF32, {3, 5});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw()) % 64, 0u);
  auto m = dev.Mirror(*t);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->raw(), t->raw());
  std::vector<float> host = Random(15, 9), back(15);
  dev.CopyToDevice(host.data(), t->raw(), host.size() * 4);
  dev.CopyToHost(t->raw(), back.data(), back.size() * 4);
  dev.Synchronize();
  EXPECT_EQ(back, host);
  EXPECT_EQ(dev.Allocate(core::DType::kF32, {-1}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace iris::kernels
