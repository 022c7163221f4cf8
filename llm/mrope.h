// Qwen2.5-VL multimodal rotary positions (M-RoPE): the (t, h, w) position of every prompt token as
// HF's get_rope_index computes it, the position of decode steps, and the decoder's cos/sin tables.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model_config.h"

namespace iris::llm {

struct MropePositions {
  // positions[axis][i], axis 0 = t, 1 = h, 2 = w; i over the prompt's L tokens.
  std::array<std::vector<int64_t>, 3> positions;
  // max(position) + 1 - L (0 for text only, negative with images).
  int64_t rope_delta = 0;
};

// Text tokens: the same position on all three axes, counting up. An image (a run of t*h*w/merge^2
// image_token_id ids, matched in order with `image_grids`): t = start + frame * 0 (images carry no
// time step), h = start + row, w = start + col in the merged grid, start = one past the largest
// position before it. Fails when the image token runs and the grids disagree, or on video tokens.
absl::StatusOr<MropePositions> ComputeMropePositions(absl::Span<const int32_t> input_ids,
                                                     absl::Span<const std::array<int64_t, 3>> image_grids,
                                                     const core::ModelConfig& config);

// A text-only model's positions 0..length-1, the same on the three rows (1-D RoPE through the
// M-RoPE path: equal rows give every column the same angle as plain RoPE), rope_delta 0.
MropePositions TextPositions(int64_t length);

// The position (same on all three axes) of decode step k: the token at sequence index L + k.
inline int64_t DecodePosition(int64_t prompt_len, int64_t k, int64_t rope_delta) {
  return prompt_len + k + rope_delta;
}

// inv_freq[i] = 1 / theta^(2i / head_dim) for i < head_dim/2, in float32 as HF computes it.
std::vector<float> MropeInvFreq(int head_dim, double theta);

// cos/sin tables for kernels/rotary.h: row r, column i < head_dim/2 holds cos/sin of
// float32(pos[axis(i)][r] * inv_freq[i]), where axis(i) is t for the first mrope_section[0]
// columns, h for the next mrope_section[1], w for the rest (HF's [t,h,w,t,h,w] split of the full
// head_dim over cat(freqs, freqs)). `positions` holds `rows` entries per axis, axis-major:
// positions[axis * rows + r].
struct RotaryTable {
  int64_t rows = 0;
  int half = 0;            // head_dim / 2
  std::vector<float> cos;  // [rows, half]
  std::vector<float> sin;  // [rows, half]
};
absl::StatusOr<RotaryTable> BuildMropeTable(absl::Span<const int64_t> positions, int64_t rows, int head_dim,
                                            absl::Span<const int> mrope_section, double theta);

// Convenience: from ComputeMropePositions' result and the text config.
absl::StatusOr<RotaryTable> BuildMropeTable(const MropePositions& positions, const core::TextConfig& text);

}  // namespace iris::llm
