// Flash-style varlen attention on AVX-512.
//
// Work is split into units of (sequence, head, block of 64 queries), run in parallel. A unit walks
// the sequence's keys in blocks of 64 with an online softmax. Keys are packed transposed
// (Kt[d][key], zero-padded to 64 keys) so that QKᵀ vectorises over keys: a micro-tile of 4 query
// rows x 64 keys is 16 zmm accumulators fed by one broadcast of q[r][d] and four loads of Kt[d]
// per d. The softmax runs on those registers; P (4 x 64) goes to a small buffer and P·V
// broadcasts P[r][j] against V's rows (read in place, vectorised over head_dim).
//
// Sequences of at most 64 tokens (the vision tower's windows) pack their keys inside the unit;
// longer sequences, whose key blocks are shared by many query blocks, are packed once up front.
#include "kernels/attention.h"

#include "kernels/cpu/simd.h"  // first: it sets up the intrinsics headers

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "core/tensor.h"
namespace iris::kernels {
namespace {

using cpu::TailMask;

constexpr int kBlock = 64;  // keys per key block, queries per unit
constexpr int kRows = 4;    // query rows per micro-tile
constexpr int kMaxChunk = 5;  // head_dim vectors accumulated at once in P·V (4 x 5 = 20 zmm)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Unit {
  int32_t seq;
  int32_t head;
  int32_t q0;  // first query of the block, relative to the sequence start
};

// In-register transpose of 16 rows of 16 floats.
inline void Transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  // r[4i + k] now holds, in each 128-bit lane L, element k of rows 4i..4i+3 for columns 4L..4L+3.
  for (int i = 0; i < 4; ++i) {
    // Combine across groups of 4 rows: 128-bit lane shuffles.
    const __m512 a = r[i], b = r[4 + i], c = r[8 + i], d = r[12 + i];
    const __m512 ab_lo = _mm512_shuffle_f32x4(a, b, 0x44);  // a.L0 a.L1 b.L0 b.L1
    const __m512 ab_hi = _mm512_shuffle_f32x4(a, b, 0xEE);  // a.L2 a.L3 b.L2 b.L3
    const __m512 cd_lo = _mm512_shuffle_f32x4(c, d, 0x44);
    const __m512 cd_hi = _mm512_shuffle_f32x4(c, d, 0xEE);
    t[i] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0x88);       // a.L0 b.L0 c.L0 d.L0
    t[4 + i] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0xDD);   // a.L1 b.L1 c.L1 d.L1
    t[8 + i] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0x88);   // L2
    t[12 + i] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0xDD);  // L3
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Packs keys [0, kn) of one head (key j at k0 + j * row_stride) into kt[d * 64 + j] for
// j < 16 * ceil(kn / 16), zero for j >= kn.
void PackKt(const float* k0, int64_t row_stride, int kn, int head_dim, float* kt) {
  const int ngroups = (kn + 15) / 16;
  const int ndg = (head_dim + 15) / 16;
  for (int jg = 0; jg < ngroups; ++jg) {
    for (int dg = 0; dg < ndg; ++dg) {
      const __mmask16 dm = TailMask(head_dim - dg * 16);
      __m512 r[16];
      for (int t = 0; t < 16; ++t) {
        const int j = jg * 16 + t;
        r[t] = j < kn ? _mm512_maskz_loadu_ps(dm, k0 + j * row_stride + dg * 16) : _mm512_setzero_ps();
      }
      Transpose16(r);
      const int dn = std::min(16, head_dim - dg * 16);
      for (int t = 0; t < dn; ++t) _mm512_store_ps(kt + (dg * 16 + t) * kBlock + jg * 16, r[t]);
    }
  }
}

// Per-thread scratch (grows, never shrinks).
struct Scratch {
  std::shared_ptr<void> buf;
  size_t capacity = 0;
  float* Get(size_t floats) {
    if (floats > capacity) {
      capacity = floats;
      buf = core::AllocateAligned(capacity * sizeof(float));
    }
    return static_cast<float*>(buf.get());
  }
};

struct UnitState {
  float* o;  // [64][head_dim] running (unnormalised) output
  float* p;  // [4][64] probabilities of the current micro-tile
  float m[kBlock];
  float l[kBlock];
};

struct Shape {
  int head_dim;
  int ndv;  // ceil(head_dim / 16)
  __mmask16 dmask[16];  // per head_dim vector: valid lanes
  float scale;
  bool causal;
};

