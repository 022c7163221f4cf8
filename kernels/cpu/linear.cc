// Linear on oneDNN matmul: weights reordered once into the primitive's preferred (blocked)
// layout, one primitive per (row count, epilogue) created on first use and cached.
#include "kernels/cpu/cpu_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/bf16.h"
#include "kernels/cpu/matmul_epilogue.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace iris::kernels::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

class CpuLinear final : public Linear {
 public:
  CpuLinear(CpuDevice& dev, int64_t out, int64_t in, ComputeType compute, RowToBf16Fn to_bf16)
      : dev_(dev), out_(out), in_(in), compute_(compute), to_bf16_(to_bf16) {}

  absl::Status Init(const core::Tensor& weight, const core::Tensor* bias) {
    const Dt dt = compute_ == ComputeType::kBF16 ? Dt::bf16 : Dt::f32;
    // The weight in the compute type, as stored: [out, in] row-major == {K=in, N=out} "ba".
    // Read in place where it already is in the compute type, else converted once here.
    const void* plain = weight.raw();
    core::Tensor f32;                  // the weight upcast, when it is not f32 already
    std::shared_ptr<void> bf16_copy;   // the weight rounded to bf16, when it is not bf16 already
    const core::DType want = compute_ == ComputeType::kBF16 ? core::DType::kBF16 : core::DType::kF32;
    if (weight.dtype() != want) {
      f32 = weight.ToF32();
      plain = f32.raw();
      if (want == core::DType::kBF16) {
        bf16_copy = core::AllocateAligned(static_cast<size_t>(f32.numel()) * 2);
        const float* src = f32.data<float>();
        uint16_t* dst = static_cast<uint16_t*>(bf16_copy.get());
#pragma omp parallel for num_threads(dev_.threads()) schedule(static)
        for (int64_t r = 0; r < out_; ++r) to_bf16_(src + r * in_, in_, dst + r * in_);
        plain = bf16_copy.get();
      }
    }
    const memory::desc plain_md({in_, out_}, dt, Tag::ba);

    // The layout the matmul prefers does not depend on M (checked for M = 1..1024 on oneDNN
    // 2.6.3 brgemm); ask once with a representative M.
    const memory::desc src_md({kProbeM, in_}, dt, Tag::ab);
    const memory::desc any_md({in_, out_}, dt, Tag::any);
    const memory::desc bias_md({1, out_}, Dt::f32, Tag::ab);
    const memory::desc dst_md({kProbeM, out_}, Dt::f32, Tag::ab);
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, any_md, bias_md, dst_md), dev_.dnnl_engine());
      weight_md_ = pd.weights_desc();
      weight_buf_ = core::AllocateAligned(weight_md_.get_size());
      dnnl::memory plain_mem(plain_md, dev_.dnnl_engine(), const_cast<void*>(plain));  // only read
      dnnl::memory packed_mem(weight_md_, dev_.dnnl_engine(), weight_buf_.get());
      dnnl::stream& s = dev_.dnnl_stream();
      dnnl::reorder(plain_mem, packed_mem).execute(s, plain_mem, packed_mem);
      s.wait();
    } catch (const dnnl::error& e) {
      return absl::InternalError(absl::StrCat("Linear: oneDNN setup failed: ", e.what()));
    }

    bias_ = core::AllocateAligned(static_cast<size_t>(out_) * sizeof(float));
    float* b = static_cast<float*>(bias_.get());
    if (bias != nullptr) {
      core::Tensor bf = bias->ToF32();
      std::memcpy(b, bf.raw(), static_cast<size_t>(out_) * sizeof(float));
    } else {
      std::fill(b, b + out_, 0.f);  // a zero bias keeps one primitive shape for both cases
    }
    return absl::OkStatus();
  }

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  ComputeType compute() const override { return compute_; }

  // Row counts vary from call to call (decoder steps); a primitive per exact M would grow without
  // bound. Up to kExactRows every M gets its own; above, M is split into a multiple of kExactRows
  // and a remainder, which bounds the cache.
  void Forward(const float* x, int64_t m, float* y, Epilogue epilogue) const override {
    if (m > kExactRows && m % kExactRows != 0) {
      const int64_t main = m / kExactRows * kExactRows;
      ForwardRows(x, main, y, epilogue);
      ForwardRows(x + main * in_, m - main, y + main * out_, epilogue);
      return;
    }
    ForwardRows(x, m, y, epilogue);
  }

 private:
  static constexpr int64_t kProbeM = 256;
  static constexpr int64_t kExactRows = 64;

  void ForwardRows(const float* x, int64_t m, float* y, Epilogue epilogue) const {
    if (m <= 0) return;
    const dnnl::matmul prim = GetPrimitive(m, epilogue);
    const bool bf16 = compute_ == ComputeType::kBF16;
    const Dt dt = bf16 ? Dt::bf16 : Dt::f32;
    void* src = const_cast<float*>(x);
    if (bf16) {
      uint16_t* xb = static_cast<uint16_t*>(
          dev_.Scratch(CpuDevice::kSlotBf16Activations, 0, static_cast<size_t>(m * in_) * sizeof(uint16_t)));
      const int64_t in = in_;
      // Vectorised f32 -> bf16 over rows (one thread per chunk of rows).
#pragma omp parallel for num_threads(dev_.threads()) schedule(static) if (m * in > 32768)
      for (int64_t r = 0; r < m; ++r) to_bf16_(x + r * in, in, xb + r * in);
      src = xb;
    }
    dnnl::engine& eng = dev_.dnnl_engine();
    dnnl::memory src_mem({{m, in_}, dt, Tag::ab}, eng, src);
    dnnl::memory wei_mem(weight_md_, eng, weight_buf_.get());
    dnnl::memory bias_mem({{1, out_}, Dt::f32, Tag::ab}, eng, bias_.get());
    dnnl::memory dst_mem({{m, out_}, Dt::f32, Tag::ab}, eng, y);
    dnnl::stream& s = dev_.dnnl_stream();
    prim.execute(s, {{DNNL_ARG_SRC, src_mem},
                     {DNNL_ARG_WEIGHTS, wei_mem},
                     {DNNL_ARG_BIAS, bias_mem},
                     {DNNL_ARG_DST, dst_mem}});
    s.wait();
  }

  dnnl::matmul GetPrimitive(int64_t m, Epilogue epilogue) const {
    // oneDNN sizes a primitive's parallel work for the team it is created under (the thread's
    // OpenMP setting), which a ComputeShare changes between ops: one primitive per team size.
    const int64_t key = (m * 4 + static_cast<int64_t>(epilogue)) * 1024 + std::min(dev_.threads(), 1023);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) return it->second;
    }
    // Created outside the lock (primitive creation is the slow part); a racing creator of the
    // same key wastes one creation, the map keeps the first.
    const Dt dt = compute_ == ComputeType::kBF16 ? Dt::bf16 : Dt::f32;
    const memory::desc src_md({m, in_}, dt, Tag::ab);
    const memory::desc bias_md({1, out_}, Dt::f32, Tag::ab);
    const memory::desc dst_md({m, out_}, Dt::f32, Tag::ab);
    dnnl::matmul prim;
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, weight_md_, bias_md, dst_md),
                                      MatmulEpilogueAttr(epilogue), dev_.dnnl_engine());
      prim = dnnl::matmul(pd);
    } catch (const dnnl::error& e) {
      // Shapes were validated at creation; oneDNN refusing them is a broken installation.
      std::fprintf(stderr, "iris Linear: oneDNN matmul creation failed (m=%lld): %s\n",
                   static_cast<long long>(m), e.what());
      std::abort();
    }
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.emplace(key, prim).first->second;
  }

  CpuDevice& dev_;
  const int64_t out_, in_;
  const ComputeType compute_;
  const RowToBf16Fn to_bf16_;
  memory::desc weight_md_;
  std::shared_ptr<void> weight_buf_;
  std::shared_ptr<void> bias_;
  mutable std::mutex mu_;
  mutable std::unordered_map<int64_t, dnnl::matmul> cache_;
};

}  // namespace

