// iris's own Hopper GEMM (sm_90a): y = A·Bᵀ for bf16 A [m][k] (activation rows) and B [n][k]
// (a Linear's weight rows, as HF stores them), f32 accumulation, with the epilogues cuBLASLt
// lacks fused in. Tiles of y are 128 x N (N, kTileN: 128, 240 or 256):
//   - warpgroup 0 is the producer: one thread has the copy engine (TMA) land 64-wide K slices of
//     A's 128 rows and B's two N/2-row halves into a ring of HopperTile::kStages shared-memory
//     stages, each announced on its `full` transaction barrier;
//   - warpgroups 1 and 2 are the consumers: they wait on a stage's `full` barrier, issue m64nNk16
//     MMAs from its 128-byte-swizzled tiles, keep one stage's MMAs in flight, and hand the stage
//     before back through its `empty` barrier. N = 128: ping-pong — each warpgroup computes
//     whole tiles (both 64-row halves), the two taking the block's tiles in turn, so that one's
//     epilogue runs while the other's MMAs do (the ring's order keeps their main loops apart).
//     Wider N: both warpgroups on every tile, 64 rows each (the accumulators of two halves of a
//     256-wide tile would not fit a thread's registers);
//   - blocks take tiles in turn (tile t: row block t / column blocks, column block t % column
//     blocks; a block per tile, or as many blocks as SMs: persistent), and the ring's stages and
//     barrier phases run on across a block's tiles, so that the producer lands the next tile's
//     first slices while the consumers write the last one out;
//   - the epilogue runs from the accumulators in registers: f32 rows (+ bias, + the rows already
//     there: a residual add), bf16 rows (+ bias), or SwiGLU: B's two halves are N/2 rows of gate
//     and the N/2 rows of up `second_half` rows below them (the gate_up weight as it is stored,
//     no permutation), so that silu(gate + bias) * (up + bias) meets in one thread's registers
//     and only the bf16 product leaves the block (the gate_up output never reaches memory);
//     or bf16 rows (+ bias) with the rotary turned on q's and k's heads: tiles of three 80-wide
//     heads (N = 240), where a value and its rotate-half partner 40 columns on sit in the same
//     thread's accumulators (5 n8 blocks apart), so the qkv projection needs no rotary launch.
// A thread holds 128 accumulators (N = 128 ping-pong: 2 x 64; N = 256: 128; N = 240: 120).
// Edges need no code: the copy engine fills zeros past the matrices' rows and K, and the epilogue
// writes only rows < m and columns < n. Shared with the SIMT harness (kernels/cuda/simt.h), which
// twins the copy engine, the barriers and the MMAs.
#pragma once

#include <cstdint>

#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/hopper_gemm.h"
#include "kernels/cuda/row_math.cuh"
#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

constexpr int kHopperTileK = 64;      // bf16 values: one 128-byte swizzle row
constexpr int kHopperThreads = 384;  // producer + two consumer warpgroups
constexpr int kHopperABytes = kHopperTileRows * kHopperTileK * 2;  // 16 KB

// A block's shape and shared memory for B tiles of kTileN rows (two halves, one box each).
template <int kTileN>
struct HopperTile {
  static_assert(kTileN == 128 || kTileN == 256 || kTileN == kHopperRotaryTileN);
  static constexpr int kHalfRows = kTileN / 2;
  static constexpr int kBHalfBytes = kHalfRows * kHopperTileK * 2;  // 1024-byte multiples (swizzle rows)
  static_assert(kBHalfBytes % 1024 == 0);
  static constexpr int kStageBytes = kHopperABytes + 2 * kBHalfBytes;  // 32, 46 or 48 KB
  // 128 x 128 tiles: ping-pong — each consumer warpgroup computes whole tiles (all 128 rows, two
  // m64 MMAs a K step), the two taking a block's tiles in turn, so that one writes its tile out
  // while the other's MMAs run. Wider tiles: both warpgroups on each tile, 64 rows each.
  static constexpr bool kPingPong = kTileN == 128;
  static constexpr int kStages = kPingPong ? 6 : 4;  // the ring: 192, 184 or 192 KB
  // The ring, its barriers (full and empty per stage, and ping-pong's two turn barriers), and room
  // to align the ring to 1024 bytes.
  static constexpr int kSharedBytes = kStages * kStageBytes + (2 * kStages + 2) * 8 + 1024;
  static constexpr int kAccumulators = kTileN / 2;  // a thread's share of 64 x kTileN (per m64 half)
  // Output columns a block covers: SwiGLU's halves make one column each.
  template <HopperEpilogue kEpi>
  static constexpr int kBlockCols = kEpi == HopperEpilogue::kSwiGluBf16 ? kHalfRows : kTileN;
};

