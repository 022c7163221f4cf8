// What a checkpoint's generation_config.json says about generating: its end ids, and the sampling
// settings Hugging Face's generate() uses when a call sets none (what a request that sets none
// gets from iris-server, unless --generation-config none).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "nlohmann/json.hpp"

namespace iris::engine {

// The settings a request's unset sampling fields take. The defaults: iris's own (greedy, no
// penalty), which is also what a checkpoint without generation_config.json gets.
struct SamplingDefaults {
  float temperature = 0.f;  // 0: greedy
  float top_p = 1.f;        // 1: off
  int top_k = 0;            // 0: off
  float repetition_penalty = 1.f;
  int64_t max_tokens = 0;   // max_new_tokens; 0: the server's --default-max-tokens (a tool's own default)
  std::string source;       // where they came from, for the startup line ("" = iris's own)

  // "temperature 0.1, top_p 0.001, top_k 1, repetition_penalty 1.05" (greedy: "greedy, ..."), then
  // ", max_new_tokens N" where set.
  std::string Describe() const;
};

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;  // eos_token_id (a number or a list); config.json's if absent
  SamplingDefaults sampling;
};

// Reads `dir`/generation_config.json as transformers' GenerationConfig reads it: do_sample
// (default false) chooses between greedy — where temperature, top_k and top_p are ignored — and
// sampling with temperature (default 1), top_k (default 50; 0 or >= vocab_size: off) and top_p
// (default 1); repetition_penalty (default 1) and max_new_tokens (as vLLM takes it: the tokens a
// request that sets no max_tokens gets; max_length, a total, is not read) apply either way. A
// missing file gives iris's
// defaults and the config's EOS id (as a file without eos_token_id gives the config's).
// INVALID_ARGUMENT naming the file and field for a value of the wrong type or outside the range a
// request could set (temperature [0, 100], top_p (0, 1], top_k >= 0, repetition_penalty (0, 10],
// max_new_tokens [1, 2^31 - 1]).
absl::StatusOr<GenerationConfig> LoadGenerationConfig(const std::string& dir, const core::ModelConfig& config);
// The same from the file's parsed JSON (`path` names it in messages).
absl::StatusOr<GenerationConfig> ParseGenerationConfig(const nlohmann::json& j, const std::string& path,
                                                       const core::ModelConfig& config);

// The tools' --generation-config value: true for "auto" (the model's defaults), false for "none"
// (iris's own); INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<bool> UsesModelSamplingDefaults(const std::string& flag_value);

}  // namespace iris::engine
