// Linear (oneDNN matmul) against a plain double-precision reference: f32 and bf16 compute,
// F32/BF16/F16 weights, bias or none, the three epilogues, odd shapes, the per-M cache.
#include "kernels/linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "core/bf16.h"
#include "kernels/elementwise.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace iris::kernels {
namespace {

Device& dev = DefaultCpuDevice();

using core::DType;
using core::Tensor;

// oneDNN's bf16 matmuls need AVX-512; below it bf16 compute runs bf16-rounded operands on the
// f32 matmul (CpuLinear), and every bf16 case below holds there too.

float RoundToBf16(float v) { return core::Bf16ToFloat(core::FloatToBf16(v)); }

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  return testing::RandomFloats(n, seed, lo, hi);
}

// IEEE half from float (round to nearest even), for building F16 weights.
uint16_t FloatToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((u >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = u & 0x7FFFFFu;
  if (exp <= 0) return static_cast<uint16_t>(sign);  // tests use normal-range values only
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(h);
}

// A weight tensor in `dtype` from float values; `rounded` gets the values it actually holds.
Tensor MakeWeight(const std::vector<float>& w, int64_t out, int64_t in, DType dtype, std::vector<float>* rounded) {
  Tensor t = Tensor::Empty(dtype, {out, in});
  rounded->resize(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    if (dtype == DType::kF32) {
      t.data<float>()[i] = w[i];
      (*rounded)[i] = w[i];
    } else if (dtype == DType::kBF16) {
      t.data<uint16_t>()[i] = core::FloatToBf16(w[i]);
      (*rounded)[i] = core::Bf16ToFloat(t.data<uint16_t>()[i]);
    } else {
      t.data<uint16_t>()[i] = FloatToF16(w[i]);
      (*rounded)[i] = core::F16ToFloat(t.data<uint16_t>()[i]);
    }
  }
  return t;
}

double GeluRef(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

// y = epilogue(x·Wᵀ + b) in double.
std::vector<float> Reference(const std::vector<float>& x, const std::vector<float>& w, const float* b, int64_t m,
                             int64_t k, int64_t n, Epilogue ep, const std::vector<float>& y0) {
  std::vector<float> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = b ? b[j] : 0.0;
      for (int64_t t = 0; t < k; ++t) acc += static_cast<double>(x[i * k + t]) * w[j * k + t];
      if (ep == Epilogue::kGeluErf) acc = GeluRef(acc);
      if (ep == Epilogue::kAccumulate) acc += y0[i * n + j];
      y[i * n + j] = static_cast<float>(acc);
    }
  }
  return y;
}

struct Case {
  int64_t m, k, n;
};

class LinearF32Test : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(LinearF32Test, MatchesReferenceOnOddShapes) {
  const auto [wdtype, with_bias] = GetParam();
  const Case cases[] = {{1, 13, 5}, {7, 80, 129}, {33, 1176, 64}, {129, 13, 33}, {129, 80, 1}, {2, 1176, 200}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "m=" << c.m << " k=" << c.k << " n=" << c.n);
    std::vector<float> wr;
    const Tensor w = MakeWeight(Random(c.n * c.k, seed++), c.n, c.k, wdtype, &wr);
    Tensor b = Tensor::Empty(DType::kF32, {c.n});
    const std::vector<float> bv = Random(c.n, seed++);
    std::memcpy(b.raw(), bv.data(), bv.size() * 4);
    auto lin = Linear::Create(dev, w, with_bias ? &b : nullptr, ComputeType::kF32);
    ASSERT_TRUE(lin.ok()) << lin.status();
    EXPECT_EQ((*lin)->in_features(), c.k);
    EXPECT_EQ((*lin)->out_features(), c.n);
    EXPECT_EQ((*lin)->compute(), ComputeType::kF32);
    const std::vector<float> x = Random(c.m * c.k, seed++);
    for (Epilogue ep : {Epilogue::kNone, Epilogue::kGeluErf, Epilogue::kAccumulate}) {
      SCOPED_TRACE(static_cast<int>(ep));
      const std::vector<float> y0 = Random(c.m * c.n, seed++);
      std::vector<float> y = y0;
      (*lin)->Forward(x.data(), c.m, y.data(), ep);
      const std::vector<float> ref = Reference(x, wr, with_bias ? bv.data() : nullptr, c.m, c.k, c.n, ep, y0);
      EXPECT_LT(testing::RelativeL2(y.data(), ref.data(), c.m * c.n), 1e-5);
      double max_ref = 0;
      for (float v : ref) max_ref = std::max(max_ref, static_cast<double>(std::fabs(v)));
      EXPECT_LE(testing::MaxAbsDiff(y.data(), ref.data(), c.m * c.n), 1e-5 * max_ref + 1e-6);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Weights, LinearF32Test,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Bool()));

