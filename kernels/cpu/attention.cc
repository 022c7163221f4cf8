// Flash-style varlen attention on AVX-512.
//
// Work is split into units of (sequence, head, block of 64 queries), run in parallel. A unit walks
// the sequence's keys in blocks of 64 with an online softmax. Keys are packed transposed
// (Kt[d][key], zero-padded to 64 keys) so that QKᵀ vectorises over keys: a micro-tile of 4 query
// rows x 64 keys is 16 zmm accumulators fed by one broadcast of q[r][d] and four loads of Kt[d]
// per d. The softmax runs on those scores; P (4 x 64) goes to a small buffer and P·V broadcasts
// P[r][j] against V's rows (read in place, vectorised over head_dim).
//
// Sequences of at most 64 tokens (the vision tower's windows) pack their keys inside the unit;
// longer sequences, whose key blocks are shared by many query blocks, are packed once up front.
// While a block computes, the rows the next one reads are prefetched into L2.
//
// The bf16 option runs both products on vdpbf16ps (pairs of bf16 products summed into f32):
// Kt is packed as bf16 pairs of dims (Ktb[d/2][key][2]), V as pairs of keys (Vb[key/2][d][2]),
// q and P are rounded to bf16; the softmax and all accumulation stay f32.
#include "kernels/cpu/cpu_ops.h"

