// The CUDA Linear's own small kernels, and the read-bandwidth probe: device code written against
// simt.h, so that nvcc compiles it (linear_kernels.cu launches it) and the host compiler runs the
// same source on the SIMT harness in CI (tests/simt_linear_kernels_test.cc).
//   - f32 -> bf16 of a Linear's input rows, rounded exactly as the CPU path rounds them
//     (core::FloatToBf16: nearest even on the bit pattern, NaN kept quiet, subnormals rounded
//     rather than flushed);
//   - y = gelu_erf(y + bias) in place after the matmul: cuBLASLt's GELU epilogue is not the erf
//     form (see cuda_linear.cc);
//   - y = x·Wᵀ for a few rows of x (a decode step's batch) with bf16 weights: GEMVs (on the CUDA
//     cores, and on the tensor cores) that stream the weight once, rounding x to bf16 as they read
//     it, where cuBLASLt's kernels for such shapes need x converted by a launch first; and that
//     may apply the op before the product as they read x (RMSNorm, SiLU·mul: GemvX), so that
//     op's launch goes too;
//   - a read-and-sum pass over a large buffer (MeasureMemoryReadBandwidth);
//   - a request for a range of memory in the L2 (PrefetchL2Kernel: weights ahead of their GEMV).
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/linear_kernels.h"
#include "kernels/cuda/row_math.cuh"
#include "kernels/cuda/simt.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace iris::kernels::cuda {

// out[r * ld + c] = bf16(x[r * cols + c]) for r < rows, c < cols; out's padding columns
// [cols, ld) are left as they are. Any grid: rows strided over blockIdx.y, columns over the x
// threads (no per-element division).
IRIS_GLOBAL void ToBf16RowsKernel(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  const int64_t col_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += col_stride) {
      out[r * ld + c] = FloatToBf16(x[r * cols + c]);
    }
  }
}

// The same, 8 values a thread (two 16-byte loads, one 16-byte store) where every row allows it:
// x 16-byte aligned with cols % 8 == 0, out 16-byte aligned with ld % 8 == 0. Columns go in
// chunks of 8 over the x threads, rows over blockIdx.y (any grid).
IRIS_GLOBAL void ToBf16Rows8Kernel(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  const int64_t chunks = cols / 8, chunk_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const Float4* src = reinterpret_cast<const Float4*>(x + r * cols);
    Chunk16* dst = reinterpret_cast<Chunk16*>(out + r * ld);
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks; c += chunk_stride) {
      const Float4 a = src[2 * c], b = src[2 * c + 1];
      Chunk16 o;
      o.w[0] = PackBf16x2(a.x, a.y);
      o.w[1] = PackBf16x2(a.z, a.w);
      o.w[2] = PackBf16x2(b.x, b.y);
      o.w[3] = PackBf16x2(b.z, b.w);
      dst[c] = o;
    }
  }
}

// gelu(v) = v * Phi(v) = 0.5 v erfc(-v / sqrt(2)), the exact (erf) form HF's vision merger uses.
// erfc rather than 1 + erf: for negative v, 1 + erf(v / sqrt 2) cancels and loses the small
// result's digits, erfc keeps them.
IRIS_DEVICE float GeluErfValue(float v) { return 0.5f * v * erfcf(-v * 0.70710678118654752f); }

// y[r, c] = gelu_erf(y[r, c] + bias[c]) in place (bias may be null: no bias). Any grid, strided
// as ToBf16RowsKernel's.
IRIS_GLOBAL void BiasGeluErfKernel(float* y, int64_t rows, int64_t cols, const float* bias) {
  const int64_t col_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += col_stride) {
      const float v = bias != nullptr ? y[r * cols + c] + bias[c] : y[r * cols + c];
      y[r * cols + c] = GeluErfValue(v);
    }
  }
}

// Both GEMVs let the kernel behind them start early (GridDependencyTrigger, simt.h) and wait for
// the kernel ahead of them (GridDependencyWait) before they read x, y or anything else another
// kernel writes. The weight is no kernel's output, so a lane loads its first pass of it into
// registers before that wait (and before a folded norm's statistics). Launched with programmatic
// stream serialization (early_start, LaunchGemvBf16's `early`), a GEMV's blocks can be resident
// while the kernel ahead finishes: the weight stream starts before x is ready, and the second
// pass's lines are asked for in the L2 then too.

