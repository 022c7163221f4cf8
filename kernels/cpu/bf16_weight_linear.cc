// bf16 compute where oneDNN has no bf16 matmul (oneDNN 2.6 below AVX-512: AVX2-only processors
// such as Zen 3 EPYCs). The weights stay bf16 ([out, in] as HF stores them, rounded once at load),
// so they cost what they cost on an AVX-512 machine; each input row is rounded to bf16 (a bf16
// matmul's input). A product of two bf16 values is exact in f32, so both paths below compute what
// a bf16 matmul with f32 accumulation computes, up to the order of the sums:
//
//  * few rows (decode): an AVX2 kernel reads the bf16 weights directly (a shift widens them), all
//    rows against each weight row while it is in registers — the step is bound by weight bytes,
//    and these are half of f32's;
//  * more rows (prefill, the encoder): panels of output columns are widened to f32 into a small
//    buffer and multiplied by oneDNN's f32 matmul, its output written in place in y's columns.
//
// The baseline build is x86-64-v3, so AVX2 and FMA are always there.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/bf16.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/matmul_epilogue.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace iris::kernels::cpu {
namespace {

using dnnl::memory;
using Dt = memory::data_type;

constexpr int64_t kDirectRows = 4;    // up to this many rows: the direct kernel
constexpr int64_t kPanel = 256;       // output columns widened per oneDNN call
constexpr int64_t kColumnBlock = 64;  // output columns per work item of the direct kernel

float GeluErf(float v) { return 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f)); }

inline float Store(Epilogue epilogue, float acc, float prev) {
  switch (epilogue) {
    case Epilogue::kNone: return acc;
    case Epilogue::kGeluErf: return GeluErf(acc);
    case Epilogue::kAccumulate: return prev + acc;
  }
  return acc;
}

inline __m256 WidenBf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[r, n] for r < M, n in [n0, n1): C weight rows at a time against every input row.
template <int M, int C>
void DirectColumns(const float* x, int64_t k, const uint16_t* w, const float* bias, int64_t n0, int64_t n1, float* y,
                   int64_t ldy, Epilogue epilogue) {
  const int64_t k8 = k / 8 * 8;
  int64_t n = n0;
  for (; n + C <= n1; n += C) {
    __m256 acc[M][C];
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t t = 0; t < k8; t += 8) {
      __m256 wv[C];
      for (int c = 0; c < C; ++c) wv[c] = WidenBf16(w + (n + c) * k + t);
      for (int r = 0; r < M; ++r) {
        const __m256 xv = _mm256_loadu_ps(x + r * k + t);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < M; ++r) {
      for (int c = 0; c < C; ++c) {
        float s = HorizontalSum(acc[r][c]);
        for (int64_t t = k8; t < k; ++t) s += x[r * k + t] * core::Bf16ToFloat(w[(n + c) * k + t]);
        float* out = y + r * ldy + n + c;
        *out = Store(epilogue, s + bias[n + c], *out);
      }
    }
  }
  if (n < n1) DirectColumns<M, 1>(x, k, w, bias, n, n1, y, ldy, epilogue);
}

template <int M>
void Direct(const float* x, int64_t k, const uint16_t* w, const float* bias, int64_t n0, int64_t n1, float* y,
            int64_t ldy, Epilogue epilogue) {
  // 4 weight rows for one or two input rows, 2 for three or four: at most 8 accumulators.
  DirectColumns<M, (M <= 2 ? 4 : 2)>(x, k, w, bias, n0, n1, y, ldy, epilogue);
}

class Bf16WeightLinear final : public Linear {
 public:
  Bf16WeightLinear(CpuDevice& dev, int64_t out, int64_t in, RowToBf16Fn to_bf16)
      : dev_(dev), out_(out), in_(in), to_bf16_(to_bf16) {}

  absl::Status Init(const core::Tensor& weight, const core::Tensor* bias) {
    weight_ = core::AllocateAligned(static_cast<size_t>(out_ * in_) * sizeof(uint16_t));
    uint16_t* w = static_cast<uint16_t*>(weight_.get());
    if (weight.dtype() == core::DType::kBF16) {
      std::memcpy(w, weight.raw(), static_cast<size_t>(out_ * in_) * sizeof(uint16_t));
    } else {
      const core::Tensor f32 = weight.ToF32();
      const float* src = f32.data<float>();
      const int64_t in = in_;
#pragma omp parallel for num_threads(dev_.threads()) schedule(static)
      for (int64_t r = 0; r < out_; ++r) to_bf16_(src + r * in, in, w + r * in);
    }
    bias_ = core::AllocateAligned(static_cast<size_t>(out_) * sizeof(float));
    float* b = static_cast<float*>(bias_.get());
    if (bias != nullptr) {
      const core::Tensor bf = bias->ToF32();
      std::memcpy(b, bf.raw(), static_cast<size_t>(out_) * sizeof(float));
    } else {
      std::fill(b, b + out_, 0.f);
    }
    return absl::OkStatus();
  }

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  ComputeType compute() const override { return ComputeType::kBF16; }

  void Forward(const float* x, int64_t m, float* y, Epilogue epilogue) const override {
    if (m <= 0) return;
    // The input rows rounded to bf16 (kept as f32: the f32 matmul's and the kernel's input).
    float* xr = static_cast<float*>(
        dev_.Scratch(CpuDevice::kSlotBf16Activations, 0, static_cast<size_t>(m * in_) * sizeof(float)));
    const int64_t in = in_;
#pragma omp parallel for num_threads(dev_.threads()) schedule(static) if (m * in > 32768)
    for (int64_t r = 0; r < m; ++r) RoundRow(x + r * in, in, xr + r * in);
    for (int64_t r = 0; r < m;) {
      if (m - r <= kDirectRows) {
        ForwardDirect(xr + r * in_, m - r, y + r * out_, epilogue);
        return;
      }
      // Row counts vary from call to call: primitives for exact counts up to 64, then multiples
      // of 64 (as CpuLinear), the remainder in the next round.
      const int64_t rows = m - r <= 64 ? m - r : (m - r) / 64 * 64;
      ForwardPanels(xr + r * in_, rows, y + r * out_, epilogue);
      r += rows;
    }
  }

