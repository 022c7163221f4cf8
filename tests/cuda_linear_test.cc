// The CUDA Linear (cuBLASLt) on a real GPU (label gpu: scripts/test.sh runs it only where
// nvidia-smi works), against the CPU Linear and a double-precision reference: f32 and bf16
// compute, F32/BF16/F16 weights, every epilogue with and without a bias, odd shapes, views that
// start part-way into a buffer, a graph capture of Forward; and the GEMM rate and memory
// bandwidth probes.
//
// Bounds. f32 compute (CUBLAS_COMPUTE_32F, no TF32) against the double reference: relative L2
// error 1e-5, as the CPU suite asks of oneDNN. bf16 compute: x and W are rounded to bf16 the same
// way on both backends, bf16 x bf16 products are exact in f32, so the results differ only in how
// K products are summed in f32 (tensor-core accumulation truncates rather than rounds, ~K/16
// roundings of the partial sum). Against the double reference on the rounded inputs, and against
// the CPU's bf16 Linear: relative L2 3e-5, and per element 3e-5 * (Σ_k |x_k w_k| + |b| + |y0|)
// plus the erf GELU's own 1e-6 relative.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "core/bf16.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/gated_mlp.h"
#include "kernels/linear.h"
#include "kernels/memory_bandwidth.h"
#include "kernels/qkv_bf16.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_linear.h"
#include "kernels/cuda/linear_kernels.h"
#endif
#include "tests/kernel_cases.h"
#include "tests/test_util.h"

namespace iris::kernels {
namespace {

#ifdef IRIS_HAVE_CUDA

using core::DType;
using core::Tensor;


cuda::CudaDevice& Cuda(Device& d) { return cuda::AsCuda(d); }

// Device copies of host floats, kept alive by the caller.
Tensor Upload(Device& dev, const std::vector<float>& host) {
  absl::StatusOr<Tensor> t = dev.Allocate(DType::kF32, {static_cast<int64_t>(host.size())});
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return Tensor();
  dev.CopyToDevice(host.data(), t->data<float>(), host.size() * sizeof(float));
  return std::move(*t);
}

std::vector<float> Download(Device& dev, const float* d, size_t n) {
  std::vector<float> host(n);
  dev.CopyToHost(d, host.data(), n * sizeof(float));
  EXPECT_TRUE(Cuda(dev).status().ok()) << Cuda(dev).status();
  return host;
}

// A weight [out, in] of `dtype` with random values; `held` gets the values it holds as floats.
Tensor MakeWeight(int64_t out, int64_t in, DType dtype, uint32_t seed, std::vector<float>* held) {
  const std::vector<float> v = testing::RandomFloats(out * in, seed);
  Tensor t = Tensor::Empty(dtype, {out, in});
  held->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32) {
      t.data<float>()[i] = v[i];
    } else if (dtype == DType::kBF16) {
      t.data<uint16_t>()[i] = core::FloatToBf16(v[i]);
    } else {
      // F16 normals in [2^-5, 2), random sign and mantissa, built from their bits.
      const uint32_t r = static_cast<uint32_t>(std::fabs(v[i]) * 16777216.f);
      t.data<uint16_t>()[i] = static_cast<uint16_t>((v[i] < 0 ? 0x8000u : 0u) | ((10u + r % 6u) << 10) | (r >> 8 & 0x3FFu));
    }
    (*held)[i] = dtype == DType::kF32    ? t.data<float>()[i]
                 : dtype == DType::kBF16 ? core::Bf16ToFloat(t.data<uint16_t>()[i])
                                         : core::F16ToFloat(t.data<uint16_t>()[i]);
  }
  return t;
}

std::vector<float> RoundedToBf16(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = core::Bf16ToFloat(core::FloatToBf16(v[i]));
  return r;
}

double GeluErf(double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); }

// x·Wᵀ in double, and Σ_k |x_k w_k| per output (the scale of the summation error).
struct Product {
  std::vector<double> dot, abs;
};
Product Multiply(const std::vector<float>& x, const std::vector<float>& w, int64_t m, int64_t k, int64_t n) {
  Product p{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, a = 0;
      for (int64_t t = 0; t < k; ++t) {
        const double v = static_cast<double>(x[i * k + t]) * w[j * k + t];
        s += v;
        a += std::fabs(v);
      }
      p.dot[i * n + j] = s;
      p.abs[i * n + j] = a;
    }
  }
  return p;
}

struct Expected {
  std::vector<float> value;
  std::vector<double> scale;  // Σ|x w| + |b| + |y0|
  // What the relative L2 error is measured against: the values themselves, except after GELU,
  // whose error follows its input (GELU squashes large negative inputs to ~0, and a few such
  // outputs would make any relative bound on them meaningless).
  std::vector<double> l2_reference;
};
Expected Apply(const Product& p, const float* bias, Epilogue ep, const std::vector<float>& y0, int64_t n) {
  Expected e{std::vector<float>(p.dot.size()), std::vector<double>(p.dot.size()),
             std::vector<double>(p.dot.size())};
  for (size_t i = 0; i < p.dot.size(); ++i) {
    const double b = bias ? bias[i % n] : 0.0;
    double v = p.dot[i] + b;
    e.scale[i] = p.abs[i] + std::fabs(b);
    e.l2_reference[i] = v;
    if (ep == Epilogue::kGeluErf) v = GeluErf(v);
    if (ep == Epilogue::kAccumulate) {
      v += y0[i];
      e.scale[i] += std::fabs(y0[i]);
    }
    e.value[i] = static_cast<float>(v);
    if (ep != Epilogue::kGeluErf) e.l2_reference[i] = v;
  }
  return e;
}

