// The files of a checkpoint folder, as they would be on disk: safetensors bytes -> the validating
// header parser that Checkpoint::Open runs on the mmap, and JSON text -> config.json,
// preprocessor_config.json and generation_config.json parsing. Every input goes to both (each refuses the other's format in
// its first bytes), so one corpus holds both kinds.
// Safetensors properties: every accepted entry lies inside the data section, has the byte size
// its dtype and shape say, no two entries overlap, and reading each accepted tensor's bytes stays
// inside the buffer (ASan checks the reads).
// Config properties: an accepted config satisfies what the model code relies on (divisible head
// dims, rotary sections, block indexes below depth, finite positive normalization constants,
// min_pixels <= max_pixels, a patch factor that cannot overflow).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "engine/generation_config.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_check.h"

namespace {

void CheckVision(const iris::core::VisionConfig& v) {
  IRIS_FUZZ_CHECK(v.depth > 0 && v.hidden_size > 0 && v.num_heads > 0 && v.intermediate_size > 0,
                  "non-positive vision size");
  IRIS_FUZZ_CHECK(v.hidden_size % v.num_heads == 0 && v.head_dim() % 4 == 0, "vision head_dim %d",
                  v.head_dim());
  IRIS_FUZZ_CHECK(v.patch_size > 0 && v.spatial_merge_size > 0 && v.temporal_patch_size > 0,
                  "non-positive patch sizes");
  IRIS_FUZZ_CHECK(int64_t{v.patch_size} * v.spatial_merge_size <= (int64_t{1} << 20),
                  "patch unit %d*%d too large to compute with", v.patch_size, v.spatial_merge_size);
  for (int b : v.fullatt_block_indexes) {
    IRIS_FUZZ_CHECK(b >= 0 && b < v.depth, "full-attention block %d outside [0, %d)", b, v.depth);
  }
}

void CheckText(const iris::core::TextConfig& t) {
  IRIS_FUZZ_CHECK(t.num_attention_heads > 0 && t.num_key_value_heads > 0 &&
                      t.hidden_size % t.num_attention_heads == 0 &&
                      t.num_attention_heads % t.num_key_value_heads == 0,
                  "text heads %d/%d for hidden %d", t.num_attention_heads, t.num_key_value_heads,
                  t.hidden_size);
  IRIS_FUZZ_CHECK(t.mrope_section.size() == 3, "mrope_section has %zu entries", t.mrope_section.size());
  int64_t sum = 0;
  for (int s : t.mrope_section) {
    IRIS_FUZZ_CHECK(s >= 0, "negative mrope_section entry %d", s);
    sum += s;
  }
  IRIS_FUZZ_CHECK(sum == t.head_dim() / 2, "mrope_section sums to %ld, head_dim/2 is %d", long(sum),
                  t.head_dim() / 2);
  IRIS_FUZZ_CHECK(std::isfinite(t.rms_norm_eps) && t.rms_norm_eps > 0, "rms_norm_eps %g", t.rms_norm_eps);
  IRIS_FUZZ_CHECK(std::isfinite(t.rope_theta) && t.rope_theta > 0, "rope_theta %g", t.rope_theta);
  IRIS_FUZZ_CHECK(t.vocab_size > 0, "vocab_size %ld", long(t.vocab_size));
}

void CheckPreprocessor(const iris::core::PreprocessorConfig& p) {
  IRIS_FUZZ_CHECK(p.min_pixels > 0 && p.min_pixels <= p.max_pixels, "pixels [%ld, %ld]", long(p.min_pixels),
                  long(p.max_pixels));
  IRIS_FUZZ_CHECK(p.patch_size > 0 && p.merge_size > 0 && p.temporal_patch_size > 0, "patch sizes");
  IRIS_FUZZ_CHECK(int64_t{p.patch_size} * p.merge_size <= (int64_t{1} << 20), "factor %d*%d",
                  p.patch_size, p.merge_size);
  for (int c = 0; c < 3; ++c) {
    IRIS_FUZZ_CHECK(std::isfinite(p.image_mean[c]), "image_mean[%d] = %g", c, p.image_mean[c]);
    IRIS_FUZZ_CHECK(std::isfinite(p.image_std[c]) && p.image_std[c] > 0, "image_std[%d] = %g", c,
                    p.image_std[c]);
  }
}

// What the sampler and the request validation take: each default inside the range a request
// could set, end ids that are token ids.
void CheckGeneration(const iris::engine::GenerationConfig& g, const iris::core::ModelConfig& model) {
  const iris::engine::SamplingDefaults& s = g.sampling;
  IRIS_FUZZ_CHECK(s.temperature >= 0.f && s.temperature <= 100.f, "temperature %g", s.temperature);
  IRIS_FUZZ_CHECK(s.top_p > 0.f && s.top_p <= 1.f, "top_p %g", s.top_p);
  IRIS_FUZZ_CHECK(s.top_k >= 0 && s.top_k < model.text.vocab_size, "top_k %d", s.top_k);
  IRIS_FUZZ_CHECK(s.repetition_penalty > 0.f && s.repetition_penalty <= 10.f, "repetition_penalty %g",
                  s.repetition_penalty);
  IRIS_FUZZ_CHECK(s.max_tokens >= 0 && s.max_tokens <= INT32_MAX, "max_new_tokens %lld",
                  static_cast<long long>(s.max_tokens));
  IRIS_FUZZ_CHECK(!g.eos_token_ids.empty(), "no end id");
  for (const int32_t id : g.eos_token_ids) IRIS_FUZZ_CHECK(id >= 0, "end id %d", id);
}

void FuzzSafetensors(const uint8_t* data, size_t size) {
  const auto header = iris::core::ParseSafetensorsHeader(std::span<const uint8_t>(data, size), "fuzz.safetensors");
  if (!header.ok()) return;
  IRIS_FUZZ_CHECK(header->data_start >= 8 && header->data_start <= size, "data_start %zu of %zu",
                  header->data_start, size);
  const size_t data_size = size - header->data_start;
  std::vector<std::pair<size_t, size_t>> ranges;
  uint8_t checksum = 0;
  for (const auto& e : header->entries) {
    IRIS_FUZZ_CHECK(e.begin <= e.end && e.end <= data_size, "%s: [%zu, %zu) outside %zu bytes",
                    e.name.c_str(), e.begin, e.end, data_size);
    size_t numel = 1;
    for (int64_t d : e.shape) {
      IRIS_FUZZ_CHECK(d >= 0, "%s: negative dimension", e.name.c_str());
      numel *= static_cast<size_t>(d);
    }
    IRIS_FUZZ_CHECK(e.end - e.begin == numel * iris::core::DTypeSize(e.dtype), "%s: size mismatch",
                    e.name.c_str());
    for (size_t i = e.begin; i < e.end; ++i) checksum ^= data[header->data_start + i];
    if (e.end > e.begin) ranges.emplace_back(e.begin, e.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    IRIS_FUZZ_CHECK(ranges[i].first >= ranges[i - 1].second, "overlapping tensors accepted");
  }
  volatile uint8_t sink = checksum;  // keep the reads
  (void)sink;
}

void FuzzConfigs(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  if (const auto config = iris::core::ParseModelConfig(j, "config.json"); config.ok()) {
    CheckVision(config->vision);
    if (config->has_text) CheckText(config->text);
  }
  if (const auto pre = iris::core::ParsePreprocessorConfig(j, "preprocessor_config.json"); pre.ok()) {
    CheckPreprocessor(*pre);
  }
  iris::core::ModelConfig model;
  model.text.vocab_size = 151936;
  if (const auto g = iris::engine::ParseGenerationConfig(j, "generation_config.json", model); g.ok()) {
    CheckGeneration(*g, model);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzSafetensors(data, size);
  FuzzConfigs(data, size);
  return 0;
}