// --- GEMV on the CUDA cores: y = x·Wᵀ for 1..kGemvMaxRows rows of x, W bf16 ---
// A block owns kGemvSimtOutPerBlock output features; its warps split the input columns in
// 16-byte chunks (8 bf16), lane-interleaved so that a warp's load of a weight row is 512
// contiguous bytes. Each x chunk a lane reads serves all of the block's weight rows, and a lane
// has that many 16-byte weight loads in flight before its first product. Partial sums meet in
// shared memory. It spends kRows FMAs per weight element, where the tensor-core kernel below
// spends a share of one mma whatever the rows.
constexpr int kGemvMaxRows = 8;  // both kernels' limit: the tensor-core tile's columns
constexpr int kGemvSimtWarps = 8;
constexpr int kGemvSimtThreads = kGemvSimtWarps * kWarpSize;
constexpr int kGemvSimtOutPerBlock = 8;

// One output of either GEMV: *yo = beta * *yo + bias[o] + the `parts` partial sums at
// partial[k * stride] (*yo not read when beta == 0; bias may be null).
IRIS_DEVICE void GemvFinish(const float* partial, int parts, int stride, const float* bias, int64_t o, float beta,
                            float* yo) {
  float s = 0.f;
  for (int k = 0; k < parts; ++k) s += partial[k * stride];
  if (bias != nullptr) s += bias[o];
  *yo = beta != 0.f ? beta * *yo + s : s;
}

// The norm's statistics a block of a kRmsNorm GEMV computes before its products: inv[r] =
// 1/sqrt(mean(x[r, :]^2) + eps) for r < rows, summed exactly as RmsNormVecKernel sums the row
// with x.norm_threads threads (row_math.cuh): each warp of this block takes (row, that kernel's
// warp) pairs in turn, its lanes standing for that warp's threads, and the pairs' warp sums meet
// as BlockSum's partials do. So a folded value is the norm kernel's value bit for bit. Other ops:
// nothing. Every thread of the block calls it.
constexpr int kGemvNormPartials = kGemvMaxRows * kMaxWarpsPerBlock;
template <GemvX kOp>
IRIS_DEVICE void GemvPrologue(const GemvInput& x, int rows, int64_t in, float* partials, float* inv) {
  if constexpr (kOp == GemvX::kRmsNorm) {
    const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
    const int warps = static_cast<int>(blockDim.x) / kWarpSize, norm_warps = x.norm_threads / kWarpSize;
    const int64_t vecs = in / 4;
    for (int p = warp; p < rows * norm_warps; p += warps) {
      const int r = p / norm_warps, nw = p % norm_warps;
      const int64_t t = static_cast<int64_t>(nw) * kWarpSize + lane;
      const Float4* xr = reinterpret_cast<const Float4*>(x.x + r * in);
      float ss = 0.f;
      IRIS_UNROLL
      for (int i = 0; i < kRmsNormVecs; ++i) {
        const int64_t e = t + static_cast<int64_t>(i) * x.norm_threads;
        if (e < vecs) ss = AddSquares4(ss, xr[e]);
      }
      ss = WarpSum(ss);
      if (lane == 0) partials[r * kMaxWarpsPerBlock + nw] = ss;
    }
    SyncThreads();
    for (int r = warp; r < rows; r += warps) {
      const float s = WarpSum(lane < norm_warps ? partials[r * kMaxWarpsPerBlock + lane] : 0.f);
      if (lane == 0) inv[r] = InvSqrt(s / static_cast<float>(in) + x.eps);
    }
    SyncThreads();
  }
}