void ExpectClose(const std::vector<float>& got, const Expected& want, double rel_l2, double per_scale,
                 const char* what) {
  ASSERT_EQ(got.size(), want.value.size());
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err2 += (static_cast<double>(got[i]) - want.value[i]) * (static_cast<double>(got[i]) - want.value[i]);
    ref2 += want.l2_reference[i] * want.l2_reference[i];
  }
  EXPECT_LT(std::sqrt(err2 / std::max(ref2, 1e-300)), rel_l2) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = per_scale * want.scale[i] + 1e-6 * std::fabs(want.value[i]) + 1e-30;
    ASSERT_NEAR(got[i], want.value[i], tol) << what << " at " << i;
  }
}

const char* Name(Epilogue ep) {
  return ep == Epilogue::kNone ? "none" : ep == Epilogue::kGeluErf ? "gelu_erf" : "accumulate";
}

TEST(CudaLinearTest, MatchesTheCpuLinearAndADoubleReferenceOnOddShapes) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  Device& cpu = DefaultCpuDevice();
  uint32_t seed = 100;
  for (const ComputeType compute : {ComputeType::kF32, ComputeType::kBF16}) {
    const bool bf16 = compute == ComputeType::kBF16;
    const double rel_l2 = bf16 ? 3e-5 : 1e-5, per_scale = bf16 ? 3e-5 : 1e-5;
    int shape_index = 0;
    // 1283: x rows not 16-byte aligned and a last 16-byte chunk partly past `in` (the GEMV's
    // element loads).
    for (const auto& [in, out] :
         {std::pair<int64_t, int64_t>{80, 3}, {80, 1003}, {1280, 3}, {1280, 1003}, {1283, 37}}) {
      // Weights as checkpoints hold them: the compute type's own, or converted at creation.
      const DType wdtype = (shape_index++ % 2 == 0) ? (bf16 ? DType::kBF16 : DType::kF32)
                                                     : (bf16 ? DType::kF32 : DType::kF16);
      std::vector<float> w;
      const Tensor weight = MakeWeight(out, in, wdtype, seed++, &w);
      const std::vector<float> wc = bf16 ? RoundedToBf16(w) : w;  // what the GEMM multiplies
      Tensor bias = Tensor::Empty(DType::kF32, {out});
      const std::vector<float> bv = testing::RandomFloats(out, seed++);
      std::memcpy(bias.raw(), bv.data(), bv.size() * sizeof(float));
      SCOPED_TRACE(::testing::Message() << (bf16 ? "bf16" : "f32") << " in=" << in << " out=" << out << " weight "
                                        << core::DTypeName(wdtype));
      // [0]: no bias, [1]: with the bias; on the GPU and on the CPU (whose bf16 matmul needs
      // AVX-512: where it has none, the reference alone judges).
      std::unique_ptr<Linear> gpu_lin[2], cpu_lin[2];
      for (int with_bias = 0; with_bias < 2; ++with_bias) {
        auto g = Linear::Create(*gpu, weight, with_bias ? &bias : nullptr, compute);
        ASSERT_TRUE(g.ok()) << g.status();
        EXPECT_EQ((*g)->in_features(), in);
        EXPECT_EQ((*g)->out_features(), out);
        EXPECT_EQ((*g)->compute(), compute);
        gpu_lin[with_bias] = std::move(*g);
        auto c = Linear::Create(cpu, weight, with_bias ? &bias : nullptr, compute);
        if (!bf16) {
          ASSERT_TRUE(c.ok()) << c.status();
        }
        if (c.ok()) cpu_lin[with_bias] = std::move(*c);
      }
      // m <= CudaDevice::gemv_max_rows(): iris's GEMV (bf16); above: cuBLASLt.
      for (const int64_t m : {1, 2, 7, 8, 9, 33, 300}) {
        const std::vector<float> x = testing::RandomFloats(m * in, seed++);
        const Product p = Multiply(bf16 ? RoundedToBf16(x) : x, wc, m, in, out);
        const Tensor dx = Upload(*gpu, x);
        // Rows a GEMV may take: each GEMV kernel forced, then the device's own pick (PickGemv).
        const bool gemv = bf16 && m <= Cuda(*gpu).gemv_max_rows();
        const std::optional<cuda::GemvKernel> kinds[] = {
            cuda::GemvKernel::kCudaCores, cuda::GemvKernel::kCudaCoresPipelined, cuda::GemvKernel::kCudaCoresStreamed,
            cuda::GemvKernel::kTensorCores, std::nullopt};
        const char* kind_names[] = {"GEMV on the CUDA cores", "GEMV on the CUDA cores, pipelined",
                                    "GEMV on the CUDA cores, streamed", "GEMV on the tensor cores", "as picked"};
        constexpr int kKinds = 5;
        for (int run = 0; run < (gemv ? 2 * kKinds : 2); ++run) {
          const int with_bias = run % 2;
          const int kind = gemv ? run / 2 : kKinds - 1;
          Cuda(*gpu).ForceGemvKernel(kinds[kind]);
          SCOPED_TRACE(kind_names[kind]);
          for (const Epilogue ep : {Epilogue::kNone, Epilogue::kGeluErf, Epilogue::kAccumulate}) {
            SCOPED_TRACE(::testing::Message() << "m=" << m << (with_bias ? " with bias, " : " no bias, ") << Name(ep));
            const std::vector<float> y0 = testing::RandomFloats(m * out, seed++);
            Tensor dy = Upload(*gpu, y0);
            gpu_lin[with_bias]->Forward(dx.data<float>(), m, dy.data<float>(), ep);
            const std::vector<float> got = Download(*gpu, dy.data<float>(), y0.size());
            const Expected want = Apply(p, with_bias ? bv.data() : nullptr, ep, y0, out);
            ExpectClose(got, want, rel_l2, per_scale, "GPU vs double reference");
            if (cpu_lin[with_bias] != nullptr) {
              std::vector<float> cy = y0;
              cpu_lin[with_bias]->Forward(x.data(), m, cy.data(), ep);
              ExpectClose(got, Expected{cy, want.scale, want.l2_reference}, rel_l2, per_scale, "GPU vs CPU Linear");
            }
          }
        }
      }
    }
  }
  EXPECT_TRUE(Cuda(*gpu).status().ok()) << Cuda(*gpu).status();
}

