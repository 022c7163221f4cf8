// engine::LoadGenerationConfig: generation_config.json read as transformers' GenerationConfig
// reads it (do_sample's two cases and its defaults), the published Qwen files, and field-named
// errors.
#include "engine/generation_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace iris::engine {
namespace {

namespace fs = std::filesystem;

class GenerationConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("iris_genconf_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    config_.text.vocab_size = 1000;
    config_.eos_token_id = 42;
  }
  void TearDown() override { fs::remove_all(dir_); }
  absl::StatusOr<GenerationConfig> Load(const std::string& json) {
    std::ofstream(dir_ / "generation_config.json") << json;
    return LoadGenerationConfig(dir_.string(), config_);
  }
  fs::path dir_;
  core::ModelConfig config_;
};

TEST_F(GenerationConfigTest, WithoutTheFileGreedyAndTheConfigsEndId) {
  absl::StatusOr<GenerationConfig> g = LoadGenerationConfig(dir_.string(), config_);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->eos_token_ids, std::vector<int32_t>{42});
  EXPECT_EQ(g->sampling.temperature, 0.f);
  EXPECT_EQ(g->sampling.top_k, 0);
  EXPECT_EQ(g->sampling.top_p, 1.f);
  EXPECT_EQ(g->sampling.repetition_penalty, 1.f);
  EXPECT_EQ(g->sampling.source, "");
  EXPECT_EQ(g->sampling.Describe(), "greedy, repetition_penalty 1");
}

// The published Qwen2.5-VL-3B/7B-Instruct file: sampled, but top_k 1 keeps one token.
TEST_F(GenerationConfigTest, QwenVlInstructsPublishedFile) {
  absl::StatusOr<GenerationConfig> g = Load(R"({"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
      "eos_token_id": [151645, 151643], "repetition_penalty": 1.05, "temperature": 0.1, "top_p": 0.001, "top_k": 1,
      "transformers_version": "4.37.0"})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->eos_token_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_FLOAT_EQ(g->sampling.temperature, 0.1f);
  EXPECT_FLOAT_EQ(g->sampling.top_p, 0.001f);
  EXPECT_EQ(g->sampling.top_k, 1);
  EXPECT_FLOAT_EQ(g->sampling.repetition_penalty, 1.05f);
  EXPECT_EQ(g->sampling.source, (dir_ / "generation_config.json").string());
  EXPECT_EQ(g->sampling.Describe(), "temperature 0.1, top_p 0.001, top_k 1, repetition_penalty 1.05");
}

// do_sample false (or absent, transformers' default): greedy whatever the sampling fields say;
// the penalty applies either way.
TEST_F(GenerationConfigTest, WithoutDoSampleTheSamplingFieldsAreIgnored) {
  for (const char* json : {R"({"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.1})",
                           R"({"do_sample": false, "temperature": 0.7, "top_k": 20, "top_p": 0.8,
                               "repetition_penalty": 1.1, "eos_token_id": 7})"}) {
    absl::StatusOr<GenerationConfig> g = Load(json);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->sampling.temperature, 0.f) << json;
    EXPECT_EQ(g->sampling.top_k, 0) << json;
    EXPECT_EQ(g->sampling.top_p, 1.f) << json;
    EXPECT_FLOAT_EQ(g->sampling.repetition_penalty, 1.1f) << json;
  }
  EXPECT_EQ(Load(R"({"do_sample": false, "eos_token_id": 7})")->eos_token_ids, std::vector<int32_t>{7});
}

