// Cases, inputs and the double reference for iris's Hopper GEMM (kernels/cuda/hopper_gemm.cuh),
// shared by its SIMT suite (simt_hopper_gemm_test: the kernel's code on the CPU, the copy engine,
// barriers and MMAs twinned) and its GPU tests (cuda_linear_test_hopper_gemm.cc, in cuda_linear_test: the real instructions).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/bf16.h"
#include "kernels/cuda/hopper_gemm.h"
#include "tests/test_util.h"

namespace iris::testing {

struct HopperCase {
  kernels::cuda::HopperEpilogue epilogue;
  int64_t m, n, k;  // n: y's columns (kSwiGluBf16: B has 2n rows)
  int64_t pad;      // extra values at the end of every row of A, B and y (strides stay multiples of 8)
  bool bias, accumulate;
  bool odd_ldy = false;  // one more value in y's rows: column pairs are then stored one by one
  int rotary_heads = 0;  // kBf16Rotary: the heads (of kHopperRotaryHeadDim) that turn
  int row_parts = 0;     // > 0: A holds a handed-on RMSNorm's rows, the row factor from this many partials
  bool norm_out = false;  // kF32: hands the next RMSNorm's input on (bf16 rows and partial sums)
  std::string Name() const {
    return absl::StrCat("epilogue ", static_cast<int>(epilogue), " m ", m, " n ", n, " k ", k, bias ? " bias" : "",
                        accumulate ? " accumulate" : "", rotary_heads > 0 ? " rotary heads " : "",
                        rotary_heads > 0 ? absl::StrCat(rotary_heads) : "",
                        row_parts > 0 ? absl::StrCat(" row factor of ", row_parts, " partials") : "",
                        norm_out ? " norm out" : "");
  }
};

// Odd sizes: ragged last row and column blocks, K not a whole 64-wide slice, more K slices than
// the kernel's 4 stages (its ring goes round, so the hand-back barriers' phases are exercised),
// SwiGLU outputs whose last block reads up's rows in its gate half and rows past B in its up half.
inline std::vector<HopperCase> HopperCases() {
  using E = kernels::cuda::HopperEpilogue;
  return {
      {E::kF32, 130, 136, 328, 8, false, false},  // 6 K slices: the ring goes round
      {E::kF32, 70, 200, 72, 0, true, true},      // bias + the rows already in y
      {E::kBf16, 129, 130, 200, 16, true, false},
      {E::kSwiGluBf16, 100, 100, 136, 8, true, false},
      {E::kSwiGluBf16, 16, 64, 320, 0, false, false},  // one block, 5 K slices
      {E::kBf16, 40, 77, 72, 0, true, false},          // an odd n: the last pair is half in y
      {E::kF32, 33, 75, 64, 0, true, true, true},      // an odd row stride: no pair stores
      // 16 K slices: a ping-pong warpgroup's first slices are rounds of the ring past the other's
      // (its waits must come after the other's, or the barrier's parity would name old phases).
      {E::kF32, 200, 136, 1000, 0, true, false},
  };
}

// The qkv projection with the rotary in its epilogue (tiles of three 80-wide heads): heads that
// turn and heads that do not in one tile, a last tile partly past n (its heads past n neither
// turn nor land), ragged row blocks, and an odd row stride (no pair stores).
inline std::vector<HopperCase> HopperRotaryCases() {
  using E = kernels::cuda::HopperEpilogue;
  return {
      {E::kBf16Rotary, 130, 480, 136, 8, true, false, false, 4},  // q 2, k 2, v 2 heads
      {E::kBf16Rotary, 70, 400, 72, 0, false, false, false, 3},   // the second tile: 2 of its 3 heads
      {E::kBf16Rotary, 33, 240, 64, 0, true, false, true, 3},     // every head turns, odd ldy
  };
}

// The RMSNorm hand-off between two GEMMs (HopperGemm::norm_rows, ::row_partials): f32 rows
// that hand the next norm's input on — ragged row and column blocks (the last tile's partial sums
// over fewer columns), an odd n (a last column alone), with and without the residual add — and
// every epilogue reading a handed-on norm's rows, the row factor from 1 to 10 partials (the
// rotary's scaled before its turn).
inline std::vector<HopperCase> HopperNormCases() {
  using E = kernels::cuda::HopperEpilogue;
  return {
      {E::kF32, 130, 300, 136, 8, true, true, false, 0, 0, true},   // 3 or 2 column blocks, the last partial
      {E::kF32, 70, 75, 72, 0, false, false, false, 0, 0, true},    // an odd n: its last column alone
      {E::kBf16, 129, 130, 200, 16, true, false, false, 0, 3},
      {E::kSwiGluBf16, 100, 100, 136, 8, true, false, false, 0, 10},
      {E::kF32, 33, 75, 64, 0, true, true, true, 0, 1},
      {E::kBf16Rotary, 130, 480, 136, 8, true, false, false, 4, 5},
  };
}

// The tile widths a case runs at: the rotary epilogue's own, or both of the others'.
inline std::vector<int> HopperTileWidths(const HopperCase& c) {
  if (c.epilogue == kernels::cuda::HopperEpilogue::kBf16Rotary) return {kernels::cuda::kHopperRotaryTileN};
  return {128, 256};
}

inline int64_t RoundUp8(int64_t v) { return (v + 7) / 8 * 8; }

// A case's inputs (bf16 bits of normal values), its strides, and the expected y.
struct HopperData {
  int64_t lda, ldb, ldy, b_rows;
  std::vector<uint16_t> a, b;
  std::vector<float> bias;  // empty: none
  std::vector<float> y0;    // y before the call (f32 accumulate), as floats
  std::vector<double> want;  // [m][n]
  std::vector<double> bound;  // |got - want| allowed, per element
  std::vector<float> cos, sin;  // kBf16Rotary: [m][40], the tables of angles drawn at random
  // row_parts: the handed-on norm's partial sums [m][row_parts], its width and eps; each row's
  // product is scaled by 1 / sqrt(sum / width + eps) before the bias.
  std::vector<float> row_partials;  // (stride row_parts + 2)
  int norm_width = 0;
  float norm_eps = 0.f;
  // norm_out: the next norm's weight [n].
  std::vector<float> norm_weight;
};

inline HopperData MakeHopperData(const HopperCase& c, uint32_t seed) {
  using E = kernels::cuda::HopperEpilogue;
  HopperData d;
  d.lda = RoundUp8(c.k) + c.pad;
  d.ldb = RoundUp8(c.k) + c.pad;
  d.ldy = RoundUp8(c.n) + c.pad + (c.odd_ldy ? 1 : 0);
  d.b_rows = c.epilogue == E::kSwiGluBf16 ? 2 * c.n : c.n;
  const auto bf16 = [](const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = core::FloatToBf16(v[i]);
    return out;
  };
  d.a = bf16(RandomNormal(c.m * d.lda, seed, 1.f));
  d.b = bf16(RandomNormal(d.b_rows * d.ldb, seed + 1, 0.2f));
  if (c.bias) d.bias = RandomNormal(d.b_rows, seed + 2, 0.5f);
  if (c.accumulate) d.y0 = RandomNormal(c.m * d.ldy, seed + 3, 1.f);
  d.want.resize(c.m * c.n);
  d.bound.resize(c.m * c.n);
  constexpr int kHalf = kernels::cuda::kHopperRotaryHeadDim / 2;
  if (c.epilogue == E::kBf16Rotary) {
    const std::vector<float> angle = RandomNormal(c.m * kHalf, seed + 4, 3.f);
    for (const float t : angle) {
      d.cos.push_back(std::cos(t));
      d.sin.push_back(std::sin(t));
    }
  }
  // A handed-on norm's row factors (1 where none): sums of squares of a width-wide row of values
  // around 1, split into row_parts partials at random.
  std::vector<double> factor(c.m, 1.0);
  if (c.row_parts > 0) {
    d.norm_width = 1280;
    d.norm_eps = 1e-6f;
    const std::vector<float> share = RandomNormal(c.m * c.row_parts, seed + 5, 1.f);
    // Rows of row_parts + 2 (HopperGemmOf's stride), the 2 past them huge: read, they would show.
    d.row_partials.assign(c.m * (c.row_parts + 2), 1e30f);
    for (int64_t r = 0; r < c.m; ++r) {
      float sum = 0.f;  // in the kernel's order
      for (int i = 0; i < c.row_parts; ++i) {
        const float part = d.norm_width * (0.2f + std::fabs(share[r * c.row_parts + i])) / c.row_parts;
        d.row_partials[r * (c.row_parts + 2) + i] = part;
        sum += part;
      }
      factor[r] = 1.0 / std::sqrt(double(sum) / d.norm_width + d.norm_eps);
    }
  }
  if (c.norm_out) d.norm_weight = RandomNormal(c.n, seed + 6, 1.f);
  const auto dot = [&](int64_t r, int64_t brow, double* mag) {
    double s = 0, a = 0;
    for (int64_t i = 0; i < c.k; ++i) {
      const double p = double(core::Bf16ToFloat(d.a[r * d.lda + i])) * core::Bf16ToFloat(d.b[brow * d.ldb + i]);
      s += p;
      a += std::fabs(p);
    }
    // Scaled by the row's factor (a float: about an ulp of its own).
    *mag = a * factor[r];
    return s * factor[r];
  };
  // f32 sums of k products: within about k ulps of the magnitudes' sum (twice the worst case).
  const double sum_err = 5e-7 * static_cast<double>(c.k);
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t col = 0; col < c.n; ++col) {
      double mag = 0;
      double v = dot(r, col, &mag);
      double err = sum_err * mag + (c.row_parts > 0 ? 2e-7 * mag : 0.0);
      if (c.bias) v += d.bias[col];
      if (c.epilogue == E::kSwiGluBf16) {
        double umag = 0;
        double u = dot(r, c.n + col, &umag);
        if (c.bias) u += d.bias[c.n + col];
        const double silu = v / (1 + std::exp(-v));
        // silu's slope is at most ~1.1: the gate's error passes through scaled by |u|.
        const double uerr = sum_err * umag + (c.row_parts > 0 ? 2e-7 * umag : 0.0);
        err = 1.1 * err * std::fabs(u) + std::fabs(silu) * uerr + 1e-6 * std::fabs(silu * u);
        v = silu * u;
      }
      if (c.accumulate) v += d.y0[r * d.ldy + col];
      d.want[r * c.n + col] = v;
      d.bound[r * c.n + col] = err;
    }
  }
  if (c.epilogue == E::kBf16Rotary) {
    // The rotate-half rotary on the heads that turn: each output mixes its value and its partner,
    // so it may carry both one's errors (|cos|, |sin| <= 1).
    const int hd = kernels::cuda::kHopperRotaryHeadDim;
    for (int64_t r = 0; r < c.m; ++r) {
      for (int h = 0; h < c.rotary_heads; ++h) {
        for (int i = 0; i < kHalf; ++i) {
          const int64_t c1 = r * c.n + h * hd + i, c2 = c1 + kHalf;
          const double x1 = d.want[c1], x2 = d.want[c2];
          const double co = d.cos[r * kHalf + i], si = d.sin[r * kHalf + i];
          d.want[c1] = x1 * co - x2 * si;
          d.want[c2] = x2 * co + x1 * si;
          const double err = d.bound[c1] + d.bound[c2] + 1e-6 * (std::fabs(x1) + std::fabs(x2));
          d.bound[c1] = d.bound[c2] = err;
        }
      }
    }
  }
  for (int64_t i = 0; i < c.m * c.n; ++i) {
    // One bf16 rounding (half an ulp is 2^-9) where y is bf16.
    if (c.epilogue != E::kF32) d.bound[i] += std::fabs(d.want[i]) / 256;
    d.bound[i] += 1e-6;
  }
  return d;
}