// x and y that start 4 bytes into their buffers: the heuristic must be told, or it may pick a
// kernel that needs 16- or 256-byte aligned matrices.
TEST(CudaLinearTest, ViewsThatStartPartWayIntoABufferWork) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  const int64_t in = 80, out = 1003;
  // bf16 at m = 7: the GEMV's element loads of x; at 40: cuBLASLt.
  for (const auto& [compute, m] : {std::pair{ComputeType::kF32, int64_t{7}}, {ComputeType::kBF16, int64_t{7}},
                                   {ComputeType::kBF16, int64_t{40}}}) {
    const bool bf16 = compute == ComputeType::kBF16;
    SCOPED_TRACE(::testing::Message() << (bf16 ? "bf16" : "f32") << " m=" << m);
    std::vector<float> w;
    const Tensor weight = MakeWeight(out, in, DType::kF32, 7, &w);
    Tensor bias = Tensor::Empty(DType::kF32, {out});
    const std::vector<float> bv = testing::RandomFloats(out, 8);
    std::memcpy(bias.raw(), bv.data(), bv.size() * sizeof(float));
    auto lin = Linear::Create(*gpu, weight, &bias, compute);
    ASSERT_TRUE(lin.ok()) << lin.status();
    std::vector<float> x = testing::RandomFloats(m * in + 1, 9);
    const Tensor dx = Upload(*gpu, x);
    x.erase(x.begin());
    const Product p = Multiply(bf16 ? RoundedToBf16(x) : x, bf16 ? RoundedToBf16(w) : w, m, in, out);
    for (const Epilogue ep : {Epilogue::kNone, Epilogue::kGeluErf, Epilogue::kAccumulate}) {
      SCOPED_TRACE(Name(ep));
      std::vector<float> y0 = testing::RandomFloats(m * out + 1, 10);
      Tensor dy = Upload(*gpu, y0);
      float* y = dy.data<float>() + 1;
      (*lin)->Forward(dx.data<float>() + 1, m, y, ep);
      const std::vector<float> all = Download(*gpu, dy.data<float>(), y0.size());
      EXPECT_EQ(all[0], y0[0]);  // the element before the view is untouched
      y0.erase(y0.begin());
      ExpectClose(std::vector<float>(all.begin() + 1, all.end()), Apply(p, bv.data(), ep, y0, out),
                  bf16 ? 3e-5 : 1e-5, bf16 ? 3e-5 : 1e-5, "offset views");
    }
  }
  EXPECT_TRUE(Cuda(*gpu).status().ok()) << Cuda(*gpu).status();
}

// Forward issues only stream work (no host synchronisation), so it can be captured; the replay
// reads the input buffer as it is at replay time.
TEST(CudaLinearTest, ForwardIsCapturedInAGraphAndReplays) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  const int64_t m = 33, in = 1280, out = 1003;
  std::vector<float> w;
  const Tensor weight = MakeWeight(out, in, DType::kBF16, 11, &w);
  Tensor bias = Tensor::Empty(DType::kF32, {out});
  const std::vector<float> bv = testing::RandomFloats(out, 12);
  std::memcpy(bias.raw(), bv.data(), bv.size() * sizeof(float));
  auto lin = Linear::Create(*gpu, weight, &bias, ComputeType::kBF16);
  ASSERT_TRUE(lin.ok()) << lin.status();
  Tensor dx = Upload(*gpu, testing::RandomFloats(m * in, 13));
  Tensor dy = Upload(*gpu, std::vector<float>(m * out, 0.f));
  float* y = dy.data<float>();
  const std::vector<float> y2_start = testing::RandomFloats(2 * out, 15);
  Tensor dy2 = Upload(*gpu, y2_start);
  float* y2 = dy2.data<float>();
  // Once outside the capture: the plans are made and the bf16 scratch has grown.
  for (const Epilogue ep : {Epilogue::kGeluErf, Epilogue::kNone}) (*lin)->Forward(dx.data<float>(), m, y, ep);
  gpu->Synchronize();
  ASSERT_TRUE(gpu->BeginCapture().ok());
  (*lin)->Forward(dx.data<float>(), m, y, Epilogue::kGeluErf);
  (*lin)->Forward(dx.data<float>(), 2, y2, Epilogue::kAccumulate);  // the GEMV
  absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = gpu->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  const std::vector<float> x2 = testing::RandomFloats(m * in, 14);
  gpu->CopyToDevice(x2.data(), dx.data<float>(), x2.size() * sizeof(float));
  ASSERT_TRUE((*graph)->Replay().ok());
  const std::vector<float> got = Download(*gpu, y, m * out);
  const Product p = Multiply(RoundedToBf16(x2), RoundedToBf16(w), m, in, out);
  ExpectClose(got, Apply(p, bv.data(), Epilogue::kGeluErf, {}, out), 3e-5, 3e-5, "replayed");
  const std::vector<float> got2 = Download(*gpu, y2, 2 * out);
  const Product p2 = Multiply(RoundedToBf16({x2.begin(), x2.begin() + 2 * in}), RoundedToBf16(w), 2, in, out);
  ExpectClose(got2, Apply(p2, bv.data(), Epilogue::kAccumulate, y2_start, out), 3e-5, 3e-5, "replayed GEMV");
  EXPECT_TRUE(Cuda(*gpu).status().ok()) << Cuda(*gpu).status();
}

