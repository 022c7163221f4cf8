// Varlen attention inputs and references shared by the suites that run iris's flash kernels: on
// the SIMT harness (simt_attention_test) and on a GPU (cuda_attention_test).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/device.h"
#include "tests/test_util.h"

namespace iris::testing {

// Packed sequences of the given lengths with q, k, v interleaved per row as a fused qkv
// projection leaves them ([rows][q heads | kv heads | kv heads] x head_stride, head_stride >=
// head_dim), random normal values; out rows of num_heads x head_dim.
struct VarlenCase {
  VarlenCase(std::vector<int> lengths, int heads_, int kv_heads_, int head_dim_, int head_stride_, bool causal_)
      : heads(heads_), kv_heads(kv_heads_), head_dim(head_dim_), head_stride(head_stride_), causal(causal_) {
    cu.push_back(0);
    for (int n : lengths) {
      cu.push_back(cu.back() + n);
      max_seqlen = std::max(max_seqlen, n);
    }
    rows = cu.back();
    qkv = RandomNormal(static_cast<int64_t>(rows) * row_stride(), 31 + head_dim + heads);
  }
  int64_t row_stride() const { return static_cast<int64_t>(heads + 2 * kv_heads) * head_stride; }
  int64_t out_stride() const { return static_cast<int64_t>(heads) * head_dim; }
  float scale() const { return 1.f / std::sqrt(static_cast<float>(head_dim)); }

  // The args over buffers at these addresses (host for the CPU kernel, device for a GPU).
  kernels::AttentionArgs Args(const float* qkv_data, const int32_t* cu_data, float* out) const {
    kernels::AttentionArgs a;
    a.q = {qkv_data, row_stride(), head_stride};
    a.k = {qkv_data + static_cast<int64_t>(heads) * head_stride, row_stride(), head_stride};
    a.v = {qkv_data + static_cast<int64_t>(heads + kv_heads) * head_stride, row_stride(), head_stride};
    a.out = out;
    a.out_row_stride = out_stride();
    a.num_heads = heads;
    a.num_kv_heads = kv_heads;
    a.head_dim = head_dim;
    a.scale = scale();
    a.cu_seqlens = std::span<const int32_t>(cu_data, cu.size());
    a.max_seqlen = max_seqlen;
    a.causal = causal;
    return a;
  }

  // The CPU kernel's result (f32 products), rows outside [q_begin, q_end) left NaN.
  std::vector<float> CpuReference(int64_t q_begin = 0, int64_t q_end = -1) const {
    std::vector<float> out(static_cast<size_t>(rows) * out_stride(), NAN);
    kernels::AttentionArgs a = Args(qkv.data(), cu.data(), out.data());
    a.q_begin = q_begin;
    a.q_end = q_end;
    kernels::VarlenAttention(kernels::DefaultCpuDevice(), a);
    return out;
  }

  // The same case with q, k and v rounded to bf16 (the bf16 compute mode's inputs): its
  // DoubleReference is the bf16 kernels' definition, up to the rounding of the probabilities.
  VarlenCase RoundedToBf16() const {
    VarlenCase c = *this;
    for (float& x : c.qkv) x = core::Bf16ToFloat(core::FloatToBf16(x));
    return c;
  }