TEST(LinearBf16Test, MatchesReferenceLoosely) {
  const Case cases[] = {{1, 13, 5}, {7, 80, 129}, {33, 1176, 64}, {129, 80, 33}};
  uint32_t seed = 100;
  for (DType wdtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << "m=" << c.m << " k=" << c.k << " n=" << c.n);
      std::vector<float> wr;
      const Tensor w = MakeWeight(Random(c.n * c.k, seed++), c.n, c.k, wdtype, &wr);
      Tensor b = Tensor::Empty(DType::kBF16, {c.n});
      std::vector<float> bv = Random(c.n, seed++);
      for (int64_t j = 0; j < c.n; ++j) {
        b.data<uint16_t>()[j] = core::FloatToBf16(bv[j]);
        bv[j] = core::Bf16ToFloat(b.data<uint16_t>()[j]);
      }
      auto lin = Linear::Create(dev, w, &b, ComputeType::kBF16);
      ASSERT_TRUE(lin.ok()) << lin.status();
      EXPECT_EQ((*lin)->compute(), ComputeType::kBF16);
      const std::vector<float> x = Random(c.m * c.k, seed++);
      for (Epilogue ep : {Epilogue::kNone, Epilogue::kGeluErf, Epilogue::kAccumulate}) {
        const std::vector<float> y0 = Random(c.m * c.n, seed++);
        std::vector<float> y = y0;
        (*lin)->Forward(x.data(), c.m, y.data(), ep);
        const std::vector<float> ref = Reference(x, wr, bv.data(), c.m, c.k, c.n, ep, y0);
        const double err = testing::RelativeL2(y.data(), ref.data(), c.m * c.n);
        EXPECT_LT(err, 1e-2);
        EXPECT_GT(err, 1e-5);  // the activations really were rounded to bf16
      }
    }
  }
}

TEST(LinearBf16Test, ComputesTheProductsOfBf16RoundedOperands) {
  // bf16 compute is a matmul of bf16 values with f32 accumulation: against a double-precision
  // product of the bf16-rounded input and weight it differs only by f32 summation (native bf16
  // matmul or the f32 matmul that stands in for it below AVX-512). f32 and f16 weights are rounded
  // to bf16 first, as a bf16 matmul takes them.
  // CPUs without a bf16 matmul: row counts across the direct kernel's forms (1 and 2 rows; passes
  // of 6 rows and each remainder 1-5: 7, 33, 11, 4, 3, 64; more than 64 rows by oneDNN on panels:
  // 70 = 64 + 6, 131 = 128 + 3, 200 = 192 + 8), column counts across its widened panels of 16
  // columns (4 blocks of 4; 5, 9, 45, 77, 129, 263 end inside one) and the 256-column panels.
  const Case cases[] = {{1, 13, 5},     {7, 80, 129},   {33, 1176, 64}, {70, 2048, 96}, {3, 1000, 700},
                        {4, 77, 263},   {2, 8, 9},      {131, 300, 600}, {200, 64, 520}, {11, 520, 45},
                        {64, 96, 77}};
  uint32_t seed = 500;
  for (DType wdtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << core::DTypeName(wdtype) << " m=" << c.m << " k=" << c.k << " n=" << c.n);
      std::vector<float> wr;
      const Tensor w = MakeWeight(Random(c.n * c.k, seed++), c.n, c.k, wdtype, &wr);
      for (float& v : wr) v = RoundToBf16(v);
      Tensor b = Tensor::Empty(DType::kF32, {c.n});
      const std::vector<float> bv = Random(c.n, seed++);
      std::memcpy(b.raw(), bv.data(), bv.size() * 4);
      auto lin = Linear::Create(dev, w, &b, ComputeType::kBF16);
      ASSERT_TRUE(lin.ok()) << lin.status();
      const std::vector<float> x = Random(c.m * c.k, seed++);
      std::vector<float> xr = x;
      for (float& v : xr) v = RoundToBf16(v);
      for (Epilogue ep : {Epilogue::kNone, Epilogue::kGeluErf, Epilogue::kAccumulate}) {
        const std::vector<float> y0 = Random(c.m * c.n, seed++);
        std::vector<float> y = y0;
        (*lin)->Forward(x.data(), c.m, y.data(), ep);
        const std::vector<float> ref = Reference(xr, wr, bv.data(), c.m, c.k, c.n, ep, y0);
        EXPECT_LT(testing::RelativeL2(y.data(), ref.data(), c.m * c.n), 2e-6) << "epilogue " << static_cast<int>(ep);
      }
    }
  }
}