#include "kernels/cpu/simd.h"  // first: it sets up the intrinsics headers

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace iris::kernels::cpu::avx512 {
namespace {

using cpu::PrefetchL2;
using cpu::TailMask;
using cpu::Transpose16;

constexpr int kBlock = 64;  // keys per key block, queries per unit
constexpr int kRows = 4;    // query rows per micro-tile
constexpr int kMaxChunk = 5;  // head_dim vectors accumulated at once in P·V (4 x 5 = 20 zmm)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Unit {
  int32_t seq;
  int32_t head;
  int32_t q0;  // first query of the block, relative to the sequence start
};

// Where a unit's data lives.
struct UnitGeom {
  int seq, g, q0, n, nq, nkb;
  bool prepacked;  // keys packed up front (long sequence) rather than inside the unit
  const float* qh;
  const float* kh;
  const float* vh;
  float* oh;
};

// Rows to prefetch into L2, issued in slices spread over the tiles of a key block.
struct Prefetch {
  const float* base[3];
  int64_t stride[3];
  int rows[3];
  int count = 0;
  int total = 0;
  void Add(const float* b, int64_t st, int n) {
    if (n <= 0) return;
    base[count] = b;
    stride[count] = st;
    rows[count] = n;
    ++count;
    total += n;
  }
  // Slice `i` of `n`: rows [total*i/n, total*(i+1)/n) of the concatenated row lists.
  void Issue(int i, int n, int head_dim) const {
    if (total == 0) return;
    int begin = static_cast<int>(static_cast<int64_t>(total) * i / n);
    int end = static_cast<int>(static_cast<int64_t>(total) * (i + 1) / n);
    for (int l = 0; l < count && begin < end; ++l) {
      const int lb = begin, le = std::min(end, rows[l]);
      for (int r = lb; r < le; ++r) {
        const char* row = reinterpret_cast<const char*>(base[l] + r * stride[l]);
        for (int off = 0; off < head_dim * 4; off += 64) PrefetchL2(row + off);
        PrefetchL2(row + head_dim * 4 - 1);
      }
      begin = std::max(0, begin - rows[l]);
      end -= rows[l];
    }
  }
};


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

struct UnitState {
  float* o;     // [64][head_dim] running (unnormalised) output
  float* p;     // [4][64] scores, then probabilities, of the current micro-tile
  uint16_t* pb; // bf16: [4][64] probabilities rounded to bf16
  float m[kBlock];
  float l[kBlock];
};

struct Shape {
  int head_dim;
  int ndv;          // ceil(head_dim / 16)
  __mmask16 tail;   // valid lanes of the last head_dim vector
  int hp;           // bf16: pairs of dims, ceil(head_dim / 2)
  int dpad;         // bf16: head_dim padded to whole vectors (ndv * 16)
  float scale;
  bool causal;
};

// Accumulates P (kRows x jn, in p) times V rows [0, jn) into CN vectors of the tile's output
// rows, starting at head_dim vector c0 (v0, o and out_rows are already offset to it). Only the
// head's last vector can be partial (kTail); full vectors use plain loads, which lets the
// compiler keep the accumulators in registers across the key loop.
template <int CN, bool kTail>
__attribute__((noinline)) void PvChunk(__mmask16 tail, const float* v0, int64_t v_stride, int jn, const float* p,
                    const float* alpha, bool first, bool last, const float* inv_l, float* const out_rows[kRows],
                    int rows_valid, float* o, int o_stride) {
  auto load = [tail](const float* src, int c) {
    return (kTail && c == CN - 1) ? _mm512_maskz_loadu_ps(tail, src + c * 16) : _mm512_loadu_ps(src + c * 16);
  };
  auto store = [tail](float* dst, int c, __m512 x) {
    if (kTail && c == CN - 1) {
      _mm512_mask_storeu_ps(dst + c * 16, tail, x);
    } else {
      _mm512_storeu_ps(dst + c * 16, x);
    }
  };
  __m512 acc[kRows][CN];
  if (first) {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < CN; ++c) acc[r][c] = _mm512_setzero_ps();
  } else {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 8
      for (int c = 0; c < CN; ++c) acc[r][c] = _mm512_mul_ps(a, load(o + r * o_stride, c));
    }
  }
  for (int j = 0; j < jn; ++j) {
    const float* vr = v0 + j * v_stride;
    __m512 vv[CN];
#pragma GCC unroll 8
    for (int c = 0; c < CN; ++c) {
      vv[c] = load(vr, c);
      asm("" : "+v"(vv[c]));  // one load per vector, not one per FMA
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r * kBlock + j]);
#pragma GCC unroll 8
      for (int c = 0; c < CN; ++c) acc[r][c] = _mm512_fmadd_ps(pb, vv[c], acc[r][c]);
    }
  }
  if (last) {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      if (r < rows_valid) {
        const __m512 il = _mm512_set1_ps(inv_l[r]);
#pragma GCC unroll 8
        for (int c = 0; c < CN; ++c) store(out_rows[r], c, _mm512_mul_ps(acc[r][c], il));
      }
    }
  } else {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < CN; ++c) store(o + r * o_stride, c, acc[r][c]);
  }
}