// The ops a bf16 Linear folds into its read of x (LinearInput: the RMSNorm before a projection,
// the SiLU·mul before down) give what the op's own kernel followed by Forward gives, bit for bit:
// the same values reach the same product on every path — the CUDA-core GEMVs (one block per
// group, and streamed), the tensor-core
// GEMV, and cuBLASLt fed by the op's bf16 rows.
TEST(CudaLinearTest, FoldedInputOpsGiveTheOpThenForwardBitForBit) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  cuda::CudaDevice& cuda = Cuda(*gpu);
  const int64_t in = 2048, out = 1003, max_m = 40;
  std::vector<float> w;
  const Tensor weight = MakeWeight(out, in, DType::kBF16, 31, &w);
  Tensor bias = Tensor::Empty(DType::kF32, {out});
  const std::vector<float> bv = testing::RandomFloats(out, 32);
  std::memcpy(bias.raw(), bv.data(), bv.size() * sizeof(float));
  auto lin = Linear::Create(*gpu, weight, &bias, ComputeType::kBF16);
  ASSERT_TRUE(lin.ok()) << lin.status();
  const Tensor dx = Upload(*gpu, testing::RandomFloats(max_m * in, 33));
  const Tensor dgu = Upload(*gpu, testing::RandomFloats(max_m * 2 * in, 34));
  const Tensor dnorm = Upload(*gpu, testing::RandomFloats(in, 35));
  Tensor staging = Upload(*gpu, std::vector<float>(max_m * in, 0.f));
  const std::vector<float> y0 = testing::RandomFloats(max_m * out, 36);
  using Op = LinearInput::Op;
  const std::pair<int64_t, std::optional<cuda::GemvKernel>> paths[] = {
      {1, cuda::GemvKernel::kCudaCores}, {3, cuda::GemvKernel::kCudaCores}, {8, cuda::GemvKernel::kTensorCores},
      {1, cuda::GemvKernel::kCudaCoresStreamed}, {3, cuda::GemvKernel::kCudaCoresStreamed},
      {1, cuda::GemvKernel::kCudaCoresPipelined}, {3, cuda::GemvKernel::kCudaCoresPipelined}, {max_m, std::nullopt}};
  for (const auto& [m, kernel] : paths) {
    cuda.ForceGemvKernel(kernel);
    for (const Op op : {Op::kRmsNorm, Op::kSiluMul}) {
      SCOPED_TRACE(::testing::Message() << "m=" << m << (op == Op::kRmsNorm ? " rms_norm" : " silu_mul"));
      const LinearInput input{.op = op,
                              .x = op == Op::kRmsNorm ? dx.data<float>() : dgu.data<float>(),
                              .norm_weight = dnorm.data<float>(),
                              .eps = 1e-6f,
                              .staging = staging.data<float>()};
      std::vector<float> got[2];
      for (const bool fold : {true, false}) {
        cuda.SetFoldLinearInputs(fold);
        Tensor dy = Upload(*gpu, y0);
        LinearForward(*gpu, **lin, input, m, dy.data<float>(), Epilogue::kAccumulate);
        got[fold ? 0 : 1] = Download(*gpu, dy.data<float>(), static_cast<size_t>(m * out));
      }
      EXPECT_EQ(got[0], got[1]);
      EXPECT_NE(got[0], std::vector<float>(y0.begin(), y0.begin() + m * out));
    }
  }
  cuda.ForceGemvKernel(std::nullopt);
  cuda.SetFoldLinearInputs(true);
  EXPECT_TRUE(cuda.status().ok()) << cuda.status();
}

