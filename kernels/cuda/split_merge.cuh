// Online-softmax partials and their merge, for the attention kernels that split a row's keys
// over several blocks (flash-decoding: kernels.cuh's PagedAttentionKernel, paged_flash_mma.cuh's
// PagedDecodeMmaKernel), or over a block's warps. Device code against simt.h.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

// Where split z of (step row r, head h) keeps its partial [m, l, acc[head_dim]].
IRIS_HOST_DEVICE int64_t PagedPartialIndex(int64_t r, int h, int num_heads, int z, int splits, int head_dim) {
  return ((r * num_heads + h) * splits + z) * (2 + static_cast<int64_t>(head_dim));
}

// How the merges below read partials: plainly (a block's own, in shared memory), or through the
// L2 (other blocks' writes in global memory, LoadCoherent).
struct PlainLoad {
  IRIS_DEVICE float operator()(const float* p) const { return *p; }
};
struct CoherentLoad {
  IRIS_DEVICE float operator()(const float* p) const { return LoadCoherent(p); }
};

// Merging online-softmax partials (the warps of a block, or the splits of a row): partial i has
// maximum m[i * stride], sum l[i * stride] and unnormalised accumulator acc[i * acc_stride]
// (m = -inf: no keys). The common maximum, and the sum rescaled to it:
template <typename Load = PlainLoad>
IRIS_DEVICE void MergedMaxAndSum(const float* m, const float* l, int64_t stride, int n, float* big, float* total,
                                 Load load = {}) {
  float b = -INFINITY;
  for (int i = 0; i < n; ++i) {
    const float mi = load(m + i * stride);
    b = mi > b ? mi : b;
  }
  float t = 0.f;
  for (int i = 0; i < n; ++i) {
    const float mi = load(m + i * stride);
    t += mi == -INFINITY ? 0.f : load(l + i * stride) * expf(mi - b);
  }
  *big = b;
  *total = t;
}
// ... and one accumulator element rescaled to the common maximum `big`.
template <typename Load = PlainLoad>
IRIS_DEVICE float MergedAcc(const float* m, int64_t stride, const float* acc, int64_t acc_stride, int n, float big,
                            Load load = {}) {
  float sum = 0.f;
  for (int i = 0; i < n; ++i) {
    const float mi = load(m + i * stride);
    if (mi != -INFINITY) sum += load(acc + i * acc_stride) * expf(mi - big);
  }
  return sum;
}

}  // namespace iris::kernels::cuda