TEST(LinearBf16Test, FewRowsAgreeWithManyRows) {
  // A handful of rows (decode) runs a different primitive (and kernel blocking) than a batch;
  // given the same bf16 inputs both accumulate in f32, so each row must agree closely with the
  // same row computed in a batch.
  const Case cases[] = {{5, 1176, 129}, {5, 80, 200}, {5, 13, 65}, {5, 2048, 1000}, {5, 64, 64}, {5, 33, 3}};
  uint32_t seed = 300;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "k=" << c.k << " n=" << c.n);
    std::vector<float> wr;
    const Tensor w = MakeWeight(Random(c.n * c.k, seed++), c.n, c.k, DType::kBF16, &wr);
    Tensor b = Tensor::Empty(DType::kF32, {c.n});
    const std::vector<float> bv = Random(c.n, seed++);
    std::memcpy(b.raw(), bv.data(), bv.size() * 4);
    auto lin = Linear::Create(dev, w, &b, ComputeType::kBF16);
    ASSERT_TRUE(lin.ok()) << lin.status();
    const std::vector<float> x = Random(c.m * c.k, seed++);
    for (Epilogue ep : {Epilogue::kNone, Epilogue::kGeluErf, Epilogue::kAccumulate}) {
      const std::vector<float> y0 = Random(c.m * c.n, seed++);
      std::vector<float> batch = y0;
      (*lin)->Forward(x.data(), c.m, batch.data(), ep);
      const std::vector<float> ref = Reference(x, wr, bv.data(), c.m, c.k, c.n, ep, y0);
      EXPECT_LT(testing::RelativeL2(batch.data(), ref.data(), c.m * c.n), 1e-2);
      for (int64_t m = 1; m <= 4; ++m) {
        for (int64_t r0 = 0; r0 + m <= c.m; r0 += m) {
          std::vector<float> few(y0.begin() + r0 * c.n, y0.begin() + (r0 + m) * c.n);
          (*lin)->Forward(x.data() + r0 * c.k, m, few.data(), ep);
          EXPECT_LT(testing::RelativeL2(few.data(), batch.data() + r0 * c.n, m * c.n), 2e-6)
              << "m=" << m << " r0=" << r0 << " epilogue " << static_cast<int>(ep);
        }
      }
    }
  }
}

