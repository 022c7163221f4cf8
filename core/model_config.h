// Qwen2.5-VL configuration: config.json (vision + text) and preprocessor_config.json.
// Parsing fails with a message naming the file and field when one is missing or invalid.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace iris::core {

struct VisionConfig {
  int depth = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_heads = 0;
  int in_channels = 3;
  int out_hidden_size = 0;
  int patch_size = 14;
  int spatial_merge_size = 2;
  int temporal_patch_size = 2;
  int window_size = 112;
  int tokens_per_second = 2;
  std::vector<int> fullatt_block_indexes;
  std::string hidden_act = "silu";
  float rms_norm_eps = 1e-6f;  // HF hard-codes 1e-6 for every vision RMSNorm

  int head_dim() const { return hidden_size / num_heads; }
  bool IsFullAttention(int block) const;
};

struct TextConfig {
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 1e6;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  std::vector<int> mrope_section;  // sums to head_dim / 2
  std::string hidden_act = "silu";

  int head_dim() const { return hidden_size / num_attention_heads; }
};

struct ModelConfig {
  std::string model_type;
  std::string torch_dtype;
  VisionConfig vision;
  TextConfig text;
  bool has_text = false;  // false for vision-only configs
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;
  int64_t bos_token_id = 151643;
  int64_t eos_token_id = 151645;
};

struct PreprocessorConfig {
  int64_t min_pixels = 3136;
  int64_t max_pixels = 12845056;
  int patch_size = 14;
  int temporal_patch_size = 2;
  int merge_size = 2;
  std::array<float, 3> image_mean = {0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> image_std = {0.26862954f, 0.26130258f, 0.27577711f};

  int factor() const { return patch_size * merge_size; }
};

// `source` names the file in error messages.
absl::StatusOr<VisionConfig> ParseVisionConfig(const nlohmann::json& j, const std::string& source);
absl::StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& j, const std::string& source);
absl::StatusOr<PreprocessorConfig> ParsePreprocessorConfig(const nlohmann::json& j,
                                                           const std::string& source);

// Reads `dir/config.json`. A file that is only a vision config (has "depth") is accepted too.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);
// Reads `dir/preprocessor_config.json`.
absl::StatusOr<PreprocessorConfig> LoadPreprocessorConfig(const std::string& dir);
// Parses a JSON file into `out`, with the path in any error.
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace iris::core
