#include "core/model_config.h"

#include <functional>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace iris::core {
namespace {

TEST(ModelConfig, ParsesTheTinyCheckpoint) {
  auto c = LoadModelConfig(testing::DataPath("tiny-qwen2.5-vl"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_text);
  EXPECT_EQ(c->vision.depth, 4);
  EXPECT_EQ(c->vision.head_dim(), 16);
  EXPECT_EQ(c->vision.fullatt_block_indexes, (std::vector<int>{1, 3}));
  EXPECT_EQ(c->text.num_key_value_heads, 2);
  EXPECT_EQ(c->text.mrope_section, (std::vector<int>{2, 3, 3}));
  EXPECT_TRUE(c->text.tie_word_embeddings);
  EXPECT_EQ(c->image_token_id, 151655);
  auto p = LoadPreprocessorConfig(testing::DataPath("tiny-qwen2.5-vl"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->max_pixels, 12845056);
  EXPECT_EQ(p->factor(), 28);
}

TEST(ModelConfig, ParsesABareVisionConfig) {
  auto j = ReadJsonFile(testing::DataPath("vision-3b/vision_config.json"));
  ASSERT_TRUE(j.ok());
  auto c = ParseModelConfig(*j, "vision_config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_text);
  EXPECT_EQ(c->vision.head_dim(), 80);
  EXPECT_EQ(c->vision.intermediate_size, 3420);
}

TEST(ModelConfig, NamesTheMissingOrInvalidField) {
  auto base = ReadJsonFile(testing::DataPath("tiny-qwen2.5-vl/config.json"));
  ASSERT_TRUE(base.ok());
  struct Case { std::function<void(nlohmann::json&)> edit; std::string field; };
  std::vector<Case> cases = {
      {[](auto& j) { j.erase("hidden_size"); }, "\"hidden_size\" is missing"},
      {[](auto& j) { j["vision_config"]["num_heads"] = 5; }, "vision_config.num_heads"},
      {[](auto& j) { j["vision_config"]["depth"] = "four"; }, "vision_config.depth\" must be an integer"},
      {[](auto& j) { j["rope_scaling"]["mrope_section"] = {1, 2, 3}; }, "mrope_section"},
      {[](auto& j) { j["num_key_value_heads"] = 3; }, "num_key_value_heads"},
      {[](auto& j) { j["vision_config"]["fullatt_block_indexes"] = {9}; }, "fullatt_block_indexes"},
      {[](auto& j) { j.erase("vision_config"); }, "vision_config"},
  };
  for (auto& c : cases) {
    nlohmann::json j = *base;
    c.edit(j);
    auto r = ParseModelConfig(j, "config.json");
    ASSERT_FALSE(r.ok()) << c.field;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << r.status();
  }
  auto p = ParsePreprocessorConfig(nlohmann::json{{"min_pixels", 100}, {"max_pixels", 50}}, "pp.json");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("min_pixels"), std::string::npos);
  auto q = ParsePreprocessorConfig(nlohmann::json{{"image_mean", {1, 2}}}, "pp.json");
  EXPECT_NE(q.status().message().find("image_mean"), std::string::npos);
}

}  // namespace
}  // namespace iris::core
