// The online softmax of one query row over blocks of 64 keys, in plain C++ that the compiler
// vectorises into register-resident accumulators, shared by the portable VarlenAttention and
// PagedAttention. f32 arithmetic; AttendKeys also reads bf16 rows (paged bf16 KV pages), widened
// to f32 on load.
//
// AttendBlock: a key block is packed transposed (Kt[d][64], zero-padded) once and used by every
// query row that reads it (varlen: 64 query rows): its 64 scores are then 8 vector accumulators fed
// by one broadcast of q[d] per d. P·V accumulates head_dim in chunks of up to 64 floats held in
// registers across the block's keys. AttendKeys: the keys unpacked, for few readers (paged).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/bf16.h"
#include "kernels/cpu/portable/math.h"

namespace iris::kernels::cpu::portable {

constexpr int kKeyBlock = 64;

// A query row's running state: its max score m, the sum l of e^(score - m), and the
// unnormalised output o[head_dim].
struct RowState {
  float m;
  float l;
  float* o;
};

inline void StartRow(RowState& st, float* o, int head_dim) {
  st.m = -std::numeric_limits<float>::infinity();
  st.l = 0.f;
  st.o = o;
  std::fill(o, o + head_dim, 0.f);
}

// Packs keys [0, n) (key j at k_row(j)) transposed into kt[d * 64 + j], zero for j >= n.
template <typename KRow>
void PackKeysT(const KRow& k_row, int n, int head_dim, float* kt) {
  for (int j = 0; j < n; ++j) {
    const float* k = k_row(j);
    for (int d = 0; d < head_dim; ++d) kt[d * kKeyBlock + j] = k[d];
  }
  if (n < kKeyBlock) {
    for (int d = 0; d < head_dim; ++d) std::fill(kt + d * kKeyBlock + n, kt + (d + 1) * kKeyBlock, 0.f);
  }
}

// An element of a K or V row as f32: f32 as is, bf16 (uint16_t bits) widened exactly.
inline float AsF32(float x) { return x; }
inline float AsF32(uint16_t x) { return core::Bf16ToFloat(x); }

// s[j] = q · k_j for the 64 keys of a packed block (unscaled).
inline void Scores(const float* __restrict q, const float* __restrict kt, int head_dim, float* __restrict s) {
  float acc[kKeyBlock] = {};
  for (int d = 0; d < head_dim; ++d) {
    const float qd = q[d];
    const float* k = kt + d * kKeyBlock;
    for (int j = 0; j < kKeyBlock; ++j) acc[j] += qd * k[j];
  }
  std::copy(acc, acc + kKeyBlock, s);
}

// o[d0, d0 + W) = alpha * o + sum_j p[j] * v_j[d0, d0 + W), keys j < n.
template <int W, typename VRow>
void PvChunk(const float* __restrict p, int n, const VRow& v_row, int d0, float alpha, float* __restrict o) {
  float acc[W];
  for (int t = 0; t < W; ++t) acc[t] = alpha * o[d0 + t];
  for (int j = 0; j < n; ++j) {
    const float pj = p[j];
    const float* v = v_row(j) + d0;
    for (int t = 0; t < W; ++t) acc[t] += pj * v[t];
  }
  for (int t = 0; t < W; ++t) o[d0 + t] = acc[t];
}

// o = alpha * o + P·V over head_dim, in register-sized chunks of 64, 32, 16, 8 and 1 floats.
template <typename VRow>
void Pv(const float* p, int n, const VRow& v_row, int head_dim, float alpha, float* o) {
  int d = 0;
  for (; d + 64 <= head_dim; d += 64) PvChunk<64>(p, n, v_row, d, alpha, o);
  if (d + 32 <= head_dim) {
    PvChunk<32>(p, n, v_row, d, alpha, o);
    d += 32;
  }
  if (d + 16 <= head_dim) {
    PvChunk<16>(p, n, v_row, d, alpha, o);
    d += 16;
  }
  if (d + 8 <= head_dim) {
    PvChunk<8>(p, n, v_row, d, alpha, o);
    d += 8;
  }
  for (; d < head_dim; ++d) PvChunk<1>(p, n, v_row, d, alpha, o);
}

// Folds keys [0, n) of a packed block (kt; V row j at v_row(j)) into the state of query row q.
// s: 64 floats of scratch.
template <typename VRow>
void AttendBlock(const float* q, const float* kt, int n, const VRow& v_row, int head_dim, float scale, float* s,
                 RowState& st) {
  Scores(q, kt, head_dim, s);
  float mx = st.m;
  for (int j = 0; j < n; ++j) mx = std::max(mx, s[j] * scale);
  const float alpha = Exp(st.m - mx);  // 0 on the first block (m = -inf)
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) {
    s[j] = Exp(s[j] * scale - mx);
    sum += s[j];
  }
  st.l = st.l * alpha + sum;
  st.m = mx;
  Pv(s, n, v_row, head_dim, alpha, st.o);
}

// Folds keys [0, n) (n <= 64; K row j at k_row(j), V row j at v_row(j), rows of float or of bf16
// bits) into the state of query row q without packing them: a dot product per key. For keys that
// few query vectors read (a decode's group of heads), where packing a block would cost as much as
// using it. s: 64 floats.
template <typename KRow, typename VRow>
void AttendKeys(const float* q, int n, const KRow& k_row, const VRow& v_row, int head_dim, float scale, float* s,
                RowState& st) {
  float mx = st.m;
  for (int j = 0; j < n; ++j) {
    const auto* k = k_row(j);
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < head_dim; ++d) dot += q[d] * AsF32(k[d]);
    s[j] = dot * scale;
    mx = std::max(mx, s[j]);
  }
  const float alpha = Exp(st.m - mx);  // 0 on the first block (m = -inf)
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) {
    s[j] = Exp(s[j] - mx);
    sum += s[j];
  }
  st.l = st.l * alpha + sum;
  st.m = mx;
  // o updated in memory, each V row read once: faster here than Pv's register chunks, which read
  // a pool row in several passes (measured on the paged decode and prefill shapes).
  float* o = st.o;
#pragma omp simd
  for (int d = 0; d < head_dim; ++d) o[d] *= alpha;
  for (int j = 0; j < n; ++j) {
    const auto* v = v_row(j);
    const float p = s[j];
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) o[d] += p * AsF32(v[d]);
  }
}

inline void FinishRow(const RowState& st, int head_dim, float* out) {
  const float inv_l = 1.f / st.l;
#pragma omp simd
  for (int d = 0; d < head_dim; ++d) out[d] = st.o[d] * inv_l;
}

}  // namespace iris::kernels::cpu::portable