bool HasBf16Matmul() {
  static const bool has = [] {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const memory::desc a({8, 32}, Dt::bf16, Tag::ab), b({32, 16}, Dt::bf16, Tag::any), c({8, 16}, Dt::f32, Tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return has;
}

bool OneDnnUsesBrgemm() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core:
    case dnnl::cpu_isa::avx512_core_vnni:
    case dnnl::cpu_isa::avx512_core_bf16:
    case dnnl::cpu_isa::avx512_core_amx:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<std::unique_ptr<Linear>> CreateLinear(CpuDevice& dev, const core::Tensor& weight,
                                                     const core::Tensor* bias, ComputeType compute,
                                                     RowToBf16Fn to_bf16) {
  if (weight.device() != core::Device::kCpu) return absl::InvalidArgumentError("Linear: weight must be on the CPU");
  if (weight.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("Linear: weight must be rank 2 [out, in], got ", weight.ShapeString()));
  }
  const core::DType wd = weight.dtype();
  if (wd != core::DType::kF32 && wd != core::DType::kBF16 && wd != core::DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("Linear: weight dtype must be F32, BF16 or F16, got ", core::DTypeName(wd)));
  }
  const int64_t out = weight.dim(0), in = weight.dim(1);
  if (out <= 0 || in <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Linear: empty weight ", weight.ShapeString()));
  }
  if (bias != nullptr) {
    const core::DType bd = bias->dtype();
    if (bd != core::DType::kF32 && bd != core::DType::kBF16 && bd != core::DType::kF16) {
      return absl::InvalidArgumentError(
          absl::StrCat("Linear: bias dtype must be F32, BF16 or F16, got ", core::DTypeName(bd)));
    }
    if (bias->device() != core::Device::kCpu) return absl::InvalidArgumentError("Linear: bias must be on the CPU");
    if (bias->rank() != 1 || bias->dim(0) != out) {
      return absl::InvalidArgumentError(absl::StrCat("Linear: bias shape ", bias->ShapeString(),
                                                     " does not match weight ", weight.ShapeString()));
    }
  }
  // oneDNN 2.6 has bf16 matmuls from AVX-512 on only; below, bf16 weights on the f32 matmul.
  if (compute == ComputeType::kBF16 && !HasBf16Matmul()) return CreateBf16WeightLinear(dev, weight, bias, to_bf16);
  auto linear = std::make_unique<CpuLinear>(dev, out, in, compute, to_bf16);
  absl::Status status = linear->Init(weight, bias);
  if (!status.ok()) return status;
  return std::unique_ptr<Linear>(std::move(linear));
}

