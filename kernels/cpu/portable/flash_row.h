// The online softmax of one query row over blocks of keys, in plain C++ (the compiler vectorises
// the dot products and the P·V updates over head_dim), shared by the portable VarlenAttention and
// PagedAttention. f32 only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/portable/math.h"

namespace iris::kernels::cpu::portable {

constexpr int kKeyBlock = 64;  // keys scored at once (the scores' scratch)

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

// Folds keys [0, n) (n <= kKeyBlock; K row j at k_row(j), V row j at v_row(j)) into the state of
// query row q. s: kKeyBlock floats of scratch.
template <typename KRow, typename VRow>
void AttendKeys(const float* q, int n, const KRow& k_row, const VRow& v_row, int head_dim, float scale, float* s,
                RowState& st) {
  float mx = st.m;
  for (int j = 0; j < n; ++j) {
    const float* k = k_row(j);
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < head_dim; ++d) dot += q[d] * k[d];
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
  float* o = st.o;
#pragma omp simd
  for (int d = 0; d < head_dim; ++d) o[d] *= alpha;
  for (int j = 0; j < n; ++j) {
    const float* v = v_row(j);
    const float p = s[j];
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) o[d] += p * v[d];
  }
}

inline void FinishRow(const RowState& st, int head_dim, float* out) {
  const float inv_l = 1.f / st.l;
#pragma omp simd
  for (int d = 0; d < head_dim; ++d) out[d] = st.o[d] * inv_l;
}

}  // namespace iris::kernels::cpu::portable