// S[r][0 .. 16*NJV) = q_r · Kt for the 4 rows of a micro-tile (unscaled), stored to s (rows of 64).
// Not inlined: on its own the 16 accumulators stay in registers (inlined into the tile GCC
// spilled them on every iteration).
template <int NJV>
__attribute__((noinline)) void QkTile(const float* q0, const float* q1, const float* q2, const float* q3,
                                      const float* kt, int hd, float* s) {
  __m512 acc[kRows][NJV];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int d = 0; d < hd; ++d) {
    __m512 kv[NJV];
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) {
      kv[v] = _mm512_load_ps(kt + d * kBlock + v * 16);
      // Keep the key vector in a register: GCC would otherwise re-read it in each of the four
      // FMAs (20 loads per 16 FMAs instead of 8).
      asm("" : "+v"(kv[v]));
    }
    const __m512 b0 = _mm512_set1_ps(q0[d]);
    const __m512 b1 = _mm512_set1_ps(q1[d]);
    const __m512 b2 = _mm512_set1_ps(q2[d]);
    const __m512 b3 = _mm512_set1_ps(q3[d]);
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) {
      acc[0][v] = _mm512_fmadd_ps(b0, kv[v], acc[0][v]);
      acc[1][v] = _mm512_fmadd_ps(b1, kv[v], acc[1][v]);
      acc[2][v] = _mm512_fmadd_ps(b2, kv[v], acc[2][v]);
      acc[3][v] = _mm512_fmadd_ps(b3, kv[v], acc[3][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) _mm512_store_ps(s + r * kBlock + v * 16, acc[r][v]);
}

#if defined(__AVX512BF16__)
constexpr bool kHaveBf16 = true;
using cpu::AsBh;

// Packs keys [0, kn) of one head as bf16 pairs of dims: word kt[p * 64 + j] holds
// (k[j][2p], k[j][2p+1]) for p < ceil(head_dim/2), j < 16 * ceil(kn/16); zero for j >= kn.
void PackKtBf16(const float* k0, int64_t row_stride, int kn, int head_dim, uint32_t* kt) {
  const int ngroups = (kn + 15) / 16;
  const int hp = (head_dim + 1) / 2;
  const int nwg = (hp + 15) / 16;  // groups of 16 words = 32 dims
  for (int jg = 0; jg < ngroups; ++jg) {
    for (int wg = 0; wg < nwg; ++wg) {
      const int d0 = wg * 32;
      const __mmask16 m0 = TailMask(std::max(0, head_dim - d0));
      const __mmask16 m1 = TailMask(std::max(0, head_dim - d0 - 16));
      __m512 r[16];
      for (int t = 0; t < 16; ++t) {
        const int j = jg * 16 + t;
        if (j < kn) {
          const float* row = k0 + j * row_stride + d0;
          r[t] = _mm512_castsi512_ps(
              cpu::ToBf16x32(_mm512_maskz_loadu_ps(m0, row), _mm512_maskz_loadu_ps(m1, row + 16)));
        } else {
          r[t] = _mm512_setzero_ps();
        }
      }
      Transpose16(r);  // 32-bit words: word w of key t -> vector w, lane t
      const int wn = std::min(16, hp - wg * 16);
      for (int t = 0; t < wn; ++t) {
        _mm512_store_si512(kt + (wg * 16 + t) * kBlock + jg * 16, _mm512_castps_si512(r[t]));
      }
    }
  }
}

// Packs V rows [0, kn) of one head as bf16 pairs of keys: vb[(jp * dpad + d) * 2 + i] holds
// v[2jp + i][d] for jp < ceil(kn/2), zero beyond kn and head_dim.
void PackVBf16(const float* v0, int64_t row_stride, int kn, int head_dim, int dpad, uint16_t* vb) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const int npairs = (kn + 1) / 2;
  for (int jp = 0; jp < npairs; ++jp) {
    const float* a = v0 + (2 * jp) * row_stride;
    const float* b = a + row_stride;
    const bool has_b = 2 * jp + 1 < kn;
    for (int d = 0; d < dpad; d += 16) {
      const __mmask16 m = TailMask(std::max(0, head_dim - d));
      const __m512 va = _mm512_maskz_loadu_ps(m, a + d);
      const __m512 vbv = has_b ? _mm512_maskz_loadu_ps(m, b + d) : _mm512_setzero_ps();
      // [a0..a15 | b0..b15] as bf16, then interleaved to a0 b0 a1 b1 ...
      const __m512i both = cpu::ToBf16x32(va, vbv);
      _mm512_store_si512(vb + (static_cast<int64_t>(jp) * dpad + d) * 2, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

// bf16 twin of QkTile: qb rows hold q in bf16 (pairs of dims), kt the packed key pairs.
template <int NJV>
__attribute__((noinline)) void QkTileBf16(const uint16_t* q0, const uint16_t* q1, const uint16_t* q2,
                                          const uint16_t* q3, const uint32_t* kt, int hp, float* s) {
  __m512 acc[kRows][NJV];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) acc[r][v] = _mm512_setzero_ps();
  const uint32_t* qw[kRows] = {reinterpret_cast<const uint32_t*>(q0), reinterpret_cast<const uint32_t*>(q1),
                               reinterpret_cast<const uint32_t*>(q2), reinterpret_cast<const uint32_t*>(q3)};
  for (int p = 0; p < hp; ++p) {
    __m512i kv[NJV];
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) {
      kv[v] = _mm512_load_si512(kt + p * kBlock + v * 16);
      asm("" : "+v"(kv[v]));
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512i b = _mm512_set1_epi32(static_cast<int>(qw[r][p]));
#pragma GCC unroll 4
      for (int v = 0; v < NJV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], AsBh(b), AsBh(kv[v]));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) _mm512_store_ps(s + r * kBlock + v * 16, acc[r][v]);
}

// bf16 twin of PvChunk: vb is the packed V block (offset to vector c0), pb the bf16 P rows.
template <int CN, bool kTail>
__attribute__((noinline)) void PvChunkBf16(__mmask16 tail, const uint16_t* vb, int dpad, int jpn, const uint16_t* pb,
                                           const float* alpha, bool first, bool last, const float* inv_l,
                                           float* const out_rows[kRows], int rows_valid, float* o, int o_stride) {
  auto load = [tail](const float* src, int c) {
    return (kTail && c == CN - 1) ? _mm512_maskz_loadu_ps(tail, src + c * 16) : _mm512_loadu_ps(src + c * 16);
  };
  auto store = [tail](float* dst, int c, __m512 x) {
    if (kTail && c == CN - 1) {
      _mm512_mask_storeu_ps(dst + c * 16, tail, x);
    } else {
      _mm512_storeu_ps(dst + c * 16, x);
    }
  };
  __m512 acc[kRows][CN];
  if (first) {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < CN; ++c) acc[r][c] = _mm512_setzero_ps();
  } else {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 8
      for (int c = 0; c < CN; ++c) acc[r][c] = _mm512_mul_ps(a, load(o + r * o_stride, c));
    }
  }
  const uint32_t* pw = reinterpret_cast<const uint32_t*>(pb);
  for (int jp = 0; jp < jpn; ++jp) {
    const uint16_t* vr = vb + static_cast<int64_t>(jp) * dpad * 2;
    __m512i vv[CN];
#pragma GCC unroll 8
    for (int c = 0; c < CN; ++c) {
      vv[c] = _mm512_load_si512(vr + c * 32);
      asm("" : "+v"(vv[c]));
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512i pr = _mm512_set1_epi32(static_cast<int>(pw[r * (kBlock / 2) + jp]));
#pragma GCC unroll 8
      for (int c = 0; c < CN; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], AsBh(pr), AsBh(vv[c]));
    }
  }
  if (last) {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      if (r < rows_valid) {
        const __m512 il = _mm512_set1_ps(inv_l[r]);
#pragma GCC unroll 8
        for (int c = 0; c < CN; ++c) store(out_rows[r], c, _mm512_mul_ps(acc[r][c], il));
      }
    }
  } else {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < CN; ++c) store(o + r * o_stride, c, acc[r][c]);
  }
}
#else
constexpr bool kHaveBf16 = false;
#endif

