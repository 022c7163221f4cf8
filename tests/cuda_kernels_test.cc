// iris's own CUDA kernels on a real GPU (label gpu: scripts/test.sh runs it only where nvidia-smi
// works), against the CPU kernels on odd sizes — the same device code simt_kernels_test runs on
// the host harness in CI.
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/elementwise.h"
#include "kernels/qkv_pad.h"
#include "kernels/rotary.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_kernels.h"
#endif
#include "tests/kernel_cases.h"

namespace iris::kernels {
namespace {

#ifdef IRIS_HAVE_CUDA

using testing::ExpectCloseRel;
using testing::RandomNormal;

// A GPU, host vectors copied to and from it, and the stream the launches go on.
struct Gpu {
  std::unique_ptr<Device> dev;
  cuda::CudaDevice& cuda() { return static_cast<cuda::CudaDevice&>(*dev); }
  std::vector<core::Tensor> keep;
  template <typename T>
  T* Up(const std::vector<T>& host) {
    auto t = dev->Allocate(sizeof(T) == 4 ? core::DType::kF32 : core::DType::kBF16,
                           {static_cast<int64_t>(host.size() * sizeof(T) / (sizeof(T) == 4 ? 4 : 2))});
    EXPECT_TRUE(t.ok()) << t.status();
    dev->CopyToDevice(host.data(), t->template data<char>(), host.size() * sizeof(T));
    keep.push_back(std::move(*t));
    return reinterpret_cast<T*>(keep.back().template data<char>());
  }
  template <typename T>
  std::vector<T> Down(const T* d, size_t n) {
    std::vector<T> host(n);
    dev->CopyToHost(d, host.data(), n * sizeof(T));
    EXPECT_TRUE(cuda().status().ok()) << cuda().status();
    return host;
  }
};

std::unique_ptr<Gpu> MakeGpu() {
  DeviceOptions options;
  options.name = "cuda:0";
  absl::StatusOr<std::unique_ptr<Device>> d = CreateDevice(options);
  EXPECT_TRUE(d.ok()) << d.status();  // a machine that runs label gpu has one
  if (!d.ok()) return nullptr;
  auto g = std::make_unique<Gpu>();
  g->dev = std::move(*d);
  return g;
}

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
  int32_t* out = g->Up(std::vector<int32_t>(rows, -1));
  ASSERT_EQ(cuda::LaunchArgmax(g->cuda().stream(), g->Up(logits), rows, vocab, out), 0);
  const std::vector<int32_t> got = g->Down(out, rows);
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(got[r], testing::CpuGreedyToken(logits.data() + r * vocab, vocab)) << "row " << r;
  }
}


// Decodes and a prefill chunk over shuffled pages, f32 and bf16 pools, GQA, head_dim 80 and 128.
TEST(CudaKernelsTest, PagedAttentionMatchesTheCpuKernel) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  for (const int hd : {80, 128}) {
    const testing::PagedCase c(/*kv_heads=*/2, /*heads=*/12, hd, /*num_blocks=*/200,
                               {{1, 1}, {17, 1}, {300, 7}, {1000, 1}, {32, 1}, {513, 1}}, /*block_step=*/37,
                               /*block_offset=*/3);
    const std::vector<int32_t> qs(c.meta.query_start.begin(), c.meta.query_start.end());
    const std::vector<int32_t> cl(c.meta.context_lens.begin(), c.meta.context_lens.end());
    const std::vector<int32_t> bt(c.meta.block_tables.begin(), c.meta.block_tables.end());
    for (const bool bf16 : {false, true}) {
      float* out = g->Up(std::vector<float>(c.q.size(), NAN));
      const void* kd = bf16 ? static_cast<const void*>(g->Up(c.kb)) : static_cast<const void*>(g->Up(c.kf));
      const void* vd = bf16 ? static_cast<const void*>(g->Up(c.vb)) : static_cast<const void*>(g->Up(c.vf));
      ASSERT_EQ(cuda::LaunchPagedAttention(g->cuda().stream(), g->Up(c.q), c.row_stride(), out, c.row_stride(),
                                           c.heads, c.scale(), kd, vd, bf16, c.block_size, c.kv_heads, hd, g->Up(qs),
                                           g->Up(cl), g->Up(bt), c.meta.max_blocks_per_seq, c.meta.num_seqs, 0, c.rows),
                0);
      ExpectCloseRel(g->Down(out, c.q.size()), c.Reference(bf16), 2e-5f, bf16 ? "paged bf16" : "paged f32");
    }
  }
}

#else
TEST(CudaKernelsTest, NeedsTheCudaBackend) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif

}  // namespace
}  // namespace iris::kernels
