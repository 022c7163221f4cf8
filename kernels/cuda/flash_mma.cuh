// iris's tensor-core flash attention for varlen attention in the bf16 compute mode (device code
// against simt.h: nvcc builds it in attention_kernels.cu, the SIMT harness runs it in CI, the
// tensor-core product through MmaBf16's scalar twin). The numerics of the CPU's bf16 path
// (AttentionArgs::bf16): q, k, v and the probabilities rounded to bf16, products exact, softmax
// and every sum in f32.
//
// A block owns kMmaFlashRows = 64 query rows of one (sequence, q head): grid (num_seqs,
// ceil(max_seqlen / 64), num_heads), 4 warps of 16 rows each. The warp's q rows live in
// registers as mma A fragments for the whole block. Keys come in tiles of 64: the block converts
// K (row-major) and V (transposed, so that two keys of one head dim are one 32-bit word, as the B
// fragment wants them) from the f32 activations to bf16 in shared memory; each warp then computes
// S = q·kᵀ (8 n-tiles of 8 keys), the online-softmax update on S's accumulator fragments (a row's
// values sit in the 4 lanes of a group: two shuffles reduce them), and O += P·V with P's
// accumulator fragments reused as A fragments (two 16x8 S tiles are one 16x16 A tile). The head
// dim is a template parameter (rounded up to 16: the padding dims are zeros), so every fragment
// array is indexed with constants and stays in registers.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/simt.h"
#include "kernels/cuda/varlen_block_rows.cuh"