// The call for a case on its host data (a GPU test points a, b, bias and y at its copies), and y
// before it: f32 rows holding y0 where the case accumulates, pad_value elsewhere and past n; or
// bf16 rows of pad_value.
inline kernels::cuda::HopperGemm HopperGemmOf(const HopperCase& c, const HopperData& d, int tile_n) {
  kernels::cuda::HopperGemm g;
  g.epilogue = c.epilogue;
  g.a = d.a.data();
  g.lda = d.lda;
  g.b = d.b.data();
  g.ldb = d.ldb;
  g.m = c.m;
  g.n = c.n;
  g.k = c.k;
  g.bias = c.bias ? d.bias.data() : nullptr;
  g.ldy = d.ldy;
  g.accumulate = c.accumulate;
  g.tile_n = tile_n;
  if (c.epilogue == kernels::cuda::HopperEpilogue::kBf16Rotary) {
    g.head_dim = kernels::cuda::kHopperRotaryHeadDim;
    g.rotary_heads = c.rotary_heads;
    g.cos = d.cos.data();
    g.sin = d.sin.data();
  }
  if (c.row_parts > 0) {
    g.row_partials = d.row_partials.data();
    g.row_parts = c.row_parts;
    g.partials_ld = c.row_parts + 2;  // a stride wider than the partials
    g.norm_width = d.norm_width;
    g.norm_eps = d.norm_eps;
  }
  return g;
}

