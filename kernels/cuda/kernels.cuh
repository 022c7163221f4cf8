// iris's own CUDA kernels: device code only, written against simt.h so that the same source is
// compiled by nvcc (cuda_kernels.cu launches it on a stream) and by the host compiler (the SIMT
// harness runs it in CI against the CPU kernels, tests/simt_kernels_test.cc). f32 math, row-major,
// with the CPU ops' semantics (kernels/elementwise.h, rotary.h, qkv_pad.h, rows.h,
// paged_attention.h, llm's greedy argmax). Flat kernels walk their elements with a grid-stride
// loop in 64-bit indices, so any grid covers any size.
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/decode_rotary.cuh"
#include "kernels/cuda/row_math.cuh"
#include "kernels/cuda/simt.h"
#include "kernels/cuda/split_merge.cuh"
#include "kernels/packed_logit_edits.h"
#include "kernels/patch_grid.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace iris::kernels::cuda {

// v reduced over the block, in every thread: warp_op over each warp, then over the warps'
// results (lanes past the warps count take `identity`). A fixed order, so the same values give the
// same result. `partials`: kMaxWarpsPerBlock values of shared storage. blockDim.x: a multiple of
// the warp size.
template <typename T, typename WarpOp>
IRIS_DEVICE T BlockReduce(T v, T* partials, WarpOp warp_op, T identity) {
  v = warp_op(v);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) partials[warp] = v;
  SyncThreads();
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  v = warp_op(lane < warps ? partials[lane] : identity);  // every warp reduces the partials: all lanes end with it
  SyncThreads();  // the partials are read before anyone reuses them
  return v;
}

// The sum of v over the block, in every thread (float or double).
template <typename T>
IRIS_DEVICE T BlockSum(T v, T* partials) {
  return BlockReduce(v, partials, [](T x) { return WarpSum(x); }, T{0});
}

// The largest v over the block, in every thread (no NaN expected; -inf stays -inf).
IRIS_DEVICE float BlockMax(float v, float* partials) {
  return BlockReduce(v, partials, [](float x) { return WarpMax(x); }, -INFINITY);
}

// The first element of this thread in a grid-stride loop, and the loop's stride.
IRIS_DEVICE int64_t GridStart() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
IRIS_DEVICE int64_t GridStride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// A flat element index e of rows of `width`: its row and column, divided in 32 bits where `narrow`
// (the whole range below 2^32, as the callers check once): a 64-bit division per element held the
// row kernels to about half the memory's bandwidth.
IRIS_DEVICE void RowAndColumn(int64_t e, int64_t width, bool narrow, int64_t* row, int64_t* column) {
  if (narrow) {
    const uint32_t e32 = static_cast<uint32_t>(e), w32 = static_cast<uint32_t>(width), r32 = e32 / w32;
    *row = r32;
    *column = e32 - r32 * w32;
  } else {
    *row = e / width;
    *column = e % width;
  }
}

// Where a row op's results go: f32 rows (y may alias the op's input where each thread rewrites
// only what it read), or bf16 rows of a matmul's input (rounded as core::FloatToBf16; the
// padding columns of the row stride are left as they are).
struct F32Rows {
  float* y;
  int64_t ld;  // row stride, in values
  IRIS_DEVICE void Put(int64_t r, int64_t c, float v) const { y[r * ld + c] = v; }
  // Four values at columns c .. c+3 (c % 4 == 0, the row 16-byte aligned: one 16-byte store).
  IRIS_DEVICE void Put4(int64_t r, int64_t c, const Float4& v) const { *reinterpret_cast<Float4*>(y + r * ld + c) = v; }
};
struct Bf16Rows {
  uint16_t* y;
  int64_t ld;  // row stride, in values
  IRIS_DEVICE void Put(int64_t r, int64_t c, float v) const { y[r * ld + c] = FloatToBf16(v); }
  // (c % 4 == 0, ld % 4 == 0, y 8-byte aligned: two 4-byte stores.)
  IRIS_DEVICE void Put4(int64_t r, int64_t c, const Float4& v) const {
    uint32_t* p = reinterpret_cast<uint32_t*>(y + r * ld + c);
    p[0] = PackBf16x2(v.x, v.y);
    p[1] = PackBf16x2(v.z, v.w);
  }
};