namespace iris::kernels::cuda {

constexpr int kMmaFlashWarps = 4;
constexpr int kMmaFlashRows = kMmaFlashWarps * 16;
constexpr int kMmaFlashThreads = kMmaFlashWarps * 32;
constexpr int kMmaFlashKeys = 64;
constexpr int kMmaFlashMaxHeadDim = 128;

// The head dim the kernel is instantiated for: head_dim rounded up to the mma's k (16).
constexpr int MmaFlashDim(int head_dim) { return (head_dim + 15) / 16 * 16; }

template <int kDim>
struct MmaFlashDimTag {
  static constexpr int value = kDim;
};

// f(MmaFlashDimTag<MmaFlashDim(head_dim)>{}) for head dims 1..128 (the launch and the harness
// tests pick the instantiation the same way).
template <typename F>
void WithMmaFlashDim(int head_dim, F&& f) {
  switch (MmaFlashDim(head_dim)) {
    case 16: return f(MmaFlashDimTag<16>{});
    case 32: return f(MmaFlashDimTag<32>{});
    case 48: return f(MmaFlashDimTag<48>{});
    case 64: return f(MmaFlashDimTag<64>{});
    case 80: return f(MmaFlashDimTag<80>{});
    case 96: return f(MmaFlashDimTag<96>{});
    case 112: return f(MmaFlashDimTag<112>{});
    default: return f(MmaFlashDimTag<128>{});
  }
}

// Row strides of the shared K and V tiles in 32-bit words (two bf16), padded by 4 words so that
// the 8 groups of a warp reading 8 rows at the same column hit 8 different bank quadruples.
template <int kDim>
constexpr int kMmaFlashKWords = kDim / 2 + 4;
constexpr int kMmaFlashVWords = kMmaFlashKeys / 2 + 4;

// One tile's K (row-major) and V (transposed) as bf16 pairs in shared memory, from K and V rows
// that are whole 16-byte vectors: each thread issues all of its kDim / 8 K loads before it stores
// any, then likewise its kDim / 8 V loads. K: consecutive threads read consecutive 16 bytes of a row. V: consecutive threads
// take consecutive key pairs at the same 4 head dims (two rows each), so their stores of a
// transposed row go to consecutive banks. Keys at or past key_end and dims at or past head_dim
// are zeros.
template <int kDim>
IRIS_DEVICE void MmaFlashLoadTileVec(const FlashVarlenParams& p, int64_t start, int g, int kb, int key_end, int tid,
                                     uint32_t* ks, uint32_t* vt) {
  constexpr int kQuads = kDim / 4;                                // 16-byte vectors of a row
  constexpr int kKLoads = kMmaFlashKeys * kQuads / kMmaFlashThreads;  // per thread
  constexpr int kVItems = (kMmaFlashKeys / 2) * kQuads / kMmaFlashThreads;
  static_assert(kKLoads * kMmaFlashThreads == kMmaFlashKeys * kQuads && kVItems * kMmaFlashThreads * 2 == kMmaFlashKeys * kQuads);
  const int hd = p.head_dim;
  Float4 kv[kKLoads];
IRIS_UNROLL
  for (int i = 0; i < kKLoads; ++i) {
    const int e = tid + i * kMmaFlashThreads, j = e / kQuads, d = 4 * (e % kQuads);
    const int key = kb + j;
    kv[i] = Float4{0.f, 0.f, 0.f, 0.f};
    if (key < key_end && d < hd) {
      kv[i] = *reinterpret_cast<const Float4*>(p.k + (start + key) * p.k_row_stride + g * p.k_head_stride + d);
    }
  }
IRIS_UNROLL
  for (int i = 0; i < kKLoads; ++i) {
    const int e = tid + i * kMmaFlashThreads, j = e / kQuads, d = 4 * (e % kQuads);
    ks[j * kMmaFlashKWords<kDim> + d / 2] = PackBf16x2(kv[i].x, kv[i].y);
    ks[j * kMmaFlashKWords<kDim> + d / 2 + 1] = PackBf16x2(kv[i].z, kv[i].w);
  }
  // V after K's stores: half the registers in flight (the kernel's occupancy is bound by them).
  Float4 va[kVItems], vb[kVItems];
IRIS_UNROLL
  for (int i = 0; i < kVItems; ++i) {
    const int e = tid + i * kMmaFlashThreads, pair = e % (kMmaFlashKeys / 2), d = 4 * (e / (kMmaFlashKeys / 2));
    const int key = kb + 2 * pair;
    const float* src = p.v + (start + key) * p.v_row_stride + g * p.v_head_stride + d;
    va[i] = vb[i] = Float4{0.f, 0.f, 0.f, 0.f};
    if (key < key_end && d < hd) va[i] = *reinterpret_cast<const Float4*>(src);
    if (key + 1 < key_end && d < hd) vb[i] = *reinterpret_cast<const Float4*>(src + p.v_row_stride);
  }
IRIS_UNROLL
  for (int i = 0; i < kVItems; ++i) {
    const int e = tid + i * kMmaFlashThreads, pair = e % (kMmaFlashKeys / 2), d = 4 * (e / (kMmaFlashKeys / 2));
    vt[(d + 0) * kMmaFlashVWords + pair] = PackBf16x2(va[i].x, vb[i].x);
    vt[(d + 1) * kMmaFlashVWords + pair] = PackBf16x2(va[i].y, vb[i].y);
    vt[(d + 2) * kMmaFlashVWords + pair] = PackBf16x2(va[i].z, vb[i].z);
    vt[(d + 3) * kMmaFlashVWords + pair] = PackBf16x2(va[i].w, vb[i].w);
  }
}

// MmaFlashLoadTileVec for bf16 K and V rows that are whole 16-byte vectors, wherever they are:
// k_row(key) and v_row(key) give a key's row at the kv head (asked only for keys before key_end:
// FlashVarlenParams' packed rows, or a paged cache's slots). The values are copied as they are,
// K 8 values (16 bytes) a load, V 4 values (8 bytes) a load from each of a key pair's rows,
// their halves paired into the transposed words. The same tile as the f32 load of the widened
// values, bit for bit.
template <int kDim, typename KRow, typename VRow>
IRIS_DEVICE void MmaFlashLoadTileBf16Rows(KRow k_row, VRow v_row, int kb, int key_end, int hd, int tid, uint32_t* ks,
                                          uint32_t* vt) {
  constexpr int kOcts = kDim / 8, kQuads = kDim / 4;
  constexpr int kKLoads = kMmaFlashKeys * kOcts / kMmaFlashThreads;
  constexpr int kVItems = (kMmaFlashKeys / 2) * kQuads / kMmaFlashThreads;
  static_assert(kKLoads * kMmaFlashThreads == kMmaFlashKeys * kOcts && kVItems * kMmaFlashThreads * 2 == kMmaFlashKeys * kQuads);
  Chunk16 kv[kKLoads];
IRIS_UNROLL
  for (int i = 0; i < kKLoads; ++i) {
    const int e = tid + i * kMmaFlashThreads, j = e / kOcts, d = 8 * (e % kOcts);
    const int key = kb + j;
    kv[i] = Chunk16{{0u, 0u, 0u, 0u}};
    if (key < key_end && d < hd) kv[i] = *reinterpret_cast<const Chunk16*>(k_row(key) + d);
  }
IRIS_UNROLL
  for (int i = 0; i < kKLoads; ++i) {
    const int e = tid + i * kMmaFlashThreads, j = e / kOcts, d = 8 * (e % kOcts);
IRIS_UNROLL
    for (int w = 0; w < 4; ++w) ks[j * kMmaFlashKWords<kDim> + d / 2 + w] = kv[i].w[w];
  }
  Chunk8 va[kVItems], vb[kVItems];
IRIS_UNROLL
  for (int i = 0; i < kVItems; ++i) {
    const int e = tid + i * kMmaFlashThreads, pair = e % (kMmaFlashKeys / 2), d = 4 * (e / (kMmaFlashKeys / 2));
    const int key = kb + 2 * pair;
    va[i] = vb[i] = Chunk8{{0u, 0u}};
    if (key < key_end && d < hd) va[i] = *reinterpret_cast<const Chunk8*>(v_row(key) + d);
    if (key + 1 < key_end && d < hd) vb[i] = *reinterpret_cast<const Chunk8*>(v_row(key + 1) + d);
  }
IRIS_UNROLL
  for (int i = 0; i < kVItems; ++i) {
    const int e = tid + i * kMmaFlashThreads, pair = e % (kMmaFlashKeys / 2), d = 4 * (e / (kMmaFlashKeys / 2));
    // Dim d + 2w + x of the key pair: key 2 pair's value in the low half, key 2 pair + 1's high.
IRIS_UNROLL
    for (int w = 0; w < 2; ++w) {
      vt[(d + 2 * w) * kMmaFlashVWords + pair] = (va[i].w[w] & 0xffffu) | (vb[i].w[w] << 16);
      vt[(d + 2 * w + 1) * kMmaFlashVWords + pair] = (va[i].w[w] >> 16) | (vb[i].w[w] & 0xffff0000u);
    }
  }
}

// ... for FlashVarlenParams' bf16 rows (k_bf16, v_bf16).
template <int kDim>
IRIS_DEVICE void MmaFlashLoadTileVecBf16(const FlashVarlenParams& p, int64_t start, int g, int kb, int key_end,
                                         int tid, uint32_t* ks, uint32_t* vt) {
  const auto k_row = [&](int key) { return p.k_bf16 + (start + key) * p.k_row_stride + g * p.k_head_stride; };
  const auto v_row = [&](int key) { return p.v_bf16 + (start + key) * p.v_row_stride + g * p.v_head_stride; };
  MmaFlashLoadTileBf16Rows<kDim>(k_row, v_row, kb, key_end, p.head_dim, tid, ks, vt);
}

// One q, k or v value of the kernel's input as f32: from the f32 rows, or widened from the bf16
// rows (kBf16In; exact).
template <bool kBf16In>
IRIS_DEVICE float MmaFlashIn(const float* f32, const uint16_t* bf16, int64_t i) {
  if constexpr (kBf16In) {
    return Bf16ToFloat(bf16[i]);
  } else {
    return f32[i];
  }
}

// The block's rows and the lane's place in them (both tensor-core kernels).
struct MmaFlashBlock {
  int64_t start = 0;        // the sequence's first token row
  int n = 0;                // its length
  int r_lo = 0, r_hi = 0;   // the rows computed, relative to the sequence
  int h = 0, g = 0;         // the q head and its kv head
  int tid = 0, lane = 0, warp = 0, group = 0, t = 0;
  int warp_row0 = 0;        // the warp's rows: warp_row0 + [0, 16)
  bool warp_active = false;  // whether any of them is computed (warp-uniform); else it only loads tiles
  int key_end = 0;          // the last row sees keys [0, key_end)
  int row_a = 0;            // the lane's rows: row_a (index 0) and row_a + 8 (index 1)
  int visible_a = 0, visible_b = 0;  // the keys they see: [0, visible_x)
};

// The lane's place in block (., y, .), which owns rows [64y, 64y + 64) of a sequence, once the rows
// it computes, [r_lo, r_hi), are set: thread,
// warp and fragment indices, the warp's rows and whether it computes any.
IRIS_DEVICE void MmaFlashPlaceLane(MmaFlashBlock& b) {
  b.tid = static_cast<int>(threadIdx.x);
  b.lane = b.tid % kWarpSize;
  b.warp = b.tid / kWarpSize;
  b.group = b.lane / 4;
  b.t = b.lane % 4;
  b.warp_row0 = static_cast<int>(blockIdx.y) * kMmaFlashRows + b.warp * 16;  // the block owns rows from blockIdx.y * 64
  b.warp_active = b.warp_row0 < b.r_hi && b.warp_row0 + 16 > b.r_lo;
  b.row_a = b.warp_row0 + b.group;
}

// False when the block computes no row (the whole block returns: no thread reaches a barrier).
IRIS_DEVICE bool MmaFlashBlockOf(const FlashVarlenParams& p, MmaFlashBlock& b) {
  const VarlenBlockRows rows = BlockRowsOf(p, kMmaFlashRows);
  if (rows.lo >= rows.hi) return false;
  b.start = rows.start;
  b.n = rows.n;
  b.r_lo = rows.lo;
  b.r_hi = rows.hi;
  b.h = static_cast<int>(blockIdx.z);
  b.g = b.h / (p.num_heads / p.num_kv_heads);
  MmaFlashPlaceLane(b);
  b.key_end = p.causal ? (b.n < b.r_hi ? b.n : b.r_hi) : b.n;
  b.visible_a = p.causal ? (b.n < b.row_a + 1 ? b.n : b.row_a + 1) : b.n;
  b.visible_b = p.causal ? (b.n < b.row_a + 9 ? b.n : b.row_a + 9) : b.n;
  return true;
}

// The warp's q rows as A fragments: qa[c] covers head dims [16c, 16c + 16); rows past the
// sequence and dims past head_dim are zeros.
template <int kDim, bool kBf16In>
IRIS_DEVICE void MmaFlashLoadQ(const FlashVarlenParams& p, const MmaFlashBlock& b, uint32_t (&qa)[kDim / 16][4]) {
  const auto q_at = [&](int r, int d) {
    return r < b.n && d < p.head_dim
               ? MmaFlashIn<kBf16In>(p.q, p.q_bf16, (b.start + r) * p.q_row_stride + b.h * p.q_head_stride + d)
               : 0.f;
  };
  const int ra = b.row_a, rb = ra + 8;
IRIS_UNROLL
  for (int c = 0; c < kDim / 16; ++c) {
    const int d = 16 * c + 2 * b.t;
    qa[c][0] = PackBf16x2(q_at(ra, d), q_at(ra, d + 1));
    qa[c][1] = PackBf16x2(q_at(rb, d), q_at(rb, d + 1));
    qa[c][2] = PackBf16x2(q_at(ra, d + 8), q_at(ra, d + 9));
    qa[c][3] = PackBf16x2(q_at(rb, d + 8), q_at(rb, d + 9));
  }
}

// The online softmax of the lane's two rows (index 0: row_a, 1: row_a + 8), as every row starts:
// their running maxima m, the lane's share of their sums l (the group's 4 lanes add up at the
// end), and O's accumulator fragments acc (acc[c] covers head dims [8c, 8c + 8)). m is in base-2
// units (the scaled scores times log2(e)): a probability is then one SFU instruction
// (Exp2Approx), where expf's range reduction costs ~10, on ~1000 a tile.
constexpr float kMmaFlashLog2e = 1.4426950408889634f;
constexpr float kMmaFlashLn2 = 0.6931471805599453f;
template <int kDim>
struct MmaFlashRowState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  float acc[kDim / 8][4] = {};
};