// A norm_out case's outputs before the call: bf16 rows of pad_value (stride ldy) and partial sums
// of NaN ([m][column blocks of tile_n]): every one the kernel should write must be written.
struct HopperNormOut {
  std::vector<uint16_t> rows;
  std::vector<float> partials;
  int64_t parts = 0, ld = 0;
};
inline HopperNormOut HopperStartingNormOut(const HopperCase& c, const HopperData& d, int tile_n, float pad_value) {
  HopperNormOut o;
  o.parts = (c.n + tile_n - 1) / tile_n;
  o.ld = o.parts + 1;  // a stride wider than the partials: the one past them stays NaN
  o.rows.assign(c.m * d.ldy, core::FloatToBf16(pad_value));
  o.partials.assign(c.m * o.ld, std::nanf(""));
  return o;
}
// g's norm output into o's buffers (a GPU test points them at its copies) and the next norm's
// weight.
inline void HopperAttachNormOut(const HopperData& d, HopperNormOut& o, kernels::cuda::HopperGemm& g) {
  g.norm_rows = o.rows.data();
  g.norm_ld = d.ldy;
  g.norm_weight = d.norm_weight.data();
  g.norm_partials = o.partials.data();
  g.partials_ld = o.ld;
}

// The handed-on norm's input against the y the kernel wrote (y_f32, already checked against the
// reference): each bf16 value is that y times the weight, rounded (a float product, then one
// rounding: half a bf16 ulp and a float ulp); each partial the sum of the squares of y over its
// tile's columns (a float sum of up to 256 terms in the kernel's order: 1e-6 of it), none past
// n; the rows' padding untouched.
inline void ExpectHopperNormOut(const HopperCase& c, const HopperData& d, const std::vector<float>& y_f32,
                                const HopperNormOut& o, int tile_n, float pad_value) {
  int bad = 0;
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t col = 0; col < d.ldy; ++col) {
      const double got = core::Bf16ToFloat(o.rows[r * d.ldy + col]);
      if (col >= c.n) {
        if (got != core::Bf16ToFloat(core::FloatToBf16(pad_value)) && ++bad <= 5) {
          ADD_FAILURE() << c.Name() << ": norm rows written past n at row " << r << " col " << col;
        }
        continue;
      }
      const double want = double(y_f32[r * d.ldy + col]) * d.norm_weight[col];
      if (!(std::fabs(got - want) <= std::fabs(want) / 256 + 1e-30) && ++bad <= 5) {
        ADD_FAILURE() << c.Name() << ": norm row " << r << " col " << col << " = " << got << ", want " << want;
      }
    }
    for (int64_t j = 0; j < o.parts; ++j) {
      double want = 0;
      for (int64_t col = j * tile_n; col < std::min<int64_t>(c.n, (j + 1) * tile_n); ++col) {
        want += double(y_f32[r * d.ldy + col]) * y_f32[r * d.ldy + col];
      }
      const double got = o.partials[r * o.ld + j];
      if (!(std::fabs(got - want) <= 1e-6 * want + 1e-30) && ++bad <= 5) {
        ADD_FAILURE() << c.Name() << ": partial sum of row " << r << " tile column " << j << " = " << got << ", want "
                      << want;
      }
    }
    if (!std::isnan(o.partials[r * o.ld + o.parts]) && ++bad <= 5) {
      ADD_FAILURE() << c.Name() << ": a partial sum written past the tile columns at row " << r;
    }
  }
  EXPECT_EQ(bad, 0) << c.Name();
}
inline std::vector<float> HopperStartingF32(const HopperCase& c, const HopperData& d, float pad_value) {
  std::vector<float> y = c.accumulate ? d.y0 : std::vector<float>(c.m * d.ldy, pad_value);
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t col = c.n; col < d.ldy; ++col) y[r * d.ldy + col] = pad_value;
  }
  return y;
}
inline std::vector<uint16_t> HopperStartingBf16(const HopperCase& c, const HopperData& d, float pad_value) {
  return std::vector<uint16_t>(c.m * d.ldy, core::FloatToBf16(pad_value));
}

