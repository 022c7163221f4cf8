// kernels::SampleRows' kernel (kernels/sample_rows.h): a block draws one row, where its logits
// are, and only the id leaves the device. Device code against simt.h (nvcc and the SIMT harness).
//
// The top-k value and top-p's last value are found by searching the 32-bit keys: each pass over
// the row weighs kDrawProbes evenly spaced thresholds at once and keeps the interval where the
// weight crosses what is needed (counts for top-k, probability mass for top-p), 4 bits a pass.
// Every sum is in double and in a fixed order (each thread's values in order, a fixed shuffle
// tree, the warps in order): the same row and uniform give the same id on every run. The walk
// to the drawn token steps over 256-value chunks by their sums, as llm::Sampler's walk does.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/row_math.cuh"
#include "kernels/cuda/simt.h"
#include "kernels/cuda/warp_reduce.cuh"
#include "kernels/exp_lane.h"
#include "kernels/ordered_float_key.h"
#include "kernels/row_draw.h"

namespace iris::kernels::cuda {

constexpr int kDrawProbes = 15;       // thresholds a search pass weighs (registers: a double each)
constexpr int kMaxDrawChunks = 1024;  // chunk sums kept in shared memory
constexpr int kSampleRowsThreads = 512;

// Values per chunk of the walk: 256 (llm::Sampler's chunk) up to 256 * kMaxDrawChunks values,
// larger for larger vocabularies.
IRIS_HOST_DEVICE int64_t DrawChunk(int64_t vocab) {
  const int64_t per = (vocab + 256 * kMaxDrawChunks - 1) / (256 * kMaxDrawChunks);
  return 256 * (per > 1 ? per : 1);
}

// The largest key K in [lo, hi] such that the weight of the row's values with key >= K reaches
// `need` (the weight at lo must reach it), in every thread. by_mass: a value q's key is its bits
// and its weight q (probabilities, q >= 0); else its key is OrderedFloatKey and its weight 1.
// Shared: weights [kMaxWarpsPerBlock * kDrawProbes], bounds [2].
IRIS_DEVICE uint32_t BlockSearchKey(const float* row, int64_t n, bool by_mass, uint32_t lo, uint32_t hi, double need,
                                    double* weights, uint32_t* bounds) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  while (lo < hi) {
    // Probes lo + j * step, j = 1..kDrawProbes, past hi for the last ones when the span is short.
    const uint64_t step = (static_cast<uint64_t>(hi - lo) + kDrawProbes) / (kDrawProbes + 1);
    double w[kDrawProbes];
    IRIS_UNROLL
    for (int j = 0; j < kDrawProbes; ++j) w[j] = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = row[i];
      const uint64_t key = by_mass ? FloatToBits(v) : OrderedFloatKey(v);
      const double weight = by_mass ? static_cast<double>(v) : 1.0;
      if (key <= lo) continue;
      IRIS_UNROLL
      for (int j = 0; j < kDrawProbes; ++j) w[j] += key >= lo + (j + 1) * step ? weight : 0.0;
    }
    IRIS_UNROLL
    for (int j = 0; j < kDrawProbes; ++j) {
      const double s = WarpSum(w[j]);
      if (lane == 0) weights[warp * kDrawProbes + j] = s;
    }
    SyncThreads();
    if (threadIdx.x == 0) {
      int best = -1;  // the last probe whose weight reaches need (the weights fall as j grows)
      for (int j = 0; j < kDrawProbes; ++j) {
        const uint64_t probe = lo + (j + 1) * step;
        if (probe > hi) break;
        double total = 0.0;
        for (int k = 0; k < warps; ++k) total += weights[k * kDrawProbes + j];
        if (total < need) break;
        best = j;
      }
      const uint64_t new_lo = best < 0 ? lo : lo + (best + 1) * step;
      const uint64_t next = lo + (best + 2) * step;  // the first probe that fell short (or past hi)
      bounds[0] = static_cast<uint32_t>(new_lo);
      bounds[1] = static_cast<uint32_t>(next - 1 < hi ? next - 1 : hi);
    }
    SyncThreads();
    lo = bounds[0];
    hi = bounds[1];
    SyncThreads();  // read before thread 0 writes the next pass's bounds
  }
  return lo;
}

