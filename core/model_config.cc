#include "core/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace iris::core {
namespace {

using nlohmann::json;

absl::Status FieldError(const std::string& source, std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field \"", std::string(field), "\" ", std::string(what)));
}

// Reads a positive integer field; `required` decides whether absence is an error.
absl::Status ReadInt(const json& j, const std::string& source, std::string_view prefix,
                     const char* key, bool required, int64_t min_value, int64_t* out) {
  const std::string field = absl::StrCat(std::string(prefix), key);
  if (!j.contains(key)) {
    return required ? FieldError(source, field, "is missing") : absl::OkStatus();
  }
  const json& v = j[key];
  if (!v.is_number_integer()) return FieldError(source, field, "must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x < min_value) return FieldError(source, field, absl::StrCat("must be >= ", min_value, ", got ", x));
  *out = x;
  return absl::OkStatus();
}

// Sizes are capped at 2^30 so that products of two of them fit in int64 and sums in int; the
// patch geometry gets tighter caps (below) because pixels are counted in int.
constexpr int64_t kMaxSize = int64_t{1} << 30;
constexpr int64_t kMaxPatchSize = 1024;   // published: 14
constexpr int64_t kMaxMergeSize = 16;     // published: 2 (spatial merge and temporal patch)
constexpr int64_t kMaxChannels = 16;      // published: 3

absl::Status ReadInt32(const json& j, const std::string& source, std::string_view prefix,
                       const char* key, bool required, int64_t min_value, int* out,
                       int64_t max_value = kMaxSize) {
  int64_t v = *out;
  IRIS_RETURN_IF_ERROR(ReadInt(j, source, prefix, key, required, min_value, &v));
  if (v > max_value) {
    return FieldError(source, absl::StrCat(std::string(prefix), key),
                      absl::StrCat("is too large: ", v, " (the limit is ", max_value, ")"));
  }
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status ReadNumber(const json& j, const std::string& source, std::string_view prefix,
                        const char* key, bool required, double* out) {
  if (!j.contains(key)) {
    return required ? FieldError(source, absl::StrCat(std::string(prefix), key), "is missing") : absl::OkStatus();
  }
  if (!j[key].is_number()) return FieldError(source, absl::StrCat(std::string(prefix), key), "must be a number");
  *out = j[key].get<double>();
  if (!(*out > 0) || !std::isfinite(*out)) {
    return FieldError(source, absl::StrCat(std::string(prefix), key), "must be a positive finite number");
  }
  return absl::OkStatus();
}

// A double that the model stores as float: finite and, when `positive`, still > 0 as a float.
bool FitsFloat(double v, bool positive) {
  if (!std::isfinite(v) || std::abs(v) > std::numeric_limits<float>::max()) return false;
  return !positive || static_cast<float>(v) > 0;
}

absl::Status ReadIntList(const json& j, const std::string& source, std::string_view field,
                         std::vector<int>* out) {
  if (!j.is_array()) return FieldError(source, field, "must be a list of integers");
  out->clear();
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxSize) {
      return FieldError(source, field, absl::StrCat("must be a list of integers in [0, ", kMaxSize, "]"));
    }
    out->push_back(v.get<int>());
  }
  return absl::OkStatus();
}

}  // namespace

bool VisionConfig::IsFullAttention(int block) const {
  if (!windowed) return true;
  return std::find(fullatt_block_indexes.begin(), fullatt_block_indexes.end(), block) !=
         fullatt_block_indexes.end();
}

const char* FamilyModelType(ModelFamily family) {
  switch (family) {
    case ModelFamily::kQwen2_5_VL: return "qwen2_5_vl";
    case ModelFamily::kQwen2_VL: return "qwen2_vl";
    case ModelFamily::kQwen2Text: return "qwen2";
  }
  return "?";
}

const char* FamilyArchitecture(ModelFamily family) {
  switch (family) {
    case ModelFamily::kQwen2_5_VL: return "Qwen2_5_VLForConditionalGeneration";
    case ModelFamily::kQwen2_VL: return "Qwen2VLForConditionalGeneration";
    case ModelFamily::kQwen2Text: return "Qwen2ForCausalLM";
  }
  return "?";
}

