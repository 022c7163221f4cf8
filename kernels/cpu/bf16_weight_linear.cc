// bf16 compute where oneDNN has no bf16 matmul (oneDNN 2.6 below AVX-512: AVX2-only processors
// such as Zen 3 EPYCs). The weights stay bf16 (rounded once at load), so they cost what they cost
// on an AVX-512 machine; each input row is rounded to bf16 (a bf16 matmul's input). A product of
// two bf16 values is exact in f32, so both paths below compute what a bf16 matmul with f32
// accumulation computes, up to the order of the sums:
//
//  * up to kDirectRows rows (decode): an AVX2 kernel over the bf16 weights, packed at load in
//    blocks of 4 output columns x 8 inputs (one 64-byte line per step: one sequential stream).
//    One or two rows widen each line as they read it (the step is bound by weight bytes, half of
//    f32's); more rows widen 16 output columns (four blocks) once, transposed to [input][16], into
//    an L2 buffer and run over it six rows at a time as outer products (12 accumulators fed by two
//    weight loads and six broadcasts per input: bound by the FMA units, not by loads);
//  * more rows (prefill, the encoder): panels of 256 output columns are widened to f32 into a
//    small buffer and multiplied by oneDNN's f32 matmul, its output written in place in y's columns.
//
// The baseline build is x86-64-v3, so AVX2 and FMA are always there.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

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

constexpr int64_t kDirectRows = 128;  // up to this many rows: the direct kernel (faster than the panels there)
constexpr int64_t kPanel = 256;       // output columns widened per oneDNN call (a multiple of kCols)
constexpr int kCols = 4;              // output columns of a packed block
constexpr int kLanes = 8;             // inputs per packed step (one AVX2 vector)
constexpr int64_t kBlocksPerItem = 16;  // packed blocks (64 columns) per work item of the direct kernel
                                        // (a multiple of the four blocks of a widened panel)

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
  const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// acc[r][c] over the steps of one packed block: R rows of x (row stride ldx, zero-padded to
// steps * kLanes) against the block's bf16 weights, widened as they are read.
template <int R>
inline void BlockRows(const float* x, int64_t ldx, const uint16_t* wblock, int64_t steps, __m256 (&acc)[R][kCols]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t t = 0; t < steps; ++t) {
    __m256 wv[kCols];
    const uint16_t* w = wblock + t * kCols * kLanes;
    for (int c = 0; c < kCols; ++c) wv[c] = WidenBf16(w + c * kLanes);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * ldx + t * kLanes);
      for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
}

constexpr int kPanelCols = 4 * kCols;  // output columns of a widened, transposed panel (two vectors)
constexpr int kPanelRows = 6;          // rows per pass of the outer-product kernel
static_assert(kBlocksPerItem % (kPanelCols / kCols) == 0, "a work item holds whole widened panels");

// Widens packed blocks [b0, b0 + 4) (those at or past `blocks` as zeros) into wide[k * 16 + j]:
// input k, output column b0 * 4 + j. Per step, two 8x8 transposes of the widened columns.
inline void WidenPanelTransposed(const uint16_t* blocks_base, int64_t b0, int64_t blocks, int64_t steps,
                                 float* wide) {
  const int64_t block_elems = steps * kCols * kLanes;
  for (int64_t t = 0; t < steps; ++t) {
    for (int half = 0; half < 2; ++half) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const int64_t b = b0 + half * 2 + i / kCols;
        r[i] = b < blocks ? WidenBf16(blocks_base + b * block_elems + t * kCols * kLanes + (i % kCols) * kLanes)
                          : _mm256_setzero_ps();
      }
      const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
      float* out = wide + t * kLanes * kPanelCols + half * kLanes;
      // Row l of the transpose: input t * 8 + l of the eight columns.
      _mm256_store_ps(out + 0 * kPanelCols, _mm256_permute2f128_ps(s0, s4, 0x20));
      _mm256_store_ps(out + 1 * kPanelCols, _mm256_permute2f128_ps(s1, s5, 0x20));
      _mm256_store_ps(out + 2 * kPanelCols, _mm256_permute2f128_ps(s2, s6, 0x20));
      _mm256_store_ps(out + 3 * kPanelCols, _mm256_permute2f128_ps(s3, s7, 0x20));
      _mm256_store_ps(out + 4 * kPanelCols, _mm256_permute2f128_ps(s0, s4, 0x31));
      _mm256_store_ps(out + 5 * kPanelCols, _mm256_permute2f128_ps(s1, s5, 0x31));
      _mm256_store_ps(out + 6 * kPanelCols, _mm256_permute2f128_ps(s2, s6, 0x31));
      _mm256_store_ps(out + 7 * kPanelCols, _mm256_permute2f128_ps(s3, s7, 0x31));
    }
  }
}

