// The streamed GEMV on the CUDA cores: GemvSimtKernel's product (linear_kernels.cuh) for a grid of
// resident blocks that each walk many output groups, so that a lane always has the next weight
// loads in flight while it multiplies and reduces the current ones. Device code written against
// simt.h: nvcc compiles it (linear_kernels.cu launches it), and the host compiler runs the same
// source on the SIMT harness in CI (tests/simt_linear_kernels_test.cc).
//
// Why: GemvSimtKernel gives a block one group of 8 outputs. Its lanes load their weight chunks,
// and then the block does nothing but arithmetic and a reduction until it exits and a new block
// starts loading: on an H200 the 3b decoder's GEMVs stream at ~64% of HBM that way (README). Here
// a block's work is a sequence of units (group, pass of 2048 columns); the loads of unit i+1 are
// issued before unit i's products and reduction, the norm's statistics and (for rows of at most
// 2048 columns) the op applied to x are computed once per block instead of once per group, and a
// warp reduces its outputs with a transposed butterfly (kOuts - 1 + log2(32 / kOuts) shuffles
// per row instead of 5 kOuts).
#pragma once

#include <cstdint>

#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/linear_kernels.cuh"
#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

// Outputs per group: 8 for up to 2 rows (two buffers of 8 chunks and the accumulators fit ~100
// registers, 2 blocks an SM), 4 past that (the accumulators grow with the rows).
IRIS_HOST_DEVICE constexpr int GemvStreamOuts(int rows) { return rows <= 2 ? 8 : 4; }

// v[o] summed over the warp's lanes, kN (a power of two, at most 32) sums at once: each step
// halves the values a lane holds, keeping the half its partner does not, so that lane l ends
// with the sum for output l / (32 / kN) after kN - 1 + log2(32 / kN) shuffles (5 kN for one
// butterfly per value). Every lane calls it; v is overwritten.
template <int kN>
IRIS_DEVICE float WarpSumTransposed(float (&v)[kN], int lane) {
  static_assert(kN >= 1 && kN <= kWarpSize && (kN & (kN - 1)) == 0, "a power of two up to the warp");
  int mask = kWarpSize / 2;
  IRIS_UNROLL
  for (int half = kN / 2; half >= 1; half /= 2, mask /= 2) {
    const bool upper = (lane & mask) != 0;
    IRIS_UNROLL
    for (int i = 0; i < half; ++i) {
      const float send = upper ? v[i] : v[i + half];
      const float keep = upper ? v[i + half] : v[i];
      v[i] = keep + ShflXor(send, mask);
    }
  }
  float s = v[0];
  for (; mask > 0; mask /= 2) s += ShflXor(s, mask);
  return s;
}
// The output WarpSumTransposed<kN> leaves in `lane`, and whether that lane is the first holding it.
template <int kN>
IRIS_DEVICE int WarpSumTransposedOutput(int lane) {
  return lane / (kWarpSize / kN);
}
template <int kN>
IRIS_DEVICE bool WarpSumTransposedWriter(int lane) {
  return lane % (kWarpSize / kN) == 0;
}