namespace {

// The patch geometry both towers share, and the checks on it.
absl::Status ReadPatchGeometry(const json& j, const std::string& source, VisionConfig* c) {
  const std::string p = "vision_config.";
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "in_chans", false, 1, &c->in_channels, kMaxChannels));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "in_channels", false, 1, &c->in_channels, kMaxChannels));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "patch_size", false, 1, &c->patch_size, kMaxPatchSize));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "spatial_patch_size", false, 1, &c->patch_size, kMaxPatchSize));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "spatial_merge_size", false, 1, &c->spatial_merge_size, kMaxMergeSize));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "temporal_patch_size", false, 1, &c->temporal_patch_size, kMaxMergeSize));
  return absl::OkStatus();
}

absl::Status ReadHiddenAct(const json& j, const std::string& source, const char* expected, const char* family,
                           std::string* act) {
  if (j.contains("hidden_act")) {
    if (!j["hidden_act"].is_string()) return FieldError(source, "vision_config.hidden_act", "must be a string");
    *act = j["hidden_act"].get<std::string>();
  }
  if (*act != expected) {
    return FieldError(source, "vision_config.hidden_act",
                      absl::StrCat("must be \"", expected, "\" (", family, "), got \"", *act, "\""));
  }
  return absl::OkStatus();
}

absl::Status CheckHeads(const VisionConfig& c, const std::string& source) {
  if (c.hidden_size % c.num_heads != 0) {
    return FieldError(source, "vision_config.num_heads",
                      absl::StrCat("must divide hidden_size ", c.hidden_size, ", got ", c.num_heads));
  }
  if (c.head_dim() % 4 != 0) {
    return FieldError(source, "vision_config.num_heads",
                      absl::StrCat("gives head_dim ", c.head_dim(), ", which must be a multiple of 4 for 2-D rotary"));
  }
  return absl::OkStatus();
}

// Qwen2-VL's vision_config: embed_dim is the tower's width, hidden_size the merger's output,
// the MLP is embed_dim * mlp_ratio wide.
absl::StatusOr<VisionConfig> ParseQwen2VisionConfig(const json& j, const std::string& source) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": vision_config is not an object"));
  VisionConfig c;
  const std::string p = "vision_config.";
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "depth", true, 1, &c.depth));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "embed_dim", true, 1, &c.hidden_size));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "num_heads", true, 1, &c.num_heads));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "hidden_size", true, 1, &c.out_hidden_size));
  double ratio = 4.0;
  IRIS_RETURN_IF_ERROR(ReadNumber(j, source, p, "mlp_ratio", false, &ratio));
  const double inter = ratio * c.hidden_size;
  if (inter != std::floor(inter) || inter < 1 || inter > static_cast<double>(kMaxSize)) {
    return FieldError(source, "vision_config.mlp_ratio",
                      absl::StrCat("times embed_dim ", c.hidden_size, " must be a whole number in [1, ", kMaxSize,
                                   "], got ", inter));
  }
  c.intermediate_size = static_cast<int>(inter);
  IRIS_RETURN_IF_ERROR(ReadPatchGeometry(j, source, &c));
  c.hidden_act = "quick_gelu";
  IRIS_RETURN_IF_ERROR(ReadHiddenAct(j, source, "quick_gelu", "Qwen2-VL", &c.hidden_act));
  c.norm = VisionNorm::kLayerNorm;
  c.mlp = VisionMlp::kQuickGelu;
  c.windowed = false;
  IRIS_RETURN_IF_ERROR(CheckHeads(c, source));
  return c;
}

absl::StatusOr<ModelFamily> DetectFamily(const json& j, const std::string& source) {
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string t = j["model_type"].get<std::string>();
    if (t == "qwen2_5_vl") return ModelFamily::kQwen2_5_VL;
    if (t == "qwen2_vl") return ModelFamily::kQwen2_VL;
    if (t == "qwen2") return ModelFamily::kQwen2Text;
    if (!j.contains("vision_config")) {
      return FieldError(source, "model_type",
                        absl::StrCat("is \"", t, "\", not one iris serves (qwen2_5_vl, qwen2_vl, qwen2)"));
    }
    return ModelFamily::kQwen2_5_VL;  // a renamed Qwen2.5-VL checkpoint: the tensors decide
  }
  if (j.contains("architectures") && j["architectures"].is_array()) {
    for (const auto& a : j["architectures"]) {
      if (a == "Qwen2ForCausalLM") return ModelFamily::kQwen2Text;
      if (a == "Qwen2VLForConditionalGeneration") return ModelFamily::kQwen2_VL;
    }
  }
  return ModelFamily::kQwen2_5_VL;
}

