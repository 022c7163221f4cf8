// The ops routed to iris's CUDA kernels, called through their dispatch points (kernels/*.h) on a
// CudaDevice with device buffers, against the same ops on the CPU device (label gpu: needs a GPU).
// The kernels' own checks on odd sizes and edge values are in cuda_kernels_test and
// simt_kernels_test; this suite checks the routing: each op reaches the right launch with the
// right arguments, and the device reports no error.
#include <algorithm>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/device.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/paged_attention.h"
#include "kernels/qkv_pad.h"
#include "kernels/rotary.h"
#include "kernels/rows.h"
#include "tests/kernel_cases.h"

namespace iris::kernels {
namespace {

#ifdef IRIS_HAVE_CUDA

using testing::ActivationInputs;
using testing::ExpectCloseRel;
using testing::ExpectSameBits;
using testing::MakeGpu;
using testing::RandomNormal;

template <typename T>
std::span<const T> DeviceSpan(const T* data, size_t n) {
  return std::span<const T>(data, n);
}

TEST(CudaOpsTest, ElementwiseOpsMatchTheCpu) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  Device& cpu = DefaultCpuDevice();
  const int64_t rows = 7, dim = 1283, n = rows * dim;
  const std::vector<float> x = ActivationInputs(n, 1), b = RandomNormal(n, 2);
  const std::vector<float> w = RandomNormal(dim, 3), bias = RandomNormal(dim, 4);
  std::vector<float> normal = RandomNormal(n, 5, 2.f);  // finite rows for the norms
  for (float& v : normal) v += 1.f;
  const float* dx = g->Up(x);
  const float* db = g->Up(b);
  const float* dw = g->Up(w);
  const float* dbias = g->Up(bias);
  const float* dnormal = g->Up(normal);
  std::vector<float> want(n);
  float* dy = g->Up(std::vector<float>(n, NAN));

  RmsNorm(cpu, normal.data(), w.data(), rows, dim, 1e-6f, want.data());
  RmsNorm(gpu, dnormal, dw, rows, dim, 1e-6f, dy);
  ExpectCloseRel(g->Down(dy, n), want, 2e-6f, "RmsNorm");
  LayerNorm(cpu, normal.data(), w.data(), bias.data(), rows, dim, 1e-6f, want.data());
  LayerNorm(gpu, dnormal, dw, dbias, rows, dim, 1e-6f, dy);
  ExpectCloseRel(g->Down(dy, n), want, 4e-6f, "LayerNorm");
  {
    std::vector<float> silu_rows(rows * (dim / 2));  // gate and up side by side: inter = dim / 2 of each row
    const std::vector<float> gu = RandomNormal(rows * 2 * (dim / 2), 6, 3.f);
    SiluMulRows(cpu, gu.data(), rows, dim / 2, silu_rows.data());
    SiluMulRows(gpu, g->Up(gu), rows, dim / 2, dy);
    ExpectCloseRel(g->Down(dy, silu_rows.size()), silu_rows, 4e-6f, "SiluMulRows");
  }
  SiluMul(cpu, x.data(), b.data(), n, want.data());
  SiluMul(gpu, dx, db, n, dy);
  ExpectCloseRel(g->Down(dy, n), want, 4e-6f, "SiluMul");
  GeluErf(cpu, x.data(), n, want.data());
  GeluErf(gpu, dx, n, dy);
  ExpectCloseRel(g->Down(dy, n), want, 2e-6f, "GeluErf");
  QuickGelu(cpu, x.data(), n, want.data());
  QuickGelu(gpu, dx, n, dy);
  ExpectCloseRel(g->Down(dy, n), want, 4e-6f, "QuickGelu");
  Add(cpu, x.data(), b.data(), n, want.data());
  Add(gpu, dx, db, n, dy);
  testing::ExpectSameValues(g->Down(dy, n), want, "Add");

  // In place, where the ops allow it: y aliasing x.
  float* inplace = g->Up(normal);
  RmsNorm(cpu, normal.data(), w.data(), rows, dim, 1e-6f, want.data());
  RmsNorm(gpu, inplace, dw, rows, dim, 1e-6f, inplace);
  ExpectCloseRel(g->Down(inplace, n), want, 2e-6f, "RmsNorm in place");
  inplace = g->Up(x);
  Add(cpu, x.data(), b.data(), n, want.data());
  Add(gpu, inplace, db, n, inplace);
  testing::ExpectSameValues(g->Down(inplace, n), want, "Add in place");
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

TEST(CudaOpsTest, RotaryOpsMatchTheCpu) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  Device& cpu = DefaultCpuDevice();
  // q and k rotated in the qkv buffer (16 q heads, 2 k and 2 v heads of 128), then one tensor alone.
  const int rows = 13, qh = 16, kh = 2, hd = 128, half = hd / 2;
  const int64_t stride = int64_t{qh + 2 * kh} * hd;
  const std::vector<float> qkv = RandomNormal(rows * stride, 7);
  const std::vector<float> cos = RandomNormal(rows * half, 8), sin = RandomNormal(rows * half, 9);
  const float* dcos = g->Up(cos);
  const float* dsin = g->Up(sin);
  std::vector<float> want = qkv;
  RotaryQK(cpu, HeadsView{want.data(), stride, qh}, HeadsView{want.data() + qh * hd, stride, kh}, rows, hd, cos.data(),
           sin.data());
  float* d = g->Up(qkv);
  RotaryQK(gpu, HeadsView{d, stride, qh}, HeadsView{d + qh * hd, stride, kh}, rows, hd, dcos, dsin);
  ExpectCloseRel(g->Down(d, qkv.size()), want, 1e-6f, "RotaryQK");