struct HopperGemmParams {
  int m = 0, n = 0, k = 0;  // kSwiGluBf16: n is the output width (B holds 2n rows)
  int col_blocks = 0, tiles = 0;  // tiles of y across, and in all (row blocks x col_blocks)
  int second_half = 0;      // kSwiGluBf16: the row of B where up starts (n)
  const float* bias = nullptr;  // f32: [n], or [2n] (gate's then up's) for kSwiGluBf16; null: none
  void* y = nullptr;            // f32 or bf16 rows
  int64_t ldy = 0;              // y's row stride, in elements
  bool accumulate = false;      // kF32: y += the product
  bool pairs_aligned = false;   // ldy even and y aligned to two elements: column pairs store at once
  // kBf16Rotary: columns below rotary_cols (whole heads) turn by cos/sin [m][head_dim / 2].
  int rotary_cols = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  // kF32: the next RMSNorm's input handed on (HopperGemm::norm_rows).
  uint16_t* norm_rows = nullptr;
  int64_t norm_ld = 0;
  const float* norm_weight = nullptr;
  float* norm_partials = nullptr;
  int64_t partials_ld = 0;
  // The row factor of a handed-on norm (HopperGemm::row_partials).
  const float* row_partials = nullptr;
  int row_parts = 0;
  float norm_width = 0.f;
  float norm_eps = 0.f;
};

// The kernel's parameters and grid for a call (the launcher's and the SIMT tests' one mapping).
inline HopperGemmParams HopperGemmParamsOf(const HopperGemm& g) {
  HopperGemmParams p;
  p.m = static_cast<int>(g.m);
  p.n = static_cast<int>(g.n);
  p.k = static_cast<int>(g.k);
  p.second_half = g.epilogue == HopperEpilogue::kSwiGluBf16 ? static_cast<int>(g.n) : 0;
  const HopperGrid grid = HopperGemmGrid(g);
  p.col_blocks = static_cast<int>(grid.cols);
  p.tiles = static_cast<int>(grid.cols * grid.rows);
  p.bias = g.bias;
  p.y = g.y;
  p.ldy = g.ldy;
  p.accumulate = g.accumulate && g.epilogue == HopperEpilogue::kF32;
  const uintptr_t pair_bytes = g.epilogue == HopperEpilogue::kF32 ? 8 : 4;
  p.pairs_aligned = g.ldy % 2 == 0 && reinterpret_cast<uintptr_t>(g.y) % pair_bytes == 0;
  if (g.epilogue == HopperEpilogue::kBf16Rotary) {
    p.rotary_cols = g.rotary_heads * g.head_dim;
    p.cos = g.cos;
    p.sin = g.sin;
  }
  if (g.epilogue == HopperEpilogue::kF32 && g.norm_rows != nullptr) {
    p.norm_rows = g.norm_rows;
    p.norm_ld = g.norm_ld;
    p.norm_weight = g.norm_weight;
    p.norm_partials = g.norm_partials;
  }
  p.partials_ld = g.partials_ld;
  if (g.row_partials != nullptr) {
    p.row_partials = g.row_partials;
    p.row_parts = g.row_parts;
    p.norm_width = static_cast<float>(g.norm_width);
    p.norm_eps = g.norm_eps;
  }
  return p;
}
// The kernel instantiation that runs g, as f(HopperKernelTag<epilogue, tile width>{}) (the
// launcher and the SIMT tests pick it the same way): the rotary epilogue at kHopperRotaryTileN,
// the others at 128 or 256. False, f not called, for any other width.
template <HopperEpilogue kEpi, int kTileN>
struct HopperKernelTag {
  static constexpr HopperEpilogue kEpilogue = kEpi;
  static constexpr int kWidth = kTileN;
};
template <HopperEpilogue kEpi, typename F>
bool WithHopperWidth(int tile_n, F& f) {
  if (tile_n == 128) {
    f(HopperKernelTag<kEpi, 128>{});
  } else if (tile_n == 256) {
    f(HopperKernelTag<kEpi, 256>{});
  } else {
    return false;
  }
  return true;
}
template <typename F>
bool WithHopperKernel(const HopperGemm& g, F&& f) {
  switch (g.epilogue) {
    case HopperEpilogue::kF32:
      return WithHopperWidth<HopperEpilogue::kF32>(g.tile_n, f);
    case HopperEpilogue::kBf16:
      return WithHopperWidth<HopperEpilogue::kBf16>(g.tile_n, f);
    case HopperEpilogue::kSwiGluBf16:
      return WithHopperWidth<HopperEpilogue::kSwiGluBf16>(g.tile_n, f);
    case HopperEpilogue::kBf16Rotary:
      if (g.tile_n != kHopperRotaryTileN) return false;
      f(HopperKernelTag<HopperEpilogue::kBf16Rotary, kHopperRotaryTileN>{});
      return true;
  }
  return false;
}