// What MatmulRowsSplitInvariant promises: rows computed in pieces (the resumable encoder's 64-row
// granules, single rows, prefill chunks of any size) equal the same rows of one call bit for bit
// where it says so, and to f32 rounding elsewhere.
TEST(LinearTest, RowsSplitBetweenCallsAsTheDeviceSays) {
  const bool invariant = MatmulRowsSplitInvariant(dev);
  const Case shapes[] = {{700, 1176, 640}, {300, 1024, 2816}, {130, 80, 33}};
  uint32_t seed = 900;
  for (const ComputeType compute : {ComputeType::kF32, ComputeType::kBF16}) {
    for (const Case& c : shapes) {
      SCOPED_TRACE(::testing::Message() << (compute == ComputeType::kF32 ? "f32" : "bf16") << " m=" << c.m
                                        << " k=" << c.k << " n=" << c.n);
      std::vector<float> wr;
      const Tensor w = MakeWeight(Random(c.n * c.k, seed++), c.n, c.k, DType::kBF16, &wr);
      auto lin = Linear::Create(dev, w, nullptr, compute);
      ASSERT_TRUE(lin.ok()) << lin.status();
      const std::vector<float> x = Random(c.m * c.k, seed++);
      std::vector<float> whole(c.m * c.n);
      (*lin)->Forward(x.data(), c.m, whole.data());
      for (const int64_t piece : {int64_t{64}, int64_t{1}, int64_t{37}}) {
        std::vector<float> split(c.m * c.n);
        for (int64_t r = 0; r < c.m; r += piece) {
          (*lin)->Forward(x.data() + r * c.k, std::min(piece, c.m - r), split.data() + r * c.n);
        }
        EXPECT_TRUE(testing::SameUnderRowSplits(split.data(), whole.data(), c.m * c.n, invariant, 2e-6))
            << "pieces of " << piece << " rows";
      }
    }
  }
}

// LinearForward with an input op on a device that folds nothing (the CPU): the op runs into the
// staging rows, then Forward reads them — the same y as calling the two in turn, bit for bit.
TEST(LinearTest, LinearForwardRunsTheInputOpThenTheProduct) {
  const int64_t m = 3, k = 96, n = 40;
  std::vector<float> wr;
  const Tensor w = MakeWeight(Random(n * k, 41), n, k, DType::kBF16, &wr);
  auto lin = Linear::Create(dev, w, nullptr, ComputeType::kBF16);
  ASSERT_TRUE(lin.ok()) << lin.status();
  const std::vector<float> x = Random(m * k, 42, -3.f, 3.f), gu = Random(m * 2 * k, 43, -3.f, 3.f);
  const std::vector<float> norm_w = Random(k, 44), y0 = Random(m * n, 45);
  std::vector<float> staged(m * k), want_in(m * k), want = y0, got = y0;
  RmsNorm(dev, x.data(), norm_w.data(), m, k, 1e-6f, want_in.data());
  (*lin)->Forward(want_in.data(), m, want.data(), Epilogue::kAccumulate);
  LinearForward(dev, **lin, LinearInput::RmsNorm(x.data(), norm_w.data(), 1e-6f, staged.data()), m, got.data(),
                Epilogue::kAccumulate);
  EXPECT_EQ(got, want) << "rms_norm";
  EXPECT_EQ(staged, want_in);

  SiluMulRows(dev, gu.data(), m, k, want_in.data());
  want = got = y0;
  (*lin)->Forward(want_in.data(), m, want.data());
  LinearForward(dev, **lin, LinearInput::SiluMul(gu.data(), staged.data()), m, got.data());
  EXPECT_EQ(got, want) << "silu_mul";

  want = got = y0;
  (*lin)->Forward(x.data(), m, want.data());
  LinearForward(dev, **lin, {.x = x.data()}, m, got.data());
  EXPECT_EQ(got, want) << "no op";
}

TEST(LinearTest, PrimitiveCacheAcrossRowCounts) {
  const int64_t k = 80, n = 48;
  std::vector<float> wr;
  const Tensor w = MakeWeight(Random(n * k, 7), n, k, DType::kF32, &wr);
  auto lin = Linear::Create(dev, w, nullptr, ComputeType::kF32);
  ASSERT_TRUE(lin.ok());
  const std::vector<float> x = Random(64 * k, 8);
  // The same rows computed as part of batches of different sizes agree exactly with themselves
  // when repeated, and with the reference.
  std::vector<float> first;
  for (int64_t m : {64, 1, 17, 64, 1, 17}) {
    std::vector<float> y(m * n);
    (*lin)->Forward(x.data(), m, y.data());
    const std::vector<float> ref = Reference(x, wr, nullptr, m, k, n, Epilogue::kNone, {});
    EXPECT_LT(testing::RelativeL2(y.data(), ref.data(), m * n), 1e-5) << m;
    if (m == 64 && first.empty()) first = y;
    if (m == 64) {
      EXPECT_EQ(std::memcmp(first.data(), y.data(), y.size() * 4), 0);
    }
  }
  (*lin)->Forward(x.data(), 0, nullptr);  // no rows: nothing happens
}

