// iris's own CUDA kernels: device code only, written against simt.h so that the same source is
// compiled by nvcc (cuda_kernels.cu launches it on a stream) and by the host compiler (the SIMT
// harness runs it in CI against the CPU kernels, tests/simt_kernels_test.cc). All f32, row-major,
// with the CPU ops' semantics (kernels/elementwise.h, rotary.h, qkv_pad.h, llm's greedy argmax).
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/simt.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace iris::kernels::cuda {

constexpr int kMaxWarpsPerBlock = 32;

// The sum of v over the block, in every thread. `partials`: kMaxWarpsPerBlock floats of shared
// storage. blockDim.x: a multiple of the warp size.
IRIS_DEVICE float BlockSum(float v, float* partials) {
  v = WarpSum(v);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) partials[warp] = v;
  SyncThreads();
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  v = WarpSum(lane < warps ? partials[lane] : 0.f);  // every warp reduces the partials: all lanes end with the sum
  SyncThreads();  // the partials are read before anyone reuses them
  return v;
}

IRIS_DEVICE float InvSqrt(float v) {
  // rsqrtf is approximate (2 ulp): the exact quotient, as the CPU kernel and HF compute it.
  return 1.0f / sqrtf(v);
}

// y[r, :] = (x[r, :] * 1/sqrt(mean(x[r, :]^2) + eps)) * w. One block per row.
IRIS_GLOBAL void RmsNormKernel(const float* x, const float* w, int dim, float eps, float* y) {
  IRIS_SHARED float partials[kMaxWarpsPerBlock];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  float ss = 0.f;
  for (int i = static_cast<int>(threadIdx.x); i < dim; i += static_cast<int>(blockDim.x)) ss += xr[i] * xr[i];
  const float inv = InvSqrt(BlockSum(ss, partials) / static_cast<float>(dim) + eps);
  for (int i = static_cast<int>(threadIdx.x); i < dim; i += static_cast<int>(blockDim.x)) yr[i] = (xr[i] * inv) * w[i];
}

// out[r, j] = silu(gu[r, j]) * gu[r, inter + j]: gate and up side by side in each row.
IRIS_GLOBAL void SiluMulRowsKernel(const float* gu, int64_t rows, int64_t inter, float* out) {
  const int64_t n = rows * inter;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t r = e / inter, j = e % inter;
    const float g = gu[r * 2 * inter + j];
    out[e] = g / (1.0f + expf(-g)) * gu[r * 2 * inter + inter + j];
  }
}

// The fused rotary: q's and k's heads of row blockIdx.x rotated in place in one launch
// (rotate-half; cos/sin hold head_dim/2 values per row).
IRIS_GLOBAL void RotaryQKKernel(float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride, int k_heads,
                                int head_dim, const float* cos, const float* sin) {
  const int64_t row = blockIdx.x;
  const int half = head_dim / 2;
  const float* c = cos + row * half;
  const float* s = sin + row * half;
  for (int e = static_cast<int>(threadIdx.x); e < (q_heads + k_heads) * half; e += static_cast<int>(blockDim.x)) {
    const int h = e / half, i = e % half;
    float* p = h < q_heads ? q + row * q_stride + static_cast<int64_t>(h) * head_dim
                           : k + row * k_stride + static_cast<int64_t>(h - q_heads) * head_dim;
    const float x1 = p[i], x2 = p[i + half];
    p[i] = x1 * c[i] - x2 * s[i];
    p[i + half] = x2 * c[i] + x1 * s[i];
  }
}

// One launch pads all three of q, k, v: qkv [rows, 3, heads, head_dim] -> each of q, k, v
// [heads, rows, padded_dim], dims past head_dim zero. Grid (rows, 3).
IRIS_GLOBAL void PadQkvKernel(const float* qkv, int64_t rows, int heads, int head_dim, int padded_dim, float* q,
                              float* k, float* v) {
  const int64_t row = blockIdx.x;
  const int which = static_cast<int>(blockIdx.y);
  float* out = which == 0 ? q : which == 1 ? k : v;
  const float* in = qkv + (row * 3 + which) * heads * static_cast<int64_t>(head_dim);
  for (int e = static_cast<int>(threadIdx.x); e < heads * padded_dim; e += static_cast<int>(blockDim.x)) {
    const int h = e / padded_dim, d = e % padded_dim;
    out[(static_cast<int64_t>(h) * rows + row) * padded_dim + d] = d < head_dim ? in[h * head_dim + d] : 0.f;
  }
}

// Greedy argmax per row of logits, as the CPU sampler picks it: the first maximum (lowest id
// wins ties); NaN never wins; a row with no value above -inf gives 0.
struct ArgmaxPair {
  float value = -INFINITY;
  int32_t index = INT32_MAX;  // none yet

  // Keeps (v, i) if it beats what is kept: greater, or equal with a lower id.
  IRIS_DEVICE void Take(float v, int32_t i) {
    if (v > value || (v == value && i < index)) {
      value = v;
      index = i;
    }
  }
};

// The best pair over the warp, in every lane.
IRIS_DEVICE ArgmaxPair WarpArgmax(ArgmaxPair p) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) {
    const float v = ShflXor(p.value, m);
    const int32_t i = ShflXor(p.index, m);
    p.Take(v, i);
  }
  return p;
}

