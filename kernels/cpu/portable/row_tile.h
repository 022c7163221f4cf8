// Varlen attention's inner step for processors without AVX-512, in AVX2 + FMA intrinsics (the
// x86-64-v3 baseline): a tile of up to 6 query rows folded into their online softmax against one
// packed block of 64 keys. Both products are outer-product kernels over 12 accumulators (6 rows x
// 16 columns), like the bf16-weight Linear's few-row kernel: per step two vector loads and six
// broadcasts feed twelve FMAs.
//
// Why: flash_row.h's AttendBlock takes one query row at a time, so every FMA of q·kᵀ loads its
// packed key vector again, and P·V reloads V for every row: the encoder's attention ran at 20-30%
// of the f32 matmul rate on AMD EPYC (Zen 3) (kernels_bench --filter=attention).
//
// A row's arithmetic does not depend on which rows share its tile (its dot products run over d in
// order, its P·V over the keys in order; keys it may not see get p = 0 exactly), so row pieces of
// a forward (AttentionArgs::q_begin/q_end) give the one-call result bit for bit.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/portable/flash_row.h"
#include "kernels/cpu/portable/vec8.h"

namespace iris::kernels::cpu::portable::row_tile {

constexpr int kRows = 6;           // query rows per tile
constexpr int kKeys = kKeyBlock;   // keys per packed block (64)

// The tile's rows: query row r at q[r] (head_dim floats), its state st[r], and how many of the
// block's keys it sees (keys[r] <= 0: none; its state is left as it is).
struct Tile {
  const float* q[kRows];
  RowState* st[kRows];
  int keys[kRows];
};

// s[r * 64 + j] = scale * q_r · k_j for j < round_up(kmax, 16); kt holds the block transposed
// (kt[d * 64 + j], zero past the block's keys).
inline void Scores(const Tile& t, const float* __restrict kt, int head_dim, int kmax, float scale,
                   float* __restrict s) {
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int c = 0; c < kmax; c += 16) {
    __m256 acc[kRows][2];
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const float* k = kt + c;
    for (int d = 0; d < head_dim; ++d) {
      const __m256 k0 = _mm256_loadu_ps(k + d * kKeys);
      const __m256 k1 = _mm256_loadu_ps(k + d * kKeys + 8);
#pragma GCC unroll 6
      for (int r = 0; r < kRows; ++r) {
        const __m256 qb = _mm256_broadcast_ss(t.q[r] + d);
        acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
      _mm256_storeu_ps(s + r * kKeys + c, _mm256_mul_ps(acc[r][0], vscale));
      _mm256_storeu_ps(s + r * kKeys + c + 8, _mm256_mul_ps(acc[r][1], vscale));
    }
  }
}

// Row r's softmax step over its keys: s row r becomes p (0 past keys[r], up to round_up(kmax, 8));
// returns the factor alpha its old output is scaled by.
inline float Softmax(const Tile& t, int r, int kmax, float* __restrict s_row) {
  const int n = t.keys[r];
  const int kmax8 = (kmax + 7) / 8 * 8;
  if (n <= 0) {
    std::fill(s_row, s_row + kmax8, 0.f);
    return 1.f;
  }
  RowState& st = *t.st[r];
  float mx = st.m;
  for (int j = 0; j < n; ++j) mx = std::max(mx, s_row[j]);
  const float alpha = Exp(st.m - mx);  // 0 on the first block (m = -inf)
  const __m256 vmx = _mm256_set1_ps(mx);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < kmax8; j += 8) {
    const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), lane));
    const __m256 p = _mm256_and_ps(Exp8(_mm256_sub_ps(_mm256_loadu_ps(s_row + j), vmx)), keep);
    _mm256_storeu_ps(s_row + j, p);
    sum = _mm256_add_ps(sum, p);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0.f;
  for (float x : lanes) total += x;
  st.l = st.l * alpha + total;
  st.m = mx;
  return alpha;
}

// o_r[d0, d0 + 8W) = alpha_r * o_r + sum_{j < kmax} p[r][j] * v_j[d0, d0 + 8W).
template <int W>
inline void PvColumns(const Tile& t, const float* alpha, const float* __restrict p, const float* v0,
                      int64_t v_stride, int kmax, int d0) {
  __m256 acc[kRows][W];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
    const __m256 a = _mm256_set1_ps(alpha[r]);
#pragma GCC unroll 2
    for (int w = 0; w < W; ++w) acc[r][w] = _mm256_mul_ps(a, _mm256_loadu_ps(t.st[r]->o + d0 + 8 * w));
  }
  for (int j = 0; j < kmax; ++j) {
    const float* v = v0 + j * v_stride + d0;
    __m256 vv[W];
#pragma GCC unroll 2
    for (int w = 0; w < W; ++w) vv[w] = _mm256_loadu_ps(v + 8 * w);
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
      const __m256 pb = _mm256_broadcast_ss(p + r * kKeys + j);
#pragma GCC unroll 2
      for (int w = 0; w < W; ++w) acc[r][w] = _mm256_fmadd_ps(pb, vv[w], acc[r][w]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 2
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(t.st[r]->o + d0 + 8 * w, acc[r][w]);
}

// Folds the block (kt packed transposed; V row j at v0 + j * v_stride) into the tile's rows.
// head_dim % 8 == 0. s: 6 x 64 floats of scratch.
inline void Attend(const Tile& t, const float* kt, const float* v0, int64_t v_stride, int head_dim, float scale,
                   float* s) {
  int kmax = 0;
  for (int r = 0; r < kRows; ++r) kmax = std::max(kmax, t.keys[r]);
  if (kmax <= 0) return;
  Scores(t, kt, head_dim, kmax, scale, s);
  float alpha[kRows];
  for (int r = 0; r < kRows; ++r) alpha[r] = Softmax(t, r, kmax, s + r * kKeys);
  int d = 0;
  for (; d + 16 <= head_dim; d += 16) PvColumns<2>(t, alpha, s, v0, v_stride, kmax, d);
  if (d < head_dim) PvColumns<1>(t, alpha, s, v0, v_stride, kmax, d);
}

}  // namespace iris::kernels::cpu::portable::row_tile
