// Micro-benchmarks of the CPU kernels on Qwen2.5-VL vision-tower shapes. Rates are printed next to
// this machine's matmul peak measured by the same binary (MeasureMatmulPeakFlops), and the two
// encoder techniques that live in kernels/ (fused rotary q/k, one-pass q/k/v padding) are timed
// against their unfused paths in the same run.
//
//   kernels_bench [--filter=peak,linear,padding,attention,paged,elementwise,techniques] [--min-time=0.3]
//                 [--tokens=3520]
// GCC 12's AVX-512 headers warn about their own _mm512_undefined_*() (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench/bench_machine.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/cpu/cpu_device.h"
#include "core/isa_region.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "core/bf16.h"
#include "kernels/paged_attention.h"
#include "kernels/qkv_pad.h"
#include "kernels/rotary.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace iris::kernels {
namespace {

Device& dev = DefaultCpuDevice();

double g_min_time = 0.3;

// Best time of one call of f (seconds): a warm-up, then calls until g_min_time has passed (at
// least 3). Best-of, because the machine is shared and noise only ever adds time.
double Time(const std::function<void()>& f) {
  f();
  double best = 1e30, total = 0;
  int n = 0;
  while (n < 3 || total < g_min_time) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, dt);
    total += dt;
    ++n;
  }
  return best;
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

bool Enabled(const std::string& filter, const char* name) {
  return filter.empty() || filter.find(name) != std::string::npos;
}

double g_peak_f32 = 0, g_peak_bf16 = 0;

// 12 independent FMA chains of `iters` steps on one thread (enough to cover latency x ports),
// in zmm (AVX-512 processors only) or ymm; returns their sum, to keep them alive.
IRIS_AVX512_BEGIN
float FmaChainsZmm(int64_t iters) {
  __m512 a0 = _mm512_set1_ps(1.f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
         a9 = a0, a10 = a0, a11 = a0;
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, b, c); a1 = _mm512_fmadd_ps(a1, b, c); a2 = _mm512_fmadd_ps(a2, b, c);
    a3 = _mm512_fmadd_ps(a3, b, c); a4 = _mm512_fmadd_ps(a4, b, c); a5 = _mm512_fmadd_ps(a5, b, c);
    a6 = _mm512_fmadd_ps(a6, b, c); a7 = _mm512_fmadd_ps(a7, b, c); a8 = _mm512_fmadd_ps(a8, b, c);
    a9 = _mm512_fmadd_ps(a9, b, c); a10 = _mm512_fmadd_ps(a10, b, c); a11 = _mm512_fmadd_ps(a11, b, c);
  }
  const __m512 s1 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                  _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  return _mm512_reduce_add_ps(_mm512_add_ps(s1, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
}
IRIS_AVX512_END

float FmaChainsYmm(int64_t iters) {
  __m256 a[12];
  for (auto& x : a) x = _mm256_set1_ps(1.f);
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (auto& x : a) x = _mm256_fmadd_ps(x, b, c);
  }
  float lanes[8], sum = 0;
  for (const auto& x : a) {
    _mm256_storeu_ps(lanes, x);
    for (float l : lanes) sum += l;
  }
  return sum;
}

// The f32 FMA instruction rate of all threads together (FLOP/s), best of 3; zmm where the kernels
// run AVX-512, else ymm.
double MeasureFmaPeak(bool zmm) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const int64_t iters = 20'000'000;
    const auto t0 = std::chrono::steady_clock::now();
    int threads = 1;
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
#pragma omp single
      threads = omp_get_num_threads();
      sink += zmm ? FmaChainsZmm(iters) : FmaChainsYmm(iters);
    }
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sink == 42.f) std::printf(" ");  // keep the loop alive
    best = std::max(best, 12.0 * (zmm ? 32 : 16) * iters * threads / t);
  }
  return best;
}