double MeasureMatmulPeakFlops(CpuDevice& dev, ComputeType compute, int64_t size, int repeats) {
  const int64_t n = size;
  const Dt dt = compute == ComputeType::kBF16 ? Dt::bf16 : Dt::f32;
  dnnl::engine& eng = dev.dnnl_engine();
  dnnl::stream& s = dev.dnnl_stream();
  const memory::desc src_md({n, n}, dt, Tag::ab);
  const memory::desc wei_any({n, n}, dt, Tag::any);
  const memory::desc dst_md({n, n}, Dt::f32, Tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, wei_any, dst_md), eng);
  } catch (const dnnl::error&) {
    // No bf16 matmul here (below AVX-512): bf16 compute runs on the f32 matmul, whose peak it is.
    if (compute == ComputeType::kBF16) return MeasureMatmulPeakFlops(dev, ComputeType::kF32, size, repeats);
    return 0;
  }
  dnnl::matmul prim(pd);
  const size_t elem = dt == Dt::bf16 ? 2 : 4;
  auto src = core::AllocateAligned(static_cast<size_t>(n * n) * elem);
  auto wei = core::AllocateAligned(pd.weights_desc().get_size());
  auto dst = core::AllocateAligned(static_cast<size_t>(n * n) * 4);
  // Small random values: the rate must not depend on denormals or zeros.
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t i = 0; i < n * n; ++i) {
    const float v = dist(rng);
    if (elem == 2) {
      static_cast<uint16_t*>(src.get())[i] = core::FloatToBf16(v);
    } else {
      static_cast<float*>(src.get())[i] = v;
    }
  }
  std::memset(wei.get(), 0, pd.weights_desc().get_size());
  {  // Fill the packed weight with small nonzero values of the right type (layout is irrelevant).
    const size_t count = pd.weights_desc().get_size() / elem;
    for (size_t i = 0; i < count; ++i) {
      const float v = dist(rng);
      if (elem == 2) {
        static_cast<uint16_t*>(wei.get())[i] = core::FloatToBf16(v);
      } else {
        static_cast<float*>(wei.get())[i] = v;
      }
    }
  }
  dnnl::memory src_mem(src_md, eng, src.get()), wei_mem(pd.weights_desc(), eng, wei.get()),
      dst_mem(dst_md, eng, dst.get());
  auto run = [&] {
    prim.execute(s, {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, wei_mem}, {DNNL_ARG_DST, dst_mem}});
    s.wait();
  };
  run();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double dt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, dt_s);
  }
  return 2.0 * static_cast<double>(n) * n * n / best;
}

}  // namespace iris::kernels::cpu
