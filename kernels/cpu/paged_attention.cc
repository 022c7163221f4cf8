// Paged attention on AVX-512: the flash-style kernel of attention.cc, reading keys and values
// through block tables instead of from packed rows.
//
// Work items are (sequence, kv head, tile of query rows). An item holds every q head of its kv
// group for its rows (decode: 1 row x group heads; prefill: up to 64 / group rows x group heads),
// so each K/V row is read once per group, not once per q head. An item walks its keys in chunks
// of 64 (gathered across pages through the block table, so the block size is free) with an
// online softmax. Per chunk the keys are packed transposed (Kt[d][key]) so that QKᵀ vectorises
// over keys: a micro-tile is 4 q vectors x 64 keys = 16 zmm accumulators; P·V broadcasts P[r][j]
// against V's rows (read in place from the pool, vectorised over head_dim, tail-masked).
// Sequences split into several row tiles (prefills) have their chunks packed once up front and
// shared by the tiles. While a chunk computes, the next chunk's K and V rows are prefetched
// (pages are scattered, and the hardware prefetchers did not keep up with the gather).
//
// Items are sorted by cost (query vectors x keys) and handed out dynamically: a batch of decodes
// and the tiles of one long prefill both spread over all threads. (A single decode spreads over
// its kv heads only: keys are not split between threads.)
//
// The bf16 option (as in attention.cc): both products on vdpbf16ps from bf16-rounded q, k, v and
// p; the softmax and all accumulation stay f32. K is packed as pairs of dims, V as pairs of keys.
//
// Speed on the development machine (AMD EPYC, AVX512-BF16, one thread, 16/2 heads x 128, block
// size 16; kernels_bench --filter=paged): decode over K+V in L3 runs at ~22 GB/s f32 (~26 bf16),
// which is about the FMA bound for 8 q heads per kv head (2 x 8 x 128 MACs per 1 KB of K+V); from
// DRAM (batch 32 x 1024, 64 MiB) 8-13 GB/s against a 29-38 GB/s streaming read, limited by the
// misses the prefetches can keep in flight. Prefill of 1000 tokens (8/2 heads) at ~72% of the f32
// matmul peak, within 5% of VarlenAttention on the same data.
#include "kernels/cpu/cpu_ops.h"

#include "kernels/cpu/simd.h"  // first: it sets up the intrinsics headers

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace iris::kernels::cpu::avx512 {
namespace {

using cpu::PrefetchL2;
using cpu::TailMask;
using cpu::Transpose16;

constexpr int kChunk = 64;       // keys per online-softmax step
constexpr int kRows = 4;         // q vectors per micro-tile
constexpr int kMaxChunkV = 5;    // head_dim vectors accumulated at once in P·V (4 x 5 = 20 zmm)
constexpr int kTargetQ = 64;     // q vectors (rows x group heads) per work item
constexpr int kMaxHeadDim = 256;
constexpr int kInLoopPrefetchTiles = 4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "iris PagedAttention: %s\n", what);
  std::abort();
}

// The next chunk's K and V rows, prefetched a few cache lines at a time from inside the compute
// loops of the current chunk (QkTile's d loop, PvChunk's key loop) when an item has few tiles, or
// a slice before each tile when it has many. Issued in one burst, a chunk's 1024 lines (64 keys x
// 2 x 512 B) were no faster than no prefetch at all in decode (8 GB/s from DRAM on one thread;
// spread out: 13 GB/s): the burst stalls like the loads it replaces instead of overlapping with
// the arithmetic.
struct Prefetcher {
  // Up to three lists of rows (pool rows of K, of V, or one packed block as a single row).
  struct Segment {
    const float* const* rows;
    int n;         // rows
    int lines;     // prefetches per row
    int last_off;  // byte offset of a row's last byte
  };
  Segment seg[3];
  int nseg = 0;
  int per_step = 0;  // prefetches per Step()
  int si = 0, row = 0, line = 0;