// Input row `row`'s columns 8c .. 8c+8 as f32, the op applied (kRmsNorm: with inv[row] from
// GemvPrologue); columns at or past `in` read as 0. kVecX: the rows are 16-byte aligned and
// in % 8 == 0 (16-byte loads); the folded ops need it.
template <bool kVecX, GemvX kOp>
IRIS_DEVICE void GemvXLoad(const GemvInput& x, int row, int64_t c, int64_t in, const float* inv, float (&v)[8]) {
  static_assert(kVecX || kOp == GemvX::kPlain, "the folded ops read whole 16-byte vectors");
  if constexpr (kOp == GemvX::kPlain && !kVecX) {
    const float* xr = x.x + row * in;
    for (int e = 0; e < 8; ++e) v[e] = 8 * c + e < in ? xr[8 * c + e] : 0.f;
  } else {
    const int64_t width = kOp == GemvX::kSiluMul ? 2 * in : in;  // x's row stride
    const Float4* xr = reinterpret_cast<const Float4*>(x.x + row * width);
    const Float4 a = xr[2 * c], b = xr[2 * c + 1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    if constexpr (kOp == GemvX::kRmsNorm) {
      const Float4* wr = reinterpret_cast<const Float4*>(x.norm_weight);
      const Float4 wa = wr[2 * c], wb = wr[2 * c + 1];
      const float w[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
      for (int e = 0; e < 8; ++e) v[e] = RmsNormValue(v[e], inv[row], w[e]);
    } else if constexpr (kOp == GemvX::kSiluMul) {
      const Float4* ur = reinterpret_cast<const Float4*>(x.x + row * width + in);
      const Float4 ua = ur[2 * c], ub = ur[2 * c + 1];
      const float u[8] = {ua.x, ua.y, ua.z, ua.w, ub.x, ub.y, ub.z, ub.w};
      for (int e = 0; e < 8; ++e) v[e] = Silu(v[e]) * u[e];
    }
  }
}

// ... rounded to bf16 (as ToBf16RowsKernel rounds it) and widened back to f32.
template <bool kVecX, GemvX kOp>
IRIS_DEVICE void GemvXChunk(const GemvInput& x, int row, int64_t c, int64_t in, const float* inv, float (&v)[8]) {
  GemvXLoad<kVecX, kOp>(x, row, c, in, inv, v);
  for (int e = 0; e < 8; ++e) v[e] = Bf16ToFloat(FloatToBf16(v[e]));
}

// The 16-byte chunk c of kN weight rows from o0 (one load each). Rows past `out` (the last
// group: o >= outs) read row o0: loaded, never stored.
template <int kN>
IRIS_DEVICE void GemvSimtLoadWeights(const uint16_t* w, int64_t ld, int64_t o0, int outs, int64_t c,
                                     Chunk16 (&wc)[kN]) {
  IRIS_UNROLL
  for (int o = 0; o < kN; ++o) {
    wc[o] = reinterpret_cast<const Chunk16*>(w + (o0 + (o < outs ? o : 0)) * ld)[c];
  }
}

// The output features a CUDA-core GEMV block owns: row(o) for o < outs (at most
// kGemvSimtOutPerBlock), the first four from `first` on and the other four from `second` on. A
// plain GEMV's block owns 8 consecutive rows (second = first + 4); the qkv GEMV with the rotary
// epilogue gives a block four rotary pairs (second = first + head_dim / 2), so that a pair's two
// outputs meet in one block.
struct GemvBlockRows {
  int64_t first = 0, second = 4;
  int outs = 0;
  IRIS_HOST_DEVICE int64_t row(int o) const { return o < 4 ? first + o : second + (o - 4); }
};
static_assert(kGemvSimtOutPerBlock == 8, "GemvBlockRows: two runs of four rows");

// The 16-byte chunk c of the block's weight rows (one load each). Slots past rows.outs (the last
// block of a plain GEMV) read its first row: loaded, never stored.
IRIS_DEVICE void GemvBlockLoadWeights(const uint16_t* w, int64_t ld, const GemvBlockRows& rows, int64_t c,
                                      Chunk16 (&wc)[kGemvSimtOutPerBlock]) {
  IRIS_UNROLL
  for (int o = 0; o < kGemvSimtOutPerBlock; ++o) {
    wc[o] = reinterpret_cast<const Chunk16*>(w + rows.row(o < rows.outs ? o : 0) * ld)[c];
  }
}

// The products of a CUDA-core GEMV block: partial[warp][o * kRows + r] = warp `warp`'s share of
// op(x)[r, :] (rounded to bf16) · w[rows.row(o), :], for the block's rows. Every thread calls it;
// the partials are complete after it (it ends with a barrier).
// kPipelined (GemvKernel::kCudaCoresPipelined): a lane asks for its next pass's weight chunks
// before it multiplies this pass's, so that a row of several passes (the 3b's down: 1376 chunks,
// 5.4 passes) streams with a pass of loads always in flight, where the one-pass-at-a-time loop
// leaves the memory idle while it computes and waits a full round trip per pass. The same
// products in the same order: the same y, bit for bit.
template <int kRows, bool kVecX, GemvX kOp, bool kPipelined>
IRIS_DEVICE void GemvSimtProducts(const uint16_t* w, int64_t ld, int64_t in, const GemvInput& x,
                                  const GemvBlockRows& rows, bool early_start,
                                  float (&partial)[kGemvSimtWarps][kGemvSimtOutPerBlock * kRows], float* norm_partials,
                                  float* inv) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t chunks = (in + 7) / 8;
  // This lane's first pass of the weight, loaded before the wait and the prologue (above): its
  // latency overlaps the norm's statistics and, starting early, the kernel ahead. A row of up to
  // 2048 columns is a single pass.
  const int64_t c0 = static_cast<int64_t>(warp) * kWarpSize + lane;
  Chunk16 wc[kGemvSimtOutPerBlock];
  if (c0 < chunks) GemvBlockLoadWeights(w, ld, rows, c0, wc);
  if (const int64_t c1 = c0 + kGemvSimtThreads; early_start && c1 < chunks) {
    for (int o = 0; o < rows.outs; ++o) PrefetchL2(reinterpret_cast<const Chunk16*>(w + rows.row(o) * ld) + c1);
  }
  GridDependencyWait();
  GemvPrologue<kOp>(x, kRows, in, norm_partials, inv);
  float acc[kGemvSimtOutPerBlock][kRows];
  for (int o = 0; o < kGemvSimtOutPerBlock; ++o) {
    for (int r = 0; r < kRows; ++r) acc[o][r] = 0.f;
  }
  for (int64_t c = c0; c < chunks; c += kGemvSimtThreads) {
    Chunk16 next[kPipelined ? kGemvSimtOutPerBlock : 1];
    if constexpr (kPipelined) {
      if (c + kGemvSimtThreads < chunks) GemvBlockLoadWeights(w, ld, rows, c + kGemvSimtThreads, next);
    } else {
      if (c != c0) GemvBlockLoadWeights(w, ld, rows, c, wc);
    }
    float xv[kRows][8];
    IRIS_UNROLL
    for (int r = 0; r < kRows; ++r) GemvXChunk<kVecX, kOp>(x, r, c, in, inv, xv[r]);
    IRIS_UNROLL
    for (int o = 0; o < kGemvSimtOutPerBlock; ++o) {
      float wv[8];
      ChunkValues(wc[o], wv, static_cast<const uint16_t*>(nullptr));  // once per weight chunk
      IRIS_UNROLL
      for (int r = 0; r < kRows; ++r) {
        for (int e = 0; e < 8; ++e) acc[o][r] += xv[r][e] * wv[e];
      }
    }
    if constexpr (kPipelined) {
      IRIS_UNROLL
      for (int o = 0; o < kGemvSimtOutPerBlock; ++o) wc[o] = next[o];
    }
  }
  for (int o = 0; o < kGemvSimtOutPerBlock; ++o) {
    for (int r = 0; r < kRows; ++r) {
      float s = acc[o][r];
      for (int m = kWarpSize / 2; m > 0; m >>= 1) s += ShflXor(s, m);
      if (lane == 0) partial[warp][o * kRows + r] = s;
    }
  }
  SyncThreads();
}

// What GemvMmaKernel computes (below), for kRows rows. Grid: ceil(out / kGemvSimtOutPerBlock)
// blocks of kGemvSimtThreads, block b owning rows 8b .. 8b + 7.
template <int kRows, bool kVecX, GemvX kOp = GemvX::kPlain, bool kPipelined = false>
IRIS_GLOBAL void GemvSimtKernel(const uint16_t* w, int64_t ld, int64_t in, int64_t out, GemvInput x,
                                const float* bias, float beta, float* y, bool early_start) {
  IRIS_SHARED float partial[kGemvSimtWarps][kGemvSimtOutPerBlock * kRows];
  IRIS_SHARED float norm_partials[kOp == GemvX::kRmsNorm ? kGemvNormPartials : 1];
  IRIS_SHARED float inv[kGemvMaxRows];
  GemvBlockRows rows;
  rows.first = static_cast<int64_t>(blockIdx.x) * kGemvSimtOutPerBlock;
  rows.second = rows.first + 4;
  rows.outs = static_cast<int>(out - rows.first < kGemvSimtOutPerBlock ? out - rows.first : kGemvSimtOutPerBlock);
  GridDependencyTrigger();
  GemvSimtProducts<kRows, kVecX, kOp, kPipelined>(w, ld, in, x, rows, early_start, partial, norm_partials, inv);
  const int t = static_cast<int>(threadIdx.x);
  if (t < rows.outs * kRows) {
    const int o = t / kRows, r = t % kRows;
    GemvFinish(&partial[0][t], kGemvSimtWarps, kGemvSimtOutPerBlock * kRows, bias, rows.row(o), beta,
               y + static_cast<int64_t>(r) * out + rows.row(o));
  }
  SyncThreads();  // the shared partials are read before a next block (harness) reuses them
}

// --- The qkv GEMV of a decode step with the step's rotary and KV write as its epilogue ---
// y = qkv rows [rows, (q_heads + 2 k_heads) * head_dim] (q heads, then k heads, then v heads, as
// the decoder's qkv Linear lays them out), then what RotaryQKWriteKvKernel does to them: each q
// and k head's pairs (i, i + head_dim / 2) rotated in place by the row's cos/sin, and the rotated k
// and the v rows stored into pool slot slots[r] (rounded as the pool's dtype; not where the slot is
// outside [0, num_slots), kernels::kPadSlot). The values are the GEMV's then that kernel's, bit for
// bit: the same sums, the same RotatePair on the same f32 values, the same rounding; one launch
// fewer a layer, and no round trip of q and k through memory between the two (GemvRotaryKv:
// linear_kernels.h).
// Blocks of the rotary GEMV: the q and k heads' rows four pairs a block (head_dim / 8 blocks a
// head), then the v rows eight a block.
IRIS_HOST_DEVICE int64_t GemvRotaryKvBlocks(const GemvRotaryKv& r) {
  const int64_t rotated = static_cast<int64_t>(r.q_heads + r.k_heads) * (r.head_dim / 8);
  const int64_t v_rows = static_cast<int64_t>(r.k_heads) * r.head_dim;
  return rotated + (v_rows + kGemvSimtOutPerBlock - 1) / kGemvSimtOutPerBlock;
}

// pool[at] = value, rounded as the pool's dtype (bf16 or f32).
IRIS_DEVICE void StorePoolValue(void* pool, bool bf16, int64_t at, float value) {
  if (bf16) {
    StoreRounded(static_cast<uint16_t*>(pool) + at, value);
  } else {
    StoreRounded(static_cast<float*>(pool) + at, value);
  }
}

// Grid: GemvRotaryKvBlocks(rot) blocks of kGemvSimtThreads. head_dim % 8 == 0 (four pairs a block);
// out = (q_heads + 2 k_heads) * head_dim; bias may be null; y is written (beta 0).
template <int kRows, GemvX kOp = GemvX::kPlain, bool kPipelined = false>
IRIS_GLOBAL void GemvSimtRotaryKvKernel(const uint16_t* w, int64_t ld, int64_t in, int64_t out, GemvInput x,
                                        const float* bias, float* y, bool early_start, GemvRotaryKv rot) {
  IRIS_SHARED float partial[kGemvSimtWarps][kGemvSimtOutPerBlock * kRows];
  IRIS_SHARED float norm_partials[kOp == GemvX::kRmsNorm ? kGemvNormPartials : 1];
  IRIS_SHARED float inv[kGemvMaxRows];
  const int half = rot.head_dim / 2, blocks_per_head = rot.head_dim / 8;
  const int64_t rotated_blocks = static_cast<int64_t>(rot.q_heads + rot.k_heads) * blocks_per_head;
  const int64_t b = blockIdx.x;
  const bool rotary = b < rotated_blocks;
  const int head = rotary ? static_cast<int>(b / blocks_per_head) : 0;
  const int i0 = rotary ? 4 * static_cast<int>(b % blocks_per_head) : 0;  // the block's first pair in its head
  GemvBlockRows rows;
  if (rotary) {
    rows.first = static_cast<int64_t>(head) * rot.head_dim + i0;
    rows.second = rows.first + half;
    rows.outs = kGemvSimtOutPerBlock;
  } else {
    rows.first = static_cast<int64_t>(rot.q_heads + rot.k_heads) * rot.head_dim +
                 (b - rotated_blocks) * kGemvSimtOutPerBlock;
    rows.second = rows.first + 4;
    rows.outs = static_cast<int>(out - rows.first < kGemvSimtOutPerBlock ? out - rows.first : kGemvSimtOutPerBlock);
  }
  GridDependencyTrigger();
  GemvSimtProducts<kRows, true, kOp, kPipelined>(w, ld, in, x, rows, early_start, partial, norm_partials, inv);
  const int t = static_cast<int>(threadIdx.x);
  const int64_t width = static_cast<int64_t>(rot.k_heads) * rot.head_dim;  // a pool slot's values
  constexpr int kStride = kGemvSimtOutPerBlock * kRows;
  if (rotary && t < 4 * kRows) {
    // Thread (pair j, row r): the pair's two sums, rotated, to y and (k heads) the pool.
    const int j = t / kRows, r = t % kRows;
    float x1, x2;
    GemvFinish(&partial[0][j * kRows + r], kGemvSimtWarps, kStride, bias, rows.row(j), 0.f, &x1);
    GemvFinish(&partial[0][(j + 4) * kRows + r], kGemvSimtWarps, kStride, bias, rows.row(j + 4), 0.f, &x2);
    const int i = i0 + j;
    float y1, y2;
    RotatePair(x1, x2, rot.cos[static_cast<int64_t>(r) * half + i], rot.sin[static_cast<int64_t>(r) * half + i], &y1,
               &y2);
    y[static_cast<int64_t>(r) * out + rows.row(j)] = y1;
    y[static_cast<int64_t>(r) * out + rows.row(j + 4)] = y2;
    const int64_t slot = rot.slots[r];
    if (head >= rot.q_heads && slot >= 0 && slot < rot.num_slots) {
      const int64_t at = slot * width + static_cast<int64_t>(head - rot.q_heads) * rot.head_dim + i;
      StorePoolValue(rot.k_pool, rot.bf16_pool, at, y1);
      StorePoolValue(rot.k_pool, rot.bf16_pool, at + half, y2);
    }
  } else if (!rotary && t < rows.outs * kRows) {
    const int o = t / kRows, r = t % kRows;
    float v;
    GemvFinish(&partial[0][t], kGemvSimtWarps, kStride, bias, rows.row(o), 0.f, &v);
    y[static_cast<int64_t>(r) * out + rows.row(o)] = v;
    const int64_t slot = rot.slots[r];
    if (slot >= 0 && slot < rot.num_slots) {
      const int64_t at = slot * width + rows.row(o) - static_cast<int64_t>(rot.q_heads + rot.k_heads) * rot.head_dim;
      StorePoolValue(rot.v_pool, rot.bf16_pool, at, v);
    }
  }
  SyncThreads();  // the shared partials are read before a next block (harness) reuses them
}

// --- GEMV on the tensor cores: y = x·Wᵀ for 1..kGemvMaxRows rows of x, W bf16 ---
// One m16n8k16 product takes 16 weight rows (A) by up to 8 rows of x (B, its 8 columns): a
// decode batch of up to 8 costs the weight stream and nothing more. A block owns 16 output
// features; its warps split the input columns in steps of 32, each lane reading 16 bytes of two
// weight rows per step (kGemvMmaUnroll steps in flight), and the partial tiles meet in shared memory.
// The fragments want two consecutive k per register; with 16-byte loads a lane holds 8
// consecutive k of a row instead, so both operands use the same permutation of k within a step
// (lane (group, t) feeds k = 8t .. 8t+3 to the first product and 8t+4 .. 8t+7 to the second) —
// a sum does not depend on the order of its terms' k.
constexpr int kGemvMmaWarps = 16;
constexpr int kGemvMmaThreads = kGemvMmaWarps * kWarpSize;
constexpr int kGemvMmaOutPerBlock = 16;  // an mma tile's rows
constexpr int kGemvMmaUnroll = 4;        // 32-column steps a warp has in flight

// Row `row`'s columns 8c .. 8c+8 (GemvXLoad) as bf16 pairs, rounded as ToBf16RowsKernel rounds
// them: p[i] holds columns 8c+2i (low half) and 8c+2i+1.
template <bool kVecX, GemvX kOp>
IRIS_DEVICE void GemvXPairs(const GemvInput& x, int row, int64_t c, int64_t in, const float* inv, uint32_t (&p)[4]) {
  float v[8];
  GemvXLoad<kVecX, kOp>(x, row, c, in, inv, v);
  for (int i = 0; i < 4; ++i) p[i] = PackBf16x2(v[2 * i], v[2 * i + 1]);
}

// A lane's chunks of its two weight rows for the kGemvMmaUnroll steps s0, s0 + kGemvMmaWarps, ...
// (16-byte loads; zeros past the row's chunks).
IRIS_DEVICE void GemvMmaLoadWeights(const uint16_t* w_lo, const uint16_t* w_hi, int64_t s0, int t, int64_t chunks,
                                    Chunk16 (&a_lo)[kGemvMmaUnroll], Chunk16 (&a_hi)[kGemvMmaUnroll]) {
  IRIS_UNROLL
  for (int u = 0; u < kGemvMmaUnroll; ++u) {
    const int64_t c = (s0 + static_cast<int64_t>(u) * kGemvMmaWarps) * 4 + t;
    if (c < chunks) {
      a_lo[u] = reinterpret_cast<const Chunk16*>(w_lo)[c];
      a_hi[u] = reinterpret_cast<const Chunk16*>(w_hi)[c];
    } else {
      a_lo[u] = a_hi[u] = Chunk16{{0u, 0u, 0u, 0u}};
    }
  }
}

// y[r * out + o] = beta * y[r * out + o] + bias[o] + Σ_c bf16(op(x)[r, c]) · w[o * ld + c] for
// r < rows (1 .. kGemvMaxRows), o < out (op: kOp, linear_kernels.h's GemvX). w: bf16 bits,
// 16-byte aligned, ld % 8 == 0, columns [in, ld) zero (the CUDA Linear's layout). bias may be
// null; y is not read when beta == 0 (it may hold anything). Grid: ceil(out /
// kGemvMmaOutPerBlock) blocks of kGemvMmaThreads.
template <bool kVecX, GemvX kOp = GemvX::kPlain>
IRIS_GLOBAL void GemvMmaKernel(const uint16_t* w, int64_t ld, int64_t in, int64_t out, GemvInput x, int rows,
                                const float* bias, float beta, float* y, bool early_start) {
  IRIS_SHARED float partial[kGemvMmaWarps][kGemvMmaOutPerBlock * kGemvMaxRows];
  IRIS_SHARED float norm_partials[kOp == GemvX::kRmsNorm ? kGemvNormPartials : 1];
  IRIS_SHARED float inv[kGemvMaxRows];
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int group = lane / 4, t = lane % 4;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kGemvMmaOutPerBlock;
  // This lane's two weight rows; rows past `out` (the last block) read row o0: loaded, never stored.
  const uint16_t* w_lo = w + (o0 + group < out ? o0 + group : o0) * ld;
  const uint16_t* w_hi = w + (o0 + group + 8 < out ? o0 + group + 8 : o0) * ld;
  const int xrow = group < rows ? group : 0;  // batch row `group`
  const int64_t chunks = (in + 7) / 8;    // 16-byte chunks of a row holding columns below `in`
  const int64_t steps = (chunks + 3) / 4;  // 32-column steps
  GridDependencyTrigger();
  // As in GemvSimtKernel: the first pass's weight chunks are loaded before the wait and the
  // prologue, and the second pass's asked for in the L2 when starting early.
  const int64_t pass = static_cast<int64_t>(kGemvMmaWarps) * kGemvMmaUnroll;  // steps per pass
  Chunk16 a_lo[kGemvMmaUnroll], a_hi[kGemvMmaUnroll];
  GemvMmaLoadWeights(w_lo, w_hi, warp, t, chunks, a_lo, a_hi);
  IRIS_UNROLL
  for (int u = 0; u < kGemvMmaUnroll; ++u) {
    if (const int64_t c = (warp + pass + static_cast<int64_t>(u) * kGemvMmaWarps) * 4 + t; early_start && c < chunks) {
      PrefetchL2(reinterpret_cast<const Chunk16*>(w_lo) + c);
      PrefetchL2(reinterpret_cast<const Chunk16*>(w_hi) + c);
    }
  }
  GridDependencyWait();
  GemvPrologue<kOp>(x, rows, in, norm_partials, inv);
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t s0 = warp; s0 < steps; s0 += pass) {
    if (s0 != warp) GemvMmaLoadWeights(w_lo, w_hi, s0, t, chunks, a_lo, a_hi);
    IRIS_UNROLL
    for (int u = 0; u < kGemvMmaUnroll; ++u) {
      const int64_t c = (s0 + static_cast<int64_t>(u) * kGemvMmaWarps) * 4 + t;
      uint32_t xp[4] = {0u, 0u, 0u, 0u};
      if (group < rows && c < chunks) GemvXPairs<kVecX, kOp>(x, xrow, c, in, inv, xp);
      const uint32_t a0[4] = {a_lo[u].w[0], a_hi[u].w[0], a_lo[u].w[1], a_hi[u].w[1]};
      const uint32_t b0[2] = {xp[0], xp[1]};
      MmaBf16(d, a0, b0);
      const uint32_t a1[4] = {a_lo[u].w[2], a_hi[u].w[2], a_lo[u].w[3], a_hi[u].w[3]};
      const uint32_t b1[2] = {xp[2], xp[3]};
      MmaBf16(d, a1, b1);
    }
  }
  // d[0], d[1]: output o0 + group, batch rows 2t, 2t+1; d[2], d[3]: output o0 + group + 8.
  partial[warp][group * kGemvMaxRows + 2 * t] = d[0];
  partial[warp][group * kGemvMaxRows + 2 * t + 1] = d[1];
  partial[warp][(group + 8) * kGemvMaxRows + 2 * t] = d[2];
  partial[warp][(group + 8) * kGemvMaxRows + 2 * t + 1] = d[3];
  SyncThreads();
  const int i = static_cast<int>(threadIdx.x);
  const int o = i / kGemvMaxRows, r = i % kGemvMaxRows;
  if (i < kGemvMmaOutPerBlock * kGemvMaxRows && r < rows && o0 + o < out) {
    GemvFinish(&partial[0][i], kGemvMmaWarps, kGemvMmaOutPerBlock * kGemvMaxRows, bias, o0 + o, beta,
               y + static_cast<int64_t>(r) * out + o0 + o);
  }
  SyncThreads();  // the shared partials are read before a next block (harness) reuses them
}