// S's fragments (sc[j]: keys kb + [8j, 8j + 8), kKeys of them: a whole tile, or a warp's slice
// of one) scaled and masked, then the online-softmax update of the lane's two rows: sc becomes
// the probabilities, m the rows' running maxima, and l and acc are rescaled to them.
template <int kDim, int kKeys = kMmaFlashKeys>
IRIS_DEVICE void MmaFlashSoftmaxTile(const FlashVarlenParams& p, const MmaFlashBlock& b, int kb,
                                     float (&sc)[kKeys / 8][4], MmaFlashRowState<kDim>& st) {
  float(&m)[2] = st.m;
  float(&l)[2] = st.l;
  float(&acc)[kDim / 8][4] = st.acc;
  float tile_max[2] = {-INFINITY, -INFINITY};
  const float scale2 = p.scale * kMmaFlashLog2e;
IRIS_UNROLL
  for (int j = 0; j < kKeys / 8; ++j) {
IRIS_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int key = kb + 8 * j + 2 * b.t + (i & 1);
      const bool seen = key < (i < 2 ? b.visible_a : b.visible_b);
      sc[j][i] = seen ? sc[j][i] * scale2 : -INFINITY;
      tile_max[i / 2] = sc[j][i] > tile_max[i / 2] ? sc[j][i] : tile_max[i / 2];
    }
  }
  float correction[2];