void BenchPeak() {
  g_peak_f32 = MeasureMatmulPeakFlops(dev, ComputeType::kF32, 2048, 5);
  g_peak_bf16 = MeasureMatmulPeakFlops(dev, ComputeType::kBF16, 2048, 5);
  std::printf("matmul peak (M=N=K=2048, oneDNN):  f32 %8.1f GFLOP/s   bf16 %8.1f GFLOP/s\n", g_peak_f32 * 1e-9,
              g_peak_bf16 * 1e-9);
  const bool zmm = cpu::AsCpu(dev).isa() >= cpu::CpuIsa::kAvx512;
  std::printf("f32 FMA instruction peak (%s):    %8.1f GFLOP/s  (percentages below are of the matmul peak)\n",
              zmm ? "zmm" : "ymm", MeasureFmaPeak(zmm) * 1e-9);
}

void BenchLinear(int64_t tokens) {
  struct Shape {
    int64_t k, n;
    const char* what;
  };
  const Shape shapes[] = {{1280, 3840, "qkv"},       {1280, 1280, "attn proj"}, {1280, 3420, "mlp gate/up"},
                          {1280, 3456, "  ...padded"}, {3420, 1280, "mlp down"},  {3456, 1280, "  ...padded"},
                          {5120, 5120, "merger fc1"}};
  std::printf("\nLinear y = x*W^T + b (weights BF16 as published, reordered at load)\n");
  std::printf("%-12s %6s %6s %6s | %10s %7s | %10s %7s\n", "layer", "M", "K", "N", "f32 GF/s", "%peak", "bf16 GF/s",
              "%peak");
  for (int64_t m : {int64_t{1024}, tokens}) {
    for (const Shape& s : shapes) {
      core::Tensor w = core::Tensor::Empty(core::DType::kBF16, {s.n, s.k});
      std::mt19937 rng(1);
      for (int64_t i = 0; i < s.n * s.k; ++i) w.data<uint16_t>()[i] = static_cast<uint16_t>(0x3C00 + (rng() & 0xFF));
      core::Tensor b = core::Tensor::Zeros(core::DType::kF32, {s.n});
      const std::vector<float> x = Random(m * s.k, 2);
      std::vector<float> y(m * s.n);
      double rate[2];
      int i = 0;
      for (ComputeType ct : {ComputeType::kF32, ComputeType::kBF16}) {
        auto lin = Linear::Create(dev, w, &b, ct);
        if (!lin.ok()) {
          std::printf("create failed: %s\n", lin.status().ToString().c_str());
          return;
        }
        const double t = Time([&] { (*lin)->Forward(x.data(), m, y.data()); });
        rate[i++] = 2.0 * m * s.k * s.n / t;
      }
      std::printf("%-12s %6lld %6lld %6lld | %10.1f %6.0f%% | %10.1f %6.0f%%\n", s.what, static_cast<long long>(m),
                  static_cast<long long>(s.k), static_cast<long long>(s.n), rate[0] * 1e-9,
                  100 * rate[0] / g_peak_f32, rate[1] * 1e-9, 100 * rate[1] / g_peak_bf16);
    }
  }
  // Decode batches: the decoder's shapes (`small`: hidden 1024) at the rows of a decode step, where
  // the weights are read once per call and the rows decide whether it is bound by bytes or FMAs.
  // bf16 compute is oneDNN's bf16 matmul where it has one, else the bf16-weight kernel
  // (kernels/cpu/bf16_weight_linear.cc); against oneDNN's f32 matmul on the same weights widened.
  std::printf("Decode batches (the decoder of `small`), best call; f32 = oneDNN on f32 weights, same run:\n");
  std::printf("%-12s %4s %6s %6s | %9s %9s | %10s %10s | %7s\n", "layer", "M", "K", "N", "f32 ms", "bf16 ms",
              "f32 GF/s", "bf16 GF/s", "f32/bf16");
  const Shape decoder[] = {{1024, 1536, "qkv"}, {1024, 5632, "gate_up"}, {2816, 1024, "down"},
                           {1024, 151936, "lm_head"}};
  for (const Shape& s : decoder) {
    core::Tensor w = core::Tensor::Empty(core::DType::kBF16, {s.n, s.k});
    std::mt19937 rng(3);
    for (int64_t i = 0; i < s.n * s.k; ++i) w.data<uint16_t>()[i] = static_cast<uint16_t>(0x3C00 + (rng() & 0xFF));
    std::unique_ptr<Linear> lin[2];
    for (int i = 0; i < 2; ++i) {
      auto created = Linear::Create(dev, w, nullptr, i == 0 ? ComputeType::kF32 : ComputeType::kBF16);
      if (!created.ok()) {
        std::printf("create failed: %s\n", created.status().ToString().c_str());
        return;
      }
      lin[i] = std::move(*created);
    }
    for (int64_t m : {int64_t{1}, int64_t{8}, int64_t{32}, int64_t{64}}) {
      const std::vector<float> x = Random(m * s.k, 4);
      std::vector<float> y(m * s.n);
      double t[2];
      for (int i = 0; i < 2; ++i) t[i] = Time([&] { lin[i]->Forward(x.data(), m, y.data()); });
      const double flop = 2.0 * m * s.k * s.n;
      std::printf("%-12s %4lld %6lld %6lld | %9.3f %9.3f | %10.1f %10.1f | %6.2fx\n", s.what, static_cast<long long>(m),
                  static_cast<long long>(s.k), static_cast<long long>(s.n), t[0] * 1e3, t[1] * 1e3, flop / t[0] * 1e-9,
                  flop / t[1] * 1e-9, t[0] / t[1]);
    }
  }
  // Decode-like: one row, bandwidth bound (weight bytes / time).
  std::printf("M=1 (decode-like), weight bytes streamed per call:\n");
  for (const Shape& s : {Shape{2048, 11008, "3B mlp up"}, Shape{11008, 2048, "3B mlp down"}}) {
    core::Tensor w = core::Tensor::Empty(core::DType::kBF16, {s.n, s.k});
    for (int64_t i = 0; i < s.n * s.k; ++i) w.data<uint16_t>()[i] = 0x3C00 + (i & 0xFF);
    const std::vector<float> x = Random(s.k, 3);
    std::vector<float> y(s.n);
    for (ComputeType ct : {ComputeType::kF32, ComputeType::kBF16}) {
      auto lin = Linear::Create(dev, w, nullptr, ct);
      const double t = Time([&] { (*lin)->Forward(x.data(), 1, y.data()); });
      const double bytes = static_cast<double>(s.k) * s.n * (ct == ComputeType::kF32 ? 4 : 2);
      std::printf("  %-12s K=%-6lld N=%-6lld %s: %8.3f ms  %6.1f GB/s\n", s.what, static_cast<long long>(s.k),
                  static_cast<long long>(s.n), ct == ComputeType::kF32 ? "f32 " : "bf16", t * 1e3, bytes / t * 1e-9);
    }
  }
}

