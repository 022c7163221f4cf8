#include "tools/iris-make-model/presets.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "tools/iris-make-model/chat_templates.h"

namespace iris::tools {
namespace {

using ojson = nlohmann::ordered_json;

std::vector<Preset> MakePresets() {
  std::vector<Preset> p;
  {
    Preset t;
    t.name = "tiny";
    t.description = "the golden tiny model of tests/data (bit-exact with its model.safetensors)";
    t.seed = 0x5EED000000000001ull;
    t.vision = {.depth = 4, .hidden_size = 64, .intermediate_size = 128, .num_heads = 4,
                .out_hidden_size = 64, .fullatt_block_indexes = {1, 3}};
    t.text = {.hidden_size = 64, .intermediate_size = 128, .num_hidden_layers = 2,
              .num_attention_heads = 4, .num_key_value_heads = 2, .vocab_size = 151936,
              .max_position_embeddings = 4096, .max_window_layers = 2, .sliding_window = 4096,
              .tie_word_embeddings = true, .mrope_section = {2, 3, 3}};
    t.transformers_version = "4.50.0";
    t.generation = GenerationDefaults::kGreedy;
    p.push_back(t);
  }
  {
    Preset s;
    s.name = "small";
    s.description = "shaped like 3b at a fraction of the cost (vision head_dim 80, text head_dim 128)";
    s.seed = 0x5EED000000000002ull;
    s.vision = {.depth = 8, .hidden_size = 640, .intermediate_size = 1710, .num_heads = 8,
                .out_hidden_size = 1024, .fullatt_block_indexes = {3, 7}};
    s.text = {.hidden_size = 1024, .intermediate_size = 2816, .num_hidden_layers = 8,
              .num_attention_heads = 8, .num_key_value_heads = 2, .vocab_size = 151936,
              .max_position_embeddings = 128000, .max_window_layers = 8, .sliding_window = 32768,
              .tie_word_embeddings = true, .mrope_section = {16, 24, 24}};
    s.transformers_version = "4.50.0";
    s.generation = GenerationDefaults::kQwenInstruct;
    p.push_back(s);
  }
  {
    Preset b;
    b.name = "3b";
    b.description = "the shapes of Qwen2.5-VL-3B-Instruct (visual.* equal tests/data vision-3b)";
    b.seed = 0x5EED000000000003ull;
    b.vision = {.depth = 32, .hidden_size = 1280, .intermediate_size = 3420, .num_heads = 16,
                .out_hidden_size = 2048, .fullatt_block_indexes = {7, 15, 23, 31}};
    b.text = {.hidden_size = 2048, .intermediate_size = 11008, .num_hidden_layers = 36,
              .num_attention_heads = 16, .num_key_value_heads = 2, .vocab_size = 151936,
              .max_position_embeddings = 128000, .max_window_layers = 70, .sliding_window = 32768,
              .tie_word_embeddings = true, .mrope_section = {16, 24, 24}};
    b.transformers_version = "4.41.2";  // as in the published config.json
    b.generation = GenerationDefaults::kQwenInstruct;
    p.push_back(b);
  }
  using core::ModelFamily;
  // The tiny decoder of the goldens (tests/data WEIGHTS.md), for the other tiny families.
  const TextShape tiny_text = p[0].text;
  for (const bool tied : {true, false}) {
    Preset t;
    t.name = tied ? "tiny-qwen2-text" : "tiny-qwen2-text-untied";
    t.family = ModelFamily::kQwen2Text;
    t.description = tied ? "the golden text-only Qwen2ForCausalLM (tied LM head), tests/data/tiny-qwen2-text"
                         : "the golden text-only Qwen2ForCausalLM with its own lm_head.weight";
    t.seed = 0x5EED000000000004ull;  // one seed for both: the untied one adds lm_head.weight
    t.text = tiny_text;
    t.text.max_position_embeddings = 32768;
    t.text.sliding_window = 32768;
    t.text.tie_word_embeddings = tied;
    t.text.mrope_section.clear();
    t.transformers_version = "4.50.0";
    t.generation = GenerationDefaults::kGreedy;
    p.push_back(t);
  }
  {
    Preset t;
    t.name = "tiny-qwen2-vl";
    t.family = ModelFamily::kQwen2_VL;
    t.description = "the golden Qwen2VLForConditionalGeneration (LayerNorm/QuickGELU tower), tests/data/tiny-qwen2-vl";
    t.seed = 0x5EED000000000005ull;
    t.vision = {.depth = 4, .hidden_size = 64, .intermediate_size = 128, .num_heads = 4, .out_hidden_size = 64,
                .fullatt_block_indexes = {}};  // Qwen2-VL: every block attends fully
    t.text = tiny_text;
    t.transformers_version = "4.50.0";
    t.generation = GenerationDefaults::kGreedy;
    p.push_back(t);
  }
  {
    Preset b;
    b.name = "7b";
    b.description = "the shapes of Qwen2.5-VL-7B-Instruct (separate lm_head)";
    b.seed = 0x5EED000000000007ull;
    b.vision = {.depth = 32, .hidden_size = 1280, .intermediate_size = 3420, .num_heads = 16,
                .out_hidden_size = 3584, .fullatt_block_indexes = {7, 15, 23, 31}};
    b.text = {.hidden_size = 3584, .intermediate_size = 18944, .num_hidden_layers = 28,
              .num_attention_heads = 28, .num_key_value_heads = 4, .vocab_size = 152064,
              .max_position_embeddings = 128000, .max_window_layers = 28, .sliding_window = 32768,
              .tie_word_embeddings = false, .mrope_section = {16, 24, 24}};
    b.transformers_version = "4.41.2";
    p.push_back(b);
  }
  // Qwen2.5-*-Instruct text checkpoints (and distills of the same shapes).
  struct TextSize {
    const char* name;
    int hidden, inter, layers, heads, kv;
    bool config_only;
  };
  for (const TextSize& z : {TextSize{"qwen2.5-7b", 3584, 18944, 28, 28, 4, false},
                            TextSize{"qwen2.5-32b", 5120, 27648, 64, 40, 8, true},
                            TextSize{"qwen2.5-72b", 8192, 29568, 80, 64, 8, true}}) {
    Preset t;
    t.name = z.name;
    t.family = ModelFamily::kQwen2Text;
    t.description = absl::StrCat("the shapes of Qwen2.5-", std::string(z.name).substr(7), "-Instruct (text only)",
                                 z.config_only ? "; config only, too large to write here" : "");
    t.seed = 0x5EED000000000008ull;
    t.text = {.hidden_size = z.hidden, .intermediate_size = z.inter, .num_hidden_layers = z.layers,
              .num_attention_heads = z.heads, .num_key_value_heads = z.kv, .vocab_size = 152064,
              .max_position_embeddings = 32768, .max_window_layers = z.layers, .sliding_window = 131072,
              .tie_word_embeddings = false, .mrope_section = {}};
    t.transformers_version = "4.43.1";
    t.generation = GenerationDefaults::kQwenTextInstruct;
    t.config_only = z.config_only;
    p.push_back(t);
  }
  return p;
}

std::string Dump(const ojson& j) { return j.dump(2) + "\n"; }

// "10.1 M" / "3.75 B" for parameters, "20.2 MB" / "7.51 GB" for bytes.
std::string FormatCount(int64_t n, bool bytes = false) {
  char buf[32];
  if (n >= 1000000000) {
    std::snprintf(buf, sizeof buf, "%.2f %s", n / 1e9, bytes ? "GB" : "B");
  } else {
    std::snprintf(buf, sizeof buf, "%.1f M%s", n / 1e6, bytes ? "B" : "");
  }
  return buf;
}

}  // namespace

const std::vector<Preset>& AllPresets() {
  static const std::vector<Preset>* presets = new std::vector<Preset>(MakePresets());
  return *presets;
}

const Preset* FindPreset(std::string_view name) {
  for (const Preset& p : AllPresets()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string PresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : AllPresets()) names.push_back(p.name);
  return absl::StrJoin(names, ", ");
}

std::string PresetsHelp() {
  std::string out;
  for (const Preset& p : AllPresets()) {
    const VisionShape& v = p.vision;
    const TextShape& t = p.text;
    char seed[32];
    std::snprintf(seed, sizeof seed, "0x%016llX", static_cast<unsigned long long>(p.seed));
    const int64_t all = ParameterCount(PresetTensors(p, false));
    const int64_t vis = ParameterCount(PresetTensors(p, true));
    absl::StrAppend(&out, "  ", p.name, ": ", p.description, "\n",
                    "      ", core::FamilyArchitecture(p.family), ", seed ", seed, "; ", FormatCount(all),
                    " parameters (vision ", FormatCount(vis), "), ", FormatCount(all * 2, true), " in bf16\n");
    if (p.family == core::ModelFamily::kQwen2_VL) {
      absl::StrAppend(&out, "      vision: depth ", v.depth, ", embed_dim ", v.hidden_size, ", ", v.num_heads,
                      " heads, mlp ", v.intermediate_size, " (LayerNorm, QuickGELU, full attention), hidden ",
                      v.out_hidden_size, "\n");
    } else if (p.family == core::ModelFamily::kQwen2_5_VL) {
      absl::StrAppend(&out, "      vision: depth ", v.depth, ", hidden ", v.hidden_size, ", ", v.num_heads,
                      " heads (head_dim ", v.hidden_size / v.num_heads, "), intermediate ",
                      v.intermediate_size, ", full-attention blocks [",
                      absl::StrJoin(v.fullatt_block_indexes, ","), "], out_hidden ",
                      v.out_hidden_size, "\n");
    }
    absl::StrAppend(&out, "      text: hidden ", t.hidden_size, ", ", t.num_hidden_layers, " layers, ",
                    t.num_attention_heads, " heads / ", t.num_key_value_heads,
                    " KV heads (head_dim ", t.head_dim(), "), intermediate ", t.intermediate_size,
                    ", vocab ", t.vocab_size, ", ",
                    t.mrope_section.empty() ? std::string("1-D RoPE")
                                            : absl::StrCat("mrope_section [", absl::StrJoin(t.mrope_section, ","), "]"),
                    ", ", t.tie_word_embeddings ? "tied embeddings" : "separate lm_head", "\n");
  }
  return out;
}

std::vector<TensorSpec> PresetTensors(const Preset& preset, bool vision_only) {
  std::vector<TensorSpec> out;
  auto add = [&out](std::string name, std::vector<int64_t> shape) {
    out.push_back({std::move(name), std::move(shape)});
  };
  const VisionShape& v = preset.vision;
  const int64_t hv = v.hidden_size, iv = v.intermediate_size;
  // Qwen2-VL: LayerNorms with biases and an fc1/fc2 MLP; Qwen2.5-VL: RMSNorms and gate/up/down.
  const bool layer_norm = preset.family == core::ModelFamily::kQwen2_VL;
  if (preset.family != core::ModelFamily::kQwen2Text) {
    add("visual.patch_embed.proj.weight", {hv, 3, 2, 14, 14});
    for (int i = 0; i < v.depth; ++i) {
      const std::string b = absl::StrCat("visual.blocks.", i, ".");
      add(b + "norm1.weight", {hv});
      if (layer_norm) add(b + "norm1.bias", {hv});
      add(b + "norm2.weight", {hv});
      if (layer_norm) add(b + "norm2.bias", {hv});
      add(b + "attn.qkv.weight", {3 * hv, hv});
      add(b + "attn.qkv.bias", {3 * hv});
      add(b + "attn.proj.weight", {hv, hv});
      add(b + "attn.proj.bias", {hv});
      if (layer_norm) {
        add(b + "mlp.fc1.weight", {iv, hv});
        add(b + "mlp.fc1.bias", {iv});
        add(b + "mlp.fc2.weight", {hv, iv});
        add(b + "mlp.fc2.bias", {hv});
      } else {
        add(b + "mlp.gate_proj.weight", {iv, hv});
        add(b + "mlp.gate_proj.bias", {iv});
        add(b + "mlp.up_proj.weight", {iv, hv});
        add(b + "mlp.up_proj.bias", {iv});
        add(b + "mlp.down_proj.weight", {hv, iv});
        add(b + "mlp.down_proj.bias", {hv});
      }
    }
    add("visual.merger.ln_q.weight", {hv});
    if (layer_norm) add("visual.merger.ln_q.bias", {hv});
    add("visual.merger.mlp.0.weight", {4 * hv, 4 * hv});
    add("visual.merger.mlp.0.bias", {4 * hv});
    add("visual.merger.mlp.2.weight", {v.out_hidden_size, 4 * hv});
    add("visual.merger.mlp.2.bias", {v.out_hidden_size});
  }
  if (vision_only) return out;

  const TextShape& t = preset.text;
  const int64_t h = t.hidden_size, inter = t.intermediate_size, d = t.head_dim();
  const int64_t q = t.num_attention_heads * d, kv = t.num_key_value_heads * d;
  add("model.embed_tokens.weight", {t.vocab_size, h});
  for (int j = 0; j < t.num_hidden_layers; ++j) {
    const std::string l = absl::StrCat("model.layers.", j, ".");
    add(l + "self_attn.q_proj.weight", {q, h});
    add(l + "self_attn.q_proj.bias", {q});
    add(l + "self_attn.k_proj.weight", {kv, h});
    add(l + "self_attn.k_proj.bias", {kv});
    add(l + "self_attn.v_proj.weight", {kv, h});
    add(l + "self_attn.v_proj.bias", {kv});
    add(l + "self_attn.o_proj.weight", {h, q});
    add(l + "mlp.gate_proj.weight", {inter, h});
    add(l + "mlp.up_proj.weight", {inter, h});
    add(l + "mlp.down_proj.weight", {h, inter});
    add(l + "input_layernorm.weight", {h});
    add(l + "post_attention_layernorm.weight", {h});
  }
  add("model.norm.weight", {h});
  if (!t.tie_word_embeddings) add("lm_head.weight", {t.vocab_size, h});
  return out;
}

int64_t ParameterCount(const std::vector<TensorSpec>& tensors) {
  int64_t n = 0;
  for (const TensorSpec& s : tensors) {
    int64_t e = 1;
    for (int64_t d : s.shape) e *= d;
    n += e;
  }
  return n;
}

// Field order and spelling follow the published config.json files of each family.
std::string ConfigJson(const Preset& preset) {
  using core::ModelFamily;
  const VisionShape& v = preset.vision;
  const TextShape& t = preset.text;
  const bool vl = preset.family != ModelFamily::kQwen2Text;
  ojson j;
  j["architectures"] = {core::FamilyArchitecture(preset.family)};
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = t.bos_token_id;
  j["eos_token_id"] = t.eos_token_id;
  if (vl) {
    j["vision_start_token_id"] = 151652;
    j["vision_end_token_id"] = 151653;
    j["vision_token_id"] = 151654;
    j["image_token_id"] = 151655;
    j["video_token_id"] = 151656;
  }
  j["hidden_act"] = "silu";
  j["hidden_size"] = t.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = t.intermediate_size;
  j["max_position_embeddings"] = t.max_position_embeddings;
  j["max_window_layers"] = t.max_window_layers;
  j["model_type"] = core::FamilyModelType(preset.family);
  j["num_attention_heads"] = t.num_attention_heads;
  j["num_hidden_layers"] = t.num_hidden_layers;
  j["num_key_value_heads"] = t.num_key_value_heads;
  j["rms_norm_eps"] = t.rms_norm_eps;
  j["rope_theta"] = t.rope_theta;
  j["sliding_window"] = t.sliding_window;
  j["tie_word_embeddings"] = t.tie_word_embeddings;
  j["torch_dtype"] = "bfloat16";
  j["transformers_version"] = preset.transformers_version;
  j["use_cache"] = true;
  j["use_sliding_window"] = false;
  if (preset.family == ModelFamily::kQwen2_VL) {
    ojson vc;
    vc["depth"] = v.depth;
    vc["embed_dim"] = v.hidden_size;
    vc["mlp_ratio"] = v.intermediate_size / v.hidden_size;
    vc["num_heads"] = v.num_heads;
    vc["in_chans"] = 3;
    vc["hidden_size"] = v.out_hidden_size;
    vc["patch_size"] = 14;
    vc["spatial_merge_size"] = 2;
    vc["spatial_patch_size"] = 14;
    vc["temporal_patch_size"] = 2;
    j["vision_config"] = vc;
  } else if (preset.family == ModelFamily::kQwen2_5_VL) {
    ojson vc;
    vc["depth"] = v.depth;
    vc["hidden_act"] = "silu";
    vc["hidden_size"] = v.hidden_size;
    vc["intermediate_size"] = v.intermediate_size;
    vc["num_heads"] = v.num_heads;
    vc["in_chans"] = 3;
    vc["out_hidden_size"] = v.out_hidden_size;
    vc["patch_size"] = 14;
    vc["spatial_merge_size"] = 2;
    vc["spatial_patch_size"] = 14;
    vc["window_size"] = 112;
    vc["fullatt_block_indexes"] = v.fullatt_block_indexes;
    vc["tokens_per_second"] = 2;
    vc["temporal_patch_size"] = 2;
    j["vision_config"] = vc;
  }
  if (vl) j["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", t.mrope_section}};
  j["vocab_size"] = t.vocab_size;
  return Dump(j);
}