  void Add(const float* const* rows, int n, int row_bytes, bool aligned) {
    if (n <= 0) return;
    // Whole cache lines: one prefetch per line; else one more for the straddled line.
    seg[nseg++] = {rows, n, aligned && row_bytes % 64 == 0 ? row_bytes / 64 : (row_bytes - 1) / 64 + 2,
                   row_bytes - 1};
  }
  int64_t Lines() const {
    int64_t total = 0;
    for (int i = 0; i < nseg; ++i) total += static_cast<int64_t>(seg[i].n) * seg[i].lines;
    return total;
  }
  inline void Step() {
    for (int i = 0; i < per_step; ++i) {
      if (si >= nseg) return;
      const Segment& g = seg[si];
      PrefetchL2(reinterpret_cast<const char*>(g.rows[row]) + std::min(line * 64, g.last_off));
      if (++line == g.lines) {
        line = 0;
        if (++row == g.n) {
          row = 0;
          ++si;
        }
      }
    }
  }
  // Whatever the loops did not get to.
  void Finish() {
    per_step = 1 << 30;
    Step();
  }
};


// Packs keys [0, kn) (key j at rows[j]) into kt[d * 64 + j] for j < 16 * ceil(kn / 16), zero
// for j >= kn.
void PackKt(const float* const* rows, int kn, int head_dim, float* kt) {
  const int ngroups = (kn + 15) / 16;
  const int ndg = (head_dim + 15) / 16;
  for (int jg = 0; jg < ngroups; ++jg) {
    for (int dg = 0; dg < ndg; ++dg) {
      const __mmask16 dm = TailMask(head_dim - dg * 16);
      __m512 r[16];
      for (int t = 0; t < 16; ++t) {
        const int j = jg * 16 + t;
        r[t] = j < kn ? _mm512_maskz_loadu_ps(dm, rows[j] + dg * 16) : _mm512_setzero_ps();
      }
      Transpose16(r);
      const int dn = std::min(16, head_dim - dg * 16);
      for (int t = 0; t < dn; ++t) _mm512_store_ps(kt + (dg * 16 + t) * kChunk + jg * 16, r[t]);
    }
  }
}

// S[r][0 .. 16*NJV) = q_r · Kt for the 4 q vectors of a micro-tile (unscaled), stored to s
// (rows of 64). Not inlined, so that the 16 accumulators stay in registers.
template <int NJV, bool kPf>
__attribute__((noinline)) void QkTile(const float* q0, const float* q1, const float* q2, const float* q3,
                                      const float* kt, int hd, float* s, Prefetcher& pf) {
  __m512 acc[kRows][NJV];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int d = 0; d < hd; ++d) {
    if constexpr (kPf) pf.Step();
    __m512 kv[NJV];
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) {
      kv[v] = _mm512_load_ps(kt + d * kChunk + v * 16);
      asm("" : "+v"(kv[v]));  // one load per key vector, not one per FMA
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
    for (int v = 0; v < NJV; ++v) _mm512_store_ps(s + r * kChunk + v * 16, acc[r][v]);
}

// Accumulates P (kRows x jn, in p) times V rows [0, jn) (row j at vrows[j] + c_off) into CN
// head_dim vectors of the tile's q vectors, starting at vector c0 (o and out_rows are already
// offset to it). Only the head's last vector can be partial (kTail).
template <int CN, bool kTail, bool kPf>
__attribute__((noinline)) void PvChunk(__mmask16 tail, const float* const* vrows, int c_off, int jn, const float* p,
                                       const float* alpha, bool first, bool last, const float* inv_l,
                                       float* const out_rows[kRows], int rows_valid, float* o, int o_stride,
                                       Prefetcher& pf) {
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
    if constexpr (kPf) pf.Step();
    const float* vr = vrows[j] + c_off;
    __m512 vv[CN];
#pragma GCC unroll 8
    for (int c = 0; c < CN; ++c) {
      vv[c] = load(vr, c);
      asm("" : "+v"(vv[c]));
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r * kChunk + j]);
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

#if defined(__AVX512BF16__)
constexpr bool kHaveBf16 = true;
using cpu::AsBh;

// Packs keys [0, kn) as bf16 pairs of dims: word kt[p * 64 + j] holds (k[j][2p], k[j][2p+1])
// for p < ceil(head_dim/2), j < 16 * ceil(kn/16); zero for j >= kn.
void PackKtBf16(const float* const* rows, int kn, int head_dim, uint32_t* kt) {
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
          const float* row = rows[j] + d0;
          r[t] = _mm512_castsi512_ps(
              cpu::ToBf16x32(_mm512_maskz_loadu_ps(m0, row), _mm512_maskz_loadu_ps(m1, row + 16)));
        } else {
          r[t] = _mm512_setzero_ps();
        }
      }
      Transpose16(r);  // 32-bit words: word w of key t -> vector w, lane t
      const int wn = std::min(16, hp - wg * 16);
      for (int t = 0; t < wn; ++t) {
        _mm512_store_si512(kt + (wg * 16 + t) * kChunk + jg * 16, _mm512_castps_si512(r[t]));
      }
    }
  }
}