// Is padding 3420 (the 3B tower's MLP width) to 3456 worth it? Both sizes timed alternately, so
// that load from other processes hits both alike; the ratio compares wall time for the same
// useful work (the padded matmul does 1% more flops).
void BenchPadding(int64_t tokens) {
  std::printf("\nN or K = 3420 vs padded 3456 (alternating runs, best of each; speed-up = t(3420) / t(3456))\n");
  struct Pair {
    bool pad_n;  // pad N (gate/up) or K (down)
  };
  for (ComputeType ct : {ComputeType::kF32, ComputeType::kBF16}) {
    for (int64_t m : {int64_t{1024}, tokens}) {
      for (bool pad_n : {true, false}) {
        double best[2] = {1e30, 1e30};
        std::unique_ptr<Linear> lin[2];
        std::vector<float> x[2], y[2];
        for (int i = 0; i < 2; ++i) {
          const int64_t wide = i == 0 ? 3420 : 3456;
          const int64_t k = pad_n ? 1280 : wide, n = pad_n ? wide : 1280;
          core::Tensor w = core::Tensor::Empty(core::DType::kBF16, {n, k});
          for (int64_t e = 0; e < n * k; ++e) w.data<uint16_t>()[e] = static_cast<uint16_t>(0x3C00 + (e & 0xFF));
          lin[i] = std::move(*Linear::Create(dev, w, nullptr, ct));
          x[i] = Random(m * k, 10);
          y[i].resize(m * n);
          lin[i]->Forward(x[i].data(), m, y[i].data());
        }
        for (int round = 0; round < 8; ++round) {
          for (int i = 0; i < 2; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            lin[i]->Forward(x[i].data(), m, y[i].data());
            best[i] = std::min(best[i], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          }
        }
        const double useful = 2.0 * m * 1280 * 3420;
        std::printf("  %s M=%-5lld %s: 3420 %7.3f ms (%6.1f GF/s)  3456 %7.3f ms (%6.1f GF/s)  speed-up %.2fx\n",
                    ct == ComputeType::kF32 ? "f32 " : "bf16", static_cast<long long>(m), pad_n ? "N" : "K",
                    best[0] * 1e3, useful / best[0] * 1e-9, best[1] * 1e3, useful * 3456 / 3420 / best[1] * 1e-9,
                    best[0] / best[1]);
      }
    }
  }
}

// Attention over `seqs` sequences of `len` tokens, 16 heads x 80, q/k/v inside a qkv buffer.
void BenchAttentionCase(const char* what, int seqs, int len, int heads, int kv_heads, int hd, bool causal,
                        bool bf16 = false) {
  const int64_t rows = static_cast<int64_t>(seqs) * len;
  const int64_t stride = static_cast<int64_t>(heads + 2 * kv_heads) * hd;
  const std::vector<float> qkv = Random(rows * stride, 4);
  std::vector<float> out(rows * heads * hd);
  std::vector<int32_t> cu(seqs + 1);
  for (int s = 0; s <= seqs; ++s) cu[s] = s * len;
  AttentionArgs a;
  a.q = {qkv.data(), stride, hd};
  a.k = {qkv.data() + heads * hd, stride, hd};
  a.v = {qkv.data() + (heads + kv_heads) * hd, stride, hd};
  a.out = out.data();
  a.out_row_stride = static_cast<int64_t>(heads) * hd;
  a.num_heads = heads;
  a.num_kv_heads = kv_heads;
  a.head_dim = hd;
  a.scale = 1.f / std::sqrt(static_cast<float>(hd));
  a.cu_seqlens = cu;
  a.max_seqlen = len;
  a.causal = causal;
  a.bf16 = bf16;
  const double t = Time([&] { VarlenAttention(dev, a); });
  double flops = 4.0 * len * len * hd * heads * seqs;
  if (causal) flops = flops * (len + 1) / (2.0 * len);
  std::printf("%-22s %s %5d x %-5d %2d/%-2d heads x %-3d %s %9.3f ms %8.1f GFLOP/s %5.0f%% of %s matmul peak\n",
              what, bf16 ? "bf16" : "f32 ", seqs, len, heads, kv_heads, hd, causal ? "causal" : "      ", t * 1e3,
              flops / t * 1e-9, 100 * flops / t / (bf16 ? g_peak_bf16 : g_peak_f32), bf16 ? "bf16" : "f32");
}

void BenchAttention(int64_t tokens) {
  std::printf("\nVarlenAttention (flops = 4*n^2*d*heads per sequence, half that when causal)\n");
  const int windows = static_cast<int>(tokens / 64);
  for (bool bf16 : {false, true}) {
    BenchAttentionCase("window (ViT)", 16, 64, 16, 16, 80, false, bf16);
    BenchAttentionCase("window (ViT)", windows, 64, 16, 16, 80, false, bf16);
    BenchAttentionCase("full (ViT)", 1, 1024, 16, 16, 80, false, bf16);
    BenchAttentionCase("full (ViT)", 1, static_cast<int>(tokens), 16, 16, 80, false, bf16);
    BenchAttentionCase("prefill (3B decoder)", 1, 1024, 16, 2, 128, true, bf16);
  }
}

// Paged attention on the 3B decoder's shapes (16 q heads / 2 kv heads x 128, block size 16, block
// tables shuffled over the pool). Decode is bound by reading K and V: it is reported in GB/s next
// to a plain 2-thread streaming read of a buffer of the same size, measured in the same run.
// bf16_pages: the pools hold bf16 (half the bytes); returns the time of one call.
double BenchPagedCase(bool bf16, int batch, int context, int q_len, int heads, int kv_heads, int hd, double stream_bw,
                      bool bf16_pages = false) {
  const int bs = 16;
  const int64_t blocks_per_seq = (context + bs - 1) / bs;
  const int64_t num_blocks = batch * blocks_per_seq;
  const int64_t row = static_cast<int64_t>(kv_heads) * hd;
  // 64-byte aligned pools, as KvCache allocates them.
  const core::DType page_dtype = bf16_pages ? core::DType::kBF16 : core::DType::kF32;
  core::Tensor k = core::Tensor::Empty(page_dtype, {num_blocks * bs * row});
  core::Tensor v = core::Tensor::Empty(page_dtype, {num_blocks * bs * row});
  const std::vector<float> kr = Random(num_blocks * bs * row, 11), vr = Random(num_blocks * bs * row, 12);
  if (bf16_pages) {
    for (size_t i = 0; i < kr.size(); ++i) {
      k.data<uint16_t>()[i] = core::FloatToBf16(kr[i]);
      v.data<uint16_t>()[i] = core::FloatToBf16(vr[i]);
    }
  } else {
    std::copy(kr.begin(), kr.end(), k.data<float>());
    std::copy(vr.begin(), vr.end(), v.data<float>());
  }
  std::vector<int32_t> ids(num_blocks);
  for (int64_t i = 0; i < num_blocks; ++i) ids[i] = static_cast<int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(13));
  PagedMetadataBuilder meta;
  for (int s = 0; s < batch; ++s) {
    meta.Add(std::span<const int32_t>(ids).subspan(s * blocks_per_seq, blocks_per_seq), context,
             static_cast<int64_t>(s) * q_len, q_len);
  }
  const int64_t rows = static_cast<int64_t>(batch) * q_len;
  const std::vector<float> q = Random(rows * heads * hd, 14);
  std::vector<float> out(rows * heads * hd);
  PagedAttentionArgs a;
  a.q = q.data();
  a.q_row_stride = static_cast<int64_t>(heads) * hd;
  a.out = out.data();
  a.out_row_stride = static_cast<int64_t>(heads) * hd;
  a.num_heads = heads;
  a.scale = 1.f / std::sqrt(static_cast<float>(hd));
  a.layer = {k.raw(), v.raw(), num_blocks, bs, kv_heads, hd, page_dtype};
  a.metadata = meta.Build();
  a.bf16 = bf16;
  const double t = Time([&] { PagedAttention(dev, a); });
  const double kv_bytes = 2.0 * batch * context * row * (bf16_pages ? 2 : 4);
  // q row i of a sequence sees context - q_len + i + 1 keys.
  const double pairs = static_cast<double>(batch) * q_len * (context - q_len) + batch * q_len * (q_len + 1) / 2.0;
  const double flops = 4.0 * pairs * hd * heads;
  std::printf("  %s %s pages, batch %2d x context %5d, q_len %4d, %2d/%d heads x %d: %8.3f ms  K+V %6.1f GB/s "
              "(%3.0f%% of stream)  %6.1f GFLOP/s (%3.0f%% of %s peak)\n",
              bf16 ? "bf16" : "f32 ", bf16_pages ? "bf16" : "f32 ", batch, context, q_len, heads, kv_heads, hd, t * 1e3,
              kv_bytes / t * 1e-9,
              100 * kv_bytes / t / stream_bw, flops / t * 1e-9, 100 * flops / t / (bf16 ? g_peak_bf16 : g_peak_f32),
              bf16 ? "bf16" : "f32");
  return t;
}