// B's rows the copy engine may read: gate's then up's for kSwiGluBf16.
inline int64_t HopperGemmBRows(const HopperGemm& g) {
  return g.epilogue == HopperEpilogue::kSwiGluBf16 ? 2 * g.n : g.n;
}

// kBf16Rotary, one row's share of a thread (`half` picks the row as the store does): the bias
// added, then each first-half value of a rotated head turned with its partner 40 columns on.
template <int kTileN>
IRIS_DEVICE void HopperRotateRow(const HopperGemmParams& p, float (&acc)[kTileN / 2], int half, int row, int col0,
                                 int q) {
  constexpr int kHeadBlocks = kHopperRotaryHeadDim / 8;  // n8 column blocks a head
  constexpr int kPartner = kHeadBlocks / 2;               // rotate-half: 40 columns = 5 blocks on
  static_assert(kTileN % kHopperRotaryHeadDim == 0 && kHeadBlocks % 2 == 0);
  IRIS_UNROLL
  for (int j = 0; j < kTileN / 8; ++j) {
    IRIS_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int col = col0 + 8 * j + 2 * q + e;
      if (p.bias != nullptr && col < p.n) acc[4 * j + 2 * half + e] += p.bias[col];
    }
  }
  constexpr int kTableWidth = kHopperRotaryHeadDim / 2;
  IRIS_UNROLL
  for (int j = 0; j < kTileN / 8; ++j) {
    if (j % kHeadBlocks >= kPartner) continue;                    // second halves turn with their first
    if (col0 + (j / kHeadBlocks) * kHopperRotaryHeadDim >= p.rotary_cols) continue;  // v's heads, or past n
    IRIS_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int d = 8 * (j % kHeadBlocks) + 2 * q + e;  // < 40: the table's column
      const float c = p.cos[static_cast<int64_t>(row) * kTableWidth + d];
      const float s = p.sin[static_cast<int64_t>(row) * kTableWidth + d];
      float& x1 = acc[4 * j + 2 * half + e];
      float& x2 = acc[4 * (j + kPartner) + 2 * half + e];
      const float a = x1, b = x2;
      x1 = a * c - b * s;
      x2 = b * c + a * s;
    }
  }
}

// A handed-on RMSNorm's factor for a row: 1 / sqrt(mean + eps) from the producing GEMM's partial
// sums of squares, added in order (InvSqrt: the norm kernels' exact quotient).
IRIS_DEVICE float HopperRowFactor(const HopperGemmParams& p, int row) {
  const float* part = p.row_partials + static_cast<int64_t>(row) * p.partials_ld;
  float ss = 0.f;
  for (int i = 0; i < p.row_parts; ++i) ss += part[i];
  return InvSqrt(ss / p.norm_width + p.norm_eps);
}