TEST(LinearTest, ConcurrentCallersOnDistinctLayers) {
  const int64_t k = 96, n = 40;
  std::vector<float> wr1, wr2;
  const ComputeType second = ComputeType::kBF16;
  auto l1 = Linear::Create(dev, MakeWeight(Random(n * k, 11), n, k, DType::kF32, &wr1), nullptr, ComputeType::kF32);
  auto l2 = Linear::Create(dev, MakeWeight(Random(n * k, 12), n, k, DType::kBF16, &wr2), nullptr, second);
  ASSERT_TRUE(l1.ok() && l2.ok());
  const std::vector<float> x = Random(37 * k, 13);
  std::vector<float> y1(37 * n), y2(37 * n);
  std::thread t1([&] { for (int i = 0; i < 20; ++i) (*l1)->Forward(x.data(), 1 + i % 37, y1.data()); });
  std::thread t2([&] { for (int i = 0; i < 20; ++i) (*l2)->Forward(x.data(), 1 + (i * 7) % 37, y2.data()); });
  t1.join();
  t2.join();
  (*l1)->Forward(x.data(), 37, y1.data());
  (*l2)->Forward(x.data(), 37, y2.data());
  EXPECT_LT(testing::RelativeL2(y1.data(), Reference(x, wr1, nullptr, 37, k, n, Epilogue::kNone, {}).data(), 37 * n), 1e-5);
  EXPECT_LT(testing::RelativeL2(y2.data(), Reference(x, wr2, nullptr, 37, k, n, Epilogue::kNone, {}).data(), 37 * n), 1e-2);
}

TEST(LinearTest, RejectsBadArguments) {
  EXPECT_FALSE(Linear::Create(dev, Tensor::Empty(DType::kF32, {16}), nullptr, ComputeType::kF32).ok());
  EXPECT_FALSE(Linear::Create(dev, Tensor::Empty(DType::kF32, {2, 3, 4}), nullptr, ComputeType::kF32).ok());
  EXPECT_FALSE(Linear::Create(dev, Tensor::Empty(DType::kI32, {4, 4}), nullptr, ComputeType::kF32).ok());
  EXPECT_FALSE(Linear::Create(dev, Tensor::Empty(DType::kF32, {0, 4}), nullptr, ComputeType::kF32).ok());
  const Tensor w = Tensor::Zeros(DType::kF32, {4, 8});
  const Tensor bad_bias = Tensor::Zeros(DType::kF32, {8});
  EXPECT_FALSE(Linear::Create(dev, w, &bad_bias, ComputeType::kF32).ok());
  const Tensor int_bias = Tensor::Zeros(DType::kI64, {4});
  EXPECT_FALSE(Linear::Create(dev, w, &int_bias, ComputeType::kF32).ok());
  const Tensor good_bias = Tensor::Zeros(DType::kF16, {4});
  EXPECT_TRUE(Linear::Create(dev, w, &good_bias, ComputeType::kF32).ok());
  EXPECT_TRUE(Linear::Create(dev, w, &good_bias, ComputeType::kBF16).ok());
}

TEST(LinearTest, PeakFlopsIsPositive) {
  EXPECT_GT(MeasureMatmulPeakFlops(dev, ComputeType::kF32, 128, 1), 1e6);
  EXPECT_GT(MeasureMatmulPeakFlops(dev, ComputeType::kBF16, 128, 1), 1e6);
}

}  // namespace
}  // namespace iris::kernels