void BenchPaged() {
  // Streaming read bandwidth of 64 MiB (twice the L3 of the development machine), all threads.
  const int64_t n = int64_t{16} << 20;
  const std::vector<float> buf = Random(n, 15);
  float sink = 0;
  const double t_read = Time([&] {
    float total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (int64_t c = 0; c < n; c += 4096) {
      float acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = c; i < c + 4096; ++i) acc += buf[i];
      total += acc;
    }
    sink += total;
  });
  const double stream_bw = n * 4.0 / t_read;
  std::printf("\nPagedAttention (streaming read of 64 MiB: %.1f GB/s%s)\n", stream_bw * 1e-9, sink == 0.5f ? " " : "");
  for (bool bf16 : {false, true}) {
    BenchPagedCase(bf16, 32, 1024, 1, 16, 2, 128, stream_bw);  // decode (64 MiB of K+V)
    BenchPagedCase(bf16, 1, 4096, 1, 16, 2, 128, stream_bw);   // one long decode
    BenchPagedCase(bf16, 1, 1000, 1000, 8, 2, 128, stream_bw);  // prefill of a 1000-token prompt
    BenchPagedCase(bf16, 1, 1024, 1024, 16, 2, 128, stream_bw);  // as VarlenAttention's 3B prefill case
  }
  // bf16 pages against f32 pages: decodes of the `small` model's shape (8/2 heads x 128), batch 32.
  std::printf("PagedAttention decode, bf16 pages vs f32 pages (small: 8/2 heads x 128, batch 32):\n");
  for (bool bf16 : {false, true}) {
    for (int context : {512, 2048}) {
      const double f32_t = BenchPagedCase(bf16, 32, context, 1, 8, 2, 128, stream_bw, false);
      const double bf16_t = BenchPagedCase(bf16, 32, context, 1, 8, 2, 128, stream_bw, true);
      std::printf("    -> bf16 pages %.2fx the speed of f32 pages\n", f32_t / bf16_t);
    }
  }
}

