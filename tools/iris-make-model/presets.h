// The synthetic model presets of iris-make-model (tiny, small, 3b): their shapes, seeds, the
// Hugging Face JSON files they ship with, and their tensor lists in the public naming.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
  std::vector<int> mrope_section;

  int head_dim() const { return hidden_size / num_attention_heads; }
};

enum class GenerationDefaults {
  kGreedy,         // the golden fixture's: do_sample false
  kQwenInstruct,   // Qwen2.5-VL-*-Instruct: top_k 1, top_p 0.001, temperature 0.1, rep. 1.05
};

struct Preset {
  std::string name;
  std::string description;  // one line for --help
  uint64_t seed = 0;
  VisionShape vision;
  TextShape text;
  std::string transformers_version;
  GenerationDefaults generation = GenerationDefaults::kQwenInstruct;
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
// lm_head.weight only when embeddings are not tied). `vision_only` keeps only visual.*.
std::vector<TensorSpec> PresetTensors(const Preset& preset, bool vision_only);
int64_t ParameterCount(const std::vector<TensorSpec>& tensors);

// The files' exact text (2-space indented JSON with a final newline, as transformers writes).
std::string ConfigJson(const Preset& preset);
std::string GenerationConfigJson(const Preset& preset);
std::string PreprocessorConfigJson(const Preset& preset);

}  // namespace iris::tools
