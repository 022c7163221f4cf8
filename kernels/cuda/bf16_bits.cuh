// bf16 as raw bits in iris's device code (simt.h: nvcc and the SIMT harness, which has no
// cuda_bf16.h): conversions rounded exactly as core::FloatToBf16 rounds, so that a GPU kernel's
// bf16 inputs are the CPU path's bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

IRIS_DEVICE float BitsToFloat(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}
IRIS_DEVICE uint32_t FloatToBits(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// bf16 bits: the top half of an f32.
IRIS_DEVICE float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// f32 -> bf16 bits, rounded to nearest even on the bit pattern (adding 0x7FFF plus the lowest kept
// bit carries into the kept half exactly when the dropped half is above the halfway point, or at
// it with an odd kept half); a NaN keeps its top bits and is made quiet, so that a payload only in
// the dropped bits does not become an infinity; finite values past bf16's range round to inf,
// subnormals are rounded rather than flushed.
IRIS_DEVICE uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatToBits(f);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// A value of f32 or bf16 rows (KV pools, the vision blocks' qkv rows held in bf16) as f32, and
// stored back (bf16 rounded as core::FloatToBf16).
IRIS_DEVICE float LoadAsF32(const float* p) { return *p; }
IRIS_DEVICE float LoadAsF32(const uint16_t* p) { return Bf16ToFloat(*p); }
IRIS_DEVICE void StoreRounded(float* p, float x) { *p = x; }
IRIS_DEVICE void StoreRounded(uint16_t* p, float x) { *p = FloatToBf16(x); }

// Two values as the 32-bit register a tensor-core fragment holds them in: `lo` (the lower column
// or key) in the low half.
IRIS_DEVICE uint32_t PackBf16x2(float lo, float hi) {
  return static_cast<uint32_t>(FloatToBf16(lo)) | (static_cast<uint32_t>(FloatToBf16(hi)) << 16);
}

// 8 bytes of bf16 values: four of them, the first in w[0]'s low half.
struct alignas(8) Chunk8 {
  uint32_t w[2];
};

// 16 bytes of a row (a K or V row, a weight row): kPerChunk16<T> values (8 bf16 or 4 f32),
// loaded at once where the row's address allows it.
struct alignas(16) Chunk16 {
  uint32_t w[4];
};
template <typename T>
constexpr int kPerChunk16 = 16 / static_cast<int>(sizeof(T));
// The chunk's values in row order, widened to f32 (the pointer only picks the row's type).
IRIS_DEVICE void ChunkValues(const Chunk16& c, float (&v)[8], const uint16_t*) {
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = BitsToFloat(c.w[i] << 16);
    v[2 * i + 1] = BitsToFloat(c.w[i] & 0xffff0000u);
  }
}
IRIS_DEVICE void ChunkValues(const Chunk16& c, float (&v)[4], const float*) {
  for (int i = 0; i < 4; ++i) v[i] = BitsToFloat(c.w[i]);
}

}  // namespace iris::kernels::cuda