// do_sample true with fields left out: transformers' defaults, temperature 1, top_k 50, top_p 1;
// a top_k the vocabulary cannot exceed is no top-k.
TEST_F(GenerationConfigTest, SampledFieldsLeftOutTakeTransformersDefaults) {
  absl::StatusOr<GenerationConfig> g = Load(R"({"do_sample": true})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->sampling.temperature, 1.f);
  EXPECT_EQ(g->sampling.top_k, 50);
  EXPECT_EQ(g->sampling.top_p, 1.f);
  EXPECT_EQ(g->sampling.repetition_penalty, 1.f);
  EXPECT_EQ(g->eos_token_ids, std::vector<int32_t>{42});  // none in the file: the config's
  g = Load(R"({"do_sample": true, "top_k": 1000, "top_p": null, "temperature": 0.6})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->sampling.top_k, 0);
  EXPECT_EQ(g->sampling.top_p, 1.f);
  EXPECT_FLOAT_EQ(g->sampling.temperature, 0.6f);
  g = Load(R"({"do_sample": true, "top_k": 0, "temperature": 0})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->sampling.top_k, 0);
  EXPECT_EQ(g->sampling.Describe(), "greedy, repetition_penalty 1");
}

// max_new_tokens (vLLM's reading: the tokens a request that sets none gets) applies greedy or
// sampled; absent or null leaves the server's own default (0); max_length (a total) is not read.
TEST_F(GenerationConfigTest, MaxNewTokensIsTheDefaultLengthEitherWay) {
  for (const char* json : {R"({"max_new_tokens": 512, "max_length": 20})",
                           R"({"do_sample": true, "top_k": 5, "max_new_tokens": 512})"}) {
    absl::StatusOr<GenerationConfig> g = Load(json);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->sampling.max_tokens, 512) << json;
    EXPECT_NE(g->sampling.Describe().find(", max_new_tokens 512"), std::string::npos) << g->sampling.Describe();
  }
  for (const char* json : {R"({"max_length": 20})", R"({"max_new_tokens": null})", R"({"max_new_tokens": 2147483647})"}) {
    absl::StatusOr<GenerationConfig> g = Load(json);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->sampling.max_tokens, std::string(json).find("2147483647") != std::string::npos ? 2147483647 : 0)
        << json;
  }
  EXPECT_EQ(Load("{}")->sampling.Describe(), "greedy, repetition_penalty 1");
}

TEST_F(GenerationConfigTest, BadValuesAreRefusedNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"do_sample": true, "temperature": -0.5})", "temperature must be in [0, 100], got -0.5"},
      {R"({"do_sample": true, "temperature": "hot"})", "temperature must be a number"},
      {R"({"do_sample": true, "top_p": 0})", "top_p must be in (0, 1], got 0"},
      {R"({"do_sample": true, "top_p": 1.5})", "top_p must be in (0, 1], got 1.5"},
      {R"({"do_sample": true, "top_k": -1})", "top_k must be an integer >= 0"},
      {R"({"do_sample": true, "top_k": 2.5})", "top_k must be an integer >= 0"},
      {R"({"repetition_penalty": 0})", "repetition_penalty must be in (0, 10], got 0"},
      {R"({"repetition_penalty": 11})", "repetition_penalty must be in (0, 10], got 11"},
      {R"({"do_sample": "yes"})", "do_sample must be true or false"},
      {R"({"eos_token_id": "x"})", "eos_token_id must be a token id or a list of them"},
      {R"({"eos_token_id": -3})", "eos_token_id must be a token id or a list of them"},
      {R"({"eos_token_id": [1, "x"]})", "eos_token_id must hold token ids"},
      {R"({"eos_token_id": [1, 4294967296]})", "eos_token_id must hold token ids"},
      {R"({"max_new_tokens": 0})", "max_new_tokens must be an integer in [1, 2147483647]"},
      {R"({"max_new_tokens": -5})", "max_new_tokens must be an integer in [1, 2147483647]"},
      {R"({"max_new_tokens": 2147483648})", "max_new_tokens must be an integer in [1, 2147483647]"},
      {R"({"max_new_tokens": 18446744073709551615})", "max_new_tokens must be an integer in [1, 2147483647]"},
      {R"({"max_new_tokens": 12.5})", "max_new_tokens must be an integer in [1, 2147483647]"},
      {R"({"max_new_tokens": "512"})", "max_new_tokens must be an integer in [1, 2147483647]"},
      {R"([1, 2])", "not a JSON object"},
  };
  for (const auto& [json, want] : cases) {
    absl::StatusOr<GenerationConfig> g = Load(json);
    ASSERT_FALSE(g.ok()) << json;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_NE(g.status().message().find("generation_config.json: "), std::string::npos) << g.status();
    EXPECT_NE(g.status().message().find(want), std::string::npos) << json << " -> " << g.status();
  }
}

TEST(GenerationConfigFlagTest, AutoUsesTheModelsNoneIrisOwnAnythingElseIsRefused) {
  EXPECT_EQ(UsesModelSamplingDefaults("auto").value(), true);
  EXPECT_EQ(UsesModelSamplingDefaults("none").value(), false);
  const absl::StatusOr<bool> bad = UsesModelSamplingDefaults("vllm");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "--generation-config must be auto or none, got \"vllm\"");
}

}  // namespace
}  // namespace iris::engine