  // Softmax(q·kᵀ·scale)·v in double, straight from the definition. With `abs_mean` given, also
  // Σ p_j·|v_j| / Σ p_j per output element: the scale of what rounding the probabilities moves.
  std::vector<float> DoubleReference(std::vector<float>* abs_mean = nullptr) const {
    std::vector<float> out(static_cast<size_t>(rows) * out_stride());
    if (abs_mean != nullptr) abs_mean->assign(out.size(), 0.f);
    const int group = heads / kv_heads;
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
      for (int r = cu[s]; r < cu[s + 1]; ++r) {
        for (int h = 0; h < heads; ++h) {
          const int g = h / group;
          const float* q = qkv.data() + r * row_stride() + static_cast<int64_t>(h) * head_stride;
          const int last = causal ? r : cu[s + 1] - 1;
          std::vector<double> w;
          double big = -INFINITY;
          for (int j = cu[s]; j <= last; ++j) {
            const float* k = qkv.data() + j * row_stride() + static_cast<int64_t>(heads + g) * head_stride;
            double dot = 0;
            for (int d = 0; d < head_dim; ++d) dot += double{q[d]} * k[d];
            w.push_back(dot * scale());
            big = std::max(big, w.back());
          }
          double total = 0;
          for (double& x : w) total += (x = std::exp(x - big));
          for (int d = 0; d < head_dim; ++d) {
            double o = 0, a = 0;
            for (int j = cu[s]; j <= last; ++j) {
              const double v = qkv[j * row_stride() + static_cast<int64_t>(heads + kv_heads + g) * head_stride + d];
              o += w[j - cu[s]] * v;
              a += w[j - cu[s]] * std::fabs(v);
            }
            const int64_t at = r * out_stride() + static_cast<int64_t>(h) * head_dim + d;
            out[at] = static_cast<float>(o / total);
            if (abs_mean != nullptr) (*abs_mean)[at] = static_cast<float>(a / total);
          }
        }
      }
    }
    return out;
  }

  int heads, kv_heads, head_dim, head_stride;
  bool causal;
  std::vector<int32_t> cu;
  int max_seqlen = 0;
  int rows = 0;
  std::vector<float> qkv;
};

// A tensor-core kernel's result (the flash kernel's bf16 mode, cuDNN's SDPA) against the
// definition on the same bf16-rounded inputs. Such kernels round each probability to bf16 before
// P·V: off by at most u = 2^-8 of itself (round to nearest, 8 significant bits), whichever running
// maximum it was taken against, and the normaliser by as much again. So an output element may be off
// by 2u·Σ p_j|v_j|/Σ p_j, plus f32 summation order (1e-4 relative). The bound is per element: a
// causal row with two keys and a peaked softmax gets no averaging of the roundings (the first
// GPU run met 0.53% there, within its bound of at least 2u·|want| = 0.84%, bit-equal to the SIMT
// harness's result).
inline void ExpectWithinBf16ProbabilityRounding(const std::vector<float>& got, const VarlenCase& c, const char* what) {
  std::vector<float> abs_mean;
  const std::vector<float> want = c.RoundedToBf16().DoubleReference(&abs_mean);
  ASSERT_EQ(got.size(), want.size()) << what;
  constexpr double kTwoU = 1.0 / 128;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = kTwoU * abs_mean[i] + 1e-4 * std::max(1.0, std::fabs(double{want[i]}));
    ASSERT_NEAR(got[i], want[i], bound) << what << " at " << i << " (sum of p|v| / sum of p " << abs_mean[i] << ")";
  }
}

// A case's shape, for the suites' tables: packed sequence lengths, q heads, kv heads, head dim,
// head stride, causal.
struct VarlenShape {
  std::vector<int> lengths;
  int heads, kv_heads, head_dim, head_stride;
  bool causal;
  VarlenCase Case() const { return VarlenCase(lengths, heads, kv_heads, head_dim, head_stride, causal); }
};

// `piece`, computed for rows [q_begin, q_end) only into a NaN-filled output, equals `whole` bit for
// bit on those rows (the same arithmetic) and left every other row unwritten.
inline void ExpectRowsOfWholeAndRestUntouched(const VarlenCase& c, const std::vector<float>& whole,
                                              const std::vector<float>& piece, int64_t q_begin, int64_t q_end) {
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.out_stride(); ++i) {
      const float v = piece[r * c.out_stride() + i];
      if (r >= q_begin && r < q_end) {
        ASSERT_EQ(v, whole[r * c.out_stride() + i]) << "row " << r;
      } else {
        ASSERT_TRUE(std::isnan(v)) << "row " << r << " outside the range was written";
      }
    }
  }
}

}  // namespace iris::testing
