// The flash-attention micro-kernels shared by VarlenAttention (attention.cc) and PagedAttention
// (paged_attention.cc): key packing, the QKᵀ and P·V micro-tiles in f32 and bf16, and the
// online-softmax tile that joins them. The two kernels differ only in where rows come from (a
// stride, or pointers gathered through block tables) and in what they prefetch while a tile
// computes; both are template parameters here.
//
// A key block is 64 keys. Keys are packed transposed (Kt[d][key], zero-padded to 64 keys) so that
// QKᵀ vectorises over keys: a micro-tile of 4 query vectors x 64 keys is 16 zmm accumulators fed
// by one broadcast of q[r][d] and four loads of Kt[d] per d. The softmax runs on those scores; P
// (4 x 64) goes to a small buffer and P·V broadcasts P[r][j] against V's rows (read in place,
// vectorised over head_dim, tail-masked).
//
// The bf16 variant runs both products on vdpbf16ps (pairs of bf16 products summed into f32): Kt
// is packed as bf16 pairs of dims (Ktb[d/2][key][2]), V as pairs of keys (Vb[key/2][d][2]), q and
// P are rounded to bf16; the softmax and all accumulation stay f32. It runs only at tier
// kAvx512Bf16 (the callers' Run<true>), so its roundings are the hardware's.
//
// Key and value rows may hold f32 or bf16 (paged bf16 KV pages, uint16_t bits): the f32 kernels
// widen bf16 rows on load (exact), the bf16 kernels pack bf16 rows as they are.
#pragma once

#include "kernels/cpu/simd.h"  // first: it sets up the intrinsics headers

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "core/isa_region.h"