// kF32 with a norm handed on: a column pair's new y values out[0..1] (col + e < n only) into the
// norm's bf16 rows (times its weight) and the row's sum of squares ss.
IRIS_DEVICE void HopperNormOut(const HopperGemmParams& p, int row, int col, const float (&out)[2], float& ss) {
  uint16_t* r = p.norm_rows + static_cast<int64_t>(row) * p.norm_ld + col;
  if (col + 1 < p.n) {  // norm_ld even, the rows 4-byte aligned: col is even
    ss += out[0] * out[0] + out[1] * out[1];
    *reinterpret_cast<uint32_t*>(r) = PackBf16x2(out[0] * p.norm_weight[col], out[1] * p.norm_weight[col + 1]);
  } else if (col < p.n) {
    ss += out[0] * out[0];
    r[0] = FloatToBf16(out[0] * p.norm_weight[col]);
  }
}

template <HopperEpilogue kEpi, int kTileN>
IRIS_DEVICE void HopperStoreTile(const HopperGemmParams& p, float (&acc)[kTileN / 2], int row0, int col0) {
  const int t = static_cast<int>(threadIdx.x) % 128, lane = t % 32;
  const int group = lane / 4, q = lane % 4;
  constexpr int kUpBlock = kTileN / 16;  // SwiGLU: the up half's first n8 column block
  constexpr int kBlocks8 = kEpi == HopperEpilogue::kSwiGluBf16 ? kUpBlock : kTileN / 8;  // n8 blocks out
  IRIS_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 16 * (t / 32) + group + 8 * half;
    const bool live = row < p.m;
    float ss = 0.f;  // a handed-on norm's sum of squares: the thread's columns of the row
    if (live) {
      if (p.row_partials != nullptr) {
        const float f = HopperRowFactor(p, row);
        IRIS_UNROLL
        for (int j = 0; j < kTileN / 8; ++j) {
          acc[4 * j + 2 * half] *= f;
          acc[4 * j + 2 * half + 1] *= f;
        }
      }
      if constexpr (kEpi == HopperEpilogue::kBf16Rotary) HopperRotateRow<kTileN>(p, acc, half, row, col0, q);
      IRIS_UNROLL
      for (int j = 0; j < kBlocks8; ++j) {
        const int col = col0 + 8 * j + 2 * q;
        float v[2];
        IRIS_UNROLL
        for (int e = 0; e < 2; ++e) {
          v[e] = acc[4 * j + 2 * half + e];
          if constexpr (kEpi == HopperEpilogue::kSwiGluBf16) {
            float up = acc[4 * (j + kUpBlock) + 2 * half + e];  // the same column of the up half
            if (p.bias != nullptr && col + e < p.n) {
              v[e] += p.bias[col + e];
              up += p.bias[p.n + col + e];
            }
            v[e] = Silu(v[e]) * up;
          } else if (kEpi != HopperEpilogue::kBf16Rotary && p.bias != nullptr && col + e < p.n) {
            v[e] += p.bias[col + e];
          }
        }
        // Both columns in one store where both are in y and the pair is aligned (col is even: an
        // even row stride and an aligned y make it so), else one at a time.
        const bool pair = col + 1 < p.n && p.pairs_aligned;
        if constexpr (kEpi == HopperEpilogue::kF32) {
          float* y = static_cast<float*>(p.y) + static_cast<int64_t>(row) * p.ldy + col;
          float out[2] = {v[0], v[1]};  // y's new values
          if (pair) {
            if (p.accumulate) {
              const Float2 old = *reinterpret_cast<const Float2*>(y);
              out[0] = old.x + v[0];
              out[1] = old.y + v[1];
            }
            *reinterpret_cast<Float2*>(y) = Float2{out[0], out[1]};
          } else {
            for (int e = 0; e < 2; ++e) {
              if (col + e < p.n) {
                out[e] = p.accumulate ? y[e] + v[e] : v[e];
                y[e] = out[e];
              }
            }
          }
          if (p.norm_rows != nullptr) HopperNormOut(p, row, col, out, ss);
        } else {
          uint16_t* y = static_cast<uint16_t*>(p.y) + static_cast<int64_t>(row) * p.ldy + col;
          if (pair) {
            *reinterpret_cast<uint32_t*>(y) = PackBf16x2(v[0], v[1]);
          } else {
            for (int e = 0; e < 2; ++e) {
              if (col + e < p.n) y[e] = FloatToBf16(v[e]);
            }
          }
        }
      }
    }
    if constexpr (kEpi == HopperEpilogue::kF32) {
      // The row's 4 lanes (one group) add their sums: every lane of the warp shuffles, live or not
      // (p.norm_rows is the whole launch's), and one lane writes the tile's partial.
      if (p.norm_rows != nullptr) {
        ss += ShflXor(ss, 1);
        ss += ShflXor(ss, 2);
        if (live && q == 0) p.norm_partials[static_cast<int64_t>(row) * p.partials_ld + col0 / kTileN] = ss;
      }
    }
  }
}