// y (f32 or bf16 rows of stride ldy, as the case's epilogue writes them) against the reference;
// the values past n in each row must be untouched (pad_value).
inline void ExpectHopperResult(const HopperCase& c, const HopperData& d, const std::vector<float>& y_f32,
                               const std::vector<uint16_t>& y_bf16, float pad_value) {
  using E = kernels::cuda::HopperEpilogue;
  int bad = 0;
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t col = 0; col < d.ldy; ++col) {
      const double got = c.epilogue == E::kF32 ? y_f32[r * d.ldy + col] : core::Bf16ToFloat(y_bf16[r * d.ldy + col]);
      if (col >= c.n) {
        const double untouched =
            c.epilogue == E::kF32 ? pad_value : core::Bf16ToFloat(core::FloatToBf16(pad_value));
        if (got != untouched && ++bad <= 5) ADD_FAILURE() << c.Name() << ": wrote past n at row " << r << " col " << col;
        continue;
      }
      const double want = d.want[r * c.n + col];
      if (!(std::fabs(got - want) <= d.bound[r * c.n + col]) && ++bad <= 5) {
        ADD_FAILURE() << c.Name() << ": y[" << r << "][" << col << "] = " << got << ", want " << want << " +- "
                      << d.bound[r * c.n + col];
      }
    }
  }
  EXPECT_EQ(bad, 0) << c.Name();
}

