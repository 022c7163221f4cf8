#include "llm/mrope.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace iris::llm {

absl::StatusOr<MropePositions> ComputeMropePositions(absl::Span<const int32_t> input_ids,
                                                     absl::Span<const std::array<int64_t, 3>> image_grids,
                                                     const core::ModelConfig& config) {
  const int64_t L = static_cast<int64_t>(input_ids.size());
  const int64_t merge = config.vision.spatial_merge_size;
  if (merge <= 0) return absl::InvalidArgumentError("spatial merge size must be positive");
  const auto image_id = static_cast<int32_t>(config.image_token_id);
  const auto video_id = static_cast<int32_t>(config.video_token_id);

  MropePositions out;
  for (auto& axis : out.positions) axis.reserve(static_cast<size_t>(L));
  int64_t next = 0;  // one past the largest position so far
  size_t image = 0;
  int64_t i = 0;
  while (i < L) {
    const int32_t id = input_ids[i];
    if (id == video_id) return absl::UnimplementedError(absl::StrCat("input_ids[", i, "]: video tokens are not supported"));
    if (id != image_id) {
      for (auto& axis : out.positions) axis.push_back(next);
      ++next;
      ++i;
      continue;
    }
    if (image >= image_grids.size()) {
      return absl::InvalidArgumentError(absl::StrCat("input_ids[", i, "]: image token beyond the ",
                                                     image_grids.size(), " image grid(s) given"));
    }
    const auto& g = image_grids[image];
    if (g[0] <= 0 || g[1] <= 0 || g[2] <= 0 || g[1] % merge != 0 || g[2] % merge != 0) {
      return absl::InvalidArgumentError(absl::StrCat("image ", image, ": bad grid_thw (", g[0], ", ", g[1], ", ",
                                                     g[2], ")"));
    }
    const int64_t gt = g[0], gh = g[1] / merge, gw = g[2] / merge;
    const int64_t n = gt * gh * gw;
    if (i + n > L) {
      return absl::InvalidArgumentError(absl::StrCat("image ", image, ": needs ", n, " image tokens from index ", i,
                                                     " but the prompt has ", L));
    }
    for (int64_t j = 0; j < n; ++j) {
      if (input_ids[i + j] != image_id) {
        return absl::InvalidArgumentError(absl::StrCat("image ", image, ": expected ", n,
                                                       " consecutive image tokens from index ", i, ", found ", j));
      }
    }
    int64_t max_pos = next - 1;
    for (int64_t t = 0; t < gt; ++t) {
      for (int64_t r = 0; r < gh; ++r) {
        for (int64_t c = 0; c < gw; ++c) {
          // HF: t_index = (frame * second_per_grid_t(=0 for images) * tokens_per_second).long().
          out.positions[0].push_back(next);
          out.positions[1].push_back(next + r);
          out.positions[2].push_back(next + c);
          max_pos = std::max({max_pos, next + r, next + c});
        }
      }
    }
    next = max_pos + 1;
    i += n;
    ++image;
  }
  if (image != image_grids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(image_grids.size(), " image grid(s) given but the prompt has ",
                                                   image, " image(s)"));
  }
  out.rope_delta = next - L;  // next = max(position) + 1 (0 for an empty prompt)
  return out;
}

MropePositions TextPositions(int64_t length) {
  MropePositions out;
  for (auto& axis : out.positions) {
    axis.resize(static_cast<size_t>(length));
    for (int64_t i = 0; i < length; ++i) axis[static_cast<size_t>(i)] = i;
  }
  return out;
}

std::vector<float> MropeInvFreq(int head_dim, double theta) {
  const int half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all float32.
  const float base = static_cast<float>(theta);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(base, exponent);
  }
  return inv;
}

absl::StatusOr<RotaryTable> BuildMropeTable(absl::Span<const int64_t> positions, int64_t rows, int head_dim,
                                            absl::Span<const int> mrope_section, double theta) {
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", head_dim, " must be positive and even"));
  }
  const int half = head_dim / 2;
  if (mrope_section.size() != 3) return absl::InvalidArgumentError("mrope_section must have 3 entries");
  if (mrope_section[0] < 0 || mrope_section[1] < 0 || mrope_section[2] < 0 ||
      mrope_section[0] + mrope_section[1] + mrope_section[2] != half) {
    return absl::InvalidArgumentError(absl::StrCat("mrope_section [", mrope_section[0], ", ", mrope_section[1], ", ",
                                                   mrope_section[2], "] must sum to head_dim/2 = ", half));
  }
  if (rows < 0 || static_cast<int64_t>(positions.size()) != 3 * rows) {
    return absl::InvalidArgumentError(absl::StrCat("positions hold ", positions.size(), " values, expected 3 x ", rows));
  }
  const std::vector<float> inv = MropeInvFreq(head_dim, theta);
  std::vector<int> axis(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) axis[i] = i < mrope_section[0] ? 0 : (i < mrope_section[0] + mrope_section[1] ? 1 : 2);

  RotaryTable table;
  table.rows = rows;
  table.half = half;
  table.cos.resize(static_cast<size_t>(rows * half));
  table.sin.resize(static_cast<size_t>(rows * half));
  for (int64_t r = 0; r < rows; ++r) {
    float* c = table.cos.data() + r * half;
    float* s = table.sin.data() + r * half;
    for (int i = 0; i < half; ++i) {
      // float32 position times float32 inv_freq, as HF's float32 matmul of [half,1] x [1,L].
      const float pos = static_cast<float>(positions[static_cast<size_t>(axis[i] * rows + r)]);
      const float angle = pos * inv[static_cast<size_t>(i)];
      c[i] = std::cos(angle);
      s[i] = std::sin(angle);
    }
  }
  return table;
}

absl::StatusOr<RotaryTable> BuildMropeTable(const MropePositions& positions, const core::TextConfig& text) {
  const int64_t rows = static_cast<int64_t>(positions.positions[0].size());
  std::vector<int64_t> flat;
  flat.reserve(static_cast<size_t>(3 * rows));
  for (const auto& axis : positions.positions) flat.insert(flat.end(), axis.begin(), axis.end());
  return BuildMropeTable(flat, rows, text.head_dim(), text.mrope_section, text.rope_theta);
}

}  // namespace iris::llm