IRIS_UNROLL
  for (int x = 0; x < 2; ++x) {
    float v = tile_max[x];
    float o = ShflXor(v, 1);
    v = o > v ? o : v;
    o = ShflXor(v, 2);
    v = o > v ? o : v;
    const float m_new = v > m[x] ? v : m[x];
    // Nothing visible yet (a causal row before this tile's first key): the state stays.
    correction[x] = m_new == -INFINITY ? 1.f : Exp2Approx(m[x] - m_new);  // 0 after m = -inf
    m[x] = m_new;
    l[x] *= correction[x];
  }
IRIS_UNROLL
  for (int j = 0; j < kKeys / 8; ++j) {
IRIS_UNROLL
    for (int i = 0; i < 4; ++i) {
      const float mx = m[i / 2];
      const float prob = sc[j][i] == -INFINITY ? 0.f : Exp2Approx(sc[j][i] - mx);
      sc[j][i] = prob;
      l[i / 2] += prob;
    }
  }
IRIS_UNROLL
  for (int c = 0; c < kDim / 8; ++c) {
    acc[c][0] *= correction[0];
    acc[c][1] *= correction[0];
    acc[c][2] *= correction[1];
    acc[c][3] *= correction[1];
  }
}

// P's A fragment for keys kb + [16kk, 16kk + 16): S tiles 2kk and 2kk + 1, rounded to bf16.
template <int kKeys = kMmaFlashKeys>
IRIS_DEVICE void MmaFlashProbs(const float (&sc)[kKeys / 8][4], int kk, uint32_t (&pa)[4]) {
  pa[0] = PackBf16x2(sc[2 * kk][0], sc[2 * kk][1]);
  pa[1] = PackBf16x2(sc[2 * kk][2], sc[2 * kk][3]);
  pa[2] = PackBf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
  pa[3] = PackBf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
}

// The lane's rows of O = acc / l, to p.out (f32) or p.out_bf16 (kBf16Out).
template <int kDim, bool kBf16Out>
IRIS_DEVICE void MmaFlashStore(const FlashVarlenParams& p, const MmaFlashBlock& b, MmaFlashRowState<kDim>& st) {
  if (!b.warp_active) return;
  float(&l)[2] = st.l;
  const float(&acc)[kDim / 8][4] = st.acc;
  const int hd = p.head_dim;
IRIS_UNROLL
  for (int x = 0; x < 2; ++x) {
    l[x] += ShflXor(l[x], 1);
    l[x] += ShflXor(l[x], 2);
  }
IRIS_UNROLL
  for (int x = 0; x < 2; ++x) {
    const int r = b.row_a + 8 * x;
    if (r < b.r_lo || r >= b.r_hi) continue;
    if constexpr (kBf16Out) {
      uint16_t* o = p.out_bf16 + (b.start + r - p.q_begin) * p.out_bf16_ld + static_cast<int64_t>(b.h) * hd;
      // A lane's two dims (d even) as one 4-byte store where the row allows it (an even head dim
      // and stride, a 4-byte aligned buffer: the projection's rows), else one value at a time.
      const bool paired = hd % 2 == 0 && p.out_bf16_ld % 2 == 0 && reinterpret_cast<uintptr_t>(p.out_bf16) % 4 == 0;
IRIS_UNROLL
      for (int c = 0; c < kDim / 8; ++c) {
        const int d = 8 * c + 2 * b.t;
        if (paired && d < hd) {
          *reinterpret_cast<uint32_t*>(o + d) = PackBf16x2(acc[c][2 * x] / l[x], acc[c][2 * x + 1] / l[x]);
          continue;
        }
        if (d < hd) o[d] = FloatToBf16(acc[c][2 * x] / l[x]);
        if (d + 1 < hd) o[d + 1] = FloatToBf16(acc[c][2 * x + 1] / l[x]);
      }
      continue;
    }
    float* o = p.out + (b.start + r) * p.out_row_stride + static_cast<int64_t>(b.h) * hd;
IRIS_UNROLL
    for (int c = 0; c < kDim / 8; ++c) {
      const int d = 8 * c + 2 * b.t;
      if (d < hd) o[d] = acc[c][2 * x] / l[x];
      if (d + 1 < hd) o[d + 1] = acc[c][2 * x + 1] / l[x];
    }
  }
}