// GEMVs launched to start early (programmatic dependent launch) still wait for the kernel ahead
// of them: a chain of Linears, each reading the one before's output (a plain GEMV, a folded norm,
// a folded SiLU·mul, an accumulate), gives the same bits with early start on and off, run
// directly and replayed from a graph; with the GEMVs PickGemv gives them (the plain one at one row)
// and with every GEMV forced to the streamed one.
TEST(CudaLinearTest, EarlyStartGemvsWaitForTheKernelAhead) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  cuda::CudaDevice& cuda = Cuda(*gpu);
  if (absl::Status s = cuda.SetEarlyStart(true); !s.ok()) GTEST_SKIP() << s;
  const int64_t h = 1024, inter = 4096, m = 1;
  ASSERT_EQ(cuda.GemvFor(m, h, inter), cuda::GemvKernel::kCudaCores);
  ASSERT_EQ(cuda.GemvFor(m, 2 * inter, h), cuda::GemvKernel::kCudaCores);
  std::vector<float> held;
  auto make = [&](int64_t out, int64_t in, uint32_t seed) {
    auto lin = Linear::Create(*gpu, MakeWeight(out, in, DType::kBF16, seed, &held), nullptr, ComputeType::kBF16);
    EXPECT_TRUE(lin.ok()) << lin.status();
    return lin.ok() ? std::move(*lin) : nullptr;
  };
  const std::unique_ptr<Linear> a = make(h, h, 41), gate_up = make(2 * inter, h, 42), down = make(h, inter, 43);
  ASSERT_TRUE(a && gate_up && down);
  const std::vector<float> x0 = testing::RandomFloats(m * h, 44);
  Tensor x = Upload(*gpu, x0), t = Upload(*gpu, std::vector<float>(m * h, 0.f));
  Tensor gu = Upload(*gpu, std::vector<float>(m * 2 * inter, 0.f)), staging = Upload(*gpu, std::vector<float>(m * h));
  const Tensor norm = Upload(*gpu, testing::RandomFloats(h, 45));
  // x <- x + down(silu_mul(gate_up(norm(a(x))))), three times.
  auto step = [&] {
    for (int i = 0; i < 3; ++i) {
      a->Forward(x.data<float>(), m, t.data<float>());
      LinearForward(*gpu, *gate_up,
                    LinearInput::RmsNorm(t.data<float>(), norm.data<float>(), 1e-6f, staging.data<float>()), m,
                    gu.data<float>());
      LinearForward(*gpu, *down, LinearInput::SiluMul(gu.data<float>(), staging.data<float>()), m, x.data<float>(),
                    Epilogue::kAccumulate);
    }
  };
  for (const auto& [name, forced] : {std::pair{"picked", std::optional<cuda::GemvKernel>{}},
                                      std::pair{"streamed", std::optional{cuda::GemvKernel::kCudaCoresStreamed}},
                                      std::pair{"pipelined", std::optional{cuda::GemvKernel::kCudaCoresPipelined}}}) {
    cuda.ForceGemvKernel(forced);
    if (forced) {
      ASSERT_EQ(cuda.GemvFor(m, h, inter), *forced);
    }
    std::vector<float> got[2];
    for (const bool early : {false, true}) {
      ASSERT_TRUE(cuda.SetEarlyStart(early).ok());
      gpu->CopyToDevice(x0.data(), x.data<float>(), x0.size() * sizeof(float));
      step();
      got[early] = Download(*gpu, x.data<float>(), x0.size());
    }
    EXPECT_EQ(got[1], got[0]) << "direct, " << name;
    EXPECT_NE(got[0], x0);
    ASSERT_TRUE(cuda.SetEarlyStart(true).ok());
    ASSERT_TRUE(gpu->BeginCapture().ok());
    step();
    absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = gpu->EndCapture();
    ASSERT_TRUE(graph.ok()) << graph.status();
    gpu->CopyToDevice(x0.data(), x.data<float>(), x0.size() * sizeof(float));
    ASSERT_TRUE((*graph)->Replay().ok());
    EXPECT_EQ(Download(*gpu, x.data<float>(), x0.size()), got[0]) << "replayed, " << name;
  }
  cuda.ForceGemvKernel(std::nullopt);
  ASSERT_TRUE(cuda.SetEarlyStart(false).ok());
  EXPECT_TRUE(cuda.status().ok()) << cuda.status();
}

// kernels::GatedMlp's bf16 hand-off: cuBLASLt writes gate_up's output as bf16 rows and the
// SiLU·mul reads them. Against a double reference of those steps, started from gate_up's own f32
// output on the GPU (checked above): gate and up rounded to bf16, the SiLU·mul in f32 rounded to
// bf16, down in double. The two cuBLASLt kernels (f32 and bf16 output) may sum in different
// orders, so now and then a gate or up value rounds to the neighbouring bf16: the relative L2
// bound is tight, the per-element one allows such a step. With the hand-off off, and for rows the
// GEMVs take, GatedMlp is the two Linears bit for bit. Intermediates: 340, down's bf16 input rows
// padded (stride 344); 1024, unpadded; 342, a gate_up width (684) that is not whole 16-byte
// vectors, which takes the f32 output (its padded bf16 rows failed the bound on an H200), so
// GatedMlp there is the two Linears bit for bit too.
TEST(CudaLinearTest, GatedMlpHandsGateUpOverInBf16WhereAMatmulRuns) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  cuda::CudaDevice& cuda = Cuda(*gpu);
  const int64_t h = 1280;
  uint32_t seed = 500;
  for (const int64_t inter : {int64_t{340}, int64_t{342}, int64_t{1024}}) {
    std::vector<float> wgu, wdn;
    const Tensor gu_weight = MakeWeight(2 * inter, h, DType::kBF16, seed++, &wgu);
    const Tensor dn_weight = MakeWeight(h, inter, DType::kBF16, seed++, &wdn);
    // gate_up's bias bf16-exact, so that cuBLASLt's bf16 copy of it is the same bias.
    const std::vector<float> bgu = RoundedToBf16(testing::RandomFloats(2 * inter, seed++));
    const std::vector<float> bdn = testing::RandomFloats(h, seed++);
    Tensor gu_bias = Tensor::Empty(DType::kF32, {2 * inter}), dn_bias = Tensor::Empty(DType::kF32, {h});
    std::memcpy(gu_bias.raw(), bgu.data(), bgu.size() * sizeof(float));
    std::memcpy(dn_bias.raw(), bdn.data(), bdn.size() * sizeof(float));
    auto gate_up = Linear::Create(*gpu, gu_weight, &gu_bias, ComputeType::kBF16);
    auto down = Linear::Create(*gpu, dn_weight, &dn_bias, ComputeType::kBF16);
    ASSERT_TRUE(gate_up.ok() && down.ok());
    for (const int64_t m : {int64_t{77}, int64_t{2}}) {
      SCOPED_TRACE(::testing::Message() << "inter " << inter << ", m " << m);
      const bool gemv = m <= cuda.gemv_max_rows();
      cuda.ForceGemvKernel(gemv ? std::optional(cuda::GemvKernel::kCudaCores) : std::nullopt);
      const Tensor dx = Upload(*gpu, testing::RandomFloats(m * h, seed++));
      const Tensor dnorm = Upload(*gpu, testing::RandomFloats(h, seed++));
      Tensor staging = Upload(*gpu, std::vector<float>(m * h, 0.f));
      Tensor gu_out = Upload(*gpu, std::vector<float>(m * 2 * inter, 0.f));
      Tensor act = Upload(*gpu, std::vector<float>(m * inter, 0.f));
      const std::vector<float> y0 = testing::RandomFloats(m * h, seed++);
      const LinearInput in = LinearInput::RmsNorm(dx.data<float>(), dnorm.data<float>(), 1e-6f, staging.data<float>());
      std::vector<float> got[2];
      for (const bool handoff : {true, false}) {
        cuda.SetBf16Handoff(handoff);
        Tensor dy = Upload(*gpu, y0);
        GatedMlp(*gpu, **gate_up, **down, in, m, {gu_out.data<float>(), act.data<float>()}, dy.data<float>());
        got[handoff ? 0 : 1] = Download(*gpu, dy.data<float>(), static_cast<size_t>(m * h));
      }
      cuda.SetBf16Handoff(true);
      // The two Linears, as GatedMlp runs them without the hand-off.
      Tensor dy = Upload(*gpu, y0);
      LinearForward(*gpu, **gate_up, in, m, gu_out.data<float>());
      const std::vector<float> g32 = Download(*gpu, gu_out.data<float>(), static_cast<size_t>(m * 2 * inter));
      LinearForward(*gpu, **down, LinearInput::SiluMul(gu_out.data<float>(), act.data<float>()), m, dy.data<float>(),
                    Epilogue::kAccumulate);
      EXPECT_EQ(got[1], Download(*gpu, dy.data<float>(), static_cast<size_t>(m * h))) << "hand-off off";
      if (gemv || (2 * inter) % 8 != 0) {
        EXPECT_EQ(got[0], got[1]) << (gemv ? "rows a GEMV takes" : "an unaligned gate_up width") << ": no hand-off";
        continue;
      }
      EXPECT_NE(got[0], got[1]) << "the hand-off's rounding should show";
      std::vector<float> a(static_cast<size_t>(m * inter));
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < inter; ++j) {
          const float g = core::Bf16ToFloat(core::FloatToBf16(g32[r * 2 * inter + j]));
          const float u = core::Bf16ToFloat(core::FloatToBf16(g32[r * 2 * inter + inter + j]));
          a[r * inter + j] = core::Bf16ToFloat(core::FloatToBf16(g / (1.0f + std::exp(-g)) * u));
        }
      }
      const Expected want = Apply(Multiply(a, RoundedToBf16(wdn), m, inter, h), bdn.data(), Epilogue::kAccumulate, y0, h);
      ExpectClose(got[0], want, 2e-4, 2e-2, "hand-off");
    }
  }
  cuda.ForceGemvKernel(std::nullopt);
  EXPECT_TRUE(cuda.status().ok()) << cuda.status();
}