void BenchElementwise(int64_t tokens) {
  std::printf("\nElement-wise (GB/s = bytes read + written / time)\n");
  const int64_t dim = 1280, inter = 3420;
  const std::vector<float> x = Random(tokens * 2 * inter, 5);
  const std::vector<float> w = Random(dim, 6);
  std::vector<float> y(tokens * 2 * inter);
  auto report = [](const char* what, double t, double bytes) {
    std::printf("  %-34s %8.3f ms %7.1f GB/s\n", what, t * 1e3, bytes / t * 1e-9);
  };
  double t = Time([&] { RmsNorm(dev, x.data(), w.data(), tokens, dim, 1e-6f, y.data()); });
  report("RmsNorm [T, 1280]", t, 8.0 * tokens * dim);
  t = Time([&] { SiluMulRows(dev, x.data(), tokens, inter, y.data()); });
  report("SiluMulRows [T, 2x3420]", t, 12.0 * tokens * inter);
  t = Time([&] { GeluErf(dev, x.data(), tokens * 5120 / 4, y.data()); });
  report("GeluErf [T/4, 5120]", t, 8.0 * tokens * 5120 / 4);
  t = Time([&] { Add(dev, x.data(), x.data() + tokens * dim, tokens * dim, y.data()); });
  report("Add [T, 1280]", t, 12.0 * tokens * dim);
}