// One key tile for the warp's rows, from the tile in shared memory (ks: K row-major, vt: V
// transposed, as the tile loads above leave them): S = q·kᵀ (8 n-tiles of 8 keys), the
// online-softmax update, then O += P·V 16 keys at a time (S tiles 2kk and 2kk + 1 are P's A
// fragment). Or only the tile's keys [k0, k0 + kKeys) (a warp's slice of the tile, kKeys a
// multiple of 16).
template <int kDim, int kKeys = kMmaFlashKeys>
IRIS_DEVICE void MmaFlashTile(const FlashVarlenParams& p, const MmaFlashBlock& b, int kb,
                              const uint32_t (&qa)[kDim / 16][4], const uint32_t* ks, const uint32_t* vt,
                              MmaFlashRowState<kDim>& st, int k0 = 0) {
  static_assert(kKeys % 16 == 0 && kKeys <= kMmaFlashKeys);
  float sc[kKeys / 8][4];  // S's fragments: sc[j] covers keys kb + k0 + [8j, 8j + 8)
IRIS_UNROLL
  for (int j = 0; j < kKeys / 8; ++j) {
    sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
    const uint32_t* krow = ks + (k0 + 8 * j + b.group) * kMmaFlashKWords<kDim> + b.t;
IRIS_UNROLL
    for (int c = 0; c < kDim / 16; ++c) {
      const uint32_t kf[2] = {krow[8 * c], krow[8 * c + 4]};
      MmaBf16(sc[j], qa[c], kf);
    }
  }
  MmaFlashSoftmaxTile<kDim, kKeys>(p, b, kb + k0, sc, st);
IRIS_UNROLL
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    uint32_t pa[4];
    MmaFlashProbs<kKeys>(sc, kk, pa);
IRIS_UNROLL
    for (int c = 0; c < kDim / 8; ++c) {
      const uint32_t* vrow = vt + (8 * c + b.group) * kMmaFlashVWords + k0 / 2 + 8 * kk + b.t;
      const uint32_t vf[2] = {vrow[0], vrow[4]};
      MmaBf16(st.acc[c], pa, vf);
    }
  }
}

// Three blocks an SM up to head dim 80 (the vision tower's: 168 registers, no spills; 221
// without the bound), two past it (96 and 128 spill at three).
// kBf16Out: the output goes to p.out_bf16 as bf16 rows (a template parameter, not a branch: the
// f32 instantiation keeps its registers; with the branch in it, ptxas spilled at head dim 80).
// kBf16In: q, k and v are read from p.q_bf16, k_bf16, v_bf16.
template <int kDim, bool kBf16Out = false, bool kBf16In = false>
IRIS_GLOBAL void IRIS_LAUNCH_BOUNDS(kMmaFlashThreads, kDim <= 80 ? 3 : 2) FlashVarlenMmaKernel(FlashVarlenParams p) {
  static_assert(kDim % 16 == 0 && kDim <= kMmaFlashMaxHeadDim);
  constexpr int kKWords = kMmaFlashKWords<kDim>;
  constexpr int kVWords = kMmaFlashVWords;
  IRIS_SHARED uint32_t ks[kMmaFlashKeys * kKWords];  // ks[key][dim pair]
  IRIS_SHARED uint32_t vt[kDim * kVWords];           // vt[dim][key pair]

  MmaFlashBlock b;
  if (!MmaFlashBlockOf(p, b)) return;
  const int64_t start = b.start;
  const int hd = p.head_dim, g = b.g, tid = b.tid, key_end = b.key_end;

  uint32_t qa[kDim / 16][4];
  MmaFlashLoadQ<kDim, kBf16In>(p, b, qa);
  MmaFlashRowState<kDim> st;
  const int threads = static_cast<int>(blockDim.x);

  // K and V rows that are whole 16-byte vectors (the encoder's qkv buffer: head dim 80, strides
  // of whole heads) are read 4 floats a load, every load of a tile unrolled so that they are all
  // in flight at once; the element loops below otherwise (a load loop the compiler keeps in order
  // waits out each load's latency in turn).
  // (bf16 rows: 8 values to 16 bytes.)
  constexpr int kVec = kBf16In ? 8 : 4;
  const uintptr_t k_addr = kBf16In ? reinterpret_cast<uintptr_t>(p.k_bf16) : reinterpret_cast<uintptr_t>(p.k);
  const uintptr_t v_addr = kBf16In ? reinterpret_cast<uintptr_t>(p.v_bf16) : reinterpret_cast<uintptr_t>(p.v);
  const bool vec_kv = hd % kVec == 0 && p.k_row_stride % kVec == 0 && p.k_head_stride % kVec == 0 &&
                      p.v_row_stride % kVec == 0 && p.v_head_stride % kVec == 0 && k_addr % 16 == 0 &&
                      v_addr % 16 == 0 && threads == kMmaFlashThreads;
  for (int kb = 0; kb < key_end; kb += kMmaFlashKeys) {
    SyncThreads();  // the previous tile is read
    if (vec_kv) {
      if constexpr (kBf16In) {
        MmaFlashLoadTileVecBf16<kDim>(p, start, g, kb, key_end, tid, ks, vt);
      } else {
        MmaFlashLoadTileVec<kDim>(p, start, g, kb, key_end, tid, ks, vt);
      }
    } else {
    // Keys past key_end are zeros, not garbage: P·V multiplies them by p = 0.
    for (int e = tid; e < kMmaFlashKeys * (kDim / 2); e += threads) {
      const int j = e / (kDim / 2), d = 2 * (e % (kDim / 2));
      const int key = kb + j;
      const int64_t at = (start + key) * p.k_row_stride + g * p.k_head_stride + d;
      const bool ok = key < key_end;
      ks[j * kKWords + d / 2] = PackBf16x2(ok && d < hd ? MmaFlashIn<kBf16In>(p.k, p.k_bf16, at) : 0.f,
                                           ok && d + 1 < hd ? MmaFlashIn<kBf16In>(p.k, p.k_bf16, at + 1) : 0.f);
    }
    for (int e = tid; e < (kMmaFlashKeys / 2) * kDim; e += threads) {
      const int pair = e / kDim, d = e % kDim;  // consecutive threads: consecutive dims of a row
      const int key = kb + 2 * pair;
      const int64_t at = (start + key) * p.v_row_stride + g * p.v_head_stride + d;
      const float v0 = key < key_end && d < hd ? MmaFlashIn<kBf16In>(p.v, p.v_bf16, at) : 0.f;
      const float v1 = key + 1 < key_end && d < hd ? MmaFlashIn<kBf16In>(p.v, p.v_bf16, at + p.v_row_stride) : 0.f;
      vt[d * kVWords + pair] = PackBf16x2(v0, v1);
    }
    }
    SyncThreads();
    // A causal tile wholly after the warp's last row adds nothing to it.
    if (!b.warp_active || (p.causal && kb > b.warp_row0 + 15)) continue;

    MmaFlashTile<kDim>(p, b, kb, qa, ks, vt, st);
  }
  MmaFlashStore<kDim, kBf16Out>(p, b, st);
  SyncThreads();  // the shared tiles are read before a next block (harness) reuses them
}