// acc[r] = the 16 columns of R rows of x (row stride ldx) over a widened panel of k_len inputs:
// per input two weight vectors and one broadcast per row. (Keep the loop plain: unrolled, or with
// a branch in it, GCC spills an accumulator, whose store-to-load round trip then bounds the loop
// at half the FMA rate, measured.)
template <int R>
inline void PanelRows(const float* __restrict x, int64_t ldx, const float* __restrict w, int64_t k_len,
                      __m256 (&acc)[R][2]) {
  // Local accumulators, their loops unrolled before GCC decides what lives in registers: otherwise
  // it stores all twelve every input (measured: 31 instead of 80 GFLOP/s on one Zen 3 core).
  __m256 c[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) c[r][0] = c[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < k_len; ++k) {
    const __m256 w0 = _mm256_load_ps(w + k * kPanelCols);
    const __m256 w1 = _mm256_load_ps(w + k * kPanelCols + kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * ldx + k);
      c[r][0] = _mm256_fmadd_ps(xb, w0, c[r][0]);
      c[r][1] = _mm256_fmadd_ps(xb, w1, c[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc[r][0] = c[r][0];
    acc[r][1] = c[r][1];
  }
}

// Stores R rows of a panel's 16 columns (those below n_end) at y[r * ldy + n ...] with the bias
// and the epilogue.
template <int R>
inline void StorePanel(const __m256 (&acc)[R][2], const float* bias, int64_t n, int64_t n_end, float* y, int64_t ldy,
                       Epilogue epilogue) {
  const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n_end - n));
  if (cols == kPanelCols && epilogue != Epilogue::kGeluErf) {  // whole vectors
    const __m256 b0 = _mm256_loadu_ps(bias + n), b1 = _mm256_loadu_ps(bias + n + kLanes);
    for (int r = 0; r < R; ++r) {
      float* out = y + r * ldy + n;
      __m256 v0 = _mm256_add_ps(acc[r][0], b0), v1 = _mm256_add_ps(acc[r][1], b1);
      if (epilogue == Epilogue::kAccumulate) {
        v0 = _mm256_add_ps(_mm256_loadu_ps(out), v0);
        v1 = _mm256_add_ps(_mm256_loadu_ps(out + kLanes), v1);
      }
      _mm256_storeu_ps(out, v0);
      _mm256_storeu_ps(out + kLanes, v1);
    }
    return;
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float v[kPanelCols];
    _mm256_store_ps(v, acc[r][0]);
    _mm256_store_ps(v + kLanes, acc[r][1]);
    float* out = y + r * ldy + n;
    for (int c = 0; c < cols; ++c) out[c] = Store(epilogue, v[c] + bias[n + c], out[c]);
  }
}

template <int R>
inline void PanelPass(const float* x, int64_t ldx, const float* w, int64_t k_len, const float* bias, int64_t n,
                      int64_t n_end, float* y, int64_t ldy, Epilogue epilogue) {
  __m256 acc[R][2];
  PanelRows<R>(x, ldx, w, k_len, acc);
  StorePanel<R>(acc, bias, n, n_end, y, ldy, epilogue);
}

template <int R>
inline void StoreBlock(const __m256 (&acc)[R][kCols], const float* bias, int64_t n, int64_t n_end, float* y,
                       int64_t ldy, Epilogue epilogue) {
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < kCols && n + c < n_end; ++c) {
      float* out = y + r * ldy + n + c;
      *out = Store(epilogue, HorizontalSum(acc[r][c]) + bias[n + c], *out);
    }
  }
}

class Bf16WeightLinear final : public Linear {
 public:
  Bf16WeightLinear(CpuDevice& dev, int64_t out, int64_t in, RowToBf16Fn to_bf16)
      : dev_(dev),
        out_(out),
        in_(in),
        to_bf16_(to_bf16),
        steps_((in + kLanes - 1) / kLanes),
        blocks_((out + kCols - 1) / kCols) {}