// Packs V rows [0, kn) as bf16 pairs of keys: vb[(jp * dpad + d) * 2 + i] holds v[2jp + i][d]
// for jp < ceil(kn/2), zero beyond kn and head_dim.
void PackVBf16(const float* const* rows, int kn, int head_dim, int dpad, uint16_t* vb) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const int npairs = (kn + 1) / 2;
  for (int jp = 0; jp < npairs; ++jp) {
    const float* a = rows[2 * jp];
    const bool has_b = 2 * jp + 1 < kn;
    const float* b = has_b ? rows[2 * jp + 1] : a;
    for (int d = 0; d < dpad; d += 16) {
      const __mmask16 m = TailMask(std::max(0, head_dim - d));
      const __m512 va = _mm512_maskz_loadu_ps(m, a + d);
      const __m512 vbv = has_b ? _mm512_maskz_loadu_ps(m, b + d) : _mm512_setzero_ps();
      const __m512i both = cpu::ToBf16x32(va, vbv);
      _mm512_store_si512(vb + (static_cast<int64_t>(jp) * dpad + d) * 2, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

template <int NJV, bool kPf>
__attribute__((noinline)) void QkTileBf16(const uint16_t* q0, const uint16_t* q1, const uint16_t* q2,
                                          const uint16_t* q3, const uint32_t* kt, int hp, float* s,
                                          Prefetcher& pf) {
  __m512 acc[kRows][NJV];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) acc[r][v] = _mm512_setzero_ps();
  const uint32_t* qw[kRows] = {reinterpret_cast<const uint32_t*>(q0), reinterpret_cast<const uint32_t*>(q1),
                               reinterpret_cast<const uint32_t*>(q2), reinterpret_cast<const uint32_t*>(q3)};
  for (int p = 0; p < hp; ++p) {
    if constexpr (kPf) pf.Step();
    __m512i kv[NJV];
#pragma GCC unroll 4
    for (int v = 0; v < NJV; ++v) {
      kv[v] = _mm512_load_si512(kt + p * kChunk + v * 16);
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
    for (int v = 0; v < NJV; ++v) _mm512_store_ps(s + r * kChunk + v * 16, acc[r][v]);
}

template <int CN, bool kTail, bool kPf>
__attribute__((noinline)) void PvChunkBf16(__mmask16 tail, const uint16_t* vb, int dpad, int jpn, const uint16_t* pb,
                                           const float* alpha, bool first, bool last, const float* inv_l,
                                           float* const out_rows[kRows], int rows_valid, float* o, int o_stride,
                                       Prefetcher& pf) {
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
    if constexpr (kPf) pf.Step();
    const uint16_t* vr = vb + static_cast<int64_t>(jp) * dpad * 2;
    __m512i vv[CN];
#pragma GCC unroll 8
    for (int c = 0; c < CN; ++c) {
      vv[c] = _mm512_load_si512(vr + c * 32);
      asm("" : "+v"(vv[c]));
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512i pr = _mm512_set1_epi32(static_cast<int>(pw[r * (kChunk / 2) + jp]));
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

struct Shape {
  int head_dim;
  int ndv;         // ceil(head_dim / 16)
  __mmask16 tail;  // valid lanes of the last head_dim vector
  int hp;          // bf16: pairs of dims, ceil(head_dim / 2)
  int dpad;        // bf16: head_dim padded to whole vectors (ndv * 16)
  float scale;
};

// Per-item running state: o[q][head_dim] (unnormalised output), m and l per q vector, and the
// current micro-tile's scores/probabilities.
struct ItemState {
  float* o;
  float* m;
  float* l;
  float* p;      // [4][64]
  uint16_t* pb;  // bf16: [4][64]
};

// Where a micro-tile reads its operands.
struct TileInputs {
  const float* q_rows[kRows];      // f32
  const uint16_t* qb_rows[kRows];  // bf16
  const float* kt;                 // f32 Kt[d][64]
  const uint32_t* ktb;             // bf16 Ktb[d/2][64]
  const float* const* vrows;       // f32 V rows of the chunk
  const uint16_t* vb;              // bf16 Vb[key/2][dpad][2]
};

// One micro-tile: q vectors t..t+3 of the item against one chunk of kn keys starting at key kb0
// (NJV = ceil(kn/16)). qpos[r] is the position of q vector r (it sees keys 0..qpos[r]).
template <bool kBf16, int NJV, bool kPf>
inline void Tile(const Shape& sh, const TileInputs& in, const int64_t qpos[kRows], int64_t kb0, int kn, bool first,
                 bool last, float* const out_rows[kRows], int rows_valid, ItemState& st, int t, Prefetcher& pf) {
  const int hd = sh.head_dim;
#if defined(__AVX512BF16__)
  if constexpr (kBf16) {
    QkTileBf16<NJV, kPf>(in.qb_rows[0], in.qb_rows[1], in.qb_rows[2], in.qb_rows[3], in.ktb, sh.hp, st.p, pf);
  } else
#endif
  {
    QkTile<NJV, kPf>(in.q_rows[0], in.q_rows[1], in.q_rows[2], in.q_rows[3], in.kt, hd, st.p, pf);
  }

  // Online softmax.
  const __m512 scale = _mm512_set1_ps(sh.scale);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  float alpha[kRows], inv_l[kRows];
  int jn = 0;  // keys with a nonzero probability in some row
  for (int r = 0; r < kRows; ++r) {
    const int limit = static_cast<int>(std::clamp<int64_t>(qpos[r] - kb0 + 1, 0, kn));
    jn = std::max(jn, limit);
    __m512 mx = _mm512_set1_ps(kNegInf);
    __m512 sv[NJV];
    for (int v = 0; v < NJV; ++v) {
      sv[v] = _mm512_mul_ps(_mm512_load_ps(st.p + r * kChunk + v * 16), scale);
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
      const __m512 pv = cpu::Exp(_mm512_sub_ps(sv[v], mb));
      sum = _mm512_add_ps(sum, pv);
#if defined(__AVX512BF16__)
      if constexpr (kBf16) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(st.pb + r * kChunk + v * 16),
                           reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(pv)));
      } else
#endif
      {
        _mm512_store_ps(st.p + r * kChunk + v * 16, pv);
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
    const int left = sh.ndv - c0;
    const int cn = left <= kMaxChunkV ? left : (left <= 2 * kMaxChunkV ? (left + 1) / 2 : kMaxChunkV);
    const bool tail = c0 + cn == sh.ndv && sh.tail != 0xFFFF;
    float* out_c[kRows];
    for (int r = 0; r < kRows; ++r) out_c[r] = out_rows[r] + c0 * 16;
    float* oc = o + c0 * 16;
#if defined(__AVX512BF16__)
    if constexpr (kBf16) {
      const uint16_t* vc = in.vb + c0 * 32;
      const int jpn = (jn + 1) / 2;
#define IRIS_PV(CN)                                                                                             \
  (tail ? PvChunkBf16<CN, true, kPf>(sh.tail, vc, sh.dpad, jpn, st.pb, alpha, first, last, inv_l, out_c, rows_valid, oc, hd, pf) \
        : PvChunkBf16<CN, false, kPf>(sh.tail, vc, sh.dpad, jpn, st.pb, alpha, first, last, inv_l, out_c, rows_valid, oc, hd, pf))
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
#define IRIS_PV(CN)                                                                                             \
  (tail ? PvChunk<CN, true, kPf>(sh.tail, in.vrows, c0 * 16, jn, st.p, alpha, first, last, inv_l, out_c, rows_valid, oc, hd, pf) \
        : PvChunk<CN, false, kPf>(sh.tail, in.vrows, c0 * 16, jn, st.p, alpha, first, last, inv_l, out_c, rows_valid, oc, hd, pf))
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

// One sequence of the step, read from the flat metadata.
struct PagedSequence {
  std::span<const int32_t> block_table;
  int64_t context_len = 0;
  int64_t q_begin = 0;
  int64_t q_len = 0;
};

struct Item {
  int32_t seq;
  int32_t g;      // kv head
  int32_t row0;   // first query row, relative to the sequence's q_begin
  int32_t nrows;
  int64_t cost;   // q vectors x keys
};

// The pool rows of keys [kb0, kb0 + kn) of kv head g of a sequence.
void GatherRows(const PagedKvLayer& L, const PagedSequence& s, int g, int64_t kb0, int kn, const float** krows,
                const float** vrows) {
  const int bs = L.block_size;
  const int64_t row_floats = static_cast<int64_t>(L.num_kv_heads) * L.head_dim;
  const int64_t head_off = static_cast<int64_t>(g) * L.head_dim;
  int j = 0;
  while (j < kn) {
    const int64_t t = kb0 + j;
    const int64_t blk = s.block_table[t / bs];
    const int off = static_cast<int>(t % bs);
    const int n = std::min(kn - j, bs - off);
    const int64_t base = (blk * bs + off) * row_floats + head_off;
    for (int i = 0; i < n; ++i) {
      krows[j + i] = L.k + base + i * row_floats;
      vrows[j + i] = L.v + base + i * row_floats;
    }
    j += n;
  }
}

template <bool kBf16>
void Run(CpuDevice& dev, const PagedAttentionArgs& a, std::span<const PagedSequence> seqs, const std::vector<Item>& items,
         int group, int max_q) {
  const PagedKvLayer& L = a.layer;
  const int hd = L.head_dim;
  Shape sh;
  sh.head_dim = hd;
  sh.ndv = (hd + 15) / 16;
  sh.tail = TailMask(hd - (sh.ndv - 1) * 16);
  sh.hp = (hd + 1) / 2;
  sh.dpad = sh.ndv * 16;
  sh.scale = a.scale;

  // A packed chunk: f32 Kt[d][64], or bf16 Ktb[d/2][64] words followed by Vb[32][dpad][2].
  const size_t kt_bytes = kBf16 ? static_cast<size_t>(sh.hp) * kChunk * 4 : static_cast<size_t>(hd) * kChunk * 4;
  const size_t vb_bytes = kBf16 ? static_cast<size_t>(kChunk) * sh.dpad * 2 : 0;
  const int qb_stride = sh.hp * 2;  // bf16 q row: head_dim rounded up to even
  const int64_t num_items = static_cast<int64_t>(items.size());
  // Whole cache lines per row: one prefetch per line, else one more for the straddled line.
  const bool rows_aligned = (hd * 4) % 64 == 0 && reinterpret_cast<uintptr_t>(L.k) % 64 == 0 &&
                            reinterpret_cast<uintptr_t>(L.v) % 64 == 0;
  // A micro-tile reads and writes the state of 4 q vectors even past the item's last one.
  const int max_q_state = (max_q + kRows - 1) / kRows * kRows;
  const size_t block_bytes = (kt_bytes + 63) / 64 * 64 + vb_bytes;

  // Sequences split into several row tiles (prefills) share their key chunks between the
  // tiles: those chunks are packed once up front, [seq][kv head][chunk], instead of per item.
  std::vector<int64_t> pack_base(seqs.size(), -1);
  int64_t total_packed = 0;
  {
    std::vector<int> tiles_of(seqs.size(), 0);
    for (const Item& item : items) tiles_of[item.seq] += item.g == 0;
    for (size_t si = 0; si < seqs.size(); ++si) {
      if (tiles_of[si] < 2) continue;
      pack_base[si] = total_packed;
      total_packed += L.num_kv_heads * ((seqs[si].context_len + kChunk - 1) / kChunk);
    }
  }
  char* packed = nullptr;
  if (total_packed > 0) {
    packed = static_cast<char*>(
        dev.Scratch(CpuDevice::kSlotPackedKeys, 0, static_cast<size_t>(total_packed) * block_bytes));
    std::vector<std::pair<int32_t, int64_t>> jobs;  // (seq, chunk of all its kv heads)
    jobs.reserve(total_packed);
    for (size_t si = 0; si < seqs.size(); ++si) {
      if (pack_base[si] < 0) continue;
      const int64_t nch = (seqs[si].context_len + kChunk - 1) / kChunk;
      for (int64_t j = 0; j < L.num_kv_heads * nch; ++j) jobs.push_back({static_cast<int32_t>(si), j});
    }
#pragma omp parallel for num_threads(dev.threads()) schedule(static)
    for (size_t j = 0; j < jobs.size(); ++j) {
      const auto [si, gc] = jobs[j];
      const PagedSequence& s = seqs[si];
      const int64_t nch = (s.context_len + kChunk - 1) / kChunk;
      const int g = static_cast<int>(gc / nch);
      const int64_t c = gc % nch;
      const int kn = static_cast<int>(std::min<int64_t>(kChunk, s.context_len - c * kChunk));
      const float* krows[kChunk];
      const float* vrows[kChunk];
      GatherRows(L, s, g, c * kChunk, kn, krows, vrows);
      char* dst = packed + (pack_base[si] + gc) * block_bytes;
#if defined(__AVX512BF16__)
      if constexpr (kBf16) {
        PackKtBf16(krows, kn, hd, reinterpret_cast<uint32_t*>(dst));
        PackVBf16(vrows, kn, hd, sh.dpad, reinterpret_cast<uint16_t*>(dst + (kt_bytes + 63) / 64 * 64));
        continue;
      }
#endif
      PackKt(krows, kn, hd, reinterpret_cast<float*>(dst));
    }
  }

#pragma omp parallel num_threads(dev.threads()) if (num_items > 1)
  {
    const size_t need = (kt_bytes + 64) + (vb_bytes + 64) + (static_cast<size_t>(max_q_state) * hd * 4 + 64) +
                        2 * (static_cast<size_t>(max_q_state) * 4 + 64) + (kRows * kChunk * 4 + 64) +
                        (kRows * kChunk * 2 + 64) + (static_cast<size_t>(max_q) * qb_stride * 2 + 64) +
                        4 * (kChunk * sizeof(float*) + 64);
    Carver carve{static_cast<char*>(dev.Scratch(CpuDevice::kSlotTile, omp_get_thread_num(), need))};
    float* kt = carve.Take<float>(kt_bytes / 4);
    uint16_t* vb = carve.Take<uint16_t>(vb_bytes / 2);
    ItemState st;
    st.o = carve.Take<float>(static_cast<size_t>(max_q_state) * hd);
    st.m = carve.Take<float>(max_q_state);
    st.l = carve.Take<float>(max_q_state);
    st.p = carve.Take<float>(kRows * kChunk);
    st.pb = carve.Take<uint16_t>(kRows * kChunk);
    uint16_t* qb = carve.Take<uint16_t>(static_cast<size_t>(max_q) * qb_stride);
    const float** rows[2][2];  // [buffer][k, v]: this chunk's and the next chunk's pool rows
    for (auto& b : rows)
      for (auto& r : b) r = carve.Take<const float*>(kChunk);

#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < num_items; ++it) {
      const Item& item = items[it];
      const PagedSequence& s = seqs[item.seq];
      const int nq = item.nrows * group;
      const int64_t pos0 = s.context_len - s.q_len + item.row0;  // position of the item's first row
      const int64_t kend = pos0 + item.nrows;                    // keys [0, kend)
      const int64_t nchunks = (kend + kChunk - 1) / kChunk;
      const int h0 = item.g * group;
      auto q_ptr = [&](int r) {
        return a.q + (s.q_begin + item.row0 + r / group) * a.q_row_stride + static_cast<int64_t>(h0 + r % group) * hd;
      };
      auto out_ptr = [&](int r) {
        return a.out + (s.q_begin + item.row0 + r / group) * a.out_row_stride +
               static_cast<int64_t>(h0 + r % group) * hd;
      };
      for (int r = 0; r < (nq + kRows - 1) / kRows * kRows; ++r) {
        st.m[r] = kNegInf;
        st.l[r] = 0.f;
      }
      if constexpr (kBf16) {
        for (int r = 0; r < nq; ++r) {
          uint16_t* dst = qb + static_cast<size_t>(r) * qb_stride;
          cpu::FloatToBf16Row(q_ptr(r), hd, dst);
          if (hd % 2) dst[hd] = 0;
        }
      }
      const int tiles = (nq + kRows - 1) / kRows;
      // Few tiles (decode: 1 row x group heads): prefetches go inside the loops. Many tiles:
      // a slice before each tile, keeping the inner loops free of them.
      const bool in_loop = tiles <= kInLoopPrefetchTiles;
      const int qk_steps = kBf16 ? sh.hp : hd;
      int pv_groups = 0;  // calls of PvChunk per tile, as Tile splits head_dim
      for (int c0 = 0, left = sh.ndv; left > 0; ++pv_groups) {
        const int cn = left <= kMaxChunkV ? left : (left <= 2 * kMaxChunkV ? (left + 1) / 2 : kMaxChunkV);
        c0 += cn;
        left -= cn;
      }
      TileInputs in{};
      // This item's packed chunk c: prepacked, or packed here into kt / vb.
      const bool prepacked = pack_base[item.seq] >= 0;
      const int64_t seq_chunks = (s.context_len + kChunk - 1) / kChunk;
      auto packed_chunk = [&](int64_t c) {
        return packed + (pack_base[item.seq] + item.g * seq_chunks + c) * block_bytes;
      };
      GatherRows(L, s, item.g, 0, static_cast<int>(std::min<int64_t>(kChunk, kend)), rows[0][0], rows[0][1]);
      for (int64_t c = 0; c < nchunks; ++c) {
        const int64_t kb0 = c * kChunk;
        const int kn = static_cast<int>(std::min<int64_t>(kChunk, kend - kb0));
        const float** krows = rows[c & 1][0];
        const float** vrows = rows[c & 1][1];
        // The next chunk's rows, prefetched into L2 while this one computes: spread over the
        // loop iterations the chunk's tiles will run (QK over head_dim, P·V over keys for each
        // group of up to 5 head_dim vectors).
        Prefetcher pf;
        const float* next_block = nullptr;
        if (c + 1 < nchunks) {
          const int kn_next = static_cast<int>(std::min<int64_t>(kChunk, kend - kb0 - kChunk));
          const float** nk = rows[(c + 1) & 1][0];
          const float** nv = rows[(c + 1) & 1][1];
          GatherRows(L, s, item.g, kb0 + kChunk, kn_next, nk, nv);
          if (prepacked) {
            next_block = reinterpret_cast<const float*>(packed_chunk(c + 1));
            pf.Add(&next_block, 1, static_cast<int>(kBf16 ? block_bytes : kt_bytes), true);
          } else {
            pf.Add(nk, kn_next, hd * 4, rows_aligned);
          }
          if (!(prepacked && kBf16)) pf.Add(nv, kn_next, hd * 4, rows_aligned);
          const int64_t steps =
              in_loop ? static_cast<int64_t>(tiles) * (qk_steps + pv_groups * (kBf16 ? (kn + 1) / 2 : kn)) : tiles;
          pf.per_step = static_cast<int>((pf.Lines() + steps - 1) / steps);
        }
        const char* blk = reinterpret_cast<const char*>(kt);
        if (prepacked) {
          blk = packed_chunk(c);
        } else {
#if defined(__AVX512BF16__)
          if constexpr (kBf16) {
            PackKtBf16(krows, kn, hd, reinterpret_cast<uint32_t*>(kt));
            PackVBf16(vrows, kn, hd, sh.dpad, vb);
          } else
#endif
          {
            PackKt(krows, kn, hd, kt);
          }
        }
        in.kt = reinterpret_cast<const float*>(blk);
        in.ktb = reinterpret_cast<const uint32_t*>(blk);
        in.vb = prepacked ? reinterpret_cast<const uint16_t*>(blk + (kt_bytes + 63) / 64 * 64) : vb;
        in.vrows = vrows;
        const bool first = c == 0, last = c == nchunks - 1;
        const int njv = (kn + 15) / 16;
        for (int ti = 0; ti < tiles; ++ti) {
          const int t = ti * kRows;
          int64_t qpos[kRows];
          float* out_rows[kRows];
          for (int r = 0; r < kRows; ++r) {
            const int i = std::min(t + r, nq - 1);  // q vectors past the item repeat its last one
            in.q_rows[r] = q_ptr(i);
            in.qb_rows[r] = qb + static_cast<size_t>(i) * qb_stride;
            qpos[r] = pos0 + i / group;
            out_rows[r] = out_ptr(i);
          }
          const int rows_valid = std::min(kRows, nq - t);
#define IRIS_TILE(NJV, PF) Tile<kBf16, NJV, PF>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t, pf)
          if (in_loop) {
            switch (njv) {
              case 1: IRIS_TILE(1, true); break;
              case 2: IRIS_TILE(2, true); break;
              case 3: IRIS_TILE(3, true); break;
              default: IRIS_TILE(4, true); break;
            }
          } else {
            pf.Step();
            switch (njv) {
              case 1: IRIS_TILE(1, false); break;
              case 2: IRIS_TILE(2, false); break;
              case 3: IRIS_TILE(3, false); break;
              default: IRIS_TILE(4, false); break;
            }
          }
#undef IRIS_TILE
        }
        pf.Finish();
      }
    }
  }
}

}  // namespace

void WritePagedKv(CpuDevice& dev, const PagedKvLayer& layer, const float* k, int64_t k_row_stride, const float* v,
                  int64_t v_row_stride, std::span<const int64_t> slots) {
  if (slots.empty()) return;
  if (layer.k == nullptr || layer.v == nullptr || layer.block_size <= 0 || layer.num_kv_heads <= 0 ||
      layer.head_dim <= 0) {
    std::fprintf(stderr, "iris WritePagedKv: bad layer\n");
    std::abort();
  }
  const int64_t num_slots = layer.num_blocks * layer.block_size;
  const int64_t row = static_cast<int64_t>(layer.num_kv_heads) * layer.head_dim;
  const int64_t n = static_cast<int64_t>(slots.size());
  for (int64_t r = 0; r < n; ++r) {
    if (slots[r] < 0 || slots[r] >= num_slots) {
      std::fprintf(stderr, "iris WritePagedKv: slot %lld out of range [0, %lld)\n", static_cast<long long>(slots[r]),
                   static_cast<long long>(num_slots));
      std::abort();
    }
  }
  // A prefill writes ~1 MB per layer; small writes stay on the calling thread.
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (n * row >= (1 << 16))
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(layer.k + slots[r] * row, k + r * k_row_stride, static_cast<size_t>(row) * sizeof(float));
    std::memcpy(layer.v + slots[r] * row, v + r * v_row_stride, static_cast<size_t>(row) * sizeof(float));
  }
}

void PagedAttention(CpuDevice& dev, const PagedAttentionArgs& a) {
  const PagedKvLayer& L = a.layer;
  const PagedMetadata& md = a.metadata;
  if (md.num_seqs <= 0) return;
  if (static_cast<int64_t>(md.query_start.size()) < md.num_seqs + 1 ||
      static_cast<int64_t>(md.context_lens.size()) < md.num_seqs || md.max_blocks_per_seq < 0 ||
      static_cast<int64_t>(md.block_tables.size()) < int64_t{md.num_seqs} * md.max_blocks_per_seq) {
    Fail("metadata arrays shorter than num_seqs");
  }
  std::vector<PagedSequence> seqs(md.num_seqs);
  for (int si = 0; si < md.num_seqs; ++si) {
    PagedSequence& s = seqs[si];
    s.block_table = md.block_tables.subspan(static_cast<size_t>(si) * md.max_blocks_per_seq, md.max_blocks_per_seq);
    s.context_len = md.context_lens[si];
    s.q_begin = md.query_start[si];
    s.q_len = md.query_start[si + 1] - md.query_start[si];
  }
  if (L.num_kv_heads <= 0 || a.num_heads <= 0 || a.num_heads % L.num_kv_heads != 0) {
    std::fprintf(stderr, "iris PagedAttention: num_heads %d is not a positive multiple of num_kv_heads %d\n",
                 a.num_heads, L.num_kv_heads);
    std::abort();
  }
  if (L.head_dim <= 0 || L.head_dim > kMaxHeadDim) Fail("head_dim must be in 1..256");
  if (L.block_size <= 0) Fail("block_size must be positive");
  if (L.k == nullptr || L.v == nullptr || a.q == nullptr || a.out == nullptr) Fail("null pointer");
  const int group = a.num_heads / L.num_kv_heads;
  // Rows per item: all q heads of a group for up to kTargetQ q vectors.
  const int tile_rows = std::max(1, kTargetQ / group);

  std::vector<Item> items;
  int max_q = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const PagedSequence& s = seqs[si];
    if (s.q_len < 0 || s.q_len > s.context_len || s.q_begin < 0) Fail("bad sequence: need 0 <= q_len <= context_len");
    if (s.q_len == 0) continue;
    const int64_t nblocks = (s.context_len + L.block_size - 1) / L.block_size;
    if (static_cast<int64_t>(s.block_table.size()) < nblocks) Fail("block table shorter than the context");
    for (int64_t b = 0; b < nblocks; ++b) {
      if (s.block_table[b] < 0 || s.block_table[b] >= L.num_blocks) Fail("block id out of range");
    }
    for (int64_t r0 = 0; r0 < s.q_len; r0 += tile_rows) {
      const int nrows = static_cast<int>(std::min<int64_t>(tile_rows, s.q_len - r0));
      const int64_t keys = s.context_len - s.q_len + r0 + nrows;
      for (int g = 0; g < L.num_kv_heads; ++g) {
        items.push_back({static_cast<int32_t>(si), g, static_cast<int32_t>(r0), nrows,
                         static_cast<int64_t>(nrows) * group * keys});
      }
      max_q = std::max(max_q, nrows * group);
    }
  }
  if (items.empty()) return;
  // Longest first, so that the dynamic schedule ends with short items (causal prefill tiles and
  // decodes over short contexts).
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });

  if (a.bf16 && kHaveBf16 && dev.native_bf16()) {
    Run<true>(dev, a, seqs, items, group, max_q);
  } else {
    Run<false>(dev, a, seqs, items, group, max_q);
  }
}

}  // namespace iris::kernels::cpu::avx512