// --- The pipelined kernel (bf16 inputs): tile i + 1's K and V are copied to shared memory
// (cp.async) while the warps compute on tile i, so a block's loads overlap its own products
// instead of only another block's. K and V are kept as their rows are (bf16, [key][dim], stride
// kMmaFlashKWords: 16-byte rows that 8 consecutive keys read at distinct banks), no conversion
// and no transposing pass: the fragments come out of shared memory by ldmatrix, V's transposed.
// The same products in the same order as FlashVarlenMmaKernel<kDim, kBf16Out, true>: the same
// result, bit for bit.

// Two tiles of K and V fit the 48 KB of static shared memory up to head dim 80 (the vision
// tower's: 45 KB).
constexpr int kMmaFlashPipelinedMaxHeadDim = 80;

// Whether the pipelined kernel takes p: bf16 q, k, v whose K and V rows are whole 16-byte
// vectors, at a head dim it is built for (the launch's check, on the host).
inline bool MmaFlashPipelinedTakes(const FlashVarlenParams& p) {
  const auto aligned = [](const void* a) { return reinterpret_cast<uintptr_t>(a) % 16 == 0; };
  return p.q_bf16 != nullptr && p.k_bf16 != nullptr && p.v_bf16 != nullptr && p.head_dim > 0 &&
         p.head_dim <= kMmaFlashPipelinedMaxHeadDim && p.head_dim % 8 == 0 &&
         p.k_row_stride % 8 == 0 && p.k_head_stride % 8 == 0 && p.v_row_stride % 8 == 0 &&
         p.v_head_stride % 8 == 0 && aligned(p.k_bf16) && aligned(p.v_bf16) &&
         // a sequence's row offsets in 32 bits
         int64_t{p.max_seqlen} * (p.k_row_stride > p.v_row_stride ? p.k_row_stride : p.v_row_stride) < (int64_t{1} << 31);
}

// The block's K and V rows: its sequence's row 0 of its kv head, and the row strides (a
// sequence's offsets fit 32 bits: MmaFlashPipelinedTakes).
struct MmaFlashKvRows {
  const uint16_t* k;
  const uint16_t* v;
  int k_stride, v_stride;
};

// Issues the copies of keys [kb, kb + 64)'s K and V rows into ks and vs (16 bytes each, a
// thread's share of the tile); keys at or past key_end and dims at or past head_dim are zeros.
template <int kDim>
IRIS_DEVICE void MmaFlashCopyTile(const MmaFlashKvRows& kv, int head_dim, const MmaFlashBlock& b, int kb, uint32_t* ks,
                                  uint32_t* vs) {
  constexpr int kOcts = kDim / 8;  // 16-byte chunks of a row
  constexpr int kCopies = kMmaFlashKeys * kOcts / kMmaFlashThreads;
  static_assert(kCopies * kMmaFlashThreads == kMmaFlashKeys * kOcts);
IRIS_UNROLL
  for (int i = 0; i < kCopies; ++i) {
    const int e = b.tid + i * kMmaFlashThreads, j = e / kOcts, d = 8 * (e % kOcts);
    const int key = kb + j;
    const bool valid = key < b.key_end && d < head_dim;
    // (No bytes are read for an invalid chunk; the address given is the row range's first.)
    CpAsync16(ks + j * kMmaFlashKWords<kDim> + d / 2, kv.k + (valid ? key * kv.k_stride + d : 0), valid);
    CpAsync16(vs + j * kMmaFlashKWords<kDim> + d / 2, kv.v + (valid ? key * kv.v_stride + d : 0), valid);
  }
}