// out[r, :] = (x[r, :] * 1/sqrt(mean(x[r, :]^2) + eps)) * w. One block per row. out may alias x
// (F32Rows of stride dim): each thread rewrites only the elements it read, after the block sum.
template <typename Out>
IRIS_GLOBAL void RmsNormKernel(const float* x, const float* w, int64_t dim, float eps, Out out) {
  GridDependencyTrigger();  // a GEMV behind may start early (it waits for this kernel's output)
  IRIS_SHARED float partials[kMaxWarpsPerBlock];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  const float inv = InvSqrt(BlockSum(ss, partials) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out.Put(row, i, RmsNormValue(xr[i], inv, w[i]));
}

// RmsNormKernel for the common case, where a row is whole 16-byte vectors of at most
// kRmsNormVecs per thread (RmsNormVecThreads, the block size): each thread loads its x and w
// vectors at once and keeps them in registers across the block sum, so a row costs one memory
// round trip instead of a strided loop's several (a decode step's single row on one SM is all
// latency). The same per-element expression as RmsNormKernel; only the sum's order differs
// (row_math.cuh names it: the GEMVs that fold the norm sum in the same order).
template <typename Out>
IRIS_GLOBAL void RmsNormVecKernel(const float* x, const float* w, int64_t dim, float eps, Out out) {
  GridDependencyTrigger();  // a GEMV behind may start early (it waits for this kernel's output)
  IRIS_SHARED float partials[kMaxWarpsPerBlock];
  const int64_t vecs = dim / 4, row = blockIdx.x;
  const Float4* xr = reinterpret_cast<const Float4*>(x + row * dim);
  const Float4* wr = reinterpret_cast<const Float4*>(w);
  Float4 xv[kRmsNormVecs], wv[kRmsNormVecs];
  float ss = 0.f;
  IRIS_UNROLL
  for (int i = 0; i < kRmsNormVecs; ++i) {
    const int64_t e = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (e < vecs) {
      xv[i] = xr[e];
      wv[i] = wr[e];
      ss = AddSquares4(ss, xv[i]);
    }
  }
  const float inv = InvSqrt(BlockSum(ss, partials) / static_cast<float>(dim) + eps);
  IRIS_UNROLL
  for (int i = 0; i < kRmsNormVecs; ++i) {
    const int64_t e = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (e < vecs) {
      Float4 o;
      o.x = RmsNormValue(xv[i].x, inv, wv[i].x);
      o.y = RmsNormValue(xv[i].y, inv, wv[i].y);
      o.z = RmsNormValue(xv[i].z, inv, wv[i].z);
      o.w = RmsNormValue(xv[i].w, inv, wv[i].w);
      out.Put4(row, 4 * e, o);
    }
  }
}

// torch's LayerNorm: y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b, biased variance. One
// block per row; two passes for the statistics (the mean first, then the squared deviations from
// it), as the CPU kernel. y may alias x, as in RmsNormKernel.
IRIS_GLOBAL void LayerNormKernel(const float* x, const float* w, const float* b, int64_t dim, float eps, float* y) {
  IRIS_SHARED float partials[kMaxWarpsPerBlock];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += xr[i];
  const float mean = BlockSum(sum, partials) / static_cast<float>(dim);
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += (xr[i] - mean) * (xr[i] - mean);
  const float inv = InvSqrt(BlockSum(ss, partials) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

// Where a row op reads its input: f32 rows, or bf16 rows a matmul wrote (widened exactly).
struct F32In {
  const float* x;
  int64_t ld;  // row stride, in values
  IRIS_DEVICE float Get(int64_t r, int64_t c) const { return x[r * ld + c]; }
  // Four values at columns c .. c+3 (c % 4 == 0, the row 16-byte aligned: one 16-byte load).
  IRIS_DEVICE Float4 Get4(int64_t r, int64_t c) const { return *reinterpret_cast<const Float4*>(x + r * ld + c); }
};
struct Bf16In {
  const uint16_t* x;
  int64_t ld;  // row stride, in values
  IRIS_DEVICE float Get(int64_t r, int64_t c) const { return Bf16ToFloat(x[r * ld + c]); }
  // (c % 4 == 0, ld % 4 == 0, x 8-byte aligned: one 8-byte load.)
  IRIS_DEVICE Float4 Get4(int64_t r, int64_t c) const {
    const Chunk8 b = *reinterpret_cast<const Chunk8*>(x + r * ld + c);
    Float4 v;
    v.x = BitsToFloat(b.w[0] << 16);
    v.y = BitsToFloat(b.w[0] & 0xffff0000u);
    v.z = BitsToFloat(b.w[1] << 16);
    v.w = BitsToFloat(b.w[1] & 0xffff0000u);
    return v;
  }
};

// out[r, j] = silu(gu[r, j]) * gu[r, inter + j]: gate and up side by side in each row (In: F32In
// or Bf16In, a row stride of at least 2 inter).
template <typename In, typename Out>
IRIS_GLOBAL void SiluMulRowsKernel(In gu, int64_t rows, int64_t inter, Out out) {
  GridDependencyTrigger();  // a GEMV behind may start early (it waits for this kernel's output)
  const int64_t n = rows * inter;
  for (int64_t e = GridStart(); e < n; e += GridStride()) {
    const int64_t r = e / inter, j = e % inter;
    out.Put(r, j, Silu(gu.Get(r, j)) * gu.Get(r, inter + j));
  }
}

// The same, 4 values a thread (vector loads and store) where inter % 4 == 0 and the rows are
// aligned for In's Get4 and Out's Put4: one flat index over (row, quad) across the whole grid (any
// grid), so that no thread idles at a row's end, divided in 32 bits where it fits (the element
// kernel's 64-bit division per element made it run at half the memory's bandwidth).
template <typename In, typename Out>
IRIS_DEVICE void SiluMulQuad(const In& gu, int64_t r, int64_t c, int64_t inter, const Out& out) {
  const Float4 g = gu.Get4(r, 4 * c), u = gu.Get4(r, inter + 4 * c);
  Float4 y;
  y.x = Silu(g.x) * u.x;
  y.y = Silu(g.y) * u.y;
  y.z = Silu(g.z) * u.z;
  y.w = Silu(g.w) * u.w;
  out.Put4(r, 4 * c, y);
}
template <typename In, typename Out>
IRIS_GLOBAL void SiluMulRows4Kernel(In gu, int64_t rows, int64_t inter, Out out) {
  GridDependencyTrigger();  // a GEMV behind may start early (it waits for this kernel's output)
  const int64_t quads = inter / 4, n = rows * quads;
  const int64_t first = (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * gridDim.y * blockDim.x;
  const bool narrow = n <= 0xffffffffll;
  for (int64_t e = first; e < n; e += stride) {
    int64_t r, c;
    RowAndColumn(e, quads, narrow, &r, &c);
    SiluMulQuad(gu, r, c, inter, out);
  }
}

// The same from bf16 gate/up rows to bf16 rows, 8 values a thread (16-byte loads of gate and up, one
// 16-byte store), where SiluMulBf16Rows8Fits: the vision tower's intermediate, padded to 3456, is
// whole 16-byte vectors, and the 4-wide kernel's 8-byte accesses read its 170 MB (448²x8) at about
// two thirds of the H200's bandwidth. The same expression and rounding as the 4-wide kernel.
IRIS_HOST_DEVICE bool SiluMulBf16Rows8Fits(const void* gu, int64_t gu_ld, int64_t inter, const void* out, int64_t ld) {
  return inter % 8 == 0 && gu_ld % 8 == 0 && ld % 8 == 0 && reinterpret_cast<uintptr_t>(gu) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(out) % 16 == 0;
}
IRIS_GLOBAL void SiluMulBf16Rows8Kernel(const uint16_t* gu, int64_t gu_ld, int64_t rows, int64_t inter, uint16_t* out,
                                        int64_t ld) {
  GridDependencyTrigger();  // a GEMV behind may start early (it waits for this kernel's output)
  const int64_t octs = inter / 8, n = rows * octs;
  const int64_t first = (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * gridDim.y * blockDim.x;
  const bool narrow = n <= 0xffffffffll;
  for (int64_t e = first; e < n; e += stride) {
    int64_t r, c;
    RowAndColumn(e, octs, narrow, &r, &c);
    const uint16_t* row = gu + r * gu_ld + 8 * c;
    const Chunk16 g = *reinterpret_cast<const Chunk16*>(row), u = *reinterpret_cast<const Chunk16*>(row + inter);
    float gv[8], uv[8];
    ChunkValues(g, gv, static_cast<const uint16_t*>(nullptr));
    ChunkValues(u, uv, static_cast<const uint16_t*>(nullptr));
    Chunk16 y;
    for (int i = 0; i < 4; ++i) y.w[i] = PackBf16x2(Silu(gv[2 * i]) * uv[2 * i], Silu(gv[2 * i + 1]) * uv[2 * i + 1]);
    *reinterpret_cast<Chunk16*>(out + r * ld + 8 * c) = y;
  }
}

// out = silu(gate) * up over two flat arrays (out may alias gate).
IRIS_GLOBAL void SiluMulKernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = GridStart(); i < n; i += GridStride()) out[i] = Silu(gate[i]) * up[i];
}

// y = gelu(x), the exact form 0.5 x erfc(-x / sqrt(2)) (erfc: no cancellation for negative x).
IRIS_GLOBAL void GeluErfKernel(const float* x, int64_t n, float* y) {
  for (int64_t i = GridStart(); i < n; i += GridStride()) {
    const float v = x[i];
    y[i] = 0.5f * v * erfcf(-v * 0.70710678118654752f);
  }
}

// y = x * sigmoid(1.702 x), written as the CPU kernel: x / (1 + e^(-1.702 x)).
IRIS_GLOBAL void QuickGeluKernel(const float* x, int64_t n, float* y) {
  for (int64_t i = GridStart(); i < n; i += GridStride()) y[i] = x[i] / (1.0f + expf(-1.702f * x[i]));
}

IRIS_GLOBAL void AddKernel(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = GridStart(); i < n; i += GridStride()) y[i] = a[i] + b[i];
}

// The fused rotary: q's and k's heads of row blockIdx.x rotated in place in one launch
// (rotate-half; cos/sin hold head_dim/2 values per row). With k_heads = 0 (k unused) it is the
// one-tensor Rotary. T: f32 rows, or bf16 rows (the vision blocks' qkv rows held in bf16:
// widened, rotated in f32, rounded once, as HF rotates bf16 q and k in f32).
template <typename T>
IRIS_GLOBAL void RotaryQKKernel(T* q, int64_t q_stride, int q_heads, T* k, int64_t k_stride, int k_heads,
                                int head_dim, const float* cos, const float* sin) {
  const int64_t row = blockIdx.x;
  const int half = head_dim / 2;
  const float* c = cos + row * half;
  const float* s = sin + row * half;
  for (int e = static_cast<int>(threadIdx.x); e < (q_heads + k_heads) * half; e += static_cast<int>(blockDim.x)) {
    const int h = e / half, i = e % half;
    T* p = h < q_heads ? q + row * q_stride + static_cast<int64_t>(h) * head_dim
                       : k + row * k_stride + static_cast<int64_t>(h - q_heads) * head_dim;
    float y1, y2;
    RotatePair(LoadAsF32(p + i), LoadAsF32(p + i + half), c[i], s[i], &y1, &y2);
    StoreRounded(p + i, y1);
    StoreRounded(p + i + half, y2);
  }
}

// RotaryQKKernel<uint16_t> four pairs a thread: 8-byte loads and stores of bf16 rows, 16-byte
// loads of cos/sin, over a flat (row, head, quad) index (the one-block-a-row kernel's 2-byte
// accesses ran at a third of the memory's bandwidth on the vision tower's qkv rows). The same
// products rounded the same way: bit for bit that kernel's result. The caller checks
// RotaryQKBf16Vec4Fits (which also keeps the flat index in 32 bits: its divisions are per element).
IRIS_HOST_DEVICE bool RotaryQKBf16Vec4Fits(const void* q, int64_t q_stride, int q_heads, const void* k,
                                           int64_t k_stride, int k_heads, int head_dim, int64_t rows,
                                           const float* cos, const float* sin) {
  const auto aligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  return head_dim % 8 == 0 && q_stride % 4 == 0 && aligned(q, 8) && aligned(cos, 16) && aligned(sin, 16) &&
         (k_heads == 0 || (k_stride % 4 == 0 && aligned(k, 8))) &&
         rows * (q_heads + k_heads) * (head_dim / 8) <= 2147483647;
}
IRIS_GLOBAL void RotaryQKBf16Vec4Kernel(uint16_t* q, int64_t q_stride, int q_heads, uint16_t* k, int64_t k_stride,
                                        int k_heads, int head_dim, int64_t rows, const float* cos, const float* sin) {
  const int half = head_dim / 2, quads = half / 4;
  const int per_row = (q_heads + k_heads) * quads;
  const int64_t n = rows * per_row;
  for (int64_t e = GridStart(); e < n; e += GridStride()) {
    int64_t row, within;
    RowAndColumn(e, per_row, /*narrow=*/true, &row, &within);  // (RotaryQKBf16Vec4Fits: n < 2^31)
    const int h = static_cast<int>(within) / quads;
    const int i = (static_cast<int>(within) - h * quads) * 4;
    uint16_t* p = h < q_heads ? q + row * q_stride + static_cast<int64_t>(h) * head_dim
                              : k + row * k_stride + static_cast<int64_t>(h - q_heads) * head_dim;
    const Chunk8 a = *reinterpret_cast<const Chunk8*>(p + i), b = *reinterpret_cast<const Chunk8*>(p + i + half);
    const Float4 c4 = *reinterpret_cast<const Float4*>(cos + row * half + i);
    const Float4 s4 = *reinterpret_cast<const Float4*>(sin + row * half + i);
    const float x1[4] = {BitsToFloat(a.w[0] << 16), BitsToFloat(a.w[0] & 0xffff0000u), BitsToFloat(a.w[1] << 16),
                         BitsToFloat(a.w[1] & 0xffff0000u)};
    const float x2[4] = {BitsToFloat(b.w[0] << 16), BitsToFloat(b.w[0] & 0xffff0000u), BitsToFloat(b.w[1] << 16),
                         BitsToFloat(b.w[1] & 0xffff0000u)};
    const float c[4] = {c4.x, c4.y, c4.z, c4.w}, s[4] = {s4.x, s4.y, s4.z, s4.w};
    float y1[4], y2[4];
    for (int j = 0; j < 4; ++j) RotatePair(x1[j], x2[j], c[j], s[j], &y1[j], &y2[j]);
    Chunk8 ya, yb;
    ya.w[0] = PackBf16x2(y1[0], y1[1]);
    ya.w[1] = PackBf16x2(y1[2], y1[3]);
    yb.w[0] = PackBf16x2(y2[0], y2[1]);
    yb.w[1] = PackBf16x2(y2[2], y2[3]);
    *reinterpret_cast<Chunk8*>(p + i) = ya;
    *reinterpret_cast<Chunk8*>(p + i + half) = yb;
  }
}

// One row's heads, padded: in [heads, head_dim] -> out[h, row, :] of [heads, rows, padded_dim],
// dims past head_dim zero. The block's threads walk the row's outputs.
IRIS_DEVICE void PadRowHeads(const float* in, int64_t rows, int64_t row, int heads, int head_dim, int padded_dim,
                             float* out) {
  for (int e = static_cast<int>(threadIdx.x); e < heads * padded_dim; e += static_cast<int>(blockDim.x)) {
    const int h = e / padded_dim, d = e % padded_dim;
    out[(static_cast<int64_t>(h) * rows + row) * padded_dim + d] = d < head_dim ? in[h * head_dim + d] : 0.f;
  }
}

// One launch pads all three of q, k, v: qkv [rows, 3, heads, head_dim] -> each of q, k, v
// [heads, rows, padded_dim], dims past head_dim zero. Grid (rows, 3).
IRIS_GLOBAL void PadQkvKernel(const float* qkv, int64_t rows, int heads, int head_dim, int padded_dim, float* q,
                              float* k, float* v) {
  const int64_t row = blockIdx.x;
  const int which = static_cast<int>(blockIdx.y);
  float* out = which == 0 ? q : which == 1 ? k : v;
  PadRowHeads(qkv + (row * 3 + which) * heads * static_cast<int64_t>(head_dim), rows, row, heads, head_dim,
              padded_dim, out);
}

// One of q, k, v (which = 0, 1, 2) of PadQkvKernel. Grid (rows).
IRIS_GLOBAL void PadOneOfQkvKernel(const float* qkv, int64_t rows, int heads, int head_dim, int padded_dim, int which,
                                   float* out) {
  const int64_t row = blockIdx.x;
  PadRowHeads(qkv + (row * 3 + which) * heads * static_cast<int64_t>(head_dim), rows, row, heads, head_dim,
              padded_dim, out);
}

// out[r, h * head_dim + d] = padded[r, h * padded_dim + d] for d < head_dim, over all rows.
IRIS_GLOBAL void UnpadHeadsKernel(const float* padded, int64_t rows, int heads, int head_dim, int padded_dim,
                                  float* out) {
  const int64_t out_row = static_cast<int64_t>(heads) * head_dim, n = rows * out_row;
  for (int64_t e = GridStart(); e < n; e += GridStride()) {
    const int64_t r = e / out_row;
    const int c = static_cast<int>(e % out_row), h = c / head_dim, d = c % head_dim;
    out[e] = padded[r * heads * padded_dim + static_cast<int64_t>(h) * padded_dim + d];
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

// The best pair of row[begin, end) over the block's threads (NaN as -inf), complete in warp 0.
// Every thread of the block calls it; warp_v / warp_i: kMaxWarpsPerBlock shared slots.
IRIS_DEVICE ArgmaxPair BlockArgmax(const float* row, int64_t begin, int64_t end, float* warp_v, int32_t* warp_i) {
  ArgmaxPair best;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    best.Take(row[i] != row[i] ? -INFINITY : row[i], static_cast<int32_t>(i));  // NaN as -inf
  }
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  best = WarpArgmax(best);
  if (lane == 0) {
    warp_v[warp] = best.value;
    warp_i[warp] = best.index;
  }
  SyncThreads();
  ArgmaxPair p;
  if (warp == 0) {
    if (lane < static_cast<int>(blockDim.x) / kWarpSize) p = ArgmaxPair{warp_v[lane], warp_i[lane]};
    p = WarpArgmax(p);
  }
  return p;
}

// The token a row's best pair picks: 0 where nothing is above -inf.
IRIS_DEVICE int32_t ArgmaxToken(const ArgmaxPair& p) {
  return p.index == INT32_MAX || p.value == -INFINITY ? 0 : p.index;
}

// kernels::EditLogitRows, block r on row r: the row's masked ids set to -inf, then (after a
// barrier, so that a masked and penalized id ends -inf whatever the thread order) HF's penalty on
// its penalized ids. Each list is distinct within a row (LogitEdits::AddRow), so no two threads
// write one value. Ids outside [0, vocab) are skipped.
IRIS_GLOBAL void EditLogitRowsKernel(float* logits, int64_t vocab, PackedLogitEdits e) {
  const int64_t r = blockIdx.x;
  const int32_t tid = static_cast<int32_t>(threadIdx.x), threads = static_cast<int32_t>(blockDim.x);
  float* row = logits + r * vocab;
  for (int32_t k = e.masked_begin[r] + tid; k < e.masked_begin[r + 1]; k += threads) {
    if (e.masked[k] >= 0 && e.masked[k] < vocab) row[e.masked[k]] = -INFINITY;
  }
  SyncThreads();
  const float penalty = BitsToFloat(static_cast<uint32_t>(e.penalty_bits[r]));
  for (int32_t k = e.penalized_begin[r] + tid; k < e.penalized_begin[r + 1]; k += threads) {
    if (e.penalized[k] < 0 || e.penalized[k] >= vocab) continue;
    const float s = row[e.penalized[k]];
    row[e.penalized[k]] = s < 0.f ? s * penalty : s / penalty;
  }
}

IRIS_GLOBAL void ArgmaxKernel(const float* logits, int64_t vocab, int32_t* out) {
  IRIS_SHARED float warp_v[kMaxWarpsPerBlock];
  IRIS_SHARED int32_t warp_i[kMaxWarpsPerBlock];
  const ArgmaxPair p = BlockArgmax(logits + static_cast<int64_t>(blockIdx.x) * vocab, 0, vocab, warp_v, warp_i);
  if (threadIdx.x == 0) out[blockIdx.x] = ArgmaxToken(p);
  SyncThreads();  // the shared slots are read before a next block (harness) reuses them
}

// The same over a row split into gridDim.y slices, one block each (grid (rows, slices)): one block
// per row reads a 152k vocabulary at a single SM's pace (~60 us on an H200 at batch 1). Each
// block leaves its slice's best pair in part_v / part_i [row * slices + slice]; the last block of
// a row to finish (counted in counters[row], zero before and after the launch) merges them.
IRIS_GLOBAL void ArgmaxSplitKernel(const float* logits, int64_t vocab, float* part_v, int32_t* part_i, int* counters,
                                   int32_t* out) {
  IRIS_SHARED float warp_v[kMaxWarpsPerBlock];
  IRIS_SHARED int32_t warp_i[kMaxWarpsPerBlock];
  IRIS_SHARED int merges_row;
  const int64_t slices = gridDim.y, slice = (vocab + slices - 1) / slices;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * slice, end = begin + slice < vocab ? begin + slice : vocab;
  const ArgmaxPair p =
      BlockArgmax(logits + static_cast<int64_t>(blockIdx.x) * vocab, begin, end, warp_v, warp_i);
  if (threadIdx.x == 0) {
    const int64_t part = static_cast<int64_t>(blockIdx.x) * slices + blockIdx.y;
    part_v[part] = p.value;
    part_i[part] = p.index;
    ThreadFence();  // the slice's pair is visible GPU-wide before its arrival counts
    const bool last = AtomicAddInt(counters + blockIdx.x, 1) == static_cast<int>(slices) - 1;
    if (last) counters[blockIdx.x] = 0;  // every slice has arrived: zero again for the next launch
    merges_row = last ? 1 : 0;
  }
  SyncThreads();
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (merges_row != 0 && warp == 0) {
    ThreadFence();
    ArgmaxPair q;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * slices;
    for (int64_t k = lane; k < slices; k += kWarpSize) q.Take(LoadCoherent(part_v + first + k), LoadCoherent(part_i + first + k));
    q = WarpArgmax(q);
    if (lane == 0) out[blockIdx.x] = ArgmaxToken(q);
  }
  SyncThreads();  // the shared values are read before a next block (harness) reuses them
}

// --- f16 bits, converted by hand (the harness has no cuda_fp16.h; bf16: bf16_bits.cuh) ---

// IEEE half bits -> f32, exact (as core::F16ToFloat): every half is an f32, subnormals included;
// inf stays inf, NaN keeps its payload.
IRIS_DEVICE float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, a normal f32 (or 0) computed exactly.
    return BitsToFloat(sign | FloatToBits(static_cast<float>(mant) * 5.9604644775390625e-8f));
  }
  if (exp == 0x1Fu) return BitsToFloat(sign | 0x7F800000u | (mant << 13));
  return BitsToFloat(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

// --- Rows: gathers, scatters, the embedding lookup ---

// dst[i, :] = src[index[i], :] for i < n.
IRIS_GLOBAL void GatherRowsKernel(const float* src, int64_t width, const int32_t* index, int64_t n, float* dst) {
  GridDependencyTrigger();  // lm_head's GEMV may start (it waits for this kernel's rows)
  const bool narrow = n * width <= 0xffffffffll;
  for (int64_t e = GridStart(); e < n * width; e += GridStride()) {
    int64_t i, j;
    RowAndColumn(e, width, narrow, &i, &j);
    dst[e] = src[static_cast<int64_t>(index[i]) * width + j];
  }
}

// dst[index[i], :] = src[i, :] for i < n.
IRIS_GLOBAL void ScatterRowsKernel(const float* src, int64_t width, const int32_t* index, int64_t n, float* dst) {
  const bool narrow = n * width <= 0xffffffffll;
  for (int64_t e = GridStart(); e < n * width; e += GridStride()) {
    int64_t i, j;
    RowAndColumn(e, width, narrow, &i, &j);
    dst[static_cast<int64_t>(index[i]) * width + j] = src[e];
  }
}

// kernels::PatchRows (kernels/patch_rows.h): rows [row_begin, row_begin + rows) of a resized RGB8
// image's patch rows, a value a thread (consecutive threads: consecutive x of one patch line).
IRIS_GLOBAL void PatchRowsKernel(const uint8_t* rgb, PatchGrid grid, const float* table, int64_t row_begin,
                                 int64_t rows, float* out) {
  const int plane = grid.patch * grid.patch, row_len = static_cast<int>(grid.row_length());
  const bool narrow = rows * row_len <= 0xffffffffll;
  for (int64_t e = GridStart(); e < rows * row_len; e += GridStride()) {
    int64_t rr, jj;
    RowAndColumn(e, row_len, narrow, &rr, &jj);
    const int64_t r = row_begin + rr;
    const int j = static_cast<int>(jj);
    const int c = j / (grid.temporal * plane), y = (j % plane) / grid.patch, x = j % grid.patch;
    out[e] = table[c * 256 + rgb[grid.PatchOrigin(r) + (y * grid.width + x) * 3 + c]];
  }
}

// An embedding table's element type and its widening to f32 (EmbeddingLookupKernel's parameter).
struct F32Table {
  using Element = float;
  static IRIS_DEVICE float ToFloat(float x) { return x; }
};
struct Bf16Table {
  using Element = uint16_t;
  static IRIS_DEVICE float ToFloat(uint16_t bits) { return Bf16ToFloat(bits); }
};
struct F16Table {
  using Element = uint16_t;
  static IRIS_DEVICE float ToFloat(uint16_t bits) { return F16ToFloat(bits); }
};

// out[i, :] = table[ids[i], :] widened to f32, table [vocab, width]. The ids are device memory,
// so a bad one cannot stop the launch as it stops the CPU op: its row comes out NaN instead of
// being read from outside the table.
template <typename Table>
IRIS_GLOBAL void EmbeddingLookupKernel(const typename Table::Element* table, int64_t vocab, int64_t width,
                                       const int32_t* ids, int64_t n, float* out) {
  GridDependencyTrigger();  // the first layer's qkv GEMV may start (it waits for these rows)
  for (int64_t e = GridStart(); e < n * width; e += GridStride()) {
    const int64_t i = e / width, j = e % width;
    const int32_t id = ids[i];
    out[e] = id < 0 || id >= vocab ? BitsToFloat(0x7FC00000u)  // a quiet NaN
                                   : Table::ToFloat(table[static_cast<int64_t>(id) * width + j]);
  }
}

// --- The paged KV cache: its writes, and attention over it (f32 products; f32 or bf16 pools) ---

// Stores n tokens' k and v rows (row = num_kv_heads * head_dim floats each, at k + r * k_stride
// and v + r * v_stride) into pool slots slots[r], f32 or bf16 (rounded as the CPU op rounds).
// The slots are device memory: one outside [0, num_slots) cannot stop the launch as it stops the
// CPU op, so its row is dropped instead of written outside the pool.
template <typename T>
IRIS_GLOBAL void WritePagedKvKernel(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                                    const int64_t* slots, int64_t n, int64_t row, int64_t num_slots, T* k_pool,
                                    T* v_pool) {
  for (int64_t e = GridStart(); e < n * row; e += GridStride()) {
    const int64_t r = e / row, i = e % row;
    const int64_t slot = slots[r];
    if (slot < 0 || slot >= num_slots) continue;
    StoreRounded(k_pool + slot * row + i, k[r * k_stride + i]);
    StoreRounded(v_pool + slot * row + i, v[r * v_stride + i]);
  }
}

// A decode step's RotaryQKKernel and WritePagedKvKernel in one launch: row blockIdx.x's q and k
// heads rotated in place (the same expressions), and the rotated k and the row's v (v_stride
// apart) stored into pool slot slots[row] (k_heads * head_dim values, f32 or bf16 rounded as the
// CPU op rounds), unless the slot is outside [0, num_slots) (kernels::kPadSlot): then the row is
// rotated and not stored. The pool gets exactly what the two kernels would write. A row's work is
// strided over its gridDim.y blocks' threads: a decode step of one row would otherwise be one
// block walking 1000+ rotary pairs in turn, a memory round trip each.
// Launched to start early (behind the qkv projection), a block reads only its row's slot (step
// metadata, uploaded before the step's kernels) before GridDependencyWait; q, k, v and the
// cos/sin rows after it, and it writes nothing before it.
template <typename T>
IRIS_GLOBAL void RotaryQKWriteKvKernel(float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride,
                                       int k_heads, int head_dim, const float* cos, const float* sin, const float* v,
                                       int64_t v_stride, const int64_t* slots, int64_t num_slots, T* k_pool,
                                       T* v_pool) {
  GridDependencyTrigger();  // the paged attention behind may start early (it waits for this kernel)
  const int64_t row = blockIdx.x;
  const int half = head_dim / 2;
  const int64_t width = static_cast<int64_t>(k_heads) * head_dim;  // a pool slot's values
  const int64_t slot = slots[row];
  GridDependencyWait();
  T* k_slot = slot >= 0 && slot < num_slots ? k_pool + slot * width : nullptr;
  const float* c = cos + row * half;
  const float* s = sin + row * half;
  const int first = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  const int stride = static_cast<int>(gridDim.y * blockDim.x);
  for (int e = first; e < (q_heads + k_heads) * half; e += stride) {
    const int h = e / half, i = e % half;
    const bool is_k = h >= q_heads;
    const int64_t at = static_cast<int64_t>(is_k ? h - q_heads : h) * head_dim;
    float* p = is_k ? k + row * k_stride + at : q + row * q_stride + at;
    float y1, y2;
    RotatePair(p[i], p[i + half], c[i], s[i], &y1, &y2);
    p[i] = y1;
    p[i + half] = y2;
    if (is_k && k_slot != nullptr) {
      StoreRounded(k_slot + at + i, y1);
      StoreRounded(k_slot + at + i + half, y2);
    }
  }
  if (k_slot == nullptr) return;
  for (int64_t e = first; e < width; e += stride) StoreRounded(v_pool + slot * width + e, v[row * v_stride + e]);
}

constexpr int kPagedWarps = 8;        // a block: 8 warps (256 threads)
constexpr int kPagedMaxHeadDim = 256;
constexpr int kPagedDimsPerLane = kPagedMaxHeadDim / 32;

// q·k of one key, computed whole by one lane (q in shared memory). Rows whose address and length
// allow it are read 16 bytes at a time, kKeyDotBatch loads issued before their products (a bf16
// row of 128 dims is one memory round trip, not one per loop turn: the loads of a turn wait for
// the last turn's products otherwise); four partial sums keep the products independent. The sum's
// order is the chunks' order whatever the batching.
constexpr int kKeyDotBatch = 8;
// `chunked`: whether to read kr 16 bytes at a time (kr is then 16-byte aligned); the sum's order
// depends on it, so a key held elsewhere (the fused rotary's shared copy) takes its pool row's.
template <typename T>
IRIS_DEVICE float KeyDot(const T* kr, const float* qs, int head_dim, bool chunked) {
  constexpr int kPer = kPerChunk16<T>;  // values per 16-byte chunk: 8 bf16, 4 f32
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  int d = 0;
  if (chunked) {
    const Chunk16* kc = reinterpret_cast<const Chunk16*>(kr);
    const int chunks = head_dim / kPer;  // whole chunks; the rest goes element by element below
    for (int c0 = 0; c0 < chunks; c0 += kKeyDotBatch) {
      const int n = chunks - c0 < kKeyDotBatch ? chunks - c0 : kKeyDotBatch;
      Chunk16 c[kKeyDotBatch];
      IRIS_UNROLL
      for (int b = 0; b < kKeyDotBatch; ++b) {
        if (b < n) c[b] = kc[c0 + b];
      }
      IRIS_UNROLL
      for (int b = 0; b < kKeyDotBatch; ++b) {
        if (b >= n) break;
        float v[kPer];
        ChunkValues(c[b], v, kr);
        const float* q = qs + (c0 + b) * kPer;
        if constexpr (kPer == 8) {
          for (int i = 0; i < 4; ++i) s[i] += q[2 * i] * v[2 * i] + q[2 * i + 1] * v[2 * i + 1];
        } else {
          for (int i = 0; i < 4; ++i) s[i] += q[i] * v[i];
        }
      }
    }
    d = chunks * kPer;
  }
  for (; d < head_dim; ++d) s[d % 4] += qs[d] * LoadAsF32(kr + d);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// V rows read 16 bytes per lane: a row of head_dim values is `chunks` = head_dim / kPerChunk16<T>
// chunks, so a warp reads `32 / chunks` keys' rows per load instruction, and a lane keeps a batch of
// kPagedVBatch loads in flight before its products: a short tile's V rows arrive in one memory
// round trip instead of four. Where the rows are not whole aligned chunks (an odd head dim), lanes
// own head dims instead (lane + 32 i) and load element by element. 0: that case.
// The lean kernel (below) keeps half as many: the same V rows in the same order, two round trips.
constexpr int kPagedVBatch = 16;
constexpr int kPagedVBatchLean = 8;
template <typename T>
IRIS_HOST_DEVICE int PagedVChunks(const T* v_pool, int head_dim) {
  if (reinterpret_cast<uintptr_t>(v_pool) % 16 != 0 || head_dim % kPerChunk16<T> != 0) return 0;
  const int chunks = head_dim / kPerChunk16<T>;
  return chunks <= kWarpSize ? chunks : 0;
}
// acc[e] += p * the chunk's e-th value.
template <typename T>
IRIS_DEVICE void AccumulateChunk(float* acc, const Chunk16& c, float p) {
  float v[kPerChunk16<T>];
  ChunkValues(c, v, static_cast<const T*>(nullptr));
  for (int e = 0; e < kPerChunk16<T>; ++e) acc[e] += p * v[e];
}

// The pool slot of key j of a sequence whose block table is `table` (kernels/paged_attention.h).
IRIS_DEVICE int64_t PagedSlot(const int32_t* table, int64_t j, int block_size) {
  return static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
}

// One block per (query row, q head) of a step (grid (row_end - row_begin, num_heads)), the layout and metadata of
// kernels/paged_attention.h: the row's sequence is found in query_start; it attends causally to
// keys 0 .. its position, read through the block table. The keys go in tiles of 32, the warps
// taking every 8th tile: a lane computes one key's score whole (so the 32 keys' loads are in
// flight at once, rather than one key per warp reduction), the warp updates its online softmax
// by the tile's maximum, then the lanes, each owning head dims, accumulate the tile's 32 V rows.
// The eight warps' partial results are merged at the end. Where a step has too few (row, head)
// pairs to fill the GPU (a small decode batch), gridDim.z > 1 splits each row's keys over that
// many blocks, which write partials; the last of them to finish (counted in split_counters, one
// zeroed int per (row, head), which it leaves zeroed again) merges them into the output, so the
// merge costs no launch of its own.
// Launched to start early (programmatic dependent launch, behind the kernel that writes q and the
// step's keys), a block reads the step's metadata and block table and asks for its first tile's
// K and V lines in the L2 before GridDependencyWait: no kernel of the step writes the metadata or
// the table (a copy uploads them before the step's first kernel, and no early start crosses a
// copy), so they are safe however far the early starts ahead of this one run; and a prefetch of a
// line a kernel is still writing reads nothing into registers. q, the output and the partials wait.
// kRotary (a step of decode rows only; PagedDecodeRotary, paged_decode_rotary.h): the step's
// rotary and KV write are this kernel's too. q is the row's q before rotary, rotated as it is
// read; the row's own key and value (its last key: a decode row's position is its context's end)
// are rotated and rounded from the qkv rows into shared memory and read from there, as
// RotaryQKWriteKvKernel would have stored them; one block per (row, kv head) stores them into the
// row's pool slot for the steps after (no block of this launch reads that slot). The same
// products in the same order as RotaryQKWriteKvKernel then this kernel without it: the same
// output and pools, bit for bit.
// kChunkedV: the V rows are whole aligned 16-byte chunks (PagedVChunks > 0, the launch's choice),
// so the element-by-element V path is not compiled in: its registers counted even where it never
// ran (255 a thread and spills with both; 155-178 with one). kLean (with kChunkedV): at most 128
// registers, two blocks an SM, by taking V rows kPagedVBatchLean at a time, for grids of more
// blocks than one wave holds (a large decode batch). Every instantiation computes the same
// products in the same order: the same output, bit for bit.
template <typename T, bool kRotary = false, bool kChunkedV = true, bool kLean = false>
IRIS_GLOBAL void IRIS_LAUNCH_BOUNDS(kPagedWarps * kWarpSize, kLean ? 2 : 1) PagedAttentionKernel(const float* q, int64_t q_row_stride, float* out, int64_t out_row_stride,
                                      int num_heads, float scale, const T* k_pool, const T* v_pool, int block_size,
                                      int num_kv_heads, int head_dim, const int32_t* query_start,
                                      const int32_t* context_lens, const int32_t* block_tables,
                                      int max_blocks_per_seq, int num_seqs, int64_t row_begin, float* partials,
                                      int* split_counters, PagedDecodeRotary rotary) {
  GridDependencyTrigger();  // the o projection's GEMV may start (it waits for this kernel's output)
  IRIS_SHARED float q_shared[kPagedMaxHeadDim];
  // The row's own key and value (kRotary), as the pool holds them; 16-byte aligned, as KeyDot's
  // and the V loop's chunked reads want.
  constexpr int kCurChunks = kRotary ? kPagedMaxHeadDim * static_cast<int>(sizeof(T)) / 16 : 1;
  IRIS_SHARED Chunk16 cur_k_chunks[kCurChunks];
  IRIS_SHARED Chunk16 cur_v_chunks[kCurChunks];
  T* const cur_k = reinterpret_cast<T*>(cur_k_chunks);
  T* const cur_v = reinterpret_cast<T*>(cur_v_chunks);
  IRIS_SHARED int merges_splits;
  IRIS_SHARED float tile_p[kPagedWarps][kWarpSize];
  IRIS_SHARED int64_t tile_slot[kPagedWarps][kWarpSize];
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
  // Warp w of block z takes tile w * gridDim.z + z, then every (8 * gridDim.z)th: a short context's
  // few tiles go to different blocks (SMs) before a block's second warp gets one.
  const int64_t first_tile = static_cast<int64_t>(warp) * gridDim.z + blockIdx.z;
  const int64_t tile_step = static_cast<int64_t>(gridDim.z) * kPagedWarps * kWarpSize;
  if (const int64_t j = first_tile * kWarpSize + lane; j < keys) {
    const int64_t at = PagedSlot(table, j, block_size) * row_elems + static_cast<int64_t>(g) * head_dim;
    for (int64_t b = 0; b < static_cast<int64_t>(head_dim) * static_cast<int64_t>(sizeof(T)); b += 128) {
      PrefetchL2(reinterpret_cast<const char*>(k_pool + at) + b);
      PrefetchL2(reinterpret_cast<const char*>(v_pool + at) + b);
    }
  }
  GridDependencyWait();
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  if constexpr (kRotary) {
    RotateDecodeHeads(rotary, row, qr, 1, head_dim, q_shared, tid, threads);
    LoadOwnKv(rotary, row, g, head_dim, cur_k, cur_v, tid, threads);
  } else {
    for (int d = tid; d < head_dim; d += threads) q_shared[d] = qr[d];
  }
  SyncThreads();
  if constexpr (kRotary) {
    // The kv head's first q head's first split stores the row's key and value.
    if (h % (num_heads / num_kv_heads) == 0 && blockIdx.z == 0) {
      StoreOwnKv(rotary, row, row_elems, g, head_dim, cur_k, cur_v, tid, threads);
    }
  }
  // Chunked V (PagedVChunks): lane = key group * chunks + chunk, the groups taking a tile's keys
  // in turn; lanes past groups * chunks idle in the V products.
  static_assert(kChunkedV || !kLean, "the lean kernel reads V in chunks");
  constexpr int kVBatch = kLean ? kPagedVBatchLean : kPagedVBatch;
  const int chunks = kChunkedV ? PagedVChunks(v_pool, head_dim) : 0;  // > 0 where kChunkedV (the launch's pick)
  const int groups = chunks > 0 ? kWarpSize / chunks : 0;
  const int key_group = chunks > 0 ? lane / chunks : 0, chunk = chunks > 0 ? lane % chunks : 0;

  float acc[kPagedDimsPerLane];
  for (int i = 0; i < kPagedDimsPerLane; ++i) acc[i] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int64_t t0 = first_tile * kWarpSize; t0 < keys; t0 += tile_step) {
    const int64_t j = t0 + lane;
    const bool valid = j < keys;
    int64_t slot = 0;
    float score = -INFINITY;
    if (valid) {
      slot = PagedSlot(table, j, block_size);
      const T* kr = k_pool + slot * row_elems + static_cast<int64_t>(g) * head_dim;
      const bool chunked = reinterpret_cast<uintptr_t>(kr) % 16 == 0;  // the pool row's way, whichever is read
      if constexpr (kRotary) {
        if (j == keys - 1) {
          kr = cur_k;
          slot = -1;  // the V loops' mark for cur_v
        }
      }
      score = KeyDot(kr, q_shared, head_dim, chunked) * scale;
    }
    const float tile_max = WarpMax(score);  // finite: the tile's first key is valid
    const float m_new = tile_max > m ? tile_max : m;
    const float p = valid ? expf(score - m_new) : 0.f;
    const float correction = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * correction + WarpSum(p);
    for (int i = 0; i < kPagedDimsPerLane; ++i) acc[i] *= correction;
    m = m_new;
    tile_p[warp][lane] = p;
    tile_slot[warp][lane] = slot;
    SyncWarp();
    const int n = keys - t0 < kWarpSize ? static_cast<int>(keys - t0) : kWarpSize;
    // Tile key u's V row (the row's own, kRotary: slot -1, from shared memory).
    const auto v_row = [&](int u) -> const T* {
      const int64_t su = tile_slot[warp][u];
      if constexpr (kRotary) {
        if (su < 0) return cur_v;
      }
      return v_pool + su * row_elems + static_cast<int64_t>(g) * head_dim;
    };
    if constexpr (kChunkedV) {
      if (key_group < groups) {
        const int64_t column = static_cast<int64_t>(chunk) * kPerChunk16<T>;
        for (int u0 = key_group; u0 < n; u0 += groups * kVBatch) {
          Chunk16 vv[kVBatch];
          for (int k = 0; k < kVBatch; ++k) {
            const int u = u0 + k * groups;
            vv[k] = u < n ? *reinterpret_cast<const Chunk16*>(v_row(u) + column) : Chunk16{};
          }
          for (int k = 0; k < kVBatch; ++k) {
            const int u = u0 + k * groups;
            if (u < n) AccumulateChunk<T>(acc, vv[k], tile_p[warp][u]);
          }
        }
      }
      SyncWarp();  // the tile's p and slots are read before the next tile writes them
      continue;
    }
    int u = 0;
    // Eight V rows' loads issued before their products, so they are in flight together (one at
    // a time, each key would wait a full memory latency).
    for (; u + 8 <= n; u += 8) {
      float vv[8][kPagedDimsPerLane];
      for (int k = 0; k < 8; ++k) {
        const T* vr = v_row(u + k);
        for (int i = 0; i < kPagedDimsPerLane; ++i) {
          const int d = lane + i * kWarpSize;
          vv[k][i] = d < head_dim ? LoadAsF32(vr + d) : 0.f;
        }
      }
      for (int k = 0; k < 8; ++k) {
        const float pu = tile_p[warp][u + k];
        for (int i = 0; i < kPagedDimsPerLane; ++i) acc[i] += pu * vv[k][i];
      }
    }
    for (; u < n; ++u) {
      const float pu = tile_p[warp][u];
      const T* vr = v_row(u);
      for (int i = 0; i < kPagedDimsPerLane; ++i) {
        const int d = lane + i * kWarpSize;
        if (d < head_dim) acc[i] += pu * LoadAsF32(vr + d);
      }
    }
    SyncWarp();  // the tile's p and slots are read before the next tile writes them
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
  if constexpr (kChunkedV) {
    // Each key group's sums side by side (groups * head_dim <= 32 * kPerChunk16 <= kPagedMaxHeadDim
    // floats), then each head dim's sum over the groups in its group-0 place, by the lane that
    // alone reads that place.
    if (key_group < groups) {
      for (int e = 0; e < kPerChunk16<T>; ++e) warp_acc[warp][key_group * head_dim + chunk * kPerChunk16<T> + e] = acc[e];
    }
    SyncWarp();
    for (int d = lane; d < head_dim; d += kWarpSize) {
      float sum = warp_acc[warp][d];
      for (int k = 1; k < groups; ++k) sum += warp_acc[warp][k * head_dim + d];
      warp_acc[warp][d] = sum;
    }
  } else {
    for (int i = 0; i < kPagedDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < head_dim) warp_acc[warp][d] = acc[i];
    }
  }
  SyncThreads();
  float big, total;
  MergedMaxAndSum(warp_m, warp_l, 1, kPagedWarps, &big, &total);
  // One split: the row's output. Several: this block's unnormalised partial [m, l, acc...] (m =
  // -inf where the block had no keys), merged below by the split that finishes last.
  const bool whole = partials == nullptr;
  float* orow = whole ? out + row * out_row_stride + static_cast<int64_t>(h) * head_dim
                      : partials + PagedPartialIndex(blockIdx.x, h, num_heads, blockIdx.z, gridDim.z, head_dim);
  if (!whole && threadIdx.x == 0) {
    orow[0] = big;
    orow[1] = total;
  }
  for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += static_cast<int>(blockDim.x)) {
    const float sum = MergedAcc(warp_m, 1, &warp_acc[0][d], kPagedMaxHeadDim, kPagedWarps, big);
    if (whole) {
      orow[d] = sum / total;
    } else {
      orow[2 + d] = sum;
    }
  }
  if (!whole) {
    ThreadFence();  // this thread's share of the partial is visible GPU-wide before the arrival counts
    SyncThreads();
    if (threadIdx.x == 0) {
      int* counter = split_counters + static_cast<int64_t>(blockIdx.x) * num_heads + h;
      const bool last = AtomicAddInt(counter, 1) == static_cast<int>(gridDim.z) - 1;
      if (last) *counter = 0;  // every split has arrived: zero again for the next launch
      merges_splits = last ? 1 : 0;
    }
    SyncThreads();
    if (merges_splits != 0) {
      ThreadFence();
      const int splits = static_cast<int>(gridDim.z);
      const float* part = partials + PagedPartialIndex(blockIdx.x, h, num_heads, 0, splits, head_dim);
      const int64_t ps = 2 + static_cast<int64_t>(head_dim);
      float top, sum_l;
      MergedMaxAndSum(part, part + 1, ps, splits, &top, &sum_l, CoherentLoad{});
      float* out_row = out + row * out_row_stride + static_cast<int64_t>(h) * head_dim;
      for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += static_cast<int>(blockDim.x)) {
        out_row[d] = MergedAcc(part, ps, part + 2 + d, ps, splits, top, CoherentLoad{}) / sum_l;
      }
    }
  }
  SyncThreads();  // the shared partials are read before a next block (harness) reuses them
}

}  // namespace iris::kernels::cuda