IRIS_GLOBAL void ArgmaxKernel(const float* logits, int64_t vocab, int32_t* out) {
  IRIS_SHARED float part_v[kMaxWarpsPerBlock];
  IRIS_SHARED int32_t part_i[kMaxWarpsPerBlock];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  ArgmaxPair best;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    best.Take(row[i] != row[i] ? -INFINITY : row[i], static_cast<int32_t>(i));  // NaN as -inf
  }
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  best = WarpArgmax(best);
  if (lane == 0) {
    part_v[warp] = best.value;
    part_i[warp] = best.index;
  }
  SyncThreads();
  if (warp == 0) {
    ArgmaxPair p;
    if (lane < static_cast<int>(blockDim.x) / kWarpSize) p = ArgmaxPair{part_v[lane], part_i[lane]};
    p = WarpArgmax(p);
    if (lane == 0) out[blockIdx.x] = p.index == INT32_MAX || p.value == -INFINITY ? 0 : p.index;
  }
}

// --- Paged attention (f32 products; f32 or bf16 pools) ---

IRIS_DEVICE float LoadKv(const float* p) { return *p; }
IRIS_DEVICE float LoadKv(const uint16_t* p) {  // bf16 bits: the top half of an f32
  const uint32_t bits = static_cast<uint32_t>(*p) << 16;
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

constexpr int kPagedWarps = 4;        // a block: 4 warps (128 threads)
constexpr int kPagedMaxHeadDim = 256;
constexpr int kPagedDimsPerLane = kPagedMaxHeadDim / 32;

// One block per (query row, q head) of a step (grid (row_end - row_begin, num_heads)), the layout and metadata of
// kernels/paged_attention.h: the row's sequence is found in query_start; it attends causally to
// keys 0 .. its position, read through the block table. Each warp takes every 4th key — lanes
// split head_dim, a warp reduction gives the score — with its own online softmax; the four
// warps' partial results are merged at the end.
template <typename T>
IRIS_GLOBAL void PagedAttentionKernel(const float* q, int64_t q_row_stride, float* out, int64_t out_row_stride,
                                      int num_heads, float scale, const T* k_pool, const T* v_pool, int block_size,
                                      int num_kv_heads, int head_dim, const int32_t* query_start,
                                      const int32_t* context_lens, const int32_t* block_tables,
                                      int max_blocks_per_seq, int num_seqs, int64_t row_begin) {
  IRIS_SHARED float warp_m[kPagedWarps];
  IRIS_SHARED float warp_l[kPagedWarps];
  IRIS_SHARED float warp_acc[kPagedWarps][kPagedMaxHeadDim];
  const int row = static_cast<int>(row_begin + blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  // The sequence holding this row: the last s with query_start[s] <= row.
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= row) lo = mid; else hi = mid - 1;
  }
  const int s = lo;
  const int q_len = query_start[s + 1] - query_start[s];
  const int64_t keys = static_cast<int64_t>(context_lens[s]) - q_len + (row - query_start[s]) + 1;
  const int g = h / (num_heads / num_kv_heads);
  const int64_t row_elems = static_cast<int64_t>(num_kv_heads) * head_dim;
  const float* qr = q + row * q_row_stride + static_cast<int64_t>(h) * head_dim;
  const int32_t* table = block_tables + static_cast<int64_t>(s) * max_blocks_per_seq;

  float qd[kPagedDimsPerLane], acc[kPagedDimsPerLane];
  for (int i = 0; i < kPagedDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    qd[i] = d < head_dim ? qr[d] : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t j = warp; j < keys; j += kPagedWarps) {
    const int64_t slot = static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
    const T* kr = k_pool + slot * row_elems + static_cast<int64_t>(g) * head_dim;
    const T* vr = v_pool + slot * row_elems + static_cast<int64_t>(g) * head_dim;
    float dot = 0.f;
    for (int i = 0; i < kPagedDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < head_dim) dot += qd[i] * LoadKv(kr + d);
    }
    const float score = WarpSum(dot) * scale;
    const float m_new = score > m ? score : m;
    const float correction = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(score - m_new);
    l = l * correction + p;
    for (int i = 0; i < kPagedDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      acc[i] = acc[i] * correction + (d < head_dim ? p * LoadKv(vr + d) : 0.f);
    }
    m = m_new;
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
  for (int i = 0; i < kPagedDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    if (d < head_dim) warp_acc[warp][d] = acc[i];
  }
  SyncThreads();
  float big = -INFINITY;
  for (int w = 0; w < kPagedWarps; ++w) big = warp_m[w] > big ? warp_m[w] : big;
  float total = 0.f;
  for (int w = 0; w < kPagedWarps; ++w) total += warp_m[w] == -INFINITY ? 0.f : warp_l[w] * expf(warp_m[w] - big);
  float* orow = out + row * out_row_stride + static_cast<int64_t>(h) * head_dim;
  for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += static_cast<int>(blockDim.x)) {
    float sum = 0.f;
    for (int w = 0; w < kPagedWarps; ++w) {
      if (warp_m[w] != -INFINITY) sum += warp_acc[w][d] * expf(warp_m[w] - big);
    }
    orow[d] = sum / total;
  }
  SyncThreads();  // the shared partials are read before a next block (harness) reuses them
}

}  // namespace iris::kernels::cuda