 private:
  void RoundRow(const float* x, int64_t n, float* y) const {
    constexpr int64_t kChunk = 1024;
    uint16_t tmp[kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t len = std::min(kChunk, n - i);
      to_bf16_(x + i, len, tmp);
      for (int64_t j = 0; j < len; ++j) y[i + j] = core::Bf16ToFloat(tmp[j]);
    }
  }

  void ForwardDirect(const float* xr, int64_t m, float* y, Epilogue epilogue) const {
    const uint16_t* w = static_cast<const uint16_t*>(weight_.get());
    const float* b = static_cast<const float*>(bias_.get());
    const int64_t blocks = (out_ + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for num_threads(dev_.threads()) schedule(static) if (blocks > 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t n0 = blk * kColumnBlock, n1 = std::min(out_, n0 + kColumnBlock);
      switch (m) {
        case 1: Direct<1>(xr, in_, w, b, n0, n1, y, out_, epilogue); break;
        case 2: Direct<2>(xr, in_, w, b, n0, n1, y, out_, epilogue); break;
        case 3: Direct<3>(xr, in_, w, b, n0, n1, y, out_, epilogue); break;
        default: Direct<4>(xr, in_, w, b, n0, n1, y, out_, epilogue); break;
      }
    }
  }

  void ForwardPanels(const float* xr, int64_t m, float* y, Epilogue epilogue) const {
    const uint16_t* w = static_cast<const uint16_t*>(weight_.get());
    float* panel = static_cast<float*>(
        dev_.Scratch(CpuDevice::kSlotWeightPanel, 0, static_cast<size_t>(kPanel * in_) * sizeof(float)));
    dnnl::engine& eng = dev_.dnnl_engine();
    dnnl::stream& s = dev_.dnnl_stream();
    for (int64_t n0 = 0; n0 < out_; n0 += kPanel) {
      const int64_t np = std::min(kPanel, out_ - n0);
      const int64_t count = np * in_;
      const uint16_t* src = w + n0 * in_;
#pragma omp parallel for simd num_threads(dev_.threads()) schedule(static) if (count > 65536)
      for (int64_t i = 0; i < count; ++i) panel[i] = core::Bf16ToFloat(src[i]);
      const dnnl::matmul prim = GetPrimitive(m, np, epilogue);
      // Weights {K, np} read from the panel's rows ([np, K]: "ba"); dst: y's columns, row stride out_.
      dnnl::memory src_mem({{m, in_}, Dt::f32, memory::dims{in_, 1}}, eng, const_cast<float*>(xr));
      dnnl::memory wei_mem({{in_, np}, Dt::f32, memory::dims{1, in_}}, eng, panel);
      dnnl::memory bias_mem({{1, np}, Dt::f32, memory::dims{np, 1}}, eng, static_cast<float*>(bias_.get()) + n0);
      dnnl::memory dst_mem({{m, np}, Dt::f32, memory::dims{out_, 1}}, eng, y + n0);
      prim.execute(s, {{DNNL_ARG_SRC, src_mem},
                       {DNNL_ARG_WEIGHTS, wei_mem},
                       {DNNL_ARG_BIAS, bias_mem},
                       {DNNL_ARG_DST, dst_mem}});
      s.wait();
    }
  }

  dnnl::matmul GetPrimitive(int64_t m, int64_t np, Epilogue epilogue) const {
    const int64_t key = (m * (kPanel + 1) + np) * 4 + static_cast<int64_t>(epilogue);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) return it->second;
    }
    const memory::desc src_md({m, in_}, Dt::f32, memory::dims{in_, 1});
    const memory::desc wei_md({in_, np}, Dt::f32, memory::dims{1, in_});
    const memory::desc bias_md({1, np}, Dt::f32, memory::dims{np, 1});
    const memory::desc dst_md({m, np}, Dt::f32, memory::dims{out_, 1});
    dnnl::matmul prim;
    try {
      prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, wei_md, bias_md, dst_md),
                                                       MatmulEpilogueAttr(epilogue), dev_.dnnl_engine()));
    } catch (const dnnl::error& e) {
      // f32 matmuls exist on every x86-64 oneDNN supports; a refusal is a broken installation.
      std::fprintf(stderr, "iris Linear: oneDNN f32 matmul creation failed (m=%lld, n=%lld): %s\n",
                   static_cast<long long>(m), static_cast<long long>(np), e.what());
      std::abort();
    }
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.emplace(key, prim).first->second;
  }

  CpuDevice& dev_;
  const int64_t out_, in_;
  const RowToBf16Fn to_bf16_;
  std::shared_ptr<void> weight_;  // bf16 [out, in]
  std::shared_ptr<void> bias_;    // f32 [out]
  mutable std::mutex mu_;
  mutable std::unordered_map<int64_t, dnnl::matmul> cache_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Linear>> CreateBf16WeightLinear(CpuDevice& dev, const core::Tensor& weight,
                                                               const core::Tensor* bias, RowToBf16Fn to_bf16) {
  auto linear = std::make_unique<Bf16WeightLinear>(dev, weight.dim(0), weight.dim(1), to_bf16);
  absl::Status status = linear->Init(weight, bias);
  if (!status.ok()) return status;
  return std::unique_ptr<Linear>(std::move(linear));
}

}  // namespace iris::kernels::cpu