  absl::Status Init(const core::Tensor& weight, const core::Tensor* bias) {
    // Packed [block][step][column][lane], zero past the last column and input.
    const size_t packed = static_cast<size_t>(blocks_ * steps_) * kCols * kLanes;
    weight_ = core::AllocateAligned(packed * sizeof(uint16_t));
    uint16_t* w = static_cast<uint16_t*>(weight_.get());
    const core::Tensor f32 = weight.dtype() == core::DType::kBF16 ? core::Tensor() : weight.ToF32();
    const int64_t in = in_, steps = steps_;
#pragma omp parallel num_threads(dev_.threads())
    {
      std::vector<uint16_t> row(static_cast<size_t>(steps * kLanes), 0);
#pragma omp for schedule(static)
      for (int64_t n = 0; n < blocks_ * kCols; ++n) {
        if (n < out_ && weight.dtype() == core::DType::kBF16) {
          std::memcpy(row.data(), weight.data<uint16_t>() + n * in, static_cast<size_t>(in) * sizeof(uint16_t));
        } else if (n < out_) {
          to_bf16_(f32.data<float>() + n * in, in, row.data());
        } else {
          std::fill(row.begin(), row.end(), uint16_t{0});
        }
        uint16_t* block = w + (n / kCols) * steps * kCols * kLanes + (n % kCols) * kLanes;
        for (int64_t t = 0; t < steps; ++t) std::memcpy(block + t * kCols * kLanes, row.data() + t * kLanes, kLanes * 2);
      }
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
    // The input rows rounded to bf16 (kept as f32: both paths' input), each padded with zeros to
    // whole steps so that the direct kernel reads no further than its row.
    const int64_t ldx = steps_ * kLanes;
    float* xr = static_cast<float*>(
        dev_.Scratch(CpuDevice::kSlotBf16Activations, 0, static_cast<size_t>(m * ldx) * sizeof(float)));
    const int64_t in = in_;
#pragma omp parallel for num_threads(dev_.threads()) schedule(static) if (m * in > 32768)
    for (int64_t r = 0; r < m; ++r) RoundRow(x + r * in, in, xr + r * ldx, ldx);
    for (int64_t r = 0; r < m;) {
      if (m - r <= kDirectRows) {
        ForwardDirect(xr + r * ldx, ldx, m - r, y + r * out_, epilogue);
        return;
      }
      // Row counts vary from call to call: primitives for multiples of 64 rows (as CpuLinear),
      // the remainder by the direct kernel.
      const int64_t rows = (m - r) / 64 * 64;
      ForwardPanels(xr + r * ldx, ldx, rows, y + r * out_, epilogue);
      r += rows;
    }
  }

 private:
  void RoundRow(const float* x, int64_t n, float* y, int64_t padded) const {
    constexpr int64_t kChunk = 1024;
    uint16_t tmp[kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t len = std::min(kChunk, n - i);
      to_bf16_(x + i, len, tmp);
      for (int64_t j = 0; j < len; ++j) y[i + j] = core::Bf16ToFloat(tmp[j]);
    }
    std::fill(y + n, y + padded, 0.f);
  }

  const uint16_t* Block(int64_t b) const {
    return static_cast<const uint16_t*>(weight_.get()) + b * steps_ * kCols * kLanes;
  }

  void ForwardDirect(const float* xr, int64_t ldx, int64_t m, float* y, Epilogue epilogue) const {
    const float* bias = static_cast<const float*>(bias_.get());
    const int64_t items = (blocks_ + kBlocksPerItem - 1) / kBlocksPerItem;
    const size_t wide_bytes = static_cast<size_t>(steps_) * kLanes * kPanelCols * sizeof(float);
    const uint16_t* packed = static_cast<const uint16_t*>(weight_.get());
#pragma omp parallel num_threads(dev_.threads()) if (items > 1)
    {
      // More than two rows: 16 columns at a time widened, transposed, into this buffer.
      float* wide = m > 2 ? static_cast<float*>(dev_.Scratch(CpuDevice::kSlotTile, omp_get_thread_num(), wide_bytes))
                          : nullptr;
#pragma omp for schedule(static)
      for (int64_t item = 0; item < items; ++item) {
        const int64_t b1 = std::min(blocks_, (item + 1) * kBlocksPerItem);
        if (m <= 2) {
          for (int64_t b = item * kBlocksPerItem; b < b1; ++b) {
            const int64_t n = b * kCols;
            if (m == 1) {
              __m256 acc[1][kCols];
              BlockRows<1>(xr, ldx, Block(b), steps_, acc);
              StoreBlock<1>(acc, bias, n, out_, y, out_, epilogue);
            } else {
              __m256 acc[2][kCols];
              BlockRows<2>(xr, ldx, Block(b), steps_, acc);
              StoreBlock<2>(acc, bias, n, out_, y, out_, epilogue);
            }
          }
          continue;
        }
        const int64_t k_len = steps_ * kLanes;
        for (int64_t b = item * kBlocksPerItem; b < b1; b += kPanelCols / kCols) {
          WidenPanelTransposed(packed, b, blocks_, steps_, wide);
          const int64_t n = b * kCols;
          for (int64_t r = 0; r < m; r += kPanelRows) {
            const float* xp = xr + r * ldx;
            float* yp = y + r * out_;
            switch (std::min<int64_t>(kPanelRows, m - r)) {
              case 6: PanelPass<6>(xp, ldx, wide, k_len, bias, n, out_, yp, out_, epilogue); break;
              case 5: PanelPass<5>(xp, ldx, wide, k_len, bias, n, out_, yp, out_, epilogue); break;
              case 4: PanelPass<4>(xp, ldx, wide, k_len, bias, n, out_, yp, out_, epilogue); break;
              case 3: PanelPass<3>(xp, ldx, wide, k_len, bias, n, out_, yp, out_, epilogue); break;
              case 2: PanelPass<2>(xp, ldx, wide, k_len, bias, n, out_, yp, out_, epilogue); break;
              default: PanelPass<1>(xp, ldx, wide, k_len, bias, n, out_, yp, out_, epilogue); break;
            }
          }
        }
      }
    }
  }

  void ForwardPanels(const float* xr, int64_t ldx, int64_t m, float* y, Epilogue epilogue) const {
    float* panel = static_cast<float*>(
        dev_.Scratch(CpuDevice::kSlotWeightPanel, 0, static_cast<size_t>(kPanel * in_) * sizeof(float)));
    dnnl::engine& eng = dev_.dnnl_engine();
    dnnl::stream& s = dev_.dnnl_stream();
    const int64_t in = in_, steps = steps_;
    for (int64_t n0 = 0; n0 < out_; n0 += kPanel) {
      const int64_t np = std::min(kPanel, out_ - n0);
      // The panel's rows [np, in] from the packed blocks (n0 is a multiple of kCols).
#pragma omp parallel for num_threads(dev_.threads()) schedule(static) if (np * in > 65536)
      for (int64_t j = 0; j < np; ++j) {
        const uint16_t* src = Block((n0 + j) / kCols) + ((n0 + j) % kCols) * kLanes;
        float* dst = panel + j * in;
        for (int64_t t = 0; t < steps; ++t) {
          const int64_t len = std::min<int64_t>(kLanes, in - t * kLanes);
          for (int64_t l = 0; l < len; ++l) dst[t * kLanes + l] = core::Bf16ToFloat(src[t * kCols * kLanes + l]);
        }
      }
      const dnnl::matmul prim = GetPrimitive(m, ldx, np, epilogue);
      // Weights {K, np} read from the panel's rows ([np, K]: "ba"); dst: y's columns, row stride out_.
      dnnl::memory src_mem({{m, in_}, Dt::f32, memory::dims{ldx, 1}}, eng, const_cast<float*>(xr));
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

  dnnl::matmul GetPrimitive(int64_t m, int64_t ldx, int64_t np, Epilogue epilogue) const {
    // One primitive per team size too (CpuLinear::GetPrimitive says why).
    const int64_t key = ((m * (kPanel + 1) + np) * 4 + static_cast<int64_t>(epilogue)) * 1024 + std::min(dev_.threads(), 1023);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) return it->second;
    }
    const memory::desc src_md({m, in_}, Dt::f32, memory::dims{ldx, 1});
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
  const int64_t steps_;   // packed steps of kLanes inputs (in rounded up)
  const int64_t blocks_;  // packed blocks of kCols output columns (out rounded up)
  std::shared_ptr<void> weight_;  // bf16, packed (see Init)
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
