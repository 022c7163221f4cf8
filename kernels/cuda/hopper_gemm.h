// iris's own Hopper GEMM (kernels/cuda/hopper_gemm.cuh) as host code calls it: bf16 rows times a
// bf16 weight's rows, f32 accumulation, the epilogue fused. Pointers are device memory; a launch
// only enqueues and returns its cudaError_t value (0: success), so this header needs no CUDA
// header. sm_90a only (wgmma, the copy engine): compute capability exactly 9.0.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace iris::kernels::cuda {

enum class HopperEpilogue : int {
  kF32,         // y f32: A·Bᵀ + bias (+ y where accumulate)
  kBf16,        // y bf16: A·Bᵀ + bias, rounded
  kSwiGluBf16,  // y bf16: silu(gate + bias) * (up + bias), rounded, where B's rows are n of gate
                // then n of up (a gated MLP's gate_up weight as stored) and the bias [2n] likewise
  kBf16Rotary,  // y bf16: A·Bᵀ + bias with the rotary turned on its first rotary_heads heads (the
                // vision blocks' qkv rows: q's and k's heads), rounded once
};

// The fused rotary's heads: Qwen2-VL's and Qwen2.5-VL's vision heads (1280 / 16 = 80 values), in
// tiles of three whole heads, so that every value and its rotate-half partner 40 columns on meet
// in one thread's accumulators (the MMA's fragments hold columns 8 apart).
constexpr int kHopperRotaryHeadDim = 80;
constexpr int kHopperRotaryTileN = 240;

constexpr int kHopperTileRows = 128;  // a tile's rows of A (m)

struct HopperGemm {
  HopperEpilogue epilogue = HopperEpilogue::kF32;
  const uint16_t* a = nullptr;  // [m][lda] bf16
  int64_t lda = 0;
  const uint16_t* b = nullptr;  // [n][ldb] bf16 ([2n][ldb] for kSwiGluBf16)
  int64_t ldb = 0;
  int64_t m = 0, n = 0, k = 0;  // n: y's columns
  const float* bias = nullptr;  // [n] ([2n] for kSwiGluBf16) or null
  void* y = nullptr;            // [m][ldy], f32 or bf16 by the epilogue
  int64_t ldy = 0;
  bool accumulate = false;      // kF32 only
  int tile_n = 128;             // B rows a block multiplies: 128 or 256 (twice the work per A byte);
                                // kBf16Rotary: kHopperRotaryTileN
  // 0: a block per 128 x tile_n tile of y. Else at most this many blocks (the SMs: persistent),
  // each taking tiles in turn, so that the copy engine lands the next tile's first K slices while
  // the MMA warpgroups write the last tile out.
  int max_blocks = 0;
  // kBf16Rotary: the rotate-half rotary (kernels/rotary.h) of heads [0, rotary_heads) of
  // head_dim values each, row r of the call by cos/sin [m][head_dim / 2] row r.
  int head_dim = 0;
  int rotary_heads = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  // kF32, the next RMSNorm's input handed on (kernels::RmsNormHandoff): of the rows y holds after
  // the call, norm_rows[r][c] = bf16(y[r][c] * norm_weight[c]) (stride norm_ld: even, the rows
  // 4-byte aligned), and norm_partials[r * partials_ld + j] = the sum of y[r][c]^2 over tile
  // column j's columns (HopperGemmGrid(g).cols partials a row, each written once, so no zeroing
  // and the same bits every run). Null norm_rows: none.
  uint16_t* norm_rows = nullptr;
  int64_t norm_ld = 0;
  const float* norm_weight = nullptr;
  float* norm_partials = nullptr;
  int64_t partials_ld = 0;  // (also row_partials')
  // Any epilogue, the RMSNorm's row factor applied to the product where A holds a handed-on
  // norm's rows: row r of A·Bᵀ is multiplied by 1 / sqrt(s / norm_width + norm_eps) before the
  // bias, s the sum of row_partials[r * partials_ld + i], i < row_parts, in that order. Null
  // row_partials: none.
  const float* row_partials = nullptr;
  int row_parts = 0;
  int norm_width = 0;
  float norm_eps = 0.f;
};

// y's tiles (kHopperTileRows x tile_n, half as wide for SwiGLU's output) and the launch's blocks.
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

// Whether the kernel takes g: a and b 16-byte aligned with row strides of whole 16-byte vectors
// (lda, ldb multiples of 8, at least k), ldy >= n, sizes that fit the kernel's 32-bit indices,
// tile_n 128 or 256; kBf16Rotary: head_dim kHopperRotaryHeadDim, tile_n kHopperRotaryTileN, the
// tables given, the rotated heads inside n; a handed-on norm's output only from kF32, its buffers
// given, its rows even and 4-byte aligned, room for a partial per tile column; a row factor's
// partials at least one a row.
inline bool HopperGemmTakes(const HopperGemm& g) {
  constexpr int64_t kMax = int64_t{1} << 31;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool shape = g.a != nullptr && g.b != nullptr && g.y != nullptr && aligned(g.a) && aligned(g.b) && g.m > 0 &&
                     g.n > 0 && g.k > 0 && g.m < kMax && 2 * g.n < kMax && g.k < kMax && g.lda % 8 == 0 &&
                     g.ldb % 8 == 0 && g.lda >= g.k && g.ldb >= g.k && g.ldy >= g.n && g.max_blocks >= 0;
  const bool rotary = g.epilogue == HopperEpilogue::kBf16Rotary;
  const bool width = rotary ? g.tile_n == kHopperRotaryTileN : g.tile_n == 128 || g.tile_n == 256;
  if (!shape || !width) return false;
  const HopperGrid grid = HopperGemmGrid(g);
  if (grid.cols * grid.rows >= kMax) return false;  // the kernel's int
  if (rotary && !(g.head_dim == kHopperRotaryHeadDim && g.cos != nullptr && g.sin != nullptr &&
                  g.rotary_heads >= 0 && int64_t{g.rotary_heads} * g.head_dim <= g.n)) {
    return false;
  }
  if (g.norm_rows != nullptr &&
      (g.epilogue != HopperEpilogue::kF32 || g.norm_weight == nullptr || g.norm_partials == nullptr ||
       g.norm_ld < g.n || g.norm_ld % 2 != 0 || reinterpret_cast<uintptr_t>(g.norm_rows) % 4 != 0 ||
       g.partials_ld < grid.cols)) {
    return false;
  }
  return g.row_partials == nullptr ||
         (g.row_parts >= 1 && g.partials_ld >= g.row_parts && g.norm_width >= 1 && g.norm_eps >= 0.f);
}

// Enqueues g on stream (cudaErrorInvalidValue where !HopperGemmTakes; the driver's error where
// its tensor maps cannot be made).
int LaunchHopperGemm(CUstream_st* stream, const HopperGemm& g);

}  // namespace iris::kernels::cuda
