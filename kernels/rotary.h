// Rotary position embedding (rotate-half convention, as HF's apply_rotary_pos_emb):
//   x' = x*cos + rotate_half(x)*sin,  rotate_half(x) = cat(-x[d/2:], x[:d/2])
// cos/sin tables hold head_dim/2 values per row (HF's table is cat(freqs, freqs), i.e. the same
// half twice), row r for token r.
#pragma once

#include <cstdint>

#include "kernels/device.h"

namespace iris::kernels {

// A strided set of heads: head h of token r starts at data[r * row_stride + h * head_dim].
struct HeadsView {
  float* data;
  int64_t row_stride;
  int num_heads;
  // Instead of data (null then): bf16 values at the same offsets, rotated in f32 and rounded once
  // (the vision blocks' qkv rows held in bf16: kernels/qkv_bf16.h; a device whose KeepsQkvInBf16
  // said so). q and k in the same form.
  uint16_t* bf16 = nullptr;
};

// The fused kernel: rotates q and k together, in place, in one pass over the rows (straight in
// the qkv projection's output when q and k point into it).
void RotaryQK(Device& device, HeadsView q, HeadsView k, int64_t rows, int head_dim, const float* cos,
              const float* sin);

// One tensor at a time (the unfused path the technique switch falls back to).
void Rotary(Device& device, HeadsView x, int64_t rows, int head_dim, const float* cos, const float* sin);

}  // namespace iris::kernels