// One K/V tile of the pipelined kernels, from shared memory (kt, vt: the tile's K and V rows,
// stride kMmaFlashKWords): S = q·kᵀ, the online softmax, O += P·V, into st. mat, mat_row: the
// lane's ldmatrix tile and row (lane / 8, lane % 8).
template <int kDim>
IRIS_DEVICE void MmaFlashPipelinedTile(const FlashVarlenParams& p, const MmaFlashBlock& b, int kb,
                                       const uint32_t (&qa)[kDim / 16][4], const uint32_t* kt, const uint32_t* vt,
                                       int mat, int mat_row, MmaFlashRowState<kDim>& st) {
  constexpr int kWords = kMmaFlashKWords<kDim>;
  float sc[kMmaFlashKeys / 8][4];
IRIS_UNROLL
  for (int j = 0; j < kMmaFlashKeys / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
  // S = q·kᵀ: one ldmatrix gives K's B fragments for key tiles j and j + 1 at head dims
  // [16c, 16c + 16) (its four 8x8 tiles: keys 8j or 8j + 8, dims 16c or 16c + 8).
IRIS_UNROLL
  for (int j = 0; j < kMmaFlashKeys / 8; j += 2) {
IRIS_UNROLL
    for (int c = 0; c < kDim / 16; ++c) {
      uint32_t kf[4];
      LdMatrixX4(kf, kt + (8 * (j + mat / 2) + mat_row) * kWords + 8 * c + 4 * (mat % 2));
      const uint32_t k0[2] = {kf[0], kf[1]}, k1[2] = {kf[2], kf[3]};
      MmaBf16(sc[j], qa[c], k0);
      MmaBf16(sc[j + 1], qa[c], k1);
    }
  }
  MmaFlashSoftmaxTile<kDim>(p, b, kb, sc, st);
  // O += P·V: one transposing ldmatrix gives V's B fragments for head dims [8c, 8c + 8) and
  // [8c + 8, 8c + 16) at keys kb + [16kk, 16kk + 16) (tiles: keys + 0 or 8, dims 8c or 8c + 8).
IRIS_UNROLL
  for (int kk = 0; kk < kMmaFlashKeys / 16; ++kk) {
    uint32_t pa[4];
    MmaFlashProbs(sc, kk, pa);
IRIS_UNROLL
    for (int c = 0; c < kDim / 8; c += 2) {
      uint32_t vf[4];
      LdMatrixX4Trans(vf, vt + (16 * kk + 8 * (mat % 2) + mat_row) * kWords + 4 * (c + mat / 2));
      const uint32_t v0[2] = {vf[0], vf[1]}, v1[2] = {vf[2], vf[3]};
      MmaBf16(st.acc[c], pa, v0);
      MmaBf16(st.acc[c + 1], pa, v1);
    }
  }
}

// As FlashVarlenMmaKernel<kDim, kBf16Out, true> where MmaFlashPipelinedTakes(p), 128 threads.
template <int kDim, bool kBf16Out>
IRIS_GLOBAL void IRIS_LAUNCH_BOUNDS(kMmaFlashThreads, 3) FlashVarlenMmaPipelinedKernel(FlashVarlenParams p) {
  static_assert(kDim % 16 == 0 && kDim <= kMmaFlashPipelinedMaxHeadDim);
  constexpr int kWords = kMmaFlashKWords<kDim>;
  constexpr int kTileWords = kMmaFlashKeys * kWords;
  // Two buffers of each (tile i in buffer i % 2), declared as 16-byte chunks for the alignment
  // the copies and ldmatrix need.
  IRIS_SHARED Chunk16 k_tiles[2 * kTileWords / 4];
  IRIS_SHARED Chunk16 v_tiles[2 * kTileWords / 4];

  MmaFlashBlock b;
  if (!MmaFlashBlockOf(p, b)) return;
  uint32_t* const ks = k_tiles[0].w;
  uint32_t* const vs = v_tiles[0].w;
  const int tiles = (b.key_end + kMmaFlashKeys - 1) / kMmaFlashKeys;
  const MmaFlashKvRows kv{p.k_bf16 + b.start * p.k_row_stride + b.g * p.k_head_stride,
                          p.v_bf16 + b.start * p.v_row_stride + b.g * p.v_head_stride,
                          static_cast<int>(p.k_row_stride), static_cast<int>(p.v_row_stride)};
  MmaFlashCopyTile<kDim>(kv, p.head_dim, b, 0, ks, vs);
  CpAsyncCommit();

  uint32_t qa[kDim / 16][4];  // q's loads wait while the first tile is in flight
  MmaFlashLoadQ<kDim, true>(p, b, qa);
  MmaFlashRowState<kDim> st;
  // The lane's ldmatrix row: tile lane / 8, row lane % 8 of it.
  const int mat = b.lane / 8, mat_row = b.lane % 8;

  for (int i = 0; i < tiles; ++i) {
    const int kb = i * kMmaFlashKeys;
    if (i + 1 < tiles) {
      MmaFlashCopyTile<kDim>(kv, p.head_dim, b, kb + kMmaFlashKeys, ks + (i + 1) % 2 * kTileWords, vs + (i + 1) % 2 * kTileWords);
    }
    CpAsyncCommit();  // (an empty group after the last tile: the wait below still means tile i)
    CpAsyncWait<1>();  // this thread's copies of tile i have landed
    SyncThreads();     // and every thread's
    if (b.warp_active && !(p.causal && kb > b.warp_row0 + 15)) {
      MmaFlashPipelinedTile<kDim>(p, b, kb, qa, ks + i % 2 * kTileWords, vs + i % 2 * kTileWords, mat, mat_row, st);
    }
    SyncThreads();  // tile i's buffers are read before tile i + 2's copies refill them
  }
  MmaFlashStore<kDim, kBf16Out>(p, b, st);
}

// The pipelined kernel with a block owning the same rows of kHeads consecutive q heads (grid z:
// the heads / kHeads, rounded up; FlashVarlenParams::heads_per_block), walking their tiles as
// one sequence of (head, tile) items: the next head's first K/V tile is copied while the warps
// compute on this head's last, and its q rows are asked into the L2 a head ahead. A window
// attention's sequence (64 rows, one tile) then overlaps its loads with another head's products
// instead of only with other blocks' (on the H200 such a layer ran at ~26 TFLOP/s, latency-bound).
// Each head's products and store are the one-head kernel's, bit for bit. Two blocks an SM (255
// registers): at three, the head loop's extra live state spilled 350 bytes.
template <int kDim, bool kBf16Out, int kHeads>
IRIS_GLOBAL void IRIS_LAUNCH_BOUNDS(kMmaFlashThreads, 2) FlashVarlenMmaPipelinedHeadsKernel(FlashVarlenParams p) {
  static_assert(kDim % 16 == 0 && kDim <= kMmaFlashPipelinedMaxHeadDim && kHeads >= 2);
  constexpr int kWords = kMmaFlashKWords<kDim>;
  constexpr int kTileWords = kMmaFlashKeys * kWords;
  // Two buffers of each (item i in buffer i % 2), declared as 16-byte chunks for the alignment
  // the copies and ldmatrix need.
  IRIS_SHARED Chunk16 k_tiles[2 * kTileWords / 4];
  IRIS_SHARED Chunk16 v_tiles[2 * kTileWords / 4];

  MmaFlashBlock b;
  if (!MmaFlashBlockOf(p, b)) return;  // (the rows, the same for every head of the block)
  uint32_t* const ks = k_tiles[0].w;
  uint32_t* const vs = v_tiles[0].w;
  const int tiles = (b.key_end + kMmaFlashKeys - 1) / kMmaFlashKeys;
  const int h0 = static_cast<int>(blockIdx.z) * kHeads;
  const int heads = p.num_heads - h0 < kHeads ? p.num_heads - h0 : kHeads;
  const int group = p.num_heads / p.num_kv_heads;
  // A head's K and V rows (its kv head's), from the sequence's first row.
  const auto kv_of = [&](int hh) {
    const int g = (h0 + hh) / group;
    return MmaFlashKvRows{p.k_bf16 + b.start * p.k_row_stride + g * p.k_head_stride,
                          p.v_bf16 + b.start * p.v_row_stride + g * p.v_head_stride,
                          static_cast<int>(p.k_row_stride), static_cast<int>(p.v_row_stride)};
  };
  // The block's rows of a head's q, asked into the L2 while the head before computes, so that
  // its q loads find them there: the lines holding bytes 0, 128 and the last of each row's
  // head_dim values (a row of up to 80 bf16 values, 160 bytes, spans at most three lines).
  const auto prefetch_q = [&](int hh) {
    const int row_bytes = p.head_dim * 2;
    for (int e = b.tid; e < kMmaFlashRows * 3; e += kMmaFlashThreads) {
      const int r = b.r_lo + e / 3, byte = 128 * (e % 3) < row_bytes ? 128 * (e % 3) : row_bytes - 1;
      if (r < b.r_hi) {
        PrefetchL2(reinterpret_cast<const char*>(p.q_bf16 + (b.start + r) * p.q_row_stride +
                                                 static_cast<int64_t>(h0 + hh) * p.q_head_stride) + byte);
      }
    }
  };
  MmaFlashCopyTile<kDim>(kv_of(0), p.head_dim, b, 0, ks, vs);
  CpAsyncCommit();
  // The lane's ldmatrix row: tile lane / 8, row lane % 8 of it.
  const int mat = b.lane / 8, mat_row = b.lane % 8;

  int item = 0;  // (head, tile) items walked so far: item i is in buffer i % 2
  for (int hh = 0; hh < heads; ++hh) {
    b.h = h0 + hh;
    b.g = b.h / group;
    if (hh + 1 < heads) prefetch_q(hh + 1);
    uint32_t qa[kDim / 16][4];  // q's loads wait while the head's first tile is in flight
    MmaFlashLoadQ<kDim, true>(p, b, qa);
    MmaFlashRowState<kDim> st;
    for (int t = 0; t < tiles; ++t, ++item) {
      const int kb = t * kMmaFlashKeys;
      // The next item's copies: this head's next tile, or the next head's first.
      uint32_t* const next_k = ks + (item + 1) % 2 * kTileWords;
      uint32_t* const next_v = vs + (item + 1) % 2 * kTileWords;
      if (t + 1 < tiles) {
        MmaFlashCopyTile<kDim>(kv_of(hh), p.head_dim, b, kb + kMmaFlashKeys, next_k, next_v);
      } else if (hh + 1 < heads) {
        MmaFlashCopyTile<kDim>(kv_of(hh + 1), p.head_dim, b, 0, next_k, next_v);
      }
      CpAsyncCommit();  // (an empty group after the last item: the wait below still means this one)
      CpAsyncWait<1>();  // this thread's copies of this item have landed
      SyncThreads();     // and every thread's
      if (b.warp_active && !(p.causal && kb > b.warp_row0 + 15)) {
        MmaFlashPipelinedTile<kDim>(p, b, kb, qa, ks + item % 2 * kTileWords, vs + item % 2 * kTileWords, mat, mat_row,
                                    st);
      }
      SyncThreads();  // this item's buffers are read before item + 2's copies refill them
    }
    MmaFlashStore<kDim, kBf16Out>(p, b, st);
  }
}

}  // namespace iris::kernels::cuda