// Accumulates P (kRows x jn, in st.p) times V rows [0, jn) into the tile's output rows.
template <int CN>
inline void PvChunk(const Shape& sh, int c0, const float* v0, int64_t v_stride, int jn, const float* alpha,
                    bool first, bool last, const float* inv_l, float* const out_rows[kRows], int rows_valid,
                    UnitState& st, int t) {
  __m512 acc[kRows][CN];
  for (int r = 0; r < kRows; ++r) {
    if (first) {
      for (int c = 0; c < CN; ++c) acc[r][c] = _mm512_setzero_ps();
    } else {
      const __m512 a = _mm512_set1_ps(alpha[r]);
      const float* o = st.o + (t + r) * sh.head_dim;
      for (int c = 0; c < CN; ++c) {
        acc[r][c] = _mm512_mul_ps(a, _mm512_maskz_loadu_ps(sh.dmask[c0 + c], o + (c0 + c) * 16));
      }
    }
  }
  const float* p = st.p;
  for (int j = 0; j < jn; ++j) {
    const float* vr = v0 + j * v_stride + c0 * 16;
    __m512 vv[CN];
    for (int c = 0; c < CN; ++c) vv[c] = _mm512_maskz_loadu_ps(sh.dmask[c0 + c], vr + c * 16);
    for (int r = 0; r < kRows; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r * kBlock + j]);
      for (int c = 0; c < CN; ++c) acc[r][c] = _mm512_fmadd_ps(pb, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    if (last) {
      if (r >= rows_valid) continue;
      const __m512 il = _mm512_set1_ps(inv_l[r]);
      for (int c = 0; c < CN; ++c) {
        _mm512_mask_storeu_ps(out_rows[r] + (c0 + c) * 16, sh.dmask[c0 + c], _mm512_mul_ps(acc[r][c], il));
      }
    } else {
      float* o = st.o + (t + r) * sh.head_dim;
      for (int c = 0; c < CN; ++c) _mm512_mask_storeu_ps(o + (c0 + c) * 16, sh.dmask[c0 + c], acc[r][c]);
    }
  }
}

