// The online softmax of one query row's group of q heads (the heads that share a kv head) over
// blocks of up to 64 keys, in AVX2 + FMA intrinsics (the x86-64-v3 baseline), for paged
// attention on processors without AVX-512. Keys are read through row pointers (f32 rows, or bf16
// rows widened on load), each K and V row once per group instead of once per head.
//
// Why not flash_row.h's AttendKeys per head: there a head's score for a key ends in a horizontal
// sum, each head widens the same bf16 row again, and P·V updates o in memory; at 4-8 heads per kv
// head that made bf16 pages compute-bound at about half the streaming bandwidth (kernels_bench
// --filter=paged, AMD EPYC Zen 3). Here the G heads' partial sums for a key are reduced together
// into one vector (lane h = head h), so the softmax runs on vectors across heads, and P·V keeps
// G x W vectors of o in registers while the block's V rows stream past.
//
// f32 arithmetic throughout (PagedAttentionArgs::bf16 is not used on this tier).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "kernels/cpu/portable/vec8.h"

namespace iris::kernels::cpu::portable::group_row {

constexpr int kMaxGroup = 8;  // heads per pass: one lane each
constexpr int kKAhead = 8;    // K rows prefetched this many keys ahead

// Lane h of the result = the sum of v[h]'s 8 lanes.
inline __m256 SumEach(const __m256 v[8]) {
  const __m256 a = _mm256_hadd_ps(v[0], v[1]);  // per 128-bit half: [v0 pair sums, v1 pair sums]
  const __m256 b = _mm256_hadd_ps(v[2], v[3]);
  const __m256 c = _mm256_hadd_ps(v[4], v[5]);
  const __m256 d = _mm256_hadd_ps(v[6], v[7]);
  const __m256 ab = _mm256_hadd_ps(a, b);  // [v0..v3 sums of lanes 0-3 | v0..v3 sums of lanes 4-7]
  const __m256 cd = _mm256_hadd_ps(c, d);
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

// Every cache line of a row of head_dim elements of T (rows need not start on a line).
template <typename T>
inline void PrefetchRow(const T* row, int head_dim) {
  const char* p = reinterpret_cast<const char*>(row);
  const int bytes = head_dim * static_cast<int>(sizeof(T));
  for (int off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
  _mm_prefetch(p + bytes - 1, _MM_HINT_T0);
}

// The running state of up to 8 heads of one query row: lane h holds head h's max score m and sum
// l of e^(score - m); o[h * head_dim + d] its unnormalised output.
struct State {
  __m256 m;
  __m256 l;
  float* o;
};

inline void Start(State& st, float* o, int heads, int head_dim) {
  st.m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  st.l = _mm256_setzero_ps();
  st.o = o;
  for (int i = 0; i < heads * head_dim; ++i) o[i] = 0.f;
}

// Folds keys [0, n) (n <= 64; K row j at krows[j], V row j at vrows[j], each head_dim elements of
// T) into the state of G heads whose queries are q[h * head_dim + d] (scores scaled by scale).
// head_dim % (8 * W) == 0. s: 64 * 8 floats of scratch (scores, then probabilities, key-major).
template <int G, int W, typename T>
void Attend(const float* __restrict q, int n, const T* const* krows, const T* const* vrows, int head_dim,
            float scale, float* __restrict s, State& st) {
  static_assert(G >= 1 && G <= kMaxGroup);
  const __m256 vscale = _mm256_set1_ps(scale);
  __m256 mx = st.m;
  // Scores: G dot products per key, reduced together into lane h = head h.
  for (int j = 0; j < n; ++j) {
    const T* k = krows[j];
    // V row j is needed by P·V below, a few 64-byte pieces per pass over the block: fetched whole
    // now, while the scores compute, so those passes hit the cache.
    PrefetchRow(vrows[j], head_dim);
    if (j + kKAhead < n) PrefetchRow(krows[j + kKAhead], head_dim);
    __m256 acc[8];
#pragma GCC unroll 8
    for (int h = 0; h < 8; ++h) acc[h] = _mm256_setzero_ps();
    for (int d = 0; d < head_dim; d += 8) {
      const __m256 kv = Load8(k + d);
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * head_dim + d), kv, acc[h]);
    }
    const __m256 sj = _mm256_mul_ps(SumEach(acc), vscale);
    _mm256_store_ps(s + j * 8, sj);
    mx = _mm256_max_ps(mx, sj);
  }
  // Online softmax, all heads at once.
  const __m256 alpha = Exp8(_mm256_sub_ps(st.m, mx));  // 0 on the first block (m = -inf)
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < n; ++j) {
    const __m256 p = Exp8(_mm256_sub_ps(_mm256_load_ps(s + j * 8), mx));
    _mm256_store_ps(s + j * 8, p);
    sum = _mm256_add_ps(sum, p);
  }
  st.l = _mm256_fmadd_ps(st.l, alpha, sum);
  st.m = mx;
  alignas(32) float a[8];
  _mm256_store_ps(a, alpha);
  // P·V: o[h][d0, d0 + 8W) in registers across the block's keys.
  for (int d0 = 0; d0 < head_dim; d0 += 8 * W) {
    __m256 acc[G][W];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      const __m256 ah = _mm256_set1_ps(a[h]);
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) acc[h][w] = _mm256_mul_ps(ah, _mm256_loadu_ps(st.o + h * head_dim + d0 + 8 * w));
    }
    for (int j = 0; j < n; ++j) {
      __m256 v[W];
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) v[w] = Load8(vrows[j] + d0 + 8 * w);
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) {
        const __m256 p = _mm256_broadcast_ss(s + j * 8 + h);
#pragma GCC unroll 4
        for (int w = 0; w < W; ++w) acc[h][w] = _mm256_fmadd_ps(p, v[w], acc[h][w]);
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h)
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) _mm256_storeu_ps(st.o + h * head_dim + d0 + 8 * w, acc[h][w]);
  }
}

// out[h * head_dim + d] = o / l for the first `heads` heads.
inline void Finish(const State& st, int heads, int head_dim, float* out) {
  alignas(32) float l[8];
  _mm256_store_ps(l, st.l);
  for (int h = 0; h < heads; ++h) {
    const float inv_l = 1.f / l[h];
    for (int d = 0; d < head_dim; ++d) out[h * head_dim + d] = st.o[h * head_dim + d] * inv_l;
  }
}

// The widest W (8-float vectors of o per head kept in registers in P·V) that leaves registers for
// G heads: G x W accumulators + W rows of V + a broadcast within 16 ymm registers.
constexpr int PreferredWidth(int g) { return g <= 2 ? 4 : g <= 4 ? 2 : 1; }

}  // namespace iris::kernels::cpu::portable::group_row