IRIS_AVX512_BEGIN
namespace iris::kernels::cpu::avx512::flash {

constexpr int kKeys = 64;        // keys per key block (and per online-softmax step)
constexpr int kRows = 4;         // query vectors per micro-tile
constexpr int kMaxPvVectors = 5;  // head_dim vectors accumulated at once in P·V (4 x 5 = 20 zmm)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows at a fixed stride (varlen: rows of a qkv buffer).
struct StridedRows {
  const float* base;
  int64_t stride;
  const float* operator[](int64_t j) const { return base + j * stride; }
  StridedRows Cols(int c) const { return {base + c, stride}; }
};

// Rows through a pointer array, from column `col` on (paged: pool rows gathered through a block
// table), of float or of bf16 bits (uint16_t).
template <typename T>
struct IndirectRowsOf {
  const T* const* rows;
  int col;
  const T* operator[](int64_t j) const { return rows[j] + col; }
  IndirectRowsOf Cols(int c) const { return {rows, col + c}; }
};
using IndirectRows = IndirectRowsOf<float>;

// 16 elements of a row as f32 lanes (lanes outside m zero): f32 as is, bf16 widened (exact).
inline __m512 LoadF32(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 LoadF32(__mmask16 m, const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
inline __m512 LoadF32(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 LoadF32(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// 32 bf16 lanes: 16 elements from p0 (lanes outside m0 zero), then 16 from p1 (m1). f32 rows are
// rounded (AVX512-BF16: tier kAvx512Bf16 only), bf16 rows taken as they are.
inline __m512i Bf16x32(const float* p0, __mmask16 m0, const float* p1, __mmask16 m1) {
  return ToBf16x32<true>(_mm512_maskz_loadu_ps(m0, p0), _mm512_maskz_loadu_ps(m1, p1));
}
inline __m512i Bf16x32(const uint16_t* p0, __mmask16 m0, const uint16_t* p1, __mmask16 m1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_maskz_loadu_epi16(m0, p0)),
                            _mm256_maskz_loadu_epi16(m1, p1), 1);
}

// The prefetch hook of the micro-kernels' inner loops, for callers that prefetch elsewhere.
struct NoPrefetch {
  void Step() {}
};

// The geometry of one head, shared by every tile of a call.
struct Shape {
  int head_dim;
  int ndv;         // ceil(head_dim / 16)
  __mmask16 tail;  // valid lanes of the last head_dim vector
  int hp;          // bf16: pairs of dims, ceil(head_dim / 2)
  int dpad;        // bf16: head_dim padded to whole vectors (ndv * 16)
  float scale;
  bool causal;     // query at position p sees keys 0..p (positions relative to the key block)
};

inline Shape MakeShape(int head_dim, float scale, bool causal) {
  Shape sh;
  sh.head_dim = head_dim;
  sh.ndv = (head_dim + 15) / 16;
  sh.tail = TailMask(head_dim - (sh.ndv - 1) * 16);
  sh.hp = (head_dim + 1) / 2;
  sh.dpad = sh.ndv * 16;
  sh.scale = scale;
  sh.causal = causal;
  return sh;
}

// A packed key block: f32 Kt[d][64], or bf16 Ktb[d/2][64] words followed by Vb[32][dpad][2].
struct BlockLayout {
  size_t kt_bytes;
  size_t vb_offset;  // kt_bytes rounded up to 64
  size_t bytes;
};

template <bool kBf16>
BlockLayout MakeBlockLayout(const Shape& sh) {
  BlockLayout b;
  b.kt_bytes = kBf16 ? static_cast<size_t>(sh.hp) * kKeys * 4 : static_cast<size_t>(sh.head_dim) * kKeys * 4;
  b.vb_offset = (b.kt_bytes + 63) / 64 * 64;
  b.bytes = b.vb_offset + (kBf16 ? static_cast<size_t>(kKeys) * sh.dpad * 2 : 0);
  return b;
}

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

// The head_dim vectors one P·V call accumulates, of `left` still to do: at most 5, split evenly
// when 6..10 are left.
inline int PvVectors(int left) {
  return left <= kMaxPvVectors ? left : (left <= 2 * kMaxPvVectors ? (left + 1) / 2 : kMaxPvVectors);
}

// Packs keys [0, kn) of one head (key j at rows[j]) into kt[d * 64 + j] for
// j < 16 * ceil(kn / 16), zero for j >= kn.
template <typename Rows>
void PackKt(const Rows& rows, int kn, int head_dim, float* kt) {
  const int ngroups = (kn + 15) / 16;
  const int ndg = (head_dim + 15) / 16;
  for (int jg = 0; jg < ngroups; ++jg) {
    for (int dg = 0; dg < ndg; ++dg) {
      const __mmask16 dm = TailMask(head_dim - dg * 16);
      __m512 r[16];
      for (int t = 0; t < 16; ++t) {
        const int j = jg * 16 + t;
        r[t] = j < kn ? LoadF32(dm, rows[j] + dg * 16) : _mm512_setzero_ps();
      }
      Transpose16(r);
      const int dn = std::min(16, head_dim - dg * 16);
      for (int t = 0; t < dn; ++t) _mm512_store_ps(kt + (dg * 16 + t) * kKeys + jg * 16, r[t]);
    }
  }
}

// Accumulates P (kRows x jn, in p) times V rows [0, jn) (v[j], already offset to head_dim vector
// c0) into CN vectors of the tile's output rows (o and out_rows are offset to c0 as well). Only
// the head's last vector can be partial (kTail); full vectors use plain loads, which lets the
// compiler keep the accumulators in registers across the key loop.
template <int CN, bool kTail, typename VRows, typename Pf>
__attribute__((noinline)) void PvChunk(__mmask16 tail, VRows v, int jn, const float* p, const float* alpha,
                                       bool first, bool last, const float* inv_l, float* const out_rows[kRows],
                                       int rows_valid, float* o, int o_stride, Pf& pf) {
  // V rows: f32, or bf16 widened on load; o: f32.
  auto load = [tail](const auto* src, int c) {
    return (kTail && c == CN - 1) ? LoadF32(tail, src + c * 16) : LoadF32(src + c * 16);
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
    pf.Step();
    const auto* vr = v[j];
    __m512 vv[CN];
#pragma GCC unroll 8
    for (int c = 0; c < CN; ++c) {
      vv[c] = load(vr, c);
      asm("" : "+v"(vv[c]));  // one load per vector, not one per FMA
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r * kKeys + j]);
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
template <int NJV, typename Pf>
__attribute__((noinline)) void QkTile(const float* q0, const float* q1, const float* q2, const float* q3,
                                      const float* kt, int hd, float* s, Pf& pf) {
  __m512 acc[kRows][NJV];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int d = 0; d < hd; ++d) {
    pf.Step();
    __m512 kv[NJV];
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) {
      kv[v] = _mm512_load_ps(kt + d * kKeys + v * 16);
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
    for (int v = 0; v < NJV; ++v) _mm512_store_ps(s + r * kKeys + v * 16, acc[r][v]);
}

// Packs keys [0, kn) of one head as bf16 pairs of dims: word kt[p * 64 + j] holds
// (k[j][2p], k[j][2p+1]) for p < ceil(head_dim/2), j < 16 * ceil(kn/16); zero for j >= kn.
template <typename Rows>
void PackKtBf16(const Rows& rows, int kn, int head_dim, uint32_t* kt) {
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
          const auto* row = rows[j] + d0;
          r[t] = _mm512_castsi512_ps(Bf16x32(row, m0, row + 16, m1));
        } else {
          r[t] = _mm512_setzero_ps();
        }
      }
      Transpose16(r);  // 32-bit words: word w of key t -> vector w, lane t
      const int wn = std::min(16, hp - wg * 16);
      for (int t = 0; t < wn; ++t) {
        _mm512_store_si512(kt + (wg * 16 + t) * kKeys + jg * 16, _mm512_castps_si512(r[t]));
      }
    }
  }
}

