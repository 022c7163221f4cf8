// Model configuration of the Qwen families iris serves: config.json (vision + text) and
// preprocessor_config.json. One ModelConfig describes every family; `family` says which one and
// the fields that differ between them (the vision block's norm and MLP kind, window attention,
// 1-D vs M-RoPE positions) are data here, read by the one encoder and the one decoder.
// Parsing fails with a message naming the file and field when one is missing or invalid.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace iris::core {

// Qwen2.5-VL: RMSNorm, gated SiLU MLP (gate/up/down), windowed blocks, RMSNorm ln_q.
// Qwen2-VL: LayerNorm (with bias), fc1 → QuickGELU → fc2, full attention everywhere, LayerNorm ln_q.
enum class VisionNorm { kRmsNorm, kLayerNorm };
enum class VisionMlp { kGatedSilu, kQuickGelu };

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
  float rms_norm_eps = 1e-6f;  // HF hard-codes 1e-6 for every vision RMSNorm (and LayerNorm)
  VisionNorm norm = VisionNorm::kRmsNorm;  // the blocks' norm1/norm2 and the merger's ln_q
  VisionMlp mlp = VisionMlp::kGatedSilu;
  // false (Qwen2-VL): no window order, every block attends to its whole image.
  bool windowed = true;

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
  // sums to head_dim / 2. 1-D RoPE (text-only Qwen2) is {head_dim/2, 0, 0} with the three
  // position rows equal: the same angles, so one rotary path serves both.
  std::vector<int> mrope_section;
  bool mrope = true;                 // false: plain 1-D positions (no rope_scaling.mrope_section)
  int64_t sliding_window = 0;        // recorded; use_sliding_window true is refused at parse time
  std::string hidden_act = "silu";

  int head_dim() const { return hidden_size / num_attention_heads; }
};

enum class ModelFamily {
  kQwen2_5_VL,  // Qwen2_5_VLForConditionalGeneration, model_type qwen2_5_vl
  kQwen2_VL,    // Qwen2VLForConditionalGeneration, model_type qwen2_vl
  kQwen2Text,   // Qwen2ForCausalLM, model_type qwen2 (Qwen2/Qwen2.5 text and their distills)
};
// "qwen2_5_vl", "qwen2_vl", "qwen2": the model_type the family is read from.
const char* FamilyModelType(ModelFamily family);
// "Qwen2_5_VLForConditionalGeneration", "Qwen2VLForConditionalGeneration", "Qwen2ForCausalLM".
const char* FamilyArchitecture(ModelFamily family);

struct ModelConfig {
  std::string model_type;
  ModelFamily family = ModelFamily::kQwen2_5_VL;
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

  bool has_vision() const { return family != ModelFamily::kQwen2Text; }
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
// The family comes from model_type (or, without it, architectures); a config without vision_config
// is a text-only Qwen2 model only when it says so.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);
// Reads `dir/preprocessor_config.json`.
absl::StatusOr<PreprocessorConfig> LoadPreprocessorConfig(const std::string& dir);
// Parses a JSON file into `out`, with the path in any error.
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace iris::core