// The qkv chain's projection (kernels/qkv_bf16.h): LinearForwardToBf16 writes the f32 result's
// rounding into bf16 rows of a padded stride, leaving the padding alone. Rows a GEMV takes: the
// same GEMV's f32 output rounded, bit for bit. Matmul rows: cuBLASLt's bf16 output sums in its own
// order, so within one bf16 step of the f32 output's rounding. And the device holds q, k, v in
// bf16 only where the hand-off, folding and its flash attention are on.
TEST(CudaLinearTest, LinearForwardToBf16IsTheF32OutputRounded) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  cuda::CudaDevice& cuda = Cuda(*gpu);
  const int64_t in = 1280;
  static constexpr uint16_t kUntouched = 0xABCD;
  // 256 wide: cuBLASLt's bf16 output. 252: not whole 16-byte vectors, so the f32 output rounded
  // by one conversion (a bf16 output 684 wide was 0.4% off on an H200), exact for every row.
  for (const int64_t out : {int64_t{3 * 80 + 16}, int64_t{3 * 80 + 12}}) {
    const int64_t ldy = out + 8;
    const bool bf16_output = out % 8 == 0;
    std::vector<float> w;
    const Tensor weight = MakeWeight(out, in, DType::kBF16, 610, &w);
    // A bf16-exact bias: cuBLASLt's bf16 copy of it is the same bias.
    const std::vector<float> b = RoundedToBf16(testing::RandomFloats(out, 611));
    Tensor bias = Tensor::Empty(DType::kF32, {out});
    std::memcpy(bias.raw(), b.data(), b.size() * sizeof(float));
    auto lin = Linear::Create(*gpu, weight, &bias, ComputeType::kBF16);
    ASSERT_TRUE(lin.ok()) << lin.status();
    EXPECT_TRUE(KeepsQkvInBf16(*gpu, **lin, /*bf16_attention=*/true));
    EXPECT_FALSE(KeepsQkvInBf16(*gpu, **lin, /*bf16_attention=*/false));
    cuda.SetBf16Handoff(false);
    EXPECT_FALSE(KeepsQkvInBf16(*gpu, **lin, true));
    cuda.SetBf16Handoff(true);
    cuda.SetFoldLinearInputs(false);
    EXPECT_FALSE(KeepsQkvInBf16(*gpu, **lin, true));
    cuda.SetFoldLinearInputs(true);
    for (const int64_t m : {int64_t{2}, int64_t{77}}) {
      SCOPED_TRACE(::testing::Message() << "out " << out << ", m " << m);
      const Tensor dx = Upload(*gpu, testing::RandomFloats(m * in, 612));
      const Tensor dnorm = Upload(*gpu, testing::RandomFloats(in, 613));
      Tensor staging = Upload(*gpu, std::vector<float>(m * in, 0.f));
      Tensor dy = Upload(*gpu, std::vector<float>(m * out, 0.f));
      const LinearInput x =
          LinearInput::RmsNorm(dx.data<float>(), dnorm.data<float>(), 1e-6f, staging.data<float>());
      LinearForward(*gpu, **lin, x, m, dy.data<float>());
      const std::vector<float> f32 = Download(*gpu, dy.data<float>(), static_cast<size_t>(m * out));
      absl::StatusOr<Tensor> rows = gpu->Allocate(DType::kBF16, {m, ldy});
      ASSERT_TRUE(rows.ok()) << rows.status();
      std::vector<uint16_t> got(static_cast<size_t>(m * ldy), kUntouched);
      gpu->CopyToDevice(got.data(), rows->raw(), got.size() * sizeof(uint16_t));
      LinearForwardToBf16(*gpu, **lin, x, m, static_cast<uint16_t*>(rows->raw()), ldy);
      gpu->CopyToHost(rows->raw(), got.data(), got.size() * sizeof(uint16_t));
      ASSERT_TRUE(cuda.status().ok()) << cuda.status();
      const bool exact = m <= cuda.gemv_max_rows() || !bf16_output;
      int differ = 0;
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < ldy; ++c) {
          const uint16_t g = got[r * ldy + c];
          if (c >= out) {
            ASSERT_EQ(g, kUntouched) << "padding column " << c;
            continue;
          }
          const uint16_t want = core::FloatToBf16(f32[r * out + c]);
          if (exact) {
            ASSERT_EQ(g, want) << "row " << r << " column " << c;
          } else {
            ASSERT_LE(std::abs(int{g} - int{want}), 1) << "row " << r << " column " << c;
            differ += g != want;
          }
        }
      }
      EXPECT_LE(differ, m * out / 20) << "more than rare one-step differences";
    }
  }
}

