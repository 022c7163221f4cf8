// Splits a fused qkv projection output [rows, 3, heads, head_dim] into head-major q, k and v
// buffers [heads, rows, padded_dim], zero-filling dims head_dim..padded_dim. Attention kernels
// that want aligned head dims (80 -> 96/128) read these.
#pragma once

#include <cstdint>

#include "kernels/device.h"

namespace iris::kernels {

// One pass over qkv writes all three outputs.
void PadQkv(Device& device, const float* qkv, int64_t rows, int num_heads, int head_dim, int padded_dim,
            float* q, float* k, float* v);

// One of the three (which = 0 q, 1 k, 2 v): the unfused path, called three times.
void PadOneOfQkv(Device& device, const float* qkv, int64_t rows, int num_heads, int head_dim, int padded_dim,
                 int which, float* out);

// The inverse for an attention output: out[r, h * head_dim + d] = padded[r, h * padded_dim + d]
// for d < head_dim (the padded dims dropped).
void UnpadHeads(Device& device, const float* padded, int64_t rows, int num_heads, int head_dim,
                int padded_dim, float* out);

}  // namespace iris::kernels