// The copy-engine probe's 8192 bytes against the box laid out as the GEMM assumes (128-byte
// swizzle, zeros past the matrix); on a mismatch, also whether they match the box unswizzled (a
// first run's diagnosis).
inline void ExpectSwizzledBox(const std::vector<uint16_t>& m, int64_t rows, int64_t cols, int64_t ld, int x, int y,
                              const std::vector<unsigned char>& got, int (*offset)(int, int)) {
  ASSERT_EQ(got.size(), 8192u);
  int bad = 0, bad_plain = 0;
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 64; ++c) {
      const int64_t gy = y + r, gx = x + c;
      const uint16_t want = gy < rows && gx < cols ? m[gy * ld + gx] : 0;
      uint16_t at, plain;
      std::memcpy(&at, got.data() + offset(r, 2 * c), 2);
      std::memcpy(&plain, got.data() + r * 128 + 2 * c, 2);
      bad_plain += plain != want;
      if (at != want && ++bad <= 5) {
        ADD_FAILURE() << "box (" << x << ", " << y << ") row " << r << " value " << c << ": " << at << ", want " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0) << (bad_plain == 0 ? "the box landed unswizzled" : "the box is in neither layout");
}

// The warpgroup-MMA probe's d [64][128] against A[:, K step kk] · B[:, K step kk]ᵀ.
inline void ExpectWgmmaProbe(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, int kk,
                             const std::vector<float>& d) {
  ASSERT_EQ(d.size(), 64u * 128u);
  int bad = 0;
  for (int r = 0; r < 64; ++r) {
    for (int n = 0; n < 128; ++n) {
      double want = 0, mag = 0;
      for (int k = 16 * kk; k < 16 * kk + 16; ++k) {
        const double p = double(core::Bf16ToFloat(a[r * 64 + k])) * core::Bf16ToFloat(b[n * 64 + k]);
        want += p;
        mag += std::fabs(p);
      }
      if (!(std::fabs(d[r * 128 + n] - want) <= 1e-5 * mag + 1e-30) && ++bad <= 5) {
        ADD_FAILURE() << "K step " << kk << ": d[" << r << "][" << n << "] = " << d[r * 128 + n] << ", want " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "K step " << kk;
}

// Inputs for the probes: bf16 bits of normal values.
inline std::vector<uint16_t> Bf16Normal(int64_t n, uint32_t seed) {
  const std::vector<float> v = RandomNormal(n, seed, 1.f);
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = core::FloatToBf16(v[i]);
  return out;
}

}  // namespace iris::testing