std::string GenerationConfigJson(const Preset& preset) {
  ojson j;
  j["bos_token_id"] = 151643;
  j["pad_token_id"] = 151643;
  if (preset.generation == GenerationDefaults::kGreedy) {
    j["eos_token_id"] = {151645, 151643};
    j["do_sample"] = false;
    j["transformers_version"] = preset.transformers_version;
  } else if (preset.generation == GenerationDefaults::kQwenTextInstruct) {
    // The published Qwen2.5-7B/32B/72B-Instruct generation_config.json.
    j["do_sample"] = true;
    j["eos_token_id"] = {151645, 151643};
    j["repetition_penalty"] = 1.05;
    j["temperature"] = 0.7;
    j["top_p"] = 0.8;
    j["top_k"] = 20;
    j["transformers_version"] = "4.37.0";
  } else {
    // The published Qwen2.5-VL-3B/7B-Instruct generation_config.json.
    j["do_sample"] = true;
    j["eos_token_id"] = {151645, 151643};
    j["repetition_penalty"] = 1.05;
    j["temperature"] = 0.1;
    j["top_p"] = 0.001;
    j["top_k"] = 1;
    j["transformers_version"] = "4.37.0";
  }
  return Dump(j);
}

std::string PreprocessorConfigJson(const Preset& preset) {
  ojson j;
  j["min_pixels"] = 3136;
  j["max_pixels"] = 12845056;
  j["patch_size"] = 14;
  j["temporal_patch_size"] = 2;
  j["merge_size"] = 2;
  j["image_mean"] = {0.48145466, 0.4578275, 0.40821073};
  j["image_std"] = {0.26862954, 0.26130258, 0.27577711};
  j["image_processor_type"] = "Qwen2VLImageProcessor";
  j["processor_class"] =
      preset.family == core::ModelFamily::kQwen2_VL ? "Qwen2VLProcessor" : "Qwen2_5_VLProcessor";
  return Dump(j);
}

std::string TokenizerConfigJson(const Preset& preset, const std::string& source_text) {
  if (preset.family != core::ModelFamily::kQwen2Text) return source_text;
  // Only the chat_template line changes (the source is written one key per line, as
  // transformers writes it), so the rest of the file stays byte for byte.
  const std::string key = "\n  \"chat_template\": ";
  const size_t at = source_text.find(key);
  const std::string line = key + nlohmann::json(std::string(kQwen25InstructTextTemplate)).dump();
  if (at == std::string::npos) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(source_text, nullptr, false);
    if (!j.is_object()) return source_text;
    j["chat_template"] = kQwen25InstructTextTemplate;
    return Dump(j);
  }
  size_t end = source_text.find('\n', at + 1);
  if (end == std::string::npos) end = source_text.size();
  std::string rest = source_text.substr(end);
  const bool comma = source_text[end - 1] == ',';
  return source_text.substr(0, at) + line + (comma ? "," : "") + rest;
}

}  // namespace iris::tools