// One micro-tile: rows t..t+3 of the unit against one key block (kn keys, NJV = ceil(kn/16)).
template <int NJV>
inline void Tile(const Shape& sh, const float* const q_rows[kRows], const int qpos[kRows], const float* kt,
                 int kb0, int kn, const float* v0, int64_t v_stride, bool first, bool last,
                 float* const out_rows[kRows], int rows_valid, UnitState& st, int t) {
  // S = q · Ktᵀ for 4 rows x NJV*16 keys.
  __m512 s[kRows][NJV];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < NJV; ++v) s[r][v] = _mm512_setzero_ps();
  const int hd = sh.head_dim;
  const float* q0 = q_rows[0];
  const float* q1 = q_rows[1];
  const float* q2 = q_rows[2];
  const float* q3 = q_rows[3];
  for (int d = 0; d < hd; ++d) {
    __m512 kv[NJV];
    for (int v = 0; v < NJV; ++v) kv[v] = _mm512_load_ps(kt + d * kBlock + v * 16);
    const __m512 b0 = _mm512_set1_ps(q0[d]);
    const __m512 b1 = _mm512_set1_ps(q1[d]);
    const __m512 b2 = _mm512_set1_ps(q2[d]);
    const __m512 b3 = _mm512_set1_ps(q3[d]);
    for (int v = 0; v < NJV; ++v) {
      s[0][v] = _mm512_fmadd_ps(b0, kv[v], s[0][v]);
      s[1][v] = _mm512_fmadd_ps(b1, kv[v], s[1][v]);
      s[2][v] = _mm512_fmadd_ps(b2, kv[v], s[2][v]);
      s[3][v] = _mm512_fmadd_ps(b3, kv[v], s[3][v]);
    }
  }

  // Online softmax on the registers.
  const __m512 scale = _mm512_set1_ps(sh.scale);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  float alpha[kRows], inv_l[kRows];
  int jn = 0;  // keys with a nonzero probability in some row
  for (int r = 0; r < kRows; ++r) {
    const int limit = sh.causal ? std::min(kn, qpos[r] - kb0 + 1) : kn;
    jn = std::max(jn, limit);
    __m512 mx = _mm512_set1_ps(kNegInf);
    for (int v = 0; v < NJV; ++v) {
      s[r][v] = _mm512_mul_ps(s[r][v], scale);
      if (limit < (v + 1) * 16) {
        const __mmask16 valid =
            _mm512_cmp_epi32_mask(_mm512_add_epi32(iota, _mm512_set1_epi32(v * 16)), _mm512_set1_epi32(limit), _MM_CMPINT_LT);
        s[r][v] = _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), valid, s[r][v]);
      }
      mx = _mm512_max_ps(mx, s[r][v]);
    }
    const int row = t + r;
    const float m_old = st.m[row];
    const float m_new = std::max(m_old, _mm512_reduce_max_ps(mx));
    const float m_use = m_new == kNegInf ? 0.f : m_new;
    alpha[r] = m_old == m_new ? 1.f : std::exp(m_old - m_use);
    const __m512 mb = _mm512_set1_ps(m_use);
    __m512 sum = _mm512_setzero_ps();
    for (int v = 0; v < NJV; ++v) {
      const __m512 pv = cpu::Exp(_mm512_sub_ps(s[r][v], mb));
      sum = _mm512_add_ps(sum, pv);
      _mm512_store_ps(st.p + r * kBlock + v * 16, pv);
    }
    const float l_new = st.l[row] * alpha[r] + _mm512_reduce_add_ps(sum);
    st.l[row] = l_new;
    st.m[row] = m_new;
    inv_l[r] = 1.f / l_new;
  }

  // O = alpha * O + P · V, in chunks of head_dim vectors.
  for (int c0 = 0; c0 < sh.ndv;) {
    const int left = sh.ndv - c0;
    const int cn = left <= kMaxChunk ? left : (left <= 2 * kMaxChunk ? (left + 1) / 2 : kMaxChunk);
    switch (cn) {
      case 1: PvChunk<1>(sh, c0, v0, v_stride, jn, alpha, first, last, inv_l, out_rows, rows_valid, st, t); break;
      case 2: PvChunk<2>(sh, c0, v0, v_stride, jn, alpha, first, last, inv_l, out_rows, rows_valid, st, t); break;
      case 3: PvChunk<3>(sh, c0, v0, v_stride, jn, alpha, first, last, inv_l, out_rows, rows_valid, st, t); break;
      case 4: PvChunk<4>(sh, c0, v0, v_stride, jn, alpha, first, last, inv_l, out_rows, rows_valid, st, t); break;
      default: PvChunk<5>(sh, c0, v0, v_stride, jn, alpha, first, last, inv_l, out_rows, rows_valid, st, t); break;
    }
    c0 += cn;
  }
}

}  // namespace

void VarlenAttention(const AttentionArgs& a) {
  const int num_seqs = static_cast<int>(a.cu_seqlens.size()) - 1;
  if (num_seqs <= 0 || a.num_heads <= 0 || a.head_dim <= 0) return;
  const int kv_heads = a.num_kv_heads > 0 ? a.num_kv_heads : a.num_heads;
  const int group = a.num_heads / kv_heads;
  const int hd = a.head_dim;
  const int32_t* cu = a.cu_seqlens.data();

  Shape sh;
  sh.head_dim = hd;
  sh.ndv = (hd + 15) / 16;
  for (int c = 0; c < 16; ++c) sh.dmask[c] = TailMask(std::max(0, hd - c * 16));
  sh.scale = a.scale;
  sh.causal = a.causal;

  // Units, and the key blocks of the long sequences (packed up front, shared by query blocks).
  std::vector<Unit> units;
  std::vector<int64_t> block_base(num_seqs, -1);  // first packed block of sequence s, or -1
  int64_t total_blocks = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int n = cu[s + 1] - cu[s];
    if (n <= 0) continue;
    const int nqb = (n + kBlock - 1) / kBlock;
    if (n > kBlock) {
      block_base[s] = total_blocks;
      total_blocks += nqb;
    }
    for (int h = 0; h < a.num_heads; ++h)
      for (int qb = 0; qb < nqb; ++qb) units.push_back({s, h, qb * kBlock});
  }
  if (units.empty()) return;

  const size_t block_floats = static_cast<size_t>(hd) * kBlock;
  float* packed = nullptr;
  thread_local Scratch packed_scratch;  // of the calling thread, reused across calls
  if (total_blocks > 0) {
    packed = packed_scratch.Get(static_cast<size_t>(kv_heads) * total_blocks * block_floats);
    std::vector<std::pair<int32_t, int32_t>> blocks;  // (seq, block)
    blocks.reserve(total_blocks);
    for (int s = 0; s < num_seqs; ++s) {
      if (block_base[s] < 0) continue;
      const int n = cu[s + 1] - cu[s];
      for (int b = 0; b * kBlock < n; ++b) blocks.push_back({s, b});
    }
    const int64_t jobs = static_cast<int64_t>(kv_heads) * total_blocks;
#pragma omp parallel for schedule(static)
    for (int64_t job = 0; job < jobs; ++job) {
      const int g = static_cast<int>(job / total_blocks);
      const auto [s, b] = blocks[job % total_blocks];
      const int n = cu[s + 1] - cu[s];
      const int kn = std::min(kBlock, n - b * kBlock);
      const float* k0 = a.k.data + (cu[s] + static_cast<int64_t>(b) * kBlock) * a.k.row_stride + g * a.k.head_stride;
      PackKt(k0, a.k.row_stride, kn, hd, packed + (g * total_blocks + block_base[s] + b) * block_floats);
    }
  }

  const int64_t num_units = static_cast<int64_t>(units.size());