// Where a micro-tile reads its operands: f32 rows and Kt, or the bf16 packed forms.
struct TileInputs {
  const float* q_rows[kRows];   // f32
  const uint16_t* qb_rows[kRows];  // bf16
  const float* kt;              // f32 Kt[d][64]
  const uint32_t* ktb;          // bf16 Ktb[d/2][64]
  const float* v0;              // f32 V rows
  int64_t v_stride;
  const uint16_t* vb;           // bf16 Vb[key/2][dpad][2]
};

// One micro-tile: rows t..t+3 of the unit against one key block (kn keys, NJV = ceil(kn/16)).
template <bool kBf16, int NJV>
inline void Tile(const Shape& sh, const TileInputs& in, const int qpos[kRows], int kb0, int kn, bool first,
                 bool last, float* const out_rows[kRows], int rows_valid, UnitState& st, int t) {
  const int hd = sh.head_dim;
#if defined(__AVX512BF16__)
  if constexpr (kBf16) {
    QkTileBf16<NJV>(in.qb_rows[0], in.qb_rows[1], in.qb_rows[2], in.qb_rows[3], in.ktb, sh.hp, st.p);
  } else
#endif
  {
    QkTile<NJV>(in.q_rows[0], in.q_rows[1], in.q_rows[2], in.q_rows[3], in.kt, hd, st.p);
  }

  // Online softmax.
  const __m512 scale = _mm512_set1_ps(sh.scale);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  float alpha[kRows], inv_l[kRows];
  int jn = 0;  // keys with a nonzero probability in some row
  for (int r = 0; r < kRows; ++r) {
    const int limit = sh.causal ? std::min(kn, qpos[r] - kb0 + 1) : kn;
    jn = std::max(jn, limit);
    __m512 mx = _mm512_set1_ps(kNegInf);
    __m512 sv[NJV];
    for (int v = 0; v < NJV; ++v) {
      sv[v] = _mm512_mul_ps(_mm512_load_ps(st.p + r * kBlock + v * 16), scale);
      if (limit < (v + 1) * 16) {
        const __mmask16 valid =
            _mm512_cmp_epi32_mask(_mm512_add_epi32(iota, _mm512_set1_epi32(v * 16)), _mm512_set1_epi32(limit), _MM_CMPINT_LT);
        sv[v] = _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), valid, sv[v]);
      }
      mx = _mm512_max_ps(mx, sv[v]);
    }
    const int row = t + r;
    const float m_old = st.m[row];
    const float m_new = std::max(m_old, _mm512_reduce_max_ps(mx));
    const float m_use = m_new == kNegInf ? 0.f : m_new;
    alpha[r] = m_old == m_new ? 1.f : std::exp(m_old - m_use);
    const __m512 mb = _mm512_set1_ps(m_use);
    __m512 sum = _mm512_setzero_ps();
    for (int v = 0; v < NJV; ++v) {
      const __m512 pv = cpu::Exp(_mm512_sub_ps(sv[v], mb));
      sum = _mm512_add_ps(sum, pv);
#if defined(__AVX512BF16__)
      if constexpr (kBf16) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(st.pb + r * kBlock + v * 16),
                           reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(pv)));
      } else