// Packs V rows [0, kn) of one head as bf16 pairs of keys: vb[(jp * dpad + d) * 2 + i] holds
// v[2jp + i][d] for jp < ceil(kn/2), zero beyond kn and head_dim.
template <typename Rows>
void PackVBf16(const Rows& rows, int kn, int head_dim, int dpad, uint16_t* vb) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const int npairs = (kn + 1) / 2;
  for (int jp = 0; jp < npairs; ++jp) {
    const auto* a = rows[2 * jp];
    const bool has_b = 2 * jp + 1 < kn;
    const auto* b = has_b ? rows[2 * jp + 1] : a;
    for (int d = 0; d < dpad; d += 16) {
      const __mmask16 m = TailMask(std::max(0, head_dim - d));
      // [a0..a15 | b0..b15] as bf16, then interleaved to a0 b0 a1 b1 ...
      const __m512i both = Bf16x32(a + d, m, b + d, has_b ? m : __mmask16{0});
      _mm512_store_si512(vb + (static_cast<int64_t>(jp) * dpad + d) * 2, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

// bf16 twin of QkTile: q rows hold q in bf16 (pairs of dims), kt the packed key pairs.
template <int NJV, typename Pf>
__attribute__((noinline)) void QkTileBf16(const uint16_t* q0, const uint16_t* q1, const uint16_t* q2,
                                          const uint16_t* q3, const uint32_t* kt, int hp, float* s, Pf& pf) {
  __m512 acc[kRows][NJV];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) acc[r][v] = _mm512_setzero_ps();
  const uint32_t* qw[kRows] = {reinterpret_cast<const uint32_t*>(q0), reinterpret_cast<const uint32_t*>(q1),
                               reinterpret_cast<const uint32_t*>(q2), reinterpret_cast<const uint32_t*>(q3)};
  for (int p = 0; p < hp; ++p) {
    pf.Step();
    __m512i kv[NJV];
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) {
      kv[v] = _mm512_load_si512(kt + p * kKeys + v * 16);
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
    for (int v = 0; v < NJV; ++v) _mm512_store_ps(s + r * kKeys + v * 16, acc[r][v]);
}

// bf16 twin of PvChunk: vb is the packed V block (offset to vector c0), pb the bf16 P rows.
template <int CN, bool kTail, typename Pf>
__attribute__((noinline)) void PvChunkBf16(__mmask16 tail, const uint16_t* vb, int dpad, int jpn, const uint16_t* pb,
                                           const float* alpha, bool first, bool last, const float* inv_l,
                                           float* const out_rows[kRows], int rows_valid, float* o, int o_stride,
                                           Pf& pf) {
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
    pf.Step();
    const uint16_t* vr = vb + static_cast<int64_t>(jp) * dpad * 2;
    __m512i vv[CN];
#pragma GCC unroll 8
    for (int c = 0; c < CN; ++c) {
      vv[c] = _mm512_load_si512(vr + c * 32);
      asm("" : "+v"(vv[c]));
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512i pr = _mm512_set1_epi32(static_cast<int>(pw[r * (kKeys / 2) + jp]));
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

// Packs one key block of kn keys: Kt (f32), or Ktb then Vb (bf16) at dst (64-byte aligned).
template <bool kBf16, typename KRows, typename VRows>
void PackBlock(const Shape& sh, const BlockLayout& layout, const KRows& k, const VRows& v, int kn, char* dst) {
  if constexpr (kBf16) {
    PackKtBf16(k, kn, sh.head_dim, reinterpret_cast<uint32_t*>(dst));
    PackVBf16(v, kn, sh.head_dim, sh.dpad, reinterpret_cast<uint16_t*>(dst + layout.vb_offset));
    return;
  }
  PackKt(k, kn, sh.head_dim, reinterpret_cast<float*>(dst));
}

// Rounds n q rows (row_of(i)) to bf16 rows of qb_stride words, the odd head_dim's pad word zero.
template <typename RowOf>
void RoundRowsToBf16(int n, const RowOf& row_of, int head_dim, int qb_stride, uint16_t* qb) {
  for (int i = 0; i < n; ++i) {
    uint16_t* dst = qb + static_cast<size_t>(i) * qb_stride;
    FloatToBf16Row<true>(row_of(i), head_dim, dst);
    if (head_dim % 2) dst[head_dim] = 0;
  }
}

// The running state of a tile's query vectors: o[q][head_dim] (unnormalised output), m and l per
// q vector, and the current micro-tile's scores / probabilities.
struct TileState {
  float* o;
  float* m;
  float* l;
  float* p;      // [4][64]
  uint16_t* pb;  // bf16: [4][64]
};

// Where a micro-tile reads its operands: f32 rows and Kt, or the bf16 packed forms.
template <typename VRows>
struct TileInputs {
  const float* q_rows[kRows];      // f32
  const uint16_t* qb_rows[kRows];  // bf16
  const float* kt;                 // f32 Kt[d][64]
  const uint32_t* ktb;             // bf16 Ktb[d/2][64]
  VRows v;                         // f32 V rows of the key block
  const uint16_t* vb;              // bf16 Vb[key/2][dpad][2]
};

// One micro-tile: q vectors t..t+3 against one key block of kn keys starting at key kb0
// (NJV = ceil(kn/16)). qpos[r] is the position of q vector r: when causal it sees keys 0..qpos[r].
template <bool kBf16, int NJV, typename VRows, typename Pf>
inline void Tile(const Shape& sh, const TileInputs<VRows>& in, const int64_t qpos[kRows], int64_t kb0, int kn,
                 bool first, bool last, float* const out_rows[kRows], int rows_valid, TileState& st, int t, Pf& pf) {
  const int hd = sh.head_dim;
  if constexpr (kBf16) {
    QkTileBf16<NJV>(in.qb_rows[0], in.qb_rows[1], in.qb_rows[2], in.qb_rows[3], in.ktb, sh.hp, st.p, pf);
  } else {
    QkTile<NJV>(in.q_rows[0], in.q_rows[1], in.q_rows[2], in.q_rows[3], in.kt, hd, st.p, pf);
  }

  // Online softmax.
  const __m512 scale = _mm512_set1_ps(sh.scale);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  float alpha[kRows], inv_l[kRows];
  int jn = 0;  // keys with a nonzero probability in some row
  for (int r = 0; r < kRows; ++r) {
    const int limit = sh.causal ? static_cast<int>(std::clamp<int64_t>(qpos[r] - kb0 + 1, 0, kn)) : kn;
    jn = std::max(jn, limit);
    __m512 mx = _mm512_set1_ps(kNegInf);
    __m512 sv[NJV];
    for (int v = 0; v < NJV; ++v) {
      sv[v] = _mm512_mul_ps(_mm512_load_ps(st.p + r * kKeys + v * 16), scale);
      if (limit < (v + 1) * 16) {
        const __mmask16 valid = _mm512_cmp_epi32_mask(_mm512_add_epi32(iota, _mm512_set1_epi32(v * 16)),
                                                      _mm512_set1_epi32(limit), _MM_CMPINT_LT);
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
      const __m512 pv = Exp(_mm512_sub_ps(sv[v], mb));
      sum = _mm512_add_ps(sum, pv);
      if constexpr (kBf16) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(st.pb + r * kKeys + v * 16),
                           reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(pv)));
      } else {
        _mm512_store_ps(st.p + r * kKeys + v * 16, pv);
      }
    }
    const float l_new = st.l[row] * alpha[r] + _mm512_reduce_add_ps(sum);
    st.l[row] = l_new;
    st.m[row] = m_new;
    inv_l[r] = 1.f / l_new;
  }

  // O = alpha * O + P · V, in chunks of head_dim vectors.
  float* o = st.o + static_cast<int64_t>(t) * hd;
  for (int c0 = 0; c0 < sh.ndv;) {
    const int cn = PvVectors(sh.ndv - c0);
    const bool tail = c0 + cn == sh.ndv && sh.tail != 0xFFFF;
    float* out_c[kRows];
    for (int r = 0; r < kRows; ++r) out_c[r] = out_rows[r] + c0 * 16;
    float* oc = o + c0 * 16;
    if constexpr (kBf16) {
      const uint16_t* vc = in.vb + c0 * 32;
      const int jpn = (jn + 1) / 2;
#define IRIS_PV(CN)                                                                                           \
  (tail ? PvChunkBf16<CN, true>(sh.tail, vc, sh.dpad, jpn, st.pb, alpha, first, last, inv_l, out_c, rows_valid, \
                                oc, hd, pf)                                                                   \
        : PvChunkBf16<CN, false>(sh.tail, vc, sh.dpad, jpn, st.pb, alpha, first, last, inv_l, out_c, rows_valid, \
                                 oc, hd, pf))
      switch (cn) {
        case 1: IRIS_PV(1); break;
        case 2: IRIS_PV(2); break;
        case 3: IRIS_PV(3); break;
        case 4: IRIS_PV(4); break;
        default: IRIS_PV(5); break;
      }
#undef IRIS_PV
    } else {
      const VRows vc = in.v.Cols(c0 * 16);
#define IRIS_PV(CN)                                                                                                \
  (tail ? PvChunk<CN, true>(sh.tail, vc, jn, st.p, alpha, first, last, inv_l, out_c, rows_valid, oc, hd, pf)       \
        : PvChunk<CN, false>(sh.tail, vc, jn, st.p, alpha, first, last, inv_l, out_c, rows_valid, oc, hd, pf))
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

// Tile with NJV = ceil(kn / 16) chosen at run time.
template <bool kBf16, typename VRows, typename Pf>
inline void TileForKeys(const Shape& sh, const TileInputs<VRows>& in, const int64_t qpos[kRows], int64_t kb0, int kn,
                        bool first, bool last, float* const out_rows[kRows], int rows_valid, TileState& st, int t,
                        Pf& pf) {
  switch ((kn + 15) / 16) {
    case 1: return Tile<kBf16, 1>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t, pf);
    case 2: return Tile<kBf16, 2>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t, pf);
    case 3: return Tile<kBf16, 3>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t, pf);
    default: return Tile<kBf16, 4>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t, pf);
  }
}

}  // namespace iris::kernels::cpu::avx512::flash
IRIS_AVX512_END