// Matmul tuning (CudaDevice::SetMatmulTuning): the first call of a shape times cuBLASLt's
// candidates on a scratch output (a residual in y survives it) and gives the right product; the
// choice is the device's, per shape and row bucket: a second Linear of that shape, or another row
// count in the bucket, reuses it (no new entry), and a Linear with the same weight and input runs
// the same algorithm, bit for bit. Inside a capture nothing is timed (no host wait breaks it).
TEST(CudaLinearTest, TunedMatmulsAreRightAndSharedPerShapeAndRowBucket) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  cuda::CudaDevice& dev = Cuda(*gpu);
  dev.SetMatmulTuning(true);
  const int64_t in = 1280, out = 1280, m = 300, m2 = 400, m_captured = 1000;
  std::vector<float> w, w2;
  const Tensor weight = MakeWeight(out, in, DType::kBF16, 21, &w);
  const Tensor weight2 = MakeWeight(out, in, DType::kBF16, 22, &w2);
  Tensor bias = Tensor::Empty(DType::kF32, {out});
  const std::vector<float> bv = testing::RandomFloats(out, 23);
  std::memcpy(bias.raw(), bv.data(), bv.size() * sizeof(float));
  auto a = Linear::Create(*gpu, weight, &bias, ComputeType::kBF16);
  auto b = Linear::Create(*gpu, weight2, &bias, ComputeType::kBF16);
  auto a_again = Linear::Create(*gpu, weight, &bias, ComputeType::kBF16);
  ASSERT_TRUE(a.ok() && b.ok() && a_again.ok());
  const std::vector<float> x = testing::RandomFloats(m_captured * in, 24);
  const Tensor dx = Upload(*gpu, x);

  // The first call tunes, into a scratch output: y's residual is added once.
  const std::vector<float> y0 = testing::RandomFloats(m * out, 25);
  Tensor dy = Upload(*gpu, y0);
  (*a)->Forward(dx.data<float>(), m, dy.data<float>(), Epilogue::kAccumulate);
  const std::vector<float> got = Download(*gpu, dy.data<float>(), m * out);
  const std::vector<float> xr = RoundedToBf16(x);
  const Product p = Multiply({xr.begin(), xr.begin() + m * in}, RoundedToBf16(w), m, in, out);
  ExpectClose(got, Apply(p, bv.data(), Epilogue::kAccumulate, y0, out), 3e-5, 3e-5, "tuned, accumulate");
  std::vector<cuda::TunedMatmul> tuned = dev.matmul_algos().Entries();
  ASSERT_EQ(tuned.size(), 1u) << "cuBLASLt offered one candidate only? " << cuda::TunedMatmulTable(dev);
  EXPECT_EQ(tuned[0].rows, m);
  EXPECT_EQ(tuned[0].key.row_bucket, 512);
  EXPECT_GE(tuned[0].candidates, 2);
  EXPECT_LT(tuned[0].chosen, tuned[0].candidates);
  EXPECT_LE(tuned[0].chosen_s, tuned[0].first_s);
  EXPECT_FALSE(cuda::TunedMatmulTable(dev).empty());

  // Another Linear of the shape, at another row count of the bucket: the same entry serves.
  Tensor dy2 = Upload(*gpu, std::vector<float>(m2 * out, 0.f));
  (*b)->Forward(dx.data<float>(), m2, dy2.data<float>(), Epilogue::kNone);
  const Product p2 = Multiply({xr.begin(), xr.begin() + m2 * in}, RoundedToBf16(w2), m2, in, out);
  ExpectClose(Download(*gpu, dy2.data<float>(), m2 * out), Apply(p2, bv.data(), Epilogue::kNone, {}, out), 3e-5, 3e-5,
              "bucket's choice reused");
  EXPECT_EQ(dev.matmul_algos().Entries().size(), 1u);

  // The same weight and input through a second Linear: the table's algorithm, the same bits.
  Tensor d1 = Upload(*gpu, std::vector<float>(m * out, 0.f)), d2 = Upload(*gpu, std::vector<float>(m * out, 0.f));
  (*a)->Forward(dx.data<float>(), m, d1.data<float>(), Epilogue::kNone);
  (*a_again)->Forward(dx.data<float>(), m, d2.data<float>(), Epilogue::kNone);
  EXPECT_EQ(Download(*gpu, d1.data<float>(), m * out), Download(*gpu, d2.data<float>(), m * out));

  // A new bucket met first inside a capture: not timed, the capture holds, the replay is right.
  dev.SetMatmulTuning(false);
  Tensor d3 = Upload(*gpu, std::vector<float>(m_captured * out, 0.f));
  (*a)->Forward(dx.data<float>(), m_captured, d3.data<float>(), Epilogue::kNone);  // grows the scratch
  gpu->Synchronize();
  dev.SetMatmulTuning(true);
  ASSERT_TRUE(gpu->BeginCapture().ok());
  (*a)->Forward(dx.data<float>(), m_captured, d3.data<float>(), Epilogue::kNone);
  absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = gpu->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  const std::vector<float> zeros(m_captured * out, 0.f);
  gpu->CopyToDevice(zeros.data(), d3.data<float>(), zeros.size() * sizeof(float));
  ASSERT_TRUE((*graph)->Replay().ok());
  const Product p3 = Multiply(xr, RoundedToBf16(w), m_captured, in, out);
  ExpectClose(Download(*gpu, d3.data<float>(), m_captured * out), Apply(p3, bv.data(), Epilogue::kNone, {}, out), 3e-5,
              3e-5, "captured, untuned");
  EXPECT_EQ(dev.matmul_algos().Entries().size(), 1u);
  EXPECT_TRUE(dev.status().ok()) << dev.status();
}