#endif
      {
        _mm512_store_ps(st.p + r * kBlock + v * 16, pv);
      }
    }
    const float l_new = st.l[row] * alpha[r] + _mm512_reduce_add_ps(sum);
    st.l[row] = l_new;
    st.m[row] = m_new;
    inv_l[r] = 1.f / l_new;
  }

  // O = alpha * O + P · V, in chunks of head_dim vectors.
  float* o = st.o + t * hd;
  for (int c0 = 0; c0 < sh.ndv;) {
    const int left = sh.ndv - c0;
    const int cn = left <= kMaxChunk ? left : (left <= 2 * kMaxChunk ? (left + 1) / 2 : kMaxChunk);
    const bool tail = c0 + cn == sh.ndv && sh.tail != 0xFFFF;
    float* out_c[kRows];
    for (int r = 0; r < kRows; ++r) out_c[r] = out_rows[r] + c0 * 16;
    float* oc = o + c0 * 16;
#if defined(__AVX512BF16__)
    if constexpr (kBf16) {
      const uint16_t* vc = in.vb + c0 * 32;
      const int jpn = (jn + 1) / 2;
#define IRIS_PV(CN)                                                                                            \
  (tail ? PvChunkBf16<CN, true>(sh.tail, vc, sh.dpad, jpn, st.pb, alpha, first, last, inv_l, out_c, rows_valid, oc, hd) \
        : PvChunkBf16<CN, false>(sh.tail, vc, sh.dpad, jpn, st.pb, alpha, first, last, inv_l, out_c, rows_valid, oc, hd))
      switch (cn) {
        case 1: IRIS_PV(1); break;
        case 2: IRIS_PV(2); break;
        case 3: IRIS_PV(3); break;
        case 4: IRIS_PV(4); break;
        default: IRIS_PV(5); break;
      }
#undef IRIS_PV
    } else
#endif
    {
      const float* vc = in.v0 + c0 * 16;
#define IRIS_PV(CN)                                                                                     \
  (tail ? PvChunk<CN, true>(sh.tail, vc, in.v_stride, jn, st.p, alpha, first, last, inv_l, out_c, rows_valid, oc, hd) \
        : PvChunk<CN, false>(sh.tail, vc, in.v_stride, jn, st.p, alpha, first, last, inv_l, out_c, rows_valid, oc, hd))
      switch (cn) {
        case 1: IRIS_PV(1); break;
        case 2: IRIS_PV(2); break;
        case 3: IRIS_PV(3); break;
        case 4: IRIS_PV(4); break;
        default: IRIS_PV(5); break;
      }
#undef IRIS_PV
    }
    c0 += cn;
  }
}

}  // namespace

