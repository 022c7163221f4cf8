// iris's own Hopper GEMM (sm_90a): y = A·Bᵀ for bf16 A [m][k] (activation rows) and B [n][k]
// (a Linear's weight rows, as HF stores them), f32 accumulation, with the epilogues cuBLASLt
// lacks fused in. A block computes a 128 x N tile of products (N, kTileN, 128 or 256):
//   - warpgroup 0 is the producer: one thread has the copy engine (TMA) land 64-wide K slices of
//     A's 128 rows and B's two N/2-row halves into a ring of kHopperStages shared-memory stages,
//     each announced on its `full` transaction barrier;
//   - warpgroups 1 and 2 are the consumers, 64 rows each: they wait on a stage's `full` barrier,
//     issue four m64nNk16 MMAs from its 128-byte-swizzled tiles, keep one stage's MMAs in
//     flight, and hand the stage before back through its `empty` barrier;
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
// N = 256 does twice the MMA work per byte of A brought in, and holds 128 accumulators a thread.
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

constexpr int kHopperTileRows = 128;  // of A (m), two consumer warpgroups of 64
constexpr int kHopperTileK = 64;      // bf16 values: one 128-byte swizzle row
constexpr int kHopperStages = 4;
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
  // The ring, its barriers (full and empty per stage), and room to align the ring to 1024 bytes.
  static constexpr int kSharedBytes = kHopperStages * kStageBytes + 2 * kHopperStages * 8 + 1024;
  static constexpr int kAccumulators = kTileN / 2;  // a consumer thread's share of 64 x kTileN
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
};

struct HopperGrid {
  int64_t cols, rows;  // tiles across y's columns, down its rows
  unsigned blocks;     // the launch's (one-dimensional) grid
};
inline HopperGrid HopperGemmGrid(const HopperGemm& g) {
  const int64_t per = g.epilogue == HopperEpilogue::kSwiGluBf16 ? g.tile_n / 2 : g.tile_n;
  HopperGrid grid{(g.n + per - 1) / per, (g.m + kHopperTileRows - 1) / kHopperTileRows, 0};
  const int64_t tiles = grid.cols * grid.rows;
  grid.blocks = static_cast<unsigned>(g.max_blocks > 0 && g.max_blocks < tiles ? g.max_blocks : tiles);
  return grid;
}

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
  return p;
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

template <HopperEpilogue kEpi, int kTileN>
IRIS_DEVICE void HopperStoreTile(const HopperGemmParams& p, float (&acc)[kTileN / 2], int row0, int col0) {
  const int t = static_cast<int>(threadIdx.x) % 128, lane = t % 32;
  const int group = lane / 4, q = lane % 4;
  constexpr int kUpBlock = kTileN / 16;  // SwiGLU: the up half's first n8 column block
  constexpr int kBlocks8 = kEpi == HopperEpilogue::kSwiGluBf16 ? kUpBlock : kTileN / 8;  // n8 blocks out
  IRIS_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 16 * (t / 32) + group + 8 * half;
    if (row >= p.m) continue;
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
        if (pair) {
          Float2 out{v[0], v[1]};
          if (p.accumulate) {
            const Float2 old = *reinterpret_cast<const Float2*>(y);
            out = Float2{old.x + v[0], old.y + v[1]};
          }
          *reinterpret_cast<Float2*>(y) = out;
        } else {
          for (int e = 0; e < 2; ++e) {
            if (col + e < p.n) y[e] = p.accumulate ? y[e] + v[e] : v[e];
          }
        }
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
}

// grid (column blocks, row blocks), kHopperThreads threads, HopperTile<kTileN>::kSharedBytes of
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
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + kHopperStages * Tile::kStageBytes);
  uint64_t* empty = full + kHopperStages;
  const int tid = static_cast<int>(threadIdx.x), warpgroup = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < kHopperStages; ++s) {
      MBarrierInit(&full[s], 1);   // the producer's arrival, with the stage's bytes
      MBarrierInit(&empty[s], 2);  // one arrival per consumer warpgroup
    }
    MBarrierInitFence();
  }
  SyncThreads();
  const int k_tiles = (p.k + kHopperTileK - 1) / kHopperTileK;
  // Every K slice a block handles, over all its tiles, has its place in the ring and its barrier
  // phase by this running count (the producer's and the consumers' counts agree).
  uint32_t slice = 0;
  if (warpgroup == 0) {
    if (tid == 0) {
      for (int tile = static_cast<int>(blockIdx.x); tile < p.tiles; tile += static_cast<int>(gridDim.x)) {
        const int row0 = tile / p.col_blocks * kHopperTileRows;
        const int col0 = tile % p.col_blocks * Tile::template kBlockCols<kEpi>;
        const int b_first = col0;
        const int b_second =
            kEpi == HopperEpilogue::kSwiGluBf16 ? p.second_half + col0 : col0 + Tile::kHalfRows;
        for (int kt = 0; kt < k_tiles; ++kt, ++slice) {
          const uint32_t s = slice % kHopperStages, round = slice / kHopperStages;
          MBarrierWait(&empty[s], (round & 1u) ^ 1u);  // the consumers are done with the round before
          unsigned char* stage = ring + s * Tile::kStageBytes;
          MBarrierArriveExpectTx(&full[s], Tile::kStageBytes);
          TmaLoad2d(stage, &a, kt * kHopperTileK, row0, &full[s]);
          TmaLoad2d(stage + kHopperABytes, &b, kt * kHopperTileK, b_first, &full[s]);
          TmaLoad2d(stage + kHopperABytes + Tile::kBHalfBytes, &b, kt * kHopperTileK, b_second, &full[s]);
        }
      }
    }
    return;  // no barrier of the whole block follows
  }
  const int consumer = warpgroup - 1;
  float acc[Tile::kAccumulators];
  for (int tile = static_cast<int>(blockIdx.x); tile < p.tiles; tile += static_cast<int>(gridDim.x)) {
    IRIS_UNROLL
    for (int i = 0; i < Tile::kAccumulators; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < k_tiles; ++kt, ++slice) {
      const uint32_t s = slice % kHopperStages;
      MBarrierWait(&full[s], (slice / kHopperStages) & 1u);
      const unsigned char* stage = ring + s * Tile::kStageBytes;
      const WgmmaDesc da = WgmmaDescSw128(stage + consumer * (kHopperABytes / 2));
      const WgmmaDesc db = WgmmaDescSw128(stage + kHopperABytes);
      WgmmaFence();
      WgmmaHoldRegisters(acc);
      IRIS_UNROLL
      for (int kk = 0; kk < kHopperTileK / 16; ++kk) {
        WgmmaM64K16Bf16<kTileN>(acc, WgmmaDescAdvance(da, 32 * kk), WgmmaDescAdvance(db, 32 * kk), 1);
      }
      WgmmaCommit();
      WgmmaWait<1>();  // the stage before's MMAs are done: hand it back
      WgmmaHoldRegisters(acc);
      if (kt > 0 && tid % 128 == 0) MBarrierArrive(&empty[(slice - 1) % kHopperStages]);
    }
    WgmmaWait<0>();
    WgmmaHoldRegisters(acc);
    // The tile's last stage back too: the producer is already filling the ring for the next tile.
    if (tid % 128 == 0) MBarrierArrive(&empty[(slice - 1) % kHopperStages]);
    const int row0 = tile / p.col_blocks * kHopperTileRows;
    const int col0 = tile % p.col_blocks * Tile::template kBlockCols<kEpi>;
    HopperStoreTile<kEpi, kTileN>(p, acc, row0 + 64 * consumer, col0);
  }
#endif
}

}  // namespace iris::kernels::cuda
