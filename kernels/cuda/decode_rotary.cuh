// What the paged attentions do for a decode step's rotary and KV write when they take it over
// (PagedDecodeRotary: kernels.cuh's PagedAttentionKernel and paged_flash_mma.cuh's
// PagedDecodeMmaKernel with kRotary): rotate the row's q heads as they are read, hold its own key
// and value as the pool holds them, and store them into its slot. One block's threads share each
// piece of work; the values are RotaryQKWriteKvKernel's bit for bit (RotatePair, StoreRounded).
// Device code against simt.h (nvcc and the SIMT harness).
#pragma once

#include <cstdint>

#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/paged_decode_rotary.h"
#include "kernels/cuda/row_math.cuh"
#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

// `heads` consecutive heads of head_dim values at `in`, rotated by step row `row`'s cos/sin rows
// into `out` (the same layout; f32, or rounded to bf16).
template <typename T>
IRIS_DEVICE void RotateDecodeHeads(const PagedDecodeRotary& r, int64_t row, const float* in, int heads, int head_dim,
                                   T* out, int tid, int threads) {
  const int half = head_dim / 2;
  const float* c = r.cos + row * half;
  const float* s = r.sin + row * half;
  for (int e = tid; e < heads * half; e += threads) {
    const int64_t at = static_cast<int64_t>(e / half) * head_dim + e % half;
    float y1, y2;
    RotatePair(in[at], in[at + half], c[e % half], s[e % half], &y1, &y2);
    StoreRounded(out + at, y1);
    StoreRounded(out + at + half, y2);
  }
}

// Step row `row`'s own key (rotated) and value at kv head g, as a pool of T holds them.
template <typename T>
IRIS_DEVICE void LoadOwnKv(const PagedDecodeRotary& r, int64_t row, int g, int head_dim, T* cur_k, T* cur_v, int tid,
                           int threads) {
  const int64_t head_at = static_cast<int64_t>(g) * head_dim;
  RotateDecodeHeads(r, row, r.k + row * r.k_stride + head_at, 1, head_dim, cur_k, tid, threads);
  const float* v = r.v + row * r.v_stride + head_at;
  for (int d = tid; d < head_dim; d += threads) StoreRounded(cur_v + d, v[d]);
}

// ... stored into the row's pool slot (pool rows of row_elems values), unless the slot is outside
// the pool (a padding row's kernels::kPadSlot), as RotaryQKWriteKvKernel skips it.
template <typename T>
IRIS_DEVICE void StoreOwnKv(const PagedDecodeRotary& r, int64_t row, int64_t row_elems, int g, int head_dim,
                            const T* cur_k, const T* cur_v, int tid, int threads) {
  const int64_t slot = r.slots[row];
  if (slot < 0 || slot >= r.num_slots) return;
  const int64_t at = slot * row_elems + static_cast<int64_t>(g) * head_dim;
  for (int d = tid; d < head_dim; d += threads) {
    static_cast<T*>(r.k_pool)[at + d] = cur_k[d];
    static_cast<T*>(r.v_pool)[at + d] = cur_v[d];
  }
}

}  // namespace iris::kernels::cuda