// grid HopperGemmGrid(g).blocks, kHopperThreads threads, HopperTile<kTileN>::kSharedBytes of
// dynamic shared memory. a: A's map, box 64 x 128 rows; b: B's map, box 64 x kTileN / 2 rows;
// both 128-byte swizzled.
template <HopperEpilogue kEpi, int kTileN>
IRIS_GLOBAL void IRIS_LAUNCH_BOUNDS(kHopperThreads, 1)
    HopperGemmKernel(const IRIS_GRID_CONSTANT TmaMap2d a, const IRIS_GRID_CONSTANT TmaMap2d b,
                     const HopperGemmParams p) {
#if IRIS_SM90A_CODE
  using Tile = HopperTile<kTileN>;
  unsigned char* raw = DynamicShared();
  unsigned char* ring = raw + ((1024 - reinterpret_cast<uintptr_t>(raw) % 1024) % 1024);
  constexpr int kStages = Tile::kStages;
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + kStages * Tile::kStageBytes);
  uint64_t* empty = full + kStages;
  // Ping-pong: turn[c] completes a phase when the other warpgroup has waited for every slice of its
  // tile (each of its threads arrives). A barrier's parity tells apart only its current phase and
  // the one before, so a warpgroup must not wait for its tile's slices while the other's are still
  // coming: the other's would be two rounds of the ring behind.
  uint64_t* turn = empty + kStages;
  const int tid = static_cast<int>(threadIdx.x), warpgroup = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      MBarrierInit(&full[s], 1);  // the producer's arrival, with the stage's bytes
      // One arrival per warpgroup that reads the stage: its tile's one (ping-pong) or both.
      MBarrierInit(&empty[s], Tile::kPingPong ? 1 : 2);
    }
    MBarrierInit(&turn[0], 128);
    MBarrierInit(&turn[1], 128);
    MBarrierInitFence();
  }
  SyncThreads();
  const int k_tiles = (p.k + kHopperTileK - 1) / kHopperTileK;
  const int first = static_cast<int>(blockIdx.x), step = static_cast<int>(gridDim.x);
  const auto origin = [&](int tile, int* row0, int* col0) {
    *row0 = tile / p.col_blocks * kHopperTileRows;
    *col0 = tile % p.col_blocks * Tile::template kBlockCols<kEpi>;
  };
  // The block's j-th tile is first + j * step; its K slices are the ring's j * k_tiles onwards
  // (the count runs on over the block's tiles: a slice's stage and barrier phase come from it, as
  // the producer and the consumers agree).
  if (warpgroup == 0) {
    if (tid == 0) {
      uint32_t slice = 0;
      for (int tile = first; tile < p.tiles; tile += step) {
        int row0, col0;
        origin(tile, &row0, &col0);
        const int b_second =
            kEpi == HopperEpilogue::kSwiGluBf16 ? p.second_half + col0 : col0 + Tile::kHalfRows;
        for (int kt = 0; kt < k_tiles; ++kt, ++slice) {
          const uint32_t s = slice % kStages, round = slice / kStages;
          MBarrierWaitPhase(&empty[s], static_cast<int64_t>(round) - 1);  // the consumers are done with the round before
          unsigned char* stage = ring + s * Tile::kStageBytes;
          MBarrierArriveExpectTx(&full[s], Tile::kStageBytes);
          TmaLoad2d(stage, &a, kt * kHopperTileK, row0, &full[s]);
          TmaLoad2d(stage + kHopperABytes, &b, kt * kHopperTileK, col0, &full[s]);
          TmaLoad2d(stage + kHopperABytes + Tile::kBHalfBytes, &b, kt * kHopperTileK, b_second, &full[s]);
        }
      }
    }
    return;  // no barrier of the whole block follows
  }
  const int consumer = warpgroup - 1;
  // Ping-pong: this warpgroup's tiles are the block's j = consumer, consumer + 2, ..., each all
  // 128 rows (two m64 halves); else every tile, its own 64 rows (one half).
  constexpr int kHalves = Tile::kPingPong ? 2 : 1;
  constexpr int kEvery = Tile::kPingPong ? 2 : 1;
  const int j0 = Tile::kPingPong ? consumer : 0;
  float acc[kHalves][Tile::kAccumulators];
  uint32_t turns = 0;  // ping-pong: the turns this warpgroup has waited for
  for (int j = j0; first + j * step < p.tiles; j += kEvery) {
    if (Tile::kPingPong && j > 0) MBarrierWaitPhase(&turn[consumer], turns++);  // tile j - 1's slices all came
    IRIS_UNROLL
    for (int h = 0; h < kHalves; ++h) {
      IRIS_UNROLL
      for (int i = 0; i < Tile::kAccumulators; ++i) acc[h][i] = 0.f;
    }
    uint32_t slice = static_cast<uint32_t>(j) * static_cast<uint32_t>(k_tiles);
    for (int kt = 0; kt < k_tiles; ++kt, ++slice) {
      const uint32_t s = slice % kStages;
      MBarrierWaitPhase(&full[s], slice / kStages);
      const unsigned char* stage = ring + s * Tile::kStageBytes;
      const WgmmaDesc db = WgmmaDescSw128(stage + kHopperABytes);
      WgmmaFence();
      IRIS_UNROLL
      for (int h = 0; h < kHalves; ++h) WgmmaHoldRegisters(acc[h]);
      IRIS_UNROLL
      for (int h = 0; h < kHalves; ++h) {
        // The A rows of this half: 64 rows = 8 KB into the stage's 128-row tile.
        const WgmmaDesc da = WgmmaDescSw128(stage + (Tile::kPingPong ? h : consumer) * (kHopperABytes / 2));
        IRIS_UNROLL
        for (int kk = 0; kk < kHopperTileK / 16; ++kk) {
          WgmmaM64K16Bf16<kTileN>(acc[h], WgmmaDescAdvance(da, 32 * kk), WgmmaDescAdvance(db, 32 * kk), 1);
        }
      }
      WgmmaCommit();
      WgmmaWait<1>();  // the stage before's MMAs are done: hand it back
      IRIS_UNROLL
      for (int h = 0; h < kHalves; ++h) WgmmaHoldRegisters(acc[h]);
      if (kt > 0 && tid % 128 == 0) MBarrierArrive(&empty[(slice - 1) % kStages]);
    }
    if (Tile::kPingPong) MBarrierArrive(&turn[1 - consumer]);  // the other's turn: tile j + 1
    WgmmaWait<0>();
    IRIS_UNROLL
    for (int h = 0; h < kHalves; ++h) WgmmaHoldRegisters(acc[h]);
    // The tile's last stage back too: the producer is already filling the ring for the next tile.
    if (tid % 128 == 0) MBarrierArrive(&empty[(slice - 1) % kStages]);
    int row0, col0;
    origin(first + j * step, &row0, &col0);
    IRIS_UNROLL
    for (int h = 0; h < kHalves; ++h) {
      HopperStoreTile<kEpi, kTileN>(p, acc[h], row0 + 64 * (Tile::kPingPong ? h : consumer), col0);
    }
  }
#endif
}

}  // namespace iris::kernels::cuda
