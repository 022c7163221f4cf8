// A loaded Qwen2.5-VL model: configs, tokenizer, vision encoder and decoder from one checkpoint
// directory, plus the generation defaults (EOS ids) from generation_config.json.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "kernels/device.h"
#include "kernels/linear.h"
#include "llm/decoder.h"
#include "llm/tokenizer.h"
#include "vision/vision_encoder.h"

namespace iris::engine {

struct ModelOptions {
  kernels::ComputeType compute = kernels::ComputeType::kBF16;
  vision::EncoderTechniques techniques;
  kernels::DeviceOptions device;  // where the encoder and the decoder run
};

struct Model {
  std::string dir;
  core::ModelConfig config;
  core::PreprocessorConfig preprocessor;
  std::vector<int32_t> eos_token_ids;  // generation_config.json's eos_token_id (list or one), else config's
  llm::Tokenizer tokenizer;
  std::unique_ptr<vision::VisionEncoder> encoder;
  std::unique_ptr<llm::Decoder> decoder;
  ModelOptions options;
  std::unique_ptr<kernels::Device> device;  // what encoder and decoder run on

  // The encoder and the decoder go before the device they hold.
  ~Model() {
    encoder.reset();
    decoder.reset();
  }
};

// Loads everything from `dir` (config.json, preprocessor_config.json, generation_config.json when
// present, tokenizer.json, safetensors). Errors name the file and field.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, const ModelOptions& options);

}  // namespace iris::engine
