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
// Found with tests/fuzz/checkpoint_fuzzer's properties: numbers that parse as JSON but overflow
// what the model stores (a float of 1e300 is inf; patch_size * merge_size overflowed int; list
// entries above INT_MAX were truncated) were accepted.
TEST(ModelConfig, RefusesNumbersOutsideWhatTheModelStores) {
  auto pp = [](nlohmann::json j) { return ParsePreprocessorConfig(j, "pp.json"); };
  for (const char* key : {"image_mean", "image_std"}) {
    auto r = pp({{key, {1e300, 0.5, 0.5}}});
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_NE(r.status().message().find(key), std::string_view::npos) << r.status();
  }
  EXPECT_FALSE(pp({{"image_std", {1e-50, 0.5, 0.5}}}).ok());  // 0 as a float
  EXPECT_TRUE(pp({{"image_mean", {-0.5, 0, 1e-50}}}).ok());   // a mean may be 0 or negative
  auto huge = pp({{"patch_size", 1 << 30}, {"merge_size", 1 << 30}});
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("patch_size"), std::string_view::npos) << huge.status();
  EXPECT_FALSE(pp({{"merge_size", 17}}).ok());

  auto base = ReadJsonFile(testing::DataPath("tiny-qwen2.5-vl/config.json"));
  ASSERT_TRUE(base.ok());
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = *base;
    edit(j);
    return ParseModelConfig(j, "config.json");
  };
  EXPECT_FALSE(with([](auto& j) { j["rms_norm_eps"] = 1e300; }).ok());
  EXPECT_FALSE(with([](auto& j) { j["rms_norm_eps"] = 1e-50; }).ok());
  EXPECT_FALSE(with([](auto& j) { j["vision_config"]["spatial_merge_size"] = 1 << 30; }).ok());
  EXPECT_FALSE(with([](auto& j) { j["vision_config"]["patch_size"] = 1 << 20; }).ok());
  // 2^32 + 2 used to become 2 (truncated to int) and pass the sum check.
  EXPECT_FALSE(with([](auto& j) { j["rope_scaling"]["mrope_section"] = {int64_t{1} << 32 | 2, 3, 3}; }).ok());
  EXPECT_FALSE(with([](auto& j) { j["vision_config"]["fullatt_block_indexes"] = {int64_t{1} << 32 | 1}; }).ok());
  EXPECT_TRUE(with([](auto&) {}).ok());
}

}  // namespace iris::core
