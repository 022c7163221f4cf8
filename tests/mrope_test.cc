// M-RoPE positions against the full-model goldens (get_rope_index), decode positions, and the
// decoder's cos/sin table against a direct double-precision formula.
#include "llm/mrope.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/model_config.h"
#include "gtest/gtest.h"
#include "llm/chat_format.h"
#include "llm/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace iris::llm {
namespace {

using json = nlohmann::json;

const core::ModelConfig& Config() {
  static const core::ModelConfig* config = [] {
    auto c = core::LoadModelConfig(testing::DataPath("tiny-qwen2.5-vl"));
    EXPECT_TRUE(c.ok()) << c.status();
    return new core::ModelConfig(*c);
  }();
  return *config;
}

const json& Cases() {
  static const json cases = testing::LoadDataJson("model/manifest_tiny.json")["cases"];
  return cases;
}

struct Golden {
  std::vector<int32_t> ids;
  std::vector<std::array<int64_t, 3>> grids;
  std::vector<int64_t> position_ids;  // [3, 1, L]
  int64_t rope_delta = 0;
  std::vector<int64_t> decode_positions;  // [steps-1, 3]
  std::vector<int64_t> forced_positions;  // [3, 1, F]
};

Golden LoadCase(const json& c) {
  const std::string file = c["arrays"]["file"].get<std::string>();
  Golden g;
  for (int64_t id : testing::Int64Values(testing::LoadGolden(file, "input_ids"))) g.ids.push_back(static_cast<int32_t>(id));
  if (!c["images"].empty()) {
    std::vector<int64_t> v = testing::Int64Values(testing::LoadGolden(file, "image_grid_thw"));
    for (size_t i = 0; i + 2 < v.size(); i += 3) g.grids.push_back({v[i], v[i + 1], v[i + 2]});
  }
  g.position_ids = testing::Int64Values(testing::LoadGolden(file, "position_ids"));
  g.rope_delta = testing::Int64Values(testing::LoadGolden(file, "rope_deltas")).at(0);
  g.decode_positions = testing::Int64Values(testing::LoadGolden(file, "decode_position_ids"));
  g.forced_positions = testing::Int64Values(testing::LoadGolden(file, "forced_position_ids"));
  return g;
}

TEST(MropeTest, GoldenPositionsAndDeltas) {
  ASSERT_EQ(Cases().size(), 3u);
  for (const json& c : Cases()) {
    SCOPED_TRACE(c["case"].get<std::string>());
    const Golden g = LoadCase(c);
    const int64_t L = static_cast<int64_t>(g.ids.size());
    auto pos = ComputeMropePositions(g.ids, g.grids, Config());
    ASSERT_TRUE(pos.ok()) << pos.status();
    ASSERT_EQ(static_cast<int64_t>(g.position_ids.size()), 3 * L);
    for (int axis = 0; axis < 3; ++axis) {
      std::vector<int64_t> want(g.position_ids.begin() + axis * L, g.position_ids.begin() + (axis + 1) * L);
      EXPECT_EQ(pos->positions[axis], want) << "axis " << axis;
    }
    EXPECT_EQ(pos->rope_delta, g.rope_delta);
    if (g.grids.empty()) {
      EXPECT_EQ(pos->rope_delta, 0);
    } else {
      EXPECT_LT(pos->rope_delta, 0);
    }
    // Decode step k feeds the token at index L+k; the golden lists steps 1.. (the first generated
    // token is fed at step 1, index L).
    const int64_t steps = static_cast<int64_t>(g.decode_positions.size()) / 3;
    ASSERT_GT(steps, 0);
    for (int64_t s = 0; s < steps; ++s) {
      for (int axis = 0; axis < 3; ++axis) {
        EXPECT_EQ(DecodePosition(L, s, pos->rope_delta), g.decode_positions[s * 3 + axis]) << "step " << s;
      }
    }
    const int64_t forced = static_cast<int64_t>(g.forced_positions.size()) / 3;
    for (int axis = 0; axis < 3; ++axis) {
      for (int64_t j = 0; j < forced; ++j) {
        EXPECT_EQ(DecodePosition(L, j, pos->rope_delta), g.forced_positions[axis * forced + j]);
      }
    }
  }
}

TEST(MropeTest, OneImageLayout) {
  // README: <|vision_start|> at 14, the 7x11 image has t=15, h=15..21, w=15..25, <|vision_end|> 26.
  const Golden g = LoadCase(Cases()[1]);
  auto pos = ComputeMropePositions(g.ids, g.grids, Config());
  ASSERT_TRUE(pos.ok()) << pos.status();
  int64_t vs = -1;
  for (size_t i = 0; i < g.ids.size(); ++i) {
    if (g.ids[i] == Config().vision_start_token_id) vs = static_cast<int64_t>(i);
  }
  ASSERT_GE(vs, 0);
  EXPECT_EQ(pos->positions[0][vs], 14);
  const int64_t first = vs + 1, last = vs + 77;
  EXPECT_EQ(pos->positions[0][first], 15);
  EXPECT_EQ(pos->positions[1][last], 21);
  EXPECT_EQ(pos->positions[2][last], 25);
  EXPECT_EQ(pos->positions[0][last + 1], 26);
}

TEST(MropeTest, MismatchedGridsAreErrors) {
  const int32_t pad = static_cast<int32_t>(Config().image_token_id);
  std::vector<int32_t> ids = {1, 2, pad, pad, pad, pad, 3};
  std::vector<std::array<int64_t, 3>> grid = {{1, 4, 4}};
  EXPECT_TRUE(ComputeMropePositions(ids, grid, Config()).ok());
  std::vector<std::array<int64_t, 3>> too_big = {{1, 4, 6}};
  EXPECT_FALSE(ComputeMropePositions(ids, too_big, Config()).ok());
  EXPECT_FALSE(ComputeMropePositions(ids, {}, Config()).ok());
  std::vector<std::array<int64_t, 3>> two = {{1, 4, 4}, {1, 2, 2}};
  EXPECT_FALSE(ComputeMropePositions(ids, two, Config()).ok());
  auto pos = ComputeMropePositions(ids, grid, Config());
  // 2 text (0,1), image 2x2 at start 2 (max 3), text resumes at 4: delta = 5 - 7.
  EXPECT_EQ(pos->positions[0], (std::vector<int64_t>{0, 1, 2, 2, 2, 2, 4}));
  EXPECT_EQ(pos->positions[1], (std::vector<int64_t>{0, 1, 2, 2, 3, 3, 4}));
  EXPECT_EQ(pos->positions[2], (std::vector<int64_t>{0, 1, 2, 3, 2, 3, 4}));
  EXPECT_EQ(pos->rope_delta, -2);
}

// Direct formula in double: angle = pos[axis(i)] * theta^(-2i/d).
double Angle(int64_t p, int i, int d, double theta) { return static_cast<double>(p) * std::pow(theta, -2.0 * i / d); }

TEST(MropeTest, TableMatchesDoubleFormula) {
  const Golden g = LoadCase(Cases()[2]);  // two images
  auto pos = ComputeMropePositions(g.ids, g.grids, Config());
  ASSERT_TRUE(pos.ok());
  const core::TextConfig& text = Config().text;
  ASSERT_EQ(text.head_dim(), 16);
  ASSERT_EQ(text.mrope_section, (std::vector<int>{2, 3, 3}));
  auto table = BuildMropeTable(*pos, text);
  ASSERT_TRUE(table.ok()) << table.status();
  const int64_t L = static_cast<int64_t>(g.ids.size());
  ASSERT_EQ(table->rows, L);
  ASSERT_EQ(table->half, 8);
  const int axis_of[8] = {0, 0, 1, 1, 1, 2, 2, 2};
  for (int64_t r : {int64_t{0}, int64_t{14}, int64_t{15}, int64_t{20}, L / 2, L - 30, L - 1}) {
    for (int i = 0; i < 8; ++i) {
      const int64_t p = pos->positions[axis_of[i]][r];
      const double a = Angle(p, i, 16, text.rope_theta);
      // float32 angle: relative error ~1e-7 of the angle (positions here are < 500).
      const double tol = 1e-6 + 4e-7 * std::abs(a);
      EXPECT_NEAR(table->cos[r * 8 + i], std::cos(a), tol) << "row " << r << " col " << i;
      EXPECT_NEAR(table->sin[r * 8 + i], std::sin(a), tol) << "row " << r << " col " << i;
    }
  }
  // Rows of image tokens differ across axes: h and w columns use different positions.
  bool differs = false;
  for (int64_t r = 0; r < L; ++r) differs |= pos->positions[1][r] != pos->positions[2][r];
  EXPECT_TRUE(differs);
}

TEST(MropeTest, TextOnlyEqualsPlainRope) {
  const Golden g = LoadCase(Cases()[0]);
  auto pos = ComputeMropePositions(g.ids, g.grids, Config());
  ASSERT_TRUE(pos.ok());
  const core::TextConfig& text = Config().text;
  auto table = BuildMropeTable(*pos, text);
  ASSERT_TRUE(table.ok());
  const std::vector<float> inv = MropeInvFreq(text.head_dim(), text.rope_theta);
  const int half = text.head_dim() / 2;
  for (int64_t r = 0; r < table->rows; ++r) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(r) * inv[i];
      ASSERT_EQ(table->cos[r * half + i], std::cos(angle));
      ASSERT_EQ(table->sin[r * half + i], std::sin(angle));
    }
  }
  // And the 3B split (head_dim 128, [16, 24, 24]) with equal axes is plain RoPE too.
  std::vector<int64_t> flat;
  const int64_t rows = 300;
  for (int axis = 0; axis < 3; ++axis)
    for (int64_t r = 0; r < rows; ++r) flat.push_back(r + 7);
  auto big = BuildMropeTable(flat, rows, 128, std::vector<int>{16, 24, 24}, 1e6);
  ASSERT_TRUE(big.ok());
  const std::vector<float> inv128 = MropeInvFreq(128, 1e6);
  for (int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < 64; ++i) {
      ASSERT_EQ(big->cos[r * 64 + i], std::cos(static_cast<float>(r + 7) * inv128[i]));
    }
  }
}

TEST(MropeTest, BadTableArgumentsAreErrors) {
  std::vector<int64_t> flat(3 * 4, 0);
  EXPECT_FALSE(BuildMropeTable(flat, 4, 16, std::vector<int>{2, 3, 2}, 1e6).ok());
  EXPECT_FALSE(BuildMropeTable(flat, 4, 15, std::vector<int>{2, 3, 3}, 1e6).ok());
  EXPECT_FALSE(BuildMropeTable(flat, 5, 16, std::vector<int>{2, 3, 3}, 1e6).ok());
  EXPECT_TRUE(BuildMropeTable(flat, 4, 16, std::vector<int>{2, 3, 3}, 1e6).ok());
}

}  // namespace
}  // namespace iris::llm