// Asks the L2 for [p, p + bytes) (p 16-byte aligned, bytes a multiple of 16) in pieces of
// kPrefetchPieceBytes, thread i of the grid taking pieces i, i + threads, ...; then waits for the
// kernel ahead before it ends, so that a kernel launched early behind this one, waiting for it
// (GridDependencyWait), has waited for that kernel too: put between two kernels, it keeps the
// chain of early starts as it was. It reads nothing into registers and writes nothing. (Why: a
// decode step's attention is latency-bound and leaves HBM idle; the weights of the Linears after
// it can stream into the L2 meanwhile. kernels::PrefetchWeights.)
constexpr int64_t kPrefetchPieceBytes = int64_t{16} << 10;
IRIS_GLOBAL void PrefetchL2Kernel(const char* p, int64_t bytes) {
  GridDependencyTrigger();
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i * kPrefetchPieceBytes < bytes;
       i += threads) {
    const int64_t left = bytes - i * kPrefetchPieceBytes;
    PrefetchL2Bulk(p + i * kPrefetchPieceBytes,
                   static_cast<uint32_t>(left < kPrefetchPieceBytes ? left : kPrefetchPieceBytes));
  }
  GridDependencyWait();
}

constexpr int kReadSumMaxWarps = 32;

// partials[blockIdx.x] = the sum of this block's share of x[0, n4) (grid-stride, 16-byte loads,
// four independent loads in flight per thread). The sums are written so that no read can be
// optimised away; blockDim.x: a multiple of the warp size.
IRIS_GLOBAL void ReadSumKernel(const Float4* x, int64_t n4, float* partials) {
  IRIS_SHARED float warp_sums[kReadSumMaxWarps];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    Float4 v[4];
    for (int u = 0; u < 4; ++u) v[u] = x[i + u * stride];
    for (int u = 0; u < 4; ++u) acc[u] += (v[u].x + v[u].y) + (v[u].z + v[u].w);
  }
  for (; i < n4; i += stride) {
    const Float4 v = x[i];
    acc[0] += (v.x + v.y) + (v.z + v.w);
  }
  float s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (int m = kWarpSize / 2; m > 0; m >>= 1) s += ShflXor(s, m);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) warp_sums[warp] = s;
  SyncThreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.x) / kWarpSize; ++w) total += warp_sums[w];
    partials[blockIdx.x] = total;
  }
}

}  // namespace iris::kernels::cuda