void BenchTechniques(int64_t tokens) {
  std::printf("\nEncoder techniques in kernels/ (T=%lld tokens, 16 heads x 80)\n", static_cast<long long>(tokens));
  const int heads = 16, hd = 80;
  const int64_t stride = 3LL * heads * hd;
  std::vector<float> qkv = Random(tokens * stride, 7);
  const std::vector<float> cos = Random(tokens * hd / 2, 8), sin = Random(tokens * hd / 2, 9);
  const double t_fused = Time([&] {
    RotaryQK(dev, {qkv.data(), stride, heads}, {qkv.data() + heads * hd, stride, heads}, tokens, hd, cos.data(), sin.data());
  });
  const double t_sep = Time([&] {
    Rotary(dev, {qkv.data(), stride, heads}, tokens, hd, cos.data(), sin.data());
    Rotary(dev, {qkv.data() + heads * hd, stride, heads}, tokens, hd, cos.data(), sin.data());
  });
  std::printf("  rotary q,k: fused %8.3f ms   separate %8.3f ms   speed-up %.2fx\n", t_fused * 1e3, t_sep * 1e3,
              t_sep / t_fused);
  for (int padded : {80, 96, 128}) {
    std::vector<float> q(tokens * heads * padded), k(q.size()), v(q.size());
    const double t_one = Time([&] { PadQkv(dev, qkv.data(), tokens, heads, hd, padded, q.data(), k.data(), v.data()); });
    const double t_three = Time([&] {
      PadOneOfQkv(dev, qkv.data(), tokens, heads, hd, padded, 0, q.data());
      PadOneOfQkv(dev, qkv.data(), tokens, heads, hd, padded, 1, k.data());
      PadOneOfQkv(dev, qkv.data(), tokens, heads, hd, padded, 2, v.data());
    });
    std::printf("  qkv pad 80->%-3d: one pass %8.3f ms   three passes %8.3f ms   speed-up %.2fx\n", padded,
                t_one * 1e3, t_three * 1e3, t_three / t_one);
  }
}

}  // namespace
}  // namespace iris::kernels