// y = beta * y + bias + op(x)·Wᵀ as GemvSimtKernel computes it (same operands, same bf16 rounding
// of x, f32 sums in another order), for kRows rows, x as whole 16-byte vectors (in % 8 == 0, x
// 16-byte aligned: the kVecX case). Any grid of kGemvSimtThreads-thread blocks: block b takes
// output groups b, b + gridDim.x, ... of GemvStreamOuts(kRows) outputs; the launch sizes it to the
// blocks that fit on the GPU at once (linear_kernels.cu).
template <int kRows, GemvX kOp = GemvX::kPlain>
IRIS_GLOBAL void GemvStreamKernel(const uint16_t* w, int64_t ld, int64_t in, int64_t out, GemvInput x,
                                  const float* bias, float beta, float* y, bool early_start) {
  constexpr int kOuts = GemvStreamOuts(kRows);
  // Two buffers: group i's partial sums are written while group i - 1's may still be read.
  IRIS_SHARED float partial[2][kGemvSimtWarps][kOuts * kRows];
  IRIS_SHARED float norm_partials[kOp == GemvX::kRmsNorm ? kGemvNormPartials : 1];
  IRIS_SHARED float inv[kGemvMaxRows];
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t groups = (out + kOuts - 1) / kOuts;
  const int64_t chunks = in / 8;
  const int64_t passes = (chunks + kGemvSimtThreads - 1) / kGemvSimtThreads;
  const int64_t c_lane = static_cast<int64_t>(warp) * kWarpSize + lane;  // this lane's chunk in a pass
  GridDependencyTrigger();
  int64_t g = blockIdx.x, p = 0;  // the current unit
  if (g >= groups) return;        // the whole block: a grid larger than the work
  const auto group_outs = [&](int64_t group) {
    const int64_t left = out - group * kOuts;
    return static_cast<int>(left < kOuts ? left : kOuts);
  };
  const auto load = [&](int64_t group, int64_t pass, Chunk16(&wc)[kOuts]) {
    if (const int64_t c = c_lane + pass * kGemvSimtThreads; c < chunks) {
      GemvSimtLoadWeights(w, ld, group * kOuts, group_outs(group), c, wc);
    }
  };
  // The first unit's weights before the wait (they are no kernel's output); the second unit's
  // lines asked for in the L2 when starting early.
  Chunk16 wc[kOuts], wn[kOuts];
  load(g, p, wc);
  if (early_start) {
    const int64_t g1 = passes > 1 ? g : g + gridDim.x, p1 = passes > 1 ? 1 : 0;
    if (const int64_t c = c_lane + p1 * kGemvSimtThreads; g1 < groups && c < chunks) {
      for (int o = 0; o < group_outs(g1); ++o) {
        PrefetchL2(reinterpret_cast<const Chunk16*>(w + (g1 * kOuts + o) * ld) + c);
      }
    }
  }
  GridDependencyWait();
  GemvPrologue<kOp>(x, kRows, in, norm_partials, inv);
  float xv[kRows][8] = {};  // op(x) rounded to bf16, this lane's chunk of the current pass
  if (passes == 1 && c_lane < chunks) {
    IRIS_UNROLL
    for (int r = 0; r < kRows; ++r) GemvXChunk<true, kOp>(x, r, c_lane, in, inv, xv[r]);
  }
  float acc[kOuts][kRows];
  for (int o = 0; o < kOuts; ++o) {
    for (int r = 0; r < kRows; ++r) acc[o][r] = 0.f;
  }
  int buffer = 0;
  for (;;) {
    int64_t ng = g, np = p + 1;  // the next unit
    if (np == passes) {
      np = 0;
      ng += gridDim.x;
    }
    const bool more = ng < groups;
    if (more) load(ng, np, wn);  // in flight through this unit's products and reduction
    if (const int64_t c = c_lane + p * kGemvSimtThreads; c < chunks) {
      if (passes > 1) {
        IRIS_UNROLL
        for (int r = 0; r < kRows; ++r) GemvXChunk<true, kOp>(x, r, c, in, inv, xv[r]);
      }
      IRIS_UNROLL
      for (int o = 0; o < kOuts; ++o) {
        float wv[8];
        ChunkValues(wc[o], wv, static_cast<const uint16_t*>(nullptr));
        IRIS_UNROLL
        for (int r = 0; r < kRows; ++r) {
          for (int e = 0; e < 8; ++e) acc[o][r] += xv[r][e] * wv[e];
        }
      }
    }
    if (np == 0) {  // the group's last pass: its sums
      IRIS_UNROLL
      for (int r = 0; r < kRows; ++r) {
        float v[kOuts];
        for (int o = 0; o < kOuts; ++o) v[o] = acc[o][r], acc[o][r] = 0.f;
        const float s = WarpSumTransposed<kOuts>(v, lane);
        if (WarpSumTransposedWriter<kOuts>(lane)) partial[buffer][warp][WarpSumTransposedOutput<kOuts>(lane) * kRows + r] = s;
      }
      SyncThreads();
      const int t = static_cast<int>(threadIdx.x);
      if (const int64_t o0 = g * kOuts; t < group_outs(g) * kRows) {
        const int o = t / kRows, r = t % kRows;
        GemvFinish(&partial[buffer][0][t], kGemvSimtWarps, kOuts * kRows, bias, o0 + o, beta,
                   y + static_cast<int64_t>(r) * out + o0 + o);
      }
      buffer ^= 1;
    }
    if (!more) break;
    for (int o = 0; o < kOuts; ++o) wc[o] = wn[o];
    g = ng, p = np;
  }
  SyncThreads();  // the shared partials are read before a next block (harness) reuses them
}

}  // namespace iris::kernels::cuda