  want = qkv;
  Rotary(cpu, HeadsView{want.data() + qh * hd, stride, kh}, rows, hd, cos.data(), sin.data());
  d = g->Up(qkv);
  Rotary(gpu, HeadsView{d + qh * hd, stride, kh}, rows, hd, dcos, dsin);
  ExpectCloseRel(g->Down(d, qkv.size()), want, 1e-6f, "Rotary");

  // bf16 rows (HeadsView::bf16, the qkv chain in bf16): the CPU's f32 rotation of the widened
  // values, to within the one rounding to bf16; v's heads untouched.
  std::vector<uint16_t> qkv16(qkv.size());
  std::vector<float> widened(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) {
    qkv16[i] = core::FloatToBf16(qkv[i]);
    widened[i] = core::Bf16ToFloat(qkv16[i]);
  }
  want = widened;
  RotaryQK(cpu, HeadsView{want.data(), stride, qh}, HeadsView{want.data() + qh * hd, stride, kh}, rows, hd, cos.data(),
           sin.data());
  uint16_t* d16 = g->Up(qkv16);
  RotaryQK(gpu, HeadsView{nullptr, stride, qh, d16}, HeadsView{nullptr, stride, kh, d16 + qh * hd}, rows, hd, dcos,
           dsin);
  const std::vector<uint16_t> got16 = g->Down(d16, qkv16.size());
  std::vector<float> got(got16.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = core::Bf16ToFloat(got16[i]);
  ExpectCloseRel(got, want, 1.f / 256, "RotaryQK on bf16 rows");
  for (int r = 0; r < rows; ++r) {
    for (int64_t e = (qh + kh) * hd; e < stride; ++e) ASSERT_EQ(got16[r * stride + e], qkv16[r * stride + e]);
  }
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

TEST(CudaOpsTest, QkvPaddingOpsMatchTheCpu) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  Device& cpu = DefaultCpuDevice();
  const int rows = 37, heads = 16, hd = 80, padded = 128;
  const std::vector<float> qkv = RandomNormal(int64_t{rows} * 3 * heads * hd, 10);
  const float* dqkv = g->Up(qkv);
  const size_t n = static_cast<size_t>(heads) * rows * padded;
  std::vector<float> q(n), k(n), v(n);
  PadQkv(cpu, qkv.data(), rows, heads, hd, padded, q.data(), k.data(), v.data());
  float* dq = g->Up(std::vector<float>(n, NAN));
  float* dk = g->Up(std::vector<float>(n, NAN));
  float* dv = g->Up(std::vector<float>(n, NAN));
  PadQkv(gpu, dqkv, rows, heads, hd, padded, dq, dk, dv);
  ExpectSameBits(g->Down(dq, n), q, "PadQkv q");
  ExpectSameBits(g->Down(dk, n), k, "PadQkv k");
  ExpectSameBits(g->Down(dv, n), v, "PadQkv v");
  for (int which = 0; which < 3; ++which) {
    std::vector<float> want(n);
    PadOneOfQkv(cpu, qkv.data(), rows, heads, hd, padded, which, want.data());
    PadOneOfQkv(gpu, dqkv, rows, heads, hd, padded, which, dq);
    ExpectSameBits(g->Down(dq, n), want, "PadOneOfQkv");
  }
  const std::vector<float> attn = RandomNormal(int64_t{rows} * heads * padded, 11);
  std::vector<float> want(static_cast<size_t>(rows) * heads * hd);
  UnpadHeads(cpu, attn.data(), rows, heads, hd, padded, want.data());
  float* out = g->Up(std::vector<float>(want.size(), NAN));
  UnpadHeads(gpu, g->Up(attn), rows, heads, hd, padded, out);
  ExpectSameBits(g->Down(out, want.size()), want, "UnpadHeads");
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

TEST(CudaOpsTest, RowOpsMatchTheCpu) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  Device& cpu = DefaultCpuDevice();
  const int rows = 300;
  const int64_t width = 1280;
  const std::vector<float> src = RandomNormal(rows * width, 12);
  std::vector<int32_t> index = testing::Shuffled(rows, 13);
  index.resize(rows - 7);  // scatter leaves 7 rows alone
  const auto dindex = DeviceSpan(g->Up(index), index.size());
  std::vector<float> gathered(index.size() * width), scattered(src.size(), 7.f);
  GatherRows(cpu, src.data(), width, index, gathered.data());
  ScatterRows(cpu, gathered.data(), width, index, scattered.data());
  float* dg = g->Up(std::vector<float>(gathered.size(), NAN));
  float* ds = g->Up(std::vector<float>(src.size(), 7.f));
  GatherRows(gpu, g->Up(src), width, dindex, dg);
  ScatterRows(gpu, dg, width, dindex, ds);
  ExpectSameBits(g->Down(dg, gathered.size()), gathered, "GatherRows");
  ExpectSameBits(g->Down(ds, scattered.size()), scattered, "ScatterRows");

  // The table mirrored to the GPU as a device tensor, in each dtype (every 16-bit pattern).
  const int64_t vocab = 256, twidth = 256;
  std::vector<uint16_t> halves = testing::AllHalfBits();
  std::vector<float> f32 = RandomNormal(vocab * twidth, 14);
  const std::vector<int32_t> ids = testing::AllHalfBitsIds();
  const auto dids = DeviceSpan(g->Up(ids), ids.size());
  for (const core::DType dtype : {core::DType::kF32, core::DType::kBF16, core::DType::kF16}) {
    void* host = dtype == core::DType::kF32 ? static_cast<void*>(f32.data()) : halves.data();
    const core::Tensor table = core::Tensor::View(host, dtype, {vocab, twidth}, nullptr);
    std::vector<float> want(ids.size() * twidth);
    EmbeddingLookup(cpu, table, ids, want.data());
    absl::StatusOr<core::Tensor> dtable = gpu.Mirror(table);
    ASSERT_TRUE(dtable.ok()) << dtable.status();
    float* out = g->Up(std::vector<float>(want.size(), 0.f));
    EmbeddingLookup(gpu, *dtable, dids, out);
    ExpectSameBits(g->Down(out, want.size()), want, core::DTypeName(dtype));
  }
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

TEST(CudaOpsTest, WritePagedKvMatchesTheCpuOnF32AndBf16Pools) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  const testing::PagedWriteCase c(15);
  const float* dqkv = g->Up(c.qkv);
  const auto dslots = DeviceSpan(g->Up(c.slots), c.slots.size());
  {
    const auto [want_k, want_v] = c.Reference<float>(-7.f);
    float* k = g->Up(std::vector<float>(c.pool_elems(), -7.f));
    float* v = g->Up(std::vector<float>(c.pool_elems(), -7.f));
    WritePagedKv(gpu, c.Layer(k, v, /*bf16=*/false), dqkv + c.row(), c.stride(), dqkv + 2 * c.row(), c.stride(),
                 dslots);
    ExpectSameBits(g->Down(k, c.pool_elems()), want_k, "f32 k pool");
    ExpectSameBits(g->Down(v, c.pool_elems()), want_v, "f32 v pool");
  }
  {
    const auto [want_k, want_v] = c.Reference<uint16_t>(0xDEAD);
    uint16_t* k = g->Up(std::vector<uint16_t>(c.pool_elems(), 0xDEAD));
    uint16_t* v = g->Up(std::vector<uint16_t>(c.pool_elems(), 0xDEAD));
    WritePagedKv(gpu, c.Layer(k, v, /*bf16=*/true), dqkv + c.row(), c.stride(), dqkv + 2 * c.row(), c.stride(),
                 dslots);
    ExpectSameBits(g->Down(k, c.pool_elems()), want_k, "bf16 k pool");
    ExpectSameBits(g->Down(v, c.pool_elems()), want_v, "bf16 v pool");
  }
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

// The decode step's rotary and KV write through RotaryQKWritePagedKv (one launch on the GPU)
// leave the qkv buffer and both pools exactly as RotaryQK then WritePagedKv on the GPU do, with
// f32 and bf16 pools and a padding row; launched plainly and to start early (sm_90+), behind
// the kernel that writes the qkv buffer, which an early launch must wait for.
TEST(CudaOpsTest, RotaryQKWritePagedKvEqualsTheTwoOps) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  const int rows = 5, qh = 4, kh = 2, hd = 16, half = hd / 2, block_size = 4;
  const int64_t num_blocks = 4, stride = int64_t{qh + 2 * kh} * hd, width = int64_t{kh} * hd;
  const int64_t pool = num_blocks * block_size * width;
  const std::vector<float> qkv = RandomNormal(rows * stride, 50, 10.f);
  const float* dcos = g->Up(RandomNormal(rows * half, 51));
  const float* dsin = g->Up(RandomNormal(rows * half, 52));
  const std::vector<int64_t> slots = {3, kPadSlot, 9, 0, 14};
  const auto dslots = DeviceSpan(g->Up(slots), slots.size());
  for (const auto& [bf16, early] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
    if (!g->cuda().SetEarlyStart(early).ok()) continue;  // early start below sm_90
    SCOPED_TRACE(::testing::Message() << (bf16 ? "bf16 pools" : "f32 pools") << ", early start " << early);
    const size_t elem = bf16 ? 2 : 4;
    std::vector<float> got_qkv[2];
    std::vector<uint8_t> got_k[2], got_v[2];
    for (const bool fused : {true, false}) {
      float* d = g->Up(std::vector<float>(qkv.size(), NAN));
      ASSERT_EQ(cuda::LaunchAdd(g->cuda().stream(), g->Up(qkv), g->Up(std::vector<float>(qkv.size(), 0.f)),
                                static_cast<int64_t>(qkv.size()), d),
                0);
      auto* k = reinterpret_cast<uint8_t*>(g->Up(std::vector<float>(pool, -7.f)));
      auto* v = reinterpret_cast<uint8_t*>(g->Up(std::vector<float>(pool, -7.f)));
      const PagedKvLayer layer{k, v, num_blocks, block_size, kh, hd, bf16 ? core::DType::kBF16 : core::DType::kF32};
      const HeadsView q{d, stride, qh}, kv{d + qh * hd, stride, kh};
      if (fused) {
        RotaryQKWritePagedKv(gpu, q, kv, rows, hd, dcos, dsin, layer, d + (qh + kh) * hd, stride, dslots);
      } else {
        RotaryQK(gpu, q, kv, rows, hd, dcos, dsin);
        WritePagedKv(gpu, layer, d + qh * hd, stride, d + (qh + kh) * hd, stride, dslots);
      }
      got_qkv[fused] = g->Down(d, qkv.size());
      got_k[fused] = g->Down(k, pool * elem);
      got_v[fused] = g->Down(v, pool * elem);
    }
    ExpectSameBits(got_qkv[1], got_qkv[0], "qkv");
    EXPECT_EQ(got_k[1], got_k[0]) << "k pool";
    EXPECT_EQ(got_v[1], got_v[0]) << "v pool";
    EXPECT_NE(got_qkv[1], qkv);
  }
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

// The step's metadata on the GPU: the arrays as device spans, the row range as host integers.
PagedMetadata OnGpu(testing::Gpu& g, const PagedMetadata& host) {
  PagedMetadata md = host;
  md.query_start = DeviceSpan(g.Up(std::vector<int32_t>(host.query_start.begin(), host.query_start.end())),
                              host.query_start.size());
  md.context_lens = DeviceSpan(g.Up(std::vector<int32_t>(host.context_lens.begin(), host.context_lens.end())),
                               host.context_lens.size());
  md.block_tables = DeviceSpan(g.Up(std::vector<int32_t>(host.block_tables.begin(), host.block_tables.end())),
                               host.block_tables.size());
  return md;
}

// The case's K and V pools of one kind (bf16 or f32), uploaded afresh: a launch that writes them
// (the decode rotary's KV write) leaves the next launch's copies alone.
std::pair<void*, void*> PoolsOnGpu(testing::Gpu& g, const testing::PagedCase& c, bool bf16) {
  if (bf16) return {g.Up(c.kb), g.Up(c.vb)};
  return {g.Up(c.kf), g.Up(c.vf)};
}

TEST(CudaOpsTest, PagedAttentionMatchesTheCpu) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  // Decodes and a prefill chunk over shuffled pages, GQA, f32 and bf16 pools.
  const testing::PagedCase c(/*kv_heads=*/2, /*heads=*/12, /*head_dim=*/128, /*num_blocks=*/120,
                             {{1, 1}, {17, 1}, {300, 7}, {700, 1}, {32, 1}}, /*block_step=*/37, /*block_offset=*/3);
  const PagedMetadata md = OnGpu(*g, c.meta);
  // (The prefill rows' tensor-core kernel, which takes the bf16 option's rows from the chunk on,
  // has its own test below.)
  g->cuda().SetPagedPrefillMma(false);
  for (const bool bf16_pool : {false, true}) {
    // The bf16 option is served by the f32-product kernel on the GPU: its output is the CPU's
    // f32-product one.
    for (const bool bf16_products : {false, true}) {
      const auto [k, v] = PoolsOnGpu(*g, c, bf16_pool);
      PagedAttentionArgs a = c.Args(g->Up(c.q), g->Up(std::vector<float>(c.q.size(), NAN)), k, v, bf16_pool);
      a.metadata = md;
      a.bf16 = bf16_products;
      PagedAttention(gpu, a);
      ExpectCloseRel(g->Down(a.out, c.q.size()), c.Reference(bf16_pool), 2e-5f,
                     bf16_pool ? "bf16 pool" : "f32 pool");
    }
  }

  // A step whose rows start past 0 (row_begin = 4): the rows before it are left alone.
  PagedMetadataBuilder builder;
  const std::vector<int32_t> table = {5, 9, 2};
  builder.Add(table, /*context_len=*/40, /*q_begin=*/4, /*q_len=*/3);
  const PagedMetadata chunk = builder.Build();
  const std::vector<float> q = RandomNormal(7 * c.row_stride(), 16);
  std::vector<float> want(q.size(), NAN);
  PagedAttentionArgs a;
  a.q = q.data();
  a.q_row_stride = c.row_stride();
  a.out = want.data();
  a.out_row_stride = c.row_stride();
  a.num_heads = c.heads;
  a.scale = c.scale();
  a.layer = PagedKvLayer{const_cast<float*>(c.kf.data()), const_cast<float*>(c.vf.data()), c.num_blocks, c.block_size,
                         c.kv_heads, c.head_dim, core::DType::kF32};
  a.metadata = chunk;
  PagedAttention(DefaultCpuDevice(), a);
  a.q = g->Up(q);
  a.out = g->Up(std::vector<float>(q.size(), NAN));
  a.layer.k = g->Up(c.kf);
  a.layer.v = g->Up(c.vf);
  a.metadata = OnGpu(*g, chunk);
  PagedAttention(gpu, a);
  ExpectCloseRel(g->Down(a.out, q.size()), want, 2e-5f, "rows 4..6");
  g->cuda().SetPagedPrefillMma(true);
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

// A step of decodes then prefill chunks in the bf16 mode over bf16 pages (the engine's default on
// a GPU): the decode rows keep the f32-product kernel (the CPU's f32-product output), the
// sequences from the first chunk on go to the tensor-core prefill (paged_flash_mma.cuh) and meet
// its definition within the probabilities' bf16 rounding: a 70-row chunk after 230 cached
// tokens, a decode after it, a whole 130-token prompt (three 64-row blocks), the 3b decoder's 16/2
// heads at head dim 128. With the switch off, every row is the decode kernel's again.
TEST(CudaOpsTest, PagedPrefillRowsOnTensorCoresMeetTheDefinition) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  const testing::PagedCase c(/*kv_heads=*/2, /*heads=*/16, /*head_dim=*/128, /*num_blocks=*/120,
                             {{1, 1}, {17, 1}, {300, 70}, {700, 1}, {130, 130}}, /*block_step=*/37, /*block_offset=*/3);
  ASSERT_EQ(c.meta.prefill_seq_begin, 2);
  const PagedMetadata md = OnGpu(*g, c.meta);
  const std::vector<float> f32_products = c.Reference(/*bf16=*/true);
  for (const bool mma : {true, false}) {
    g->cuda().SetPagedPrefillMma(mma);
    PagedAttentionArgs a = c.Args(g->Up(c.q), g->Up(std::vector<float>(c.q.size(), NAN)), g->Up(c.kb), g->Up(c.vb),
                                  /*bf16_pool=*/true);
    a.metadata = md;
    a.bf16 = true;
    PagedAttention(gpu, a);
    const std::vector<float> got = g->Down(a.out, c.q.size());
    const size_t decode_values = static_cast<size_t>(c.meta.prefill_row_begin * c.row_stride());
    if (!mma) {
      ExpectCloseRel(got, f32_products, 2e-5f, "switched off: every row on the decode kernel");
      continue;
    }
    ExpectCloseRel(std::vector<float>(got.begin(), got.begin() + decode_values),
                   std::vector<float>(f32_products.begin(), f32_products.begin() + decode_values), 2e-5f,
                   "decode rows");
    testing::ExpectWithinPagedBf16Rounding(got, c, c.meta.prefill_row_begin, "prefill rows on the tensor cores");
  }
  g->cuda().SetPagedPrefillMma(true);
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

// A large batch's decode rows with the packed tensor-core kernel on (CudaDevice::SetDecodeAttention):
// more (row, q head) pairs than the GPU has SMs, so the dispatch point gives them to it; they
// meet the bf16 definition, and so do the prefill rows after them. A step of fewer decode rows
// keeps the CUDA-core kernel's f32 products, unless every batch is the tensor cores'.
TEST(CudaOpsTest, LargeBatchDecodeRowsOnTensorCoresMeetTheDefinition) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  const int sms = g->cuda().sm_count();
  std::vector<std::pair<int, int>> seqs;
  const int decodes = sms / 16 + 3;  // 16 q heads: past one block per SM
  for (int i = 0; i < decodes; ++i) seqs.push_back({1 + (i * 97) % 700, 1});
  seqs.push_back({300, 70});
  seqs.push_back({130, 130});
  const testing::PagedCase c(/*kv_heads=*/2, /*heads=*/16, /*head_dim=*/128, /*num_blocks=*/40 * decodes + 60, seqs,
                             /*block_step=*/37, /*block_offset=*/3);
  ASSERT_EQ(c.meta.prefill_row_begin, decodes);
  const PagedMetadata md = OnGpu(*g, c.meta);
  using DecodeAttention = cuda::CudaDevice::DecodeAttention;
  g->cuda().SetDecodeAttention(DecodeAttention::kTensorCores);
  PagedAttentionArgs a = c.Args(g->Up(c.q), g->Up(std::vector<float>(c.q.size(), NAN)), g->Up(c.kb), g->Up(c.vb),
                                /*bf16_pool=*/true);
  a.metadata = md;
  a.bf16 = true;
  PagedAttention(gpu, a);
  testing::ExpectWithinPagedBf16Rounding(g->Down(a.out, c.q.size()), c, 0, "decode rows packed, then prefill rows");

  // Two decode rows: 32 pairs, fewer than the SMs: the CUDA-core kernel's f32 products.
  const testing::PagedCase few(2, 16, 128, 40, {{5, 1}, {600, 1}}, 37, 3);
  const PagedMetadata few_md = OnGpu(*g, few.meta);
  PagedAttentionArgs b = few.Args(g->Up(few.q), g->Up(std::vector<float>(few.q.size(), NAN)), g->Up(few.kb),
                                  g->Up(few.vb), /*bf16_pool=*/true);
  b.metadata = few_md;
  b.bf16 = true;
  PagedAttention(gpu, b);
  ExpectCloseRel(g->Down(b.out, few.q.size()), few.Reference(/*bf16=*/true), 2e-5f, "few decode rows");
  // ... unless every batch is the tensor cores' (then split over blocks to fill the GPU).
  g->cuda().SetDecodeAttention(DecodeAttention::kTensorCoresEveryBatch);
  b.out = g->Up(std::vector<float>(few.q.size(), NAN));
  PagedAttention(gpu, b);
  testing::ExpectWithinPagedBf16Rounding(g->Down(b.out, few.q.size()), few, 0, "few decode rows, split");
  g->cuda().SetDecodeAttention(DecodeAttention::kCudaCores);
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

// The lean paged attention (CudaDevice::SetPagedAttentionLean: two blocks an SM where the grid
// holds more blocks than SMs) gives the default kernel's output bit for bit, at the 3b's heads on
// 40 decode rows (640 blocks: it takes them) and on 3 (48 blocks: it does not apply), bf16 and f32
// pools, and stays within the f32 bound of the CPU.
TEST(CudaOpsTest, LeanPagedAttentionEqualsTheDefaultKernelBitForBit) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  for (const int rows : {40, 3}) {
    std::vector<std::pair<int, int>> seqs;
    for (int r = 0; r < rows; ++r) seqs.push_back({1 + (97 * r) % 600, 1});
    const testing::PagedCase c(/*kv_heads=*/2, /*heads=*/16, /*head_dim=*/128, /*num_blocks=*/40 * 40, seqs,
                               /*block_step=*/37, /*block_offset=*/3);
    const PagedMetadata md = OnGpu(*g, c.meta);
    for (const bool bf16_pool : {true, false}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows, " << (bf16_pool ? "bf16" : "f32") << " pool");
      std::vector<float> got[2];
      for (const bool lean : {false, true}) {
        g->cuda().SetPagedAttentionLean(lean);
        const auto [k, v] = PoolsOnGpu(*g, c, bf16_pool);
        PagedAttentionArgs a = c.Args(g->Up(c.q), g->Up(std::vector<float>(c.q.size(), NAN)), k, v, bf16_pool);
        a.metadata = md;
        a.bf16 = true;
        PagedAttention(gpu, a);
        got[lean] = g->Down(a.out, c.q.size());
      }
      ExpectSameBits(got[1], got[0], "lean against the default kernel");
      ExpectCloseRel(got[1], c.Reference(bf16_pool), 2e-5f, "lean against the CPU");
    }
  }
  g->cuda().SetPagedAttentionLean(false);  // the default
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

// A decode step's qkv projection with its rotary and KV write as the GEMV's epilogue
// (CudaDevice::SetQkvGemvRotary) against the projection, then the rotary + KV write launch: the
// same qkv rows, pools and attention output, bit for bit, at the 3b's heads (16 of 128, 2 kv heads,
// hidden 2048), 1, 2 and 4 decode rows (past one, one a padding row), x plain and
// RMSNorm-folded, the CUDA-core GEMV and its pipelined twin, bf16 and f32 pools. Set off, or past
// the rows its GEMV takes, the call only projects (returns false).
TEST(CudaOpsTest, QkvGemvWithRotaryEpilogueEqualsTheProjectionThenTheRotaryLaunch) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  cuda::CudaDevice& cuda = g->cuda();
  const int hd = 128, nh = 16, nkv = 2;
  const int64_t hidden = 2048, out = int64_t{nh + 2 * nkv} * hd;
  core::Tensor w = core::Tensor::Empty(core::DType::kF32, {out, hidden});
  core::Tensor bias = core::Tensor::Empty(core::DType::kF32, {out});
  const std::vector<float> wv = RandomNormal(out * hidden, 70, 0.05f), bv = RandomNormal(out, 71);
  std::copy(wv.begin(), wv.end(), w.data<float>());
  std::copy(bv.begin(), bv.end(), bias.data<float>());
  absl::StatusOr<std::unique_ptr<Linear>> qkv = Linear::Create(gpu, w, &bias, ComputeType::kBF16);
  ASSERT_TRUE(qkv.ok()) << qkv.status();
  const float* dnorm = g->Up(RandomNormal(hidden, 72));
  float* staging = g->Up(std::vector<float>(8 * hidden, 0.f));
  for (const int rows : {1, 2, 4}) {
    std::vector<std::pair<int, int>> seqs = {{600, 1}, {17, 1}, {33, 1}, {70, 1}};
    seqs.resize(rows);
    const testing::PagedCase c(nkv, nh, hd, /*num_blocks=*/64, seqs, /*block_step=*/37, /*block_offset=*/3);
    const testing::DecodeRotaryCase d(c, /*pad_row=*/rows > 1 ? 1 : 0, 80 + rows);
    // One row: its real slot back (the case pads a row), so that its key and value are stored.
    std::vector<int64_t> slots = d.slots;
    if (rows == 1) slots[0] = int64_t{c.meta.block_tables[599 / c.block_size]} * c.block_size + 599 % c.block_size;
    const float* dx = g->Up(RandomNormal(rows * hidden, 90 + rows));
    const float* dcos = g->Up(d.cos);
    const float* dsin = g->Up(d.sin);
    const auto dslots = DeviceSpan(g->Up(slots), slots.size());
    const PagedMetadata md = OnGpu(*g, c.meta);
    for (const bool bf16 : {true, false}) {
      for (const bool norm : {true, false}) {
        for (const auto kernel : {cuda::GemvKernel::kCudaCores, cuda::GemvKernel::kCudaCoresPipelined}) {
          SCOPED_TRACE(::testing::Message() << rows << " rows, " << (bf16 ? "bf16" : "f32") << " pools, "
                                            << (norm ? "rms_norm x, " : "plain x, ")
                                            << (kernel == cuda::GemvKernel::kCudaCores ? "cuda cores" : "pipelined"));
          cuda.ForceGemvKernel(kernel);
          const LinearInput in = norm ? LinearInput::RmsNorm(dx, dnorm, 1e-6f, staging) : LinearInput::Plain(dx);
          const size_t elem = bf16 ? 2 : 4, pool = c.kf.size();
          std::vector<float> got_rows[2], got_out[2];
          std::vector<uint8_t> got_k[2], got_v[2];
          for (const bool epilogue : {true, false}) {
            cuda.SetQkvGemvRotary(epilogue);
            float* qkv_rows = g->Up(std::vector<float>(rows * d.stride, NAN));
            const auto [k, v] = PoolsOnGpu(*g, c, bf16);
            PagedAttentionArgs a = c.Args(qkv_rows, g->Up(std::vector<float>(c.q.size(), NAN)), k, v, bf16);
            a.q_row_stride = d.stride;
            a.metadata = md;
            a.bf16 = bf16;
            const bool rotated =
                ProjectQkvRotaryWriteKv(gpu, **qkv, in, rows, qkv_rows, nh, a.layer, md, dcos, dsin, dslots);
            EXPECT_EQ(rotated, epilogue);
            if (rotated) {
              PagedAttention(gpu, a);
            } else {
              RotaryPagedAttention(gpu, a, {qkv_rows, d.stride, nh}, {qkv_rows + d.k_offset(), d.stride, nkv}, hd,
                                   dcos, dsin, qkv_rows + d.v_offset(), d.stride, dslots);
            }
            got_rows[epilogue] = g->Down(qkv_rows, rows * d.stride);
            got_out[epilogue] = g->Down(a.out, c.q.size());
            got_k[epilogue] = g->Down(static_cast<uint8_t*>(k), pool * elem);
            got_v[epilogue] = g->Down(static_cast<uint8_t*>(v), pool * elem);
          }
          ExpectSameBits(got_rows[1], got_rows[0], "qkv rows");
          // Every row, the padding row too: neither path stores its key, both read the pool's.
          ExpectSameBits(got_out[1], got_out[0], "attention output");
          EXPECT_EQ(got_k[1], got_k[0]) << "k pool";
          EXPECT_EQ(got_v[1], got_v[0]) << "v pool";
        }
      }
    }
  }
  // Past the rows a CUDA-core GEMV takes (the tensor-core GEMV at 8): the projection alone.
  cuda.ForceGemvKernel(std::nullopt);
  cuda.SetQkvGemvRotary(true);
  {
    const testing::PagedCase c(nkv, nh, hd, 64, std::vector<std::pair<int, int>>(8, {20, 1}), 37, 3);
    const testing::DecodeRotaryCase d(c, 0, 99);
    float* qkv_rows = g->Up(std::vector<float>(8 * d.stride, NAN));
    PagedAttentionArgs a = c.Args(qkv_rows, g->Up(std::vector<float>(c.q.size(), NAN)), g->Up(c.kb), g->Up(c.vb), true);
    EXPECT_FALSE(ProjectQkvRotaryWriteKv(gpu, **qkv, LinearInput::Plain(g->Up(RandomNormal(8 * hidden, 98))), 8,
                                         qkv_rows, nh, a.layer, OnGpu(*g, c.meta), g->Up(d.cos), g->Up(d.sin),
                                         DeviceSpan(g->Up(d.slots), d.slots.size())));
  }
  cuda.SetQkvGemvRotary(false);  // the default
  EXPECT_TRUE(cuda.status().ok()) << cuda.status();
}

// A decode step's rotary, KV write and attention as one launch (CudaDevice::fused_decode_rotary)
// against the rotary + KV write launch and the attention: the same output and pools, bit for bit,
// on bf16 and f32 pools, at the 3b's heads (keys split over blocks at this batch), on the CUDA
// cores and on the tensor cores (the packed decode kernel). A step with a prefill chunk takes the
// two launches whatever the setting: the same again.
TEST(CudaOpsTest, RotaryPagedAttentionInOneLaunchEqualsTheTwoLaunches) {
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  for (const bool with_prefill : {false, true}) {
    std::vector<std::pair<int, int>> seqs = {{1, 1}, {17, 1}, {600, 1}, {33, 1}, {70, 1}};
    if (with_prefill) seqs.push_back({40, 3});
    // Distinct blocks for every sequence (37 is prime to 64): no two rows write one slot.
    const testing::PagedCase c(/*kv_heads=*/2, /*heads=*/16, /*head_dim=*/128, /*num_blocks=*/64, seqs,
                               /*block_step=*/37, /*block_offset=*/3);
    const testing::DecodeRotaryCase d(c, /*pad_row=*/1, 60);
    const int hd = c.head_dim, nh = c.heads, nkv = c.kv_heads;
    const int64_t stride = d.stride;
    const float* dcos = g->Up(d.cos);
    const float* dsin = g->Up(d.sin);
    const auto dslots = DeviceSpan(g->Up(d.slots), d.slots.size());
    const PagedMetadata md = OnGpu(*g, c.meta);
    using DecodeAttention = cuda::CudaDevice::DecodeAttention;
    for (const auto& [bf16, setting] : {std::pair{true, DecodeAttention::kCudaCores},
                                        {true, DecodeAttention::kTensorCoresEveryBatch},
                                        {false, DecodeAttention::kCudaCores}}) {
      g->cuda().SetDecodeAttention(setting);
      SCOPED_TRACE(::testing::Message() << (bf16 ? "bf16" : "f32") << " pools" << (with_prefill ? ", a prefill" : "")
                                        << (setting == DecodeAttention::kCudaCores ? "" : ", tensor cores"));
      const size_t elem = bf16 ? 2 : 4, pool = c.kf.size();
      std::vector<float> got_out[2];
      std::vector<uint8_t> got_k[2], got_v[2];
      for (const bool fused : {true, false}) {
        g->cuda().SetFusedDecodeRotary(fused);
        float* rows = g->Up(d.qkv);
        const auto [k, v] = PoolsOnGpu(*g, c, bf16);
        PagedAttentionArgs a = c.Args(rows, g->Up(std::vector<float>(c.q.size(), NAN)), k, v, bf16);
        a.q_row_stride = stride;
        a.metadata = md;
        a.bf16 = bf16;
        RotaryPagedAttention(gpu, a, {rows, stride, nh}, {rows + d.k_offset(), stride, nkv}, hd, dcos, dsin,
                             rows + d.v_offset(), stride, dslots);
        got_out[fused] = g->Down(a.out, c.q.size());
        got_k[fused] = g->Down(static_cast<uint8_t*>(k), pool * elem);
        got_v[fused] = g->Down(static_cast<uint8_t*>(v), pool * elem);
      }
      d.ExpectSameRowsButPadding(got_out[1], got_out[0]);
      EXPECT_EQ(got_k[1], got_k[0]) << "k pool";
      EXPECT_EQ(got_v[1], got_v[0]) << "v pool";
    }
  }
  g->cuda().SetFusedDecodeRotary(false);  // the default
  g->cuda().SetDecodeAttention(cuda::CudaDevice::DecodeAttention::kCudaCores);
  EXPECT_TRUE(g->cuda().status().ok()) << g->cuda().status();
}

// The checks that read no device memory stop the program on a GPU as on the CPU, before any launch
// (the pointers below are never read).
TEST(CudaOpsDeathTest, BadArgumentsStopAsOnTheCpu) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child makes its own CUDA context
  auto g = MakeGpu();
  ASSERT_NE(g, nullptr);
  Device& gpu = *g->dev;
  float unused = 0.f;
  const int32_t query_start[] = {0, 1}, context_lens[] = {1}, block_tables[] = {0};
  PagedAttentionArgs a;
  a.q = &unused;
  a.out = &unused;
  a.num_heads = 4;
  a.scale = 1.f;
  a.layer = PagedKvLayer{&unused, &unused, /*num_blocks=*/1, /*block_size=*/16, /*num_kv_heads=*/2,
                         /*head_dim=*/320, core::DType::kF32};
  a.metadata.num_seqs = 1;
  a.metadata.query_start = query_start;
  a.metadata.context_lens = context_lens;
  a.metadata.block_tables = block_tables;
  a.metadata.max_blocks_per_seq = 1;
  a.metadata.row_end = 1;
  EXPECT_DEATH(PagedAttention(gpu, a), "head_dim must be in 1..256");
  a.layer.head_dim = 80;
  a.num_heads = 3;
  EXPECT_DEATH(PagedAttention(gpu, a), "not a positive multiple");

  PagedKvLayer f16_pools = a.layer;
  f16_pools.dtype = core::DType::kF16;
  const int64_t slot = 0;
  EXPECT_DEATH(WritePagedKv(gpu, f16_pools, &unused, 0, &unused, 0, std::span<const int64_t>(&slot, 1)), "bad layer");

  const core::Tensor i32_table = core::Tensor::View(&unused, core::DType::kI32, {1, 1}, nullptr);
  const int32_t id = 0;
  EXPECT_DEATH(EmbeddingLookup(gpu, i32_table, std::span<const int32_t>(&id, 1), &unused), "F32, BF16 or F16");
}

#else
TEST(CudaOpsTest, NeedsTheCudaBackend) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif

}  // namespace
}  // namespace iris::kernels