int main(int argc, char** argv) {
  using namespace iris::kernels;
  std::string filter;
  int64_t tokens = 3520;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--filter=", 0) == 0) {
      filter = arg.substr(9);
    } else if (arg.rfind("--min-time=", 0) == 0) {
      g_min_time = std::stod(arg.substr(11));
    } else if (arg.rfind("--tokens=", 0) == 0) {
      tokens = std::stoll(arg.substr(9));
    } else {
      std::fprintf(stderr, "usage: %s [--filter=peak,linear,padding,attention,paged,elementwise,techniques] [--min-time=S] [--tokens=T]\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf("%s\n", dev.Describe().c_str());
  const dnnl_version_t* v = dnnl_version();
  std::printf("machine: %s, %d OpenMP threads, oneDNN %d.%d.%d (cpu isa: %s)\n", iris::bench::CpuName().c_str(),
              omp_get_max_threads(), v->major, v->minor, v->patch,
              dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_bf16  ? "avx512_core_bf16"
              : dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx ? "avx512_core_amx"
              : dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core     ? "avx512_core"
                                                                                 : "other");
  BenchPeak();  // always: the other sections report against it
  if (Enabled(filter, "linear")) BenchLinear(tokens);
  if (Enabled(filter, "padding")) BenchPadding(tokens);
  if (Enabled(filter, "attention")) BenchAttention(tokens);
  if (Enabled(filter, "paged")) BenchPaged();
  if (Enabled(filter, "elementwise")) BenchElementwise(tokens);
  if (Enabled(filter, "techniques")) BenchTechniques(tokens);
  // The machine may be shared: a peak that moved during the run means the ratios above are off.
  const double end_peak = MeasureMatmulPeakFlops(dev, ComputeType::kF32, 2048, 5);
  const double drift = 100.0 * (end_peak - g_peak_f32) / g_peak_f32;
  std::printf("\nf32 matmul peak at the end: %.1f GFLOP/s (%+.0f%%)%s\n", end_peak * 1e-9, drift,
              std::abs(drift) > 10 ? "  -- other load on the machine? rerun" : "");
  return 0;
}