// The Qwen2 decoder's fields, shared by the three families; `needs_mrope` for the VL ones.
absl::Status ParseTextConfig(const json& j, const std::string& source, bool needs_mrope, TextConfig* out) {
  // Newer transformers nest the text model under "text_config"; 4.50 keeps it at the top.
  const json& t = j.contains("text_config") && j["text_config"].is_object() ? j["text_config"] : j;
  const std::string p = &t == &j ? "" : "text_config.";
  TextConfig& x = *out;
  IRIS_RETURN_IF_ERROR(ReadInt32(t, source, p, "hidden_size", true, 1, &x.hidden_size));
  IRIS_RETURN_IF_ERROR(ReadInt32(t, source, p, "intermediate_size", true, 1, &x.intermediate_size));
  IRIS_RETURN_IF_ERROR(ReadInt32(t, source, p, "num_hidden_layers", true, 1, &x.num_hidden_layers));
  IRIS_RETURN_IF_ERROR(ReadInt32(t, source, p, "num_attention_heads", true, 1, &x.num_attention_heads));
  x.num_key_value_heads = x.num_attention_heads;
  IRIS_RETURN_IF_ERROR(ReadInt32(t, source, p, "num_key_value_heads", false, 1, &x.num_key_value_heads));
  IRIS_RETURN_IF_ERROR(ReadInt(t, source, p, "vocab_size", true, 1, &x.vocab_size));
  IRIS_RETURN_IF_ERROR(ReadInt(t, source, p, "max_position_embeddings", false, 1, &x.max_position_embeddings));
  IRIS_RETURN_IF_ERROR(ReadNumber(t, source, p, "rope_theta", false, &x.rope_theta));
  double eps = x.rms_norm_eps;
  IRIS_RETURN_IF_ERROR(ReadNumber(t, source, p, "rms_norm_eps", false, &eps));
  if (!FitsFloat(eps, /*positive=*/true)) {
    return FieldError(source, absl::StrCat(p, "rms_norm_eps"), absl::StrCat("is not a positive float: ", eps));
  }
  x.rms_norm_eps = static_cast<float>(eps);
  const json& tie_src = j.contains("tie_word_embeddings") ? j : t;
  if (tie_src.contains("tie_word_embeddings")) {
    if (!tie_src["tie_word_embeddings"].is_boolean()) return FieldError(source, "tie_word_embeddings", "must be a boolean");
    x.tie_word_embeddings = tie_src["tie_word_embeddings"].get<bool>();
  }
  if (t.contains("use_sliding_window") && !t["use_sliding_window"].is_null()) {
    if (!t["use_sliding_window"].is_boolean()) {
      return FieldError(source, absl::StrCat(p, "use_sliding_window"), "must be a boolean");
    }
    if (t["use_sliding_window"].get<bool>()) {
      return FieldError(source, absl::StrCat(p, "use_sliding_window"),
                        "is true: sliding-window attention is not implemented (every layer attends to the whole "
                        "context); set it to false or serve another checkpoint");
    }
  }
  if (t.contains("sliding_window") && t["sliding_window"].is_number_integer()) {
    x.sliding_window = t["sliding_window"].get<int64_t>();
  }
  if (x.hidden_size % x.num_attention_heads != 0) {
    return FieldError(source, absl::StrCat(p, "num_attention_heads"),
                      absl::StrCat("must divide hidden_size ", x.hidden_size));
  }
  if (x.num_attention_heads % x.num_key_value_heads != 0) {
    return FieldError(source, absl::StrCat(p, "num_key_value_heads"),
                      absl::StrCat("must divide num_attention_heads ", x.num_attention_heads));
  }
  const int half = x.head_dim() / 2;
  const json* rs = t.contains("rope_scaling") ? &t["rope_scaling"] : (j.contains("rope_scaling") ? &j["rope_scaling"] : nullptr);
  if (!needs_mrope) {
    // Qwen2 text: 1-D positions. YaRN and other scalings change the angles: refused, not ignored.
    if (rs != nullptr && !rs->is_null()) {
      return FieldError(source, absl::StrCat(p, "rope_scaling"),
                        "is set: RoPE scaling (YaRN, dynamic, ...) is not implemented for text models; remove it "
                        "(positions up to max_position_embeddings need none)");
    }
    x.mrope = false;
    x.mrope_section = {half, 0, 0};
    return absl::OkStatus();
  }
  if (rs == nullptr || !rs->is_object() || !rs->contains("mrope_section")) {
    return FieldError(source, absl::StrCat(p, "rope_scaling.mrope_section"), "is missing");
  }
  IRIS_RETURN_IF_ERROR(ReadIntList((*rs)["mrope_section"], source, "rope_scaling.mrope_section", &x.mrope_section));
  if (x.mrope_section.size() != 3 ||
      std::accumulate(x.mrope_section.begin(), x.mrope_section.end(), int64_t{0}) != half) {
    return FieldError(source, "rope_scaling.mrope_section",
                      absl::StrCat("must be 3 integers summing to head_dim/2 = ", half));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VisionConfig> ParseVisionConfig(const json& j, const std::string& source) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": vision_config is not an object"));
  VisionConfig c;
  const std::string p = "vision_config.";
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "depth", true, 1, &c.depth));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "hidden_size", true, 1, &c.hidden_size));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "intermediate_size", true, 1, &c.intermediate_size));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "num_heads", true, 1, &c.num_heads));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "out_hidden_size", true, 1, &c.out_hidden_size));
  IRIS_RETURN_IF_ERROR(ReadPatchGeometry(j, source, &c));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "window_size", false, 1, &c.window_size));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, p, "tokens_per_second", false, 0, &c.tokens_per_second));
  if (j.contains("fullatt_block_indexes")) {
    IRIS_RETURN_IF_ERROR(ReadIntList(j["fullatt_block_indexes"], source,
                                     "vision_config.fullatt_block_indexes", &c.fullatt_block_indexes));
  } else {
    return FieldError(source, "vision_config.fullatt_block_indexes", "is missing");
  }
  IRIS_RETURN_IF_ERROR(ReadHiddenAct(j, source, "silu", "Qwen2.5-VL", &c.hidden_act));
  IRIS_RETURN_IF_ERROR(CheckHeads(c, source));
  const int unit = c.patch_size * c.spatial_merge_size;
  if (c.window_size % unit != 0) {
    return FieldError(source, "vision_config.window_size",
                      absl::StrCat("must be a multiple of patch_size*spatial_merge_size = ", unit,
                                   ", got ", c.window_size));
  }
  for (int b : c.fullatt_block_indexes) {
    if (b >= c.depth) {
      return FieldError(source, "vision_config.fullatt_block_indexes",
                        absl::StrCat("entry ", b, " is not below depth ", c.depth));
    }
  }
  return c;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const json& j, const std::string& source) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  ModelConfig c;
  if (j.contains("model_type") && j["model_type"].is_string()) c.model_type = j["model_type"].get<std::string>();
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) c.torch_dtype = j["torch_dtype"].get<std::string>();
  // A bare vision config (like golden/vision-3b/vision_config.json).
  if (j.contains("depth") && !j.contains("vision_config")) {
    if (j.contains("embed_dim")) {
      c.family = ModelFamily::kQwen2_VL;
      IRIS_ASSIGN_OR_RETURN(c.vision, ParseQwen2VisionConfig(j, source));
    } else {
      IRIS_ASSIGN_OR_RETURN(c.vision, ParseVisionConfig(j, source));
    }
    return c;
  }
  IRIS_ASSIGN_OR_RETURN(c.family, DetectFamily(j, source));
  if (c.family == ModelFamily::kQwen2Text) {
    if (j.contains("vision_config")) {
      return FieldError(source, "vision_config", "is present in a text-only (model_type qwen2) config");
    }
  } else {
    if (!j.contains("vision_config")) return FieldError(source, "vision_config", "is missing");
    if (c.family == ModelFamily::kQwen2_VL) {
      IRIS_ASSIGN_OR_RETURN(c.vision, ParseQwen2VisionConfig(j["vision_config"], source));
    } else {
      IRIS_ASSIGN_OR_RETURN(c.vision, ParseVisionConfig(j["vision_config"], source));
    }
  }
  IRIS_RETURN_IF_ERROR(ParseTextConfig(j, source, c.has_vision(), &c.text));
  IRIS_RETURN_IF_ERROR(ReadInt(j, source, "", "image_token_id", false, 0, &c.image_token_id));
  IRIS_RETURN_IF_ERROR(ReadInt(j, source, "", "video_token_id", false, 0, &c.video_token_id));
  IRIS_RETURN_IF_ERROR(ReadInt(j, source, "", "vision_start_token_id", false, 0, &c.vision_start_token_id));
  IRIS_RETURN_IF_ERROR(ReadInt(j, source, "", "vision_end_token_id", false, 0, &c.vision_end_token_id));
  IRIS_RETURN_IF_ERROR(ReadInt(j, source, "", "bos_token_id", false, 0, &c.bos_token_id));
  IRIS_RETURN_IF_ERROR(ReadInt(j, source, "", "eos_token_id", false, 0, &c.eos_token_id));
  c.has_text = true;
  return c;
}

