// The synthetic model presets of iris-make-model: their family (Qwen2.5-VL, Qwen2-VL, text-only
// Qwen2), shapes, seeds, the Hugging Face JSON files they ship with, and their tensor lists in the
// public naming. The tiny ones equal the golden fixtures; the real-shape ones (7b, 32b, 72b, ...)
// follow the published config.json files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/model_config.h"

namespace iris::tools {

struct VisionShape {
  int depth = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_heads = 0;
  int out_hidden_size = 0;
  std::vector<int> fullatt_block_indexes;
};

struct TextShape {
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int64_t vocab_size = 151936;
  int64_t max_position_embeddings = 0;
  int max_window_layers = 0;
  int sliding_window = 0;
  bool tie_word_embeddings = true;
  std::vector<int> mrope_section;  // empty for text-only presets (1-D RoPE)
  double rope_theta = 1e6;
  double rms_norm_eps = 1e-6;
  int64_t bos_token_id = 151643;
  int64_t eos_token_id = 151645;

  int head_dim() const { return hidden_size / num_attention_heads; }
};

enum class GenerationDefaults {
  kGreedy,         // the golden fixture's: do_sample false
  kQwenInstruct,   // Qwen2.5-VL-*-Instruct: top_k 1, top_p 0.001, temperature 0.1, rep. 1.05
  kQwenTextInstruct,  // Qwen2.5-*-Instruct (text): top_k 20, top_p 0.8, temperature 0.7, rep. 1.05
};

struct Preset {
  std::string name;
  core::ModelFamily family = core::ModelFamily::kQwen2_5_VL;
  std::string description;  // one line for --help
  uint64_t seed = 0;
  VisionShape vision;
  TextShape text;
  std::string transformers_version;
  GenerationDefaults generation = GenerationDefaults::kQwenInstruct;
  // Too large to write here (32B/72B): iris-make-model refuses to write weights and the tests
  // check only its config and tensor list (--config-only still writes the JSON files).
  bool config_only = false;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

const std::vector<Preset>& AllPresets();
// nullptr when there is no preset of that name.
const Preset* FindPreset(std::string_view name);
// "tiny, small, 3b"
std::string PresetNames();
// One block per preset (name, seed, shapes, parameter count) for --help.
std::string PresetsHelp();

// Every tensor of the checkpoint in model order (visual.* first, then the decoder;
// lm_head.weight only when embeddings are not tied). `vision_only` keeps only visual.*; a
// text-only preset has no visual.*.
std::vector<TensorSpec> PresetTensors(const Preset& preset, bool vision_only);
int64_t ParameterCount(const std::vector<TensorSpec>& tensors);

// The files' exact text (2-space indented JSON with a final newline, as transformers writes).
std::string ConfigJson(const Preset& preset);
std::string GenerationConfigJson(const Preset& preset);
std::string PreprocessorConfigJson(const Preset& preset);
// tokenizer_config.json for the preset from a source folder's: text-only presets replace its
// chat_template with Qwen2.5-Instruct's text template (the VL ones keep the file as it is).
std::string TokenizerConfigJson(const Preset& preset, const std::string& source_text);

}  // namespace iris::tools
