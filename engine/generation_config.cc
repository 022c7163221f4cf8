#include "engine/generation_config.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace iris::engine {
namespace {

absl::Status Invalid(const std::string& path, const char* field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, " ", what));
}

// An integer in [0, 2^31) (JSON's non-negative integers parse as unsigned: compared as such).
bool IsNonNegativeInt32(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= 0x7FFFFFFFu;
  return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= 0x7FFFFFFF;
}

// eos_token_id: a token id or a list of them; empty when absent or null.
absl::StatusOr<std::vector<int32_t>> EosIds(const nlohmann::json& j, const std::string& path) {
  std::vector<int32_t> ids;
  if (!j.contains("eos_token_id")) return ids;
  const nlohmann::json& e = j["eos_token_id"];
  if (IsNonNegativeInt32(e)) {
    ids.push_back(e.get<int32_t>());
  } else if (e.is_array()) {
    for (const auto& v : e) {
      if (!IsNonNegativeInt32(v)) return Invalid(path, "eos_token_id", "must hold token ids (integers in [0, 2^31))");
      ids.push_back(v.get<int32_t>());
    }
  } else if (!e.is_null()) {
    return Invalid(path, "eos_token_id", "must be a token id or a list of them");
  }
  return ids;
}

// A number field in [lo, hi] (lo excluded where lo_open), `fallback` when absent or null.
absl::StatusOr<float> Number(const nlohmann::json& j, const std::string& path, const char* field, float fallback,
                             double lo, bool lo_open, double hi) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  if (!j[field].is_number()) return Invalid(path, field, "must be a number");
  const double v = j[field].get<double>();
  if (!(lo_open ? v > lo : v >= lo) || !(v <= hi)) {
    return Invalid(path, field, absl::StrCat("must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], got ", v));
  }
  return static_cast<float>(v);
}

}  // namespace

absl::StatusOr<bool> UsesModelSamplingDefaults(const std::string& flag_value) {
  if (flag_value == "auto" || flag_value == "none") return flag_value == "auto";
  return absl::InvalidArgumentError(absl::StrCat("--generation-config must be auto or none, got \"", flag_value, "\""));
}

std::string SamplingDefaults::Describe() const {
  const std::string rest = absl::StrCat("repetition_penalty ", repetition_penalty,
                                        max_tokens > 0 ? absl::StrCat(", max_new_tokens ", max_tokens) : "");
  if (temperature == 0.f) return absl::StrCat("greedy, ", rest);
  return absl::StrCat("temperature ", temperature, ", top_p ", top_p, ", top_k ", top_k, ", ", rest);
}

absl::StatusOr<GenerationConfig> LoadGenerationConfig(const std::string& dir, const core::ModelConfig& config) {
  const std::string path = (std::filesystem::path(dir) / "generation_config.json").string();
  if (!std::filesystem::exists(path)) {
    GenerationConfig out;
    out.eos_token_ids.push_back(static_cast<int32_t>(config.eos_token_id));
    return out;
  }
  IRIS_ASSIGN_OR_RETURN(nlohmann::json j, core::ReadJsonFile(path));
  return ParseGenerationConfig(j, path, config);
}

absl::StatusOr<GenerationConfig> ParseGenerationConfig(const nlohmann::json& j, const std::string& path,
                                                       const core::ModelConfig& config) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  GenerationConfig out;
  IRIS_ASSIGN_OR_RETURN(out.eos_token_ids, EosIds(j, path));
  if (out.eos_token_ids.empty()) out.eos_token_ids.push_back(static_cast<int32_t>(config.eos_token_id));
  SamplingDefaults& s = out.sampling;
  s.source = path;
  IRIS_ASSIGN_OR_RETURN(s.repetition_penalty, Number(j, path, "repetition_penalty", 1.f, 0.0, true, 10.0));
  if (j.contains("max_new_tokens") && !j["max_new_tokens"].is_null()) {
    const nlohmann::json& m = j["max_new_tokens"];
    if (!IsNonNegativeInt32(m) || m.get<int64_t>() < 1) {
      return Invalid(path, "max_new_tokens", "must be an integer in [1, 2147483647]");
    }
    s.max_tokens = m.get<int64_t>();
  }
  bool do_sample = false;  // transformers' default
  if (j.contains("do_sample") && !j["do_sample"].is_null()) {
    if (!j["do_sample"].is_boolean()) return Invalid(path, "do_sample", "must be true or false");
    do_sample = j["do_sample"].get<bool>();
  }
  if (!do_sample) return out;  // greedy: transformers ignores temperature, top_k and top_p
  IRIS_ASSIGN_OR_RETURN(s.temperature, Number(j, path, "temperature", 1.f, 0.0, false, 100.0));
  IRIS_ASSIGN_OR_RETURN(s.top_p, Number(j, path, "top_p", 1.f, 0.0, true, 1.0));
  int64_t top_k = 50;  // transformers' default
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    if (!j["top_k"].is_number_integer() || j["top_k"].get<int64_t>() < 0) {
      return Invalid(path, "top_k", "must be an integer >= 0");
    }
    top_k = j["top_k"].get<int64_t>();
  }
  // Keeping the whole vocabulary is no top-k at all (a request could not ask for more).
  s.top_k = top_k >= config.text.vocab_size ? 0 : static_cast<int>(top_k);
  return out;
}

}  // namespace iris::engine
