// iris's own flash-attention kernel for varlen attention over cu_seqlens (device code against
// simt.h: nvcc builds it in attention_kernels.cu, the SIMT harness runs it in CI). f32 products on
// CUDA cores: the exact second path beside cuDNN's SDPA, and the one every head dim and stride
// works with.
//
// A block owns kFlashRows query rows of one (sequence, q head): grid (num_seqs,
// ceil(max_seqlen / kFlashRows), num_heads). Each of its 4 warps takes 4 of the rows. Keys come in
// tiles of 32 (one per lane) through shared memory: a lane computes its key's score for a row, a
// warp max and sum give the online softmax's update, the row's probabilities go to shared memory,
// and the lanes (each owning head dims lane, lane + 32, ...) accumulate P·V. Causal blocks stop at
// the tile holding their last row's position.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/simt.h"
#include "kernels/cuda/varlen_block_rows.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace iris::kernels::cuda {

constexpr int kFlashWarps = 4;
constexpr int kFlashRowsPerWarp = 4;
constexpr int kFlashRows = kFlashWarps * kFlashRowsPerWarp;
constexpr int kFlashKeys = kWarpSize;
constexpr int kFlashMaxHeadDim = 128;
constexpr int kFlashDimsPerLane = kFlashMaxHeadDim / kWarpSize;

IRIS_GLOBAL void FlashVarlenKernel(FlashVarlenParams p) {
  IRIS_SHARED float qs[kFlashRows][kFlashMaxHeadDim];
  IRIS_SHARED float ks[kFlashKeys][kFlashMaxHeadDim + 1];  // +1: lanes read different rows, no bank conflicts
  IRIS_SHARED float vs[kFlashKeys][kFlashMaxHeadDim];
  IRIS_SHARED float ps[kFlashWarps][kFlashKeys];
  const int h = static_cast<int>(blockIdx.z);
  const VarlenBlockRows rows = BlockRowsOf(p, kFlashRows);
  if (rows.lo >= rows.hi) return;  // the whole block: no thread reaches a barrier
  const int64_t start = rows.start;
  const int n = rows.n, row0 = rows.row0, r_lo = rows.lo, r_hi = rows.hi;  // rows relative to the sequence
  const int hd = p.head_dim;
  const int g = h / (p.num_heads / p.num_kv_heads);
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int threads = static_cast<int>(blockDim.x);

  for (int e = tid; e < kFlashRows * hd; e += threads) {
    const int r = e / hd, d = e % hd;
    qs[r][d] = row0 + r < n ? p.q[(start + row0 + r) * p.q_row_stride + h * p.q_head_stride + d] : 0.f;
  }
  float m[kFlashRowsPerWarp], l[kFlashRowsPerWarp], acc[kFlashRowsPerWarp][kFlashDimsPerLane];
  for (int i = 0; i < kFlashRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
    for (int c = 0; c < kFlashDimsPerLane; ++c) acc[i][c] = 0.f;
  }
  const int key_end = p.causal ? (n < r_hi ? n : r_hi) : n;  // the last row sees keys [0, r_hi)
  for (int kb = 0; kb < key_end; kb += kFlashKeys) {
    SyncThreads();  // the previous tile is read (and, first time round, q is written)
    for (int e = tid; e < kFlashKeys * hd; e += threads) {
      const int j = e / hd, d = e % hd;
      const int key = kb + j;
      // Keys past the end are zeros, not garbage: P·V multiplies them by p = 0.
      ks[j][d] = key < key_end ? p.k[(start + key) * p.k_row_stride + g * p.k_head_stride + d] : 0.f;
      vs[j][d] = key < key_end ? p.v[(start + key) * p.v_row_stride + g * p.v_head_stride + d] : 0.f;
    }
    SyncThreads();
    for (int i = 0; i < kFlashRowsPerWarp; ++i) {
      const int r = row0 + warp * kFlashRowsPerWarp + i;
      const bool row_ok = r >= r_lo && r < r_hi;  // the same for the whole warp
      const int key = kb + lane;
      const int visible = p.causal ? (key_end < r + 1 ? key_end : r + 1) : key_end;
      float score = -INFINITY;
      if (row_ok && key < visible) {
        const float* qr = qs[r - row0];
        float dot = 0.f;
        for (int d = 0; d < hd; ++d) dot += qr[d] * ks[lane][d];
        score = dot * p.scale;
      }
      const float tile_max = WarpMax(score);
      const float m_new = tile_max > m[i] ? tile_max : m[i];
      // Nothing visible yet (a row outside the block's range, or a causal tile past the row):
      // the state stays as it is, and every lane still takes part in the warp's exchanges.
      const bool any = m_new != -INFINITY;
      const float prob = any && score != -INFINITY ? expf(score - m_new) : 0.f;
      const float correction = any ? expf(m[i] - m_new) : 1.f;  // 0 after m = -inf
      l[i] = l[i] * correction + WarpSum(prob);
      ps[warp][lane] = prob;
      SyncWarp();
      for (int c = 0; c < kFlashDimsPerLane; ++c) {
        const int d = lane + c * kWarpSize;
        if (d >= hd) continue;
        float a = acc[i][c] * correction;
        for (int j = 0; j < kFlashKeys; ++j) a += ps[warp][j] * vs[j][d];
        acc[i][c] = a;
      }
      SyncWarp();  // the probabilities are read before the next row overwrites them
      m[i] = m_new;
    }
  }
  for (int i = 0; i < kFlashRowsPerWarp; ++i) {
    const int r = row0 + warp * kFlashRowsPerWarp + i;
    if (r < r_lo || r >= r_hi) continue;
    float* o = p.out + (start + r) * p.out_row_stride + static_cast<int64_t>(h) * hd;
    for (int c = 0; c < kFlashDimsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < hd) o[d] = acc[i][c] / l[i];
    }
  }
  SyncThreads();  // the shared tiles are read before a next block (harness) reuses them
}

}  // namespace iris::kernels::cuda