// Block r draws row r with draws[r] into out[r]; the row is overwritten (scaled logits, then
// probabilities). Every branch below is the block's as a whole (it depends on the row only).
IRIS_GLOBAL void IRIS_LAUNCH_BOUNDS(kSampleRowsThreads, 1)
    SampleRowsKernel(float* logits, int64_t vocab, const RowDraw* draws, int32_t* out) {
  IRIS_SHARED float warp_v[kMaxWarpsPerBlock];
  IRIS_SHARED int32_t warp_i[kMaxWarpsPerBlock];
  IRIS_SHARED double warp_sums[kMaxWarpsPerBlock];
  IRIS_SHARED double weights[kMaxWarpsPerBlock * kDrawProbes];
  IRIS_SHARED uint32_t bounds[2];
  IRIS_SHARED double chunk_mass[kMaxDrawChunks];
  IRIS_SHARED int32_t chunk_ties[kMaxDrawChunks];
  const int64_t r = blockIdx.x;
  float* row = logits + r * vocab;
  const RowDraw d = draws[r];
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;

  // 1. v = x / t (NaN as -inf) and its maximum; greedy rows and rows without a finite maximum
  // are the argmax.
  bool argmax = d.greedy();
  float m = 0.f;
  if (!argmax) {
    float local = -INFINITY;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float x = row[i];
      const float v = (x != x ? -INFINITY : x) / d.temperature;
      row[i] = v;
      local = v > local ? v : local;
    }
    m = BlockMax(local, warp_v);
    argmax = m == -INFINITY || m == INFINITY;
  }
  if (argmax) {
    const ArgmaxPair p = BlockArgmax(row, 0, vocab, warp_v, warp_i);
    if (threadIdx.x == 0) out[r] = ArgmaxToken(p);
    SyncThreads();  // the shared slots are read before a next block (harness) reuses them
    return;
  }

  // 2. The candidates (v >= the k-th largest) and their q = e^(v - m); the rest 0.
  float kth = -INFINITY;
  if (d.top_k > 0 && d.top_k < vocab) {
    kth = FromOrderedFloatKey(
        BlockSearchKey(row, vocab, false, 0u, OrderedFloatKey(m), static_cast<double>(d.top_k), weights, bounds));
  }
  double part = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    const float q = v >= kth ? ExpLane(v - m) : 0.f;
    row[i] = q;
    part += q;
  }
  const double total = BlockSum(part, warp_sums);

  // 3. top-p's last value (the largest q whose q >= it carry the mass top-p needs; q <= 1 = e^0).
  const bool top_p = d.top_p < 1.f;
  const double need = top_p ? NucleusNeed(d.top_p, total) : 0.0;
  const float last = top_p ? BitsToFloat(BlockSearchKey(row, vocab, true, 0u, FloatToBits(1.f), need, weights, bounds)) : 0.f;

  // 4. By chunk: the mass above `last` and the values equal to it; then thread 0 walks.
  const int64_t chunk = DrawChunk(vocab), chunks = (vocab + chunk - 1) / chunk;
  for (int64_t c = warp; c < chunks; c += warps) {
    const int64_t end = (c + 1) * chunk < vocab ? (c + 1) * chunk : vocab;
    double s = 0.0;
    int32_t ties = 0;
    for (int64_t i = c * chunk + lane; i < end; i += kWarpSize) {
      const float q = row[i];
      if (q > last) {
        s += q;
      } else if (q == last) {
        ++ties;
      }
    }
    s = WarpSum(s);
    ties = WarpSum(ties);
    if (lane == 0) {
      chunk_mass[c] = s;
      chunk_ties[c] = ties;
    }
  }
  SyncThreads();
  if (threadIdx.x == 0) {
    double nucleus = 0.0;
    int64_t tie_count = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      nucleus += chunk_mass[c];
      tie_count += chunk_ties[c];
    }
    int64_t ties = 0;  // the values equal to `last` the nucleus takes, the lowest ids first
    if (top_p) {
      for (; ties < tie_count && nucleus < need; ++ties) nucleus += last;
    }
    const double target = d.uniform * nucleus;
    double cum = 0.0;
    int64_t pick = -1;
    for (int64_t c = 0; c < chunks && pick < 0; ++c) {
      if (cum + chunk_mass[c] <= target) {  // the target lies past this chunk
        cum += chunk_mass[c];
        continue;
      }
      const int64_t end = (c + 1) * chunk < vocab ? (c + 1) * chunk : vocab;
      for (int64_t i = c * chunk; i < end; ++i) {
        const float q = row[i];
        if (!(q > last)) continue;
        cum += q;
        if (target < cum) {
          pick = i;
          break;
        }
      }
    }
    int64_t last_tie = -1;
    for (int64_t c = 0, seen = 0; c < chunks && pick < 0 && seen < ties && last > 0.f; ++c) {
      if (chunk_ties[c] == 0) continue;
      const int64_t end = (c + 1) * chunk < vocab ? (c + 1) * chunk : vocab;
      for (int64_t i = c * chunk; i < end && seen < ties; ++i) {
        if (row[i] != last) continue;
        ++seen;
        cum += last;
        last_tie = i;
        if (target < cum) {
          pick = i;
          break;
        }
      }
    }
    if (pick < 0) pick = last_tie;
    // Only when rounding put the target at the very end: the last token above `last` (else 0).
    for (int64_t c = chunks - 1; c >= 0 && pick < 0; --c) {
      if (!(chunk_mass[c] > 0.0)) continue;
      for (int64_t i = ((c + 1) * chunk < vocab ? (c + 1) * chunk : vocab) - 1; i >= c * chunk; --i) {
        if (row[i] > last) {
          pick = i;
          break;
        }
      }
    }
    out[r] = static_cast<int32_t>(pick < 0 ? 0 : pick);
  }
  SyncThreads();  // the shared values are read before a next block (harness) reuses them
}

}  // namespace iris::kernels::cuda