namespace {

// Bytes from a 64-byte aligned base, each piece rounded up to 64 bytes.
struct Carver {
  char* base;
  size_t used = 0;
  template <typename T>
  T* Take(size_t count) {
    T* p = reinterpret_cast<T*>(base + used);
    used += (count * sizeof(T) + 63) / 64 * 64;
    return p;
  }
};

template <bool kBf16>
void Run(CpuDevice& dev, const AttentionArgs& a) {
  const int num_seqs = static_cast<int>(a.cu_seqlens.size()) - 1;
  const int kv_heads = a.num_kv_heads > 0 ? a.num_kv_heads : a.num_heads;
  const int group = a.num_heads / kv_heads;
  const int hd = a.head_dim;
  const int32_t* cu = a.cu_seqlens.data();

  Shape sh;
  sh.head_dim = hd;
  sh.ndv = (hd + 15) / 16;
  sh.tail = TailMask(hd - (sh.ndv - 1) * 16);
  sh.hp = (hd + 1) / 2;
  sh.dpad = sh.ndv * 16;
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

  // A packed key block: f32 Kt[d][64], or bf16 Ktb[d/2][64] words followed by Vb[32][dpad][2].
  const size_t kt_bytes = kBf16 ? static_cast<size_t>(sh.hp) * kBlock * 4 : static_cast<size_t>(hd) * kBlock * 4;
  const size_t vb_bytes = kBf16 ? static_cast<size_t>(kBlock) * sh.dpad * 2 : 0;
  const size_t block_bytes = (kt_bytes + 63) / 64 * 64 + vb_bytes;
  auto pack_block = [&](const float* k0, const float* v0, int kn, char* dst) {
#if defined(__AVX512BF16__)
    if constexpr (kBf16) {
      PackKtBf16(k0, a.k.row_stride, kn, hd, reinterpret_cast<uint32_t*>(dst));
      PackVBf16(v0, a.v.row_stride, kn, hd, sh.dpad, reinterpret_cast<uint16_t*>(dst + (kt_bytes + 63) / 64 * 64));
      return;
    }
#endif
    PackKt(k0, a.k.row_stride, kn, hd, reinterpret_cast<float*>(dst));
  };

  char* packed = nullptr;
  if (total_blocks > 0) {
    packed = static_cast<char*>(
        dev.Scratch(CpuDevice::kSlotPackedKeys, 0, static_cast<size_t>(kv_heads) * total_blocks * block_bytes));
    std::vector<std::pair<int32_t, int32_t>> blocks;  // (seq, block)
    blocks.reserve(total_blocks);
    for (int s = 0; s < num_seqs; ++s) {
      if (block_base[s] < 0) continue;
      const int n = cu[s + 1] - cu[s];
      for (int b = 0; b * kBlock < n; ++b) blocks.push_back({s, b});
    }
    const int64_t jobs = static_cast<int64_t>(kv_heads) * total_blocks;
#pragma omp parallel for num_threads(dev.threads()) schedule(static)
    for (int64_t job = 0; job < jobs; ++job) {
      const int g = static_cast<int>(job / total_blocks);
      const auto [s, b] = blocks[job % total_blocks];
      const int n = cu[s + 1] - cu[s];
      const int kn = std::min(kBlock, n - b * kBlock);
      const int64_t row0 = cu[s] + static_cast<int64_t>(b) * kBlock;
      const float* k0 = a.k.data + row0 * a.k.row_stride + static_cast<int64_t>(g) * a.k.head_stride;
      const float* v0 = a.v.data + row0 * a.v.row_stride + static_cast<int64_t>(g) * a.v.head_stride;
      pack_block(k0, v0, kn, packed + (g * total_blocks + block_base[s] + b) * block_bytes);
    }
  }

  const int64_t num_units = static_cast<int64_t>(units.size());
  auto geom = [&](const Unit& unit) {
    UnitGeom ug;
    ug.seq = unit.seq;
    ug.g = unit.head / group;
    ug.q0 = unit.q0;
    const int64_t t0 = cu[unit.seq];
    ug.n = cu[unit.seq + 1] - cu[unit.seq];
    ug.nq = std::min(kBlock, ug.n - unit.q0);
    // Keys this block needs: all, or up to its last query when causal.
    const int k_end = a.causal ? unit.q0 + ug.nq : ug.n;
    ug.nkb = (k_end + kBlock - 1) / kBlock;
    ug.prepacked = block_base[unit.seq] >= 0;
    ug.qh = a.q.data + (t0 + unit.q0) * a.q.row_stride + static_cast<int64_t>(unit.head) * a.q.head_stride;
    ug.kh = a.k.data + t0 * a.k.row_stride + static_cast<int64_t>(ug.g) * a.k.head_stride;
    ug.vh = a.v.data + t0 * a.v.row_stride + static_cast<int64_t>(ug.g) * a.v.head_stride;
    ug.oh = a.out + (t0 + unit.q0) * a.out_row_stride + static_cast<int64_t>(unit.head) * hd;
    return ug;
  };
  const int qb_stride = sh.hp * 2;  // bf16 q row: head_dim rounded up to even

#pragma omp parallel num_threads(dev.threads())
  {
    const size_t need = block_bytes + 64 + static_cast<size_t>(kBlock) * hd * 4 + kRows * kBlock * 4 + 64 +
                        kRows * kBlock * 2 + 64 + static_cast<size_t>(kBlock) * qb_stride * 2 + 64;
    Carver carve{static_cast<char*>(dev.Scratch(CpuDevice::kSlotTile, omp_get_thread_num(), need))};
    char* block_local = carve.Take<char>(block_bytes);
    UnitState st;
    st.o = carve.Take<float>(static_cast<size_t>(kBlock) * hd);
    st.p = carve.Take<float>(kRows * kBlock);
    st.pb = carve.Take<uint16_t>(kRows * kBlock);
    uint16_t* qb = carve.Take<uint16_t>(static_cast<size_t>(kBlock) * qb_stride);

    // Chunks of consecutive units per thread, so that the unit after this one is usually this
    // thread's own and its rows can be prefetched while this one computes.
    const int64_t chunk = std::clamp<int64_t>(num_units / (8 * omp_get_num_threads()), 1, 8);
#pragma omp for schedule(dynamic, chunk)
    for (int64_t u = 0; u < num_units; ++u) {
      const UnitGeom ug = geom(units[u]);
      for (int r = 0; r < kBlock; ++r) {
        st.m[r] = kNegInf;
        st.l[r] = 0.f;
      }
      TileInputs in{};
      in.v_stride = a.v.row_stride;
      if constexpr (kBf16) {
        for (int i = 0; i < ug.nq; ++i) {
          uint16_t* dst = qb + static_cast<size_t>(i) * qb_stride;
          cpu::FloatToBf16Row(ug.qh + i * a.q.row_stride, hd, dst);
          if (hd % 2) dst[hd] = 0;
        }
      }
      for (int kb = 0; kb < ug.nkb; ++kb) {
        const int kb0 = kb * kBlock;
        const int kn = std::min(kBlock, ug.n - kb0);
        const char* blk;
        if (!ug.prepacked) {
          pack_block(ug.kh, ug.vh, kn, block_local);
          blk = block_local;
        } else {
          blk = packed + (ug.g * total_blocks + block_base[ug.seq] + kb) * block_bytes;
        }
        in.kt = reinterpret_cast<const float*>(blk);
        in.ktb = reinterpret_cast<const uint32_t*>(blk);
        in.vb = reinterpret_cast<const uint16_t*>(blk + (kt_bytes + 63) / 64 * 64);
        in.v0 = ug.vh + static_cast<int64_t>(kb0) * a.v.row_stride;
        const bool first = kb == 0, last = kb == ug.nkb - 1;
        const int njv = (kn + 15) / 16;

        // What to prefetch (into L2) while this block computes: the next key block's V rows
        // (f32: read in place), or the next unit's Q, K and V rows. The loads they save are
        // strided rows (a page apart in a qkv buffer) that the hardware prefetchers miss.
        Prefetch next;
        if (!last) {
          if (!kBf16) next.Add(in.v0 + kBlock * a.v.row_stride, a.v.row_stride, std::min(kBlock, ug.n - kb0 - kBlock));
        } else if (u + 1 < num_units) {
          const UnitGeom nu = geom(units[u + 1]);
          next.Add(nu.qh, a.q.row_stride, nu.nq);
          if (!nu.prepacked) next.Add(nu.kh, a.k.row_stride, std::min(kBlock, nu.n));
          if (!nu.prepacked || !kBf16) next.Add(nu.vh, a.v.row_stride, std::min(kBlock, nu.n));
        }
        const int tiles = (ug.nq + kRows - 1) / kRows;

        for (int ti = 0; ti < tiles; ++ti) {
          const int t = ti * kRows;
          next.Issue(ti, tiles, hd);
          int qpos[kRows];
          float* out_rows[kRows];
          for (int r = 0; r < kRows; ++r) {
            const int i = std::min(t + r, ug.nq - 1);  // rows past the block repeat its last row
            in.q_rows[r] = ug.qh + i * a.q.row_stride;
            in.qb_rows[r] = qb + static_cast<size_t>(i) * qb_stride;
            qpos[r] = ug.q0 + i;
            out_rows[r] = ug.oh + i * a.out_row_stride;
          }
          const int rows_valid = std::min(kRows, ug.nq - t);
          switch (njv) {
            case 1: Tile<kBf16, 1>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t); break;
            case 2: Tile<kBf16, 2>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t); break;
            case 3: Tile<kBf16, 3>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t); break;
            default: Tile<kBf16, 4>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t); break;
          }
        }
      }
    }
  }
}

}  // namespace

void VarlenAttention(CpuDevice& dev, const AttentionArgs& a) {
  const int num_seqs = static_cast<int>(a.cu_seqlens.size()) - 1;
  if (num_seqs <= 0 || a.num_heads <= 0 || a.head_dim <= 0) return;
  const int kv_heads = a.num_kv_heads > 0 ? a.num_kv_heads : a.num_heads;
  if (a.num_heads % kv_heads != 0) {
    std::fprintf(stderr, "iris VarlenAttention: num_heads %d is not a multiple of num_kv_heads %d\n", a.num_heads,
                 kv_heads);
    std::abort();
  }
  if (a.bf16 && kHaveBf16 && dev.native_bf16()) {
    Run<true>(dev, a);
  } else {
    Run<false>(dev, a);
  }
}

}  // namespace iris::kernels::cpu::avx512