// The bf16 scratch cannot grow inside a capture (its memory would belong to the graph): the
// device keeps an error that says so instead of failing somewhere later.
TEST(CudaLinearTest, GrowingTheScratchInsideACaptureIsReported) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  std::vector<float> w;
  const Tensor weight = MakeWeight(64, 80, DType::kBF16, 15, &w);
  auto lin = Linear::Create(*gpu, weight, nullptr, ComputeType::kBF16);
  ASSERT_TRUE(lin.ok()) << lin.status();
  // More rows than the GEMV takes (it needs no scratch): the cuBLASLt path.
  const int64_t m = Cuda(*gpu).gemv_max_rows() + 1;
  const Tensor dx = Upload(*gpu, testing::RandomFloats(m * 80, 16));
  Tensor dy = Upload(*gpu, std::vector<float>(m * 64, 0.f));
  ASSERT_TRUE(gpu->BeginCapture().ok());
  (*lin)->Forward(dx.data<float>(), m, dy.data<float>(), Epilogue::kNone);
  (void)gpu->EndCapture();
  const absl::Status s = Cuda(*gpu).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("graph capture"), std::string::npos) << s;
}

TEST(CudaLinearTest, CreateRefusesBadShapesAndDtypes) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  const Tensor w3 = Tensor::Zeros(DType::kF32, {2, 3, 4});
  EXPECT_EQ(Linear::Create(*gpu, w3, nullptr, ComputeType::kF32).status().code(), absl::StatusCode::kInvalidArgument);
  const Tensor wi = Tensor::Zeros(DType::kI32, {2, 3});
  EXPECT_EQ(Linear::Create(*gpu, wi, nullptr, ComputeType::kF32).status().code(), absl::StatusCode::kInvalidArgument);
  const Tensor w = Tensor::Zeros(DType::kF32, {2, 3});
  const Tensor b = Tensor::Zeros(DType::kF32, {3});
  EXPECT_EQ(Linear::Create(*gpu, w, &b, ComputeType::kF32).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaLinearTest, GemvMaxRowsIsBounded) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  cuda::CudaDevice& dev = Cuda(*gpu);
  EXPECT_EQ(dev.gemv_max_rows(), cuda::kGemvMaxRowsPerLaunch);
  EXPECT_EQ(dev.SetGemvMaxRows(cuda::kGemvMaxRowsPerLaunch + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev.SetGemvMaxRows(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dev.SetGemvMaxRows(0).ok());
  EXPECT_EQ(dev.gemv_max_rows(), 0);
  EXPECT_FALSE(dev.forced_gemv_kernel().has_value());
}

TEST(CudaLinearTest, PeakRatesAreMeasured) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  const double bf16 = MeasureMatmulPeakFlops(*gpu, ComputeType::kBF16, 4096, 3);
  const double f32 = MeasureMatmulPeakFlops(*gpu, ComputeType::kF32, 2048, 3);
  const double bandwidth = MeasureMemoryReadBandwidth(*gpu);
  std::printf("%s: bf16 GEMM %.1f TFLOP/s, f32 GEMM %.1f TFLOP/s, read bandwidth %.0f GB/s\n",
              gpu->Describe().c_str(), bf16 * 1e-12, f32 * 1e-12, bandwidth * 1e-9);
  // Ampere and later: bf16 tensor cores well above 10 TFLOP/s, f32 above 1; HBM/GDDR between
  // 100 GB/s and 10 TB/s (more would mean the buffer was served from the L2).
  EXPECT_GT(bf16, 1e13);
  EXPECT_GT(f32, 1e12);
  EXPECT_GT(bf16, f32);
  EXPECT_GT(bandwidth, 1e11);
  EXPECT_LT(bandwidth, 1e13);
  EXPECT_TRUE(Cuda(*gpu).status().ok()) << Cuda(*gpu).status();
}

#else
TEST(CudaLinearTest, NeedsTheCudaBackend) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif

}  // namespace
}  // namespace iris::kernels