#pragma omp parallel
  {
    thread_local Scratch scratch;
    float* base = scratch.Get(block_floats + static_cast<size_t>(kBlock) * hd + kRows * kBlock);
    float* kt_local = base;
    UnitState st;
    st.o = base + block_floats;
    st.p = st.o + static_cast<size_t>(kBlock) * hd;

#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < num_units; ++u) {
      const Unit unit = units[u];
      const int s = unit.seq, h = unit.head, g = h / group;
      const int64_t t0 = cu[s];
      const int n = cu[s + 1] - cu[s];
      const int nq = std::min(kBlock, n - unit.q0);
      // Keys this block needs: all, or up to its last query when causal.
      const int k_end = a.causal ? unit.q0 + nq : n;
      const int nkb = (k_end + kBlock - 1) / kBlock;
      for (int r = 0; r < kBlock; ++r) {
        st.m[r] = kNegInf;
        st.l[r] = 0.f;
      }
      const float* qh = a.q.data + (t0 + unit.q0) * a.q.row_stride + h * a.q.head_stride;
      const float* kh = a.k.data + t0 * a.k.row_stride + g * a.k.head_stride;
      const float* vh = a.v.data + t0 * a.v.row_stride + g * a.v.head_stride;
      float* oh = a.out + (t0 + unit.q0) * a.out_row_stride + static_cast<int64_t>(h) * hd;

      for (int kb = 0; kb < nkb; ++kb) {
        const int kb0 = kb * kBlock;
        const int kn = std::min(kBlock, n - kb0);
        const float* kt;
        if (block_base[s] < 0) {
          PackKt(kh, a.k.row_stride, kn, hd, kt_local);
          kt = kt_local;
        } else {
          kt = packed + (g * total_blocks + block_base[s] + kb) * block_floats;
        }
        const float* v0 = vh + static_cast<int64_t>(kb0) * a.v.row_stride;
        const bool first = kb == 0, last = kb == nkb - 1;
        const int njv = (kn + 15) / 16;
        for (int t = 0; t < nq; t += kRows) {
          const float* q_rows[kRows];
          int qpos[kRows];
          float* out_rows[kRows];
          for (int r = 0; r < kRows; ++r) {
            const int i = std::min(t + r, nq - 1);  // rows past the block repeat its last row
            q_rows[r] = qh + i * a.q.row_stride;
            qpos[r] = unit.q0 + i;
            out_rows[r] = oh + i * a.out_row_stride;
          }
          const int rows_valid = std::min(kRows, nq - t);
          switch (njv) {
            case 1: Tile<1>(sh, q_rows, qpos, kt, kb0, kn, v0, a.v.row_stride, first, last, out_rows, rows_valid, st, t); break;
            case 2: Tile<2>(sh, q_rows, qpos, kt, kb0, kn, v0, a.v.row_stride, first, last, out_rows, rows_valid, st, t); break;
            case 3: Tile<3>(sh, q_rows, qpos, kt, kb0, kn, v0, a.v.row_stride, first, last, out_rows, rows_valid, st, t); break;
            default: Tile<4>(sh, q_rows, qpos, kt, kb0, kn, v0, a.v.row_stride, first, last, out_rows, rows_valid, st, t); break;
          }
        }
      }
    }
  }
}

}  // namespace iris::kernels