absl::StatusOr<PreprocessorConfig> ParsePreprocessorConfig(const json& j, const std::string& source) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  PreprocessorConfig c;
  // Newer processors store the limits as size.shortest_edge / size.longest_edge (in pixels).
  if (j.contains("size") && j["size"].is_object()) {
    IRIS_RETURN_IF_ERROR(ReadInt(j["size"], source, "size.", "shortest_edge", false, 1, &c.min_pixels));
    IRIS_RETURN_IF_ERROR(ReadInt(j["size"], source, "size.", "longest_edge", false, 1, &c.max_pixels));
  }
  IRIS_RETURN_IF_ERROR(ReadInt(j, source, "", "min_pixels", false, 1, &c.min_pixels));
  IRIS_RETURN_IF_ERROR(ReadInt(j, source, "", "max_pixels", false, 1, &c.max_pixels));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, "", "patch_size", false, 1, &c.patch_size, kMaxPatchSize));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, "", "temporal_patch_size", false, 1, &c.temporal_patch_size, kMaxMergeSize));
  IRIS_RETURN_IF_ERROR(ReadInt32(j, source, "", "merge_size", false, 1, &c.merge_size, kMaxMergeSize));
  for (const char* key : {"image_mean", "image_std"}) {
    if (!j.contains(key)) continue;
    const json& v = j[key];
    if (!v.is_array() || v.size() != 3) return FieldError(source, key, "must be a list of 3 numbers");
    auto& dst = std::string_view(key) == "image_mean" ? c.image_mean : c.image_std;
    const bool positive = &dst == &c.image_std;
    for (int i = 0; i < 3; ++i) {
      if (!v[i].is_number()) return FieldError(source, key, "must be a list of 3 numbers");
      const double x = v[i].get<double>();
      if (!FitsFloat(x, positive)) {
        return FieldError(source, key, absl::StrCat("entry ", i, " (", x, ") must be a finite float",
                                                    positive ? " above 0" : ""));
      }
      dst[i] = static_cast<float>(x);
    }
  }
  if (c.min_pixels > c.max_pixels) {
    return FieldError(source, "min_pixels",
                      absl::StrCat("(", c.min_pixels, ") must not exceed max_pixels (", c.max_pixels, ")"));
  }
  return c;
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return j;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  IRIS_ASSIGN_OR_RETURN(json j, ReadJsonFile(path));
  return ParseModelConfig(j, path);
}

absl::StatusOr<PreprocessorConfig> LoadPreprocessorConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "preprocessor_config.json").string();
  IRIS_ASSIGN_OR_RETURN(json j, ReadJsonFile(path));
  return ParsePreprocessorConfig(j, path);
}

}  // namespace iris::core
