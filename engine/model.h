// A loaded model of one of the Qwen families (Qwen2.5-VL, Qwen2-VL, text-only Qwen2/Qwen2.5):
// configs, tokenizer, chat style, vision encoder (absent for text-only models) and decoder from
// one checkpoint directory, plus the generation defaults (EOS ids, sampling) from generation_config.json.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "engine/generation_config.h"
#include "kernels/device.h"
#include "kernels/linear.h"
#include "llm/chat_template.h"
#include "llm/decoder.h"
#include "llm/tokenizer.h"
#include "vision/vision_encoder.h"

namespace iris::engine {

struct ModelOptions {
  kernels::ComputeType compute = kernels::ComputeType::kBF16;
  vision::EncoderTechniques techniques;
  kernels::DeviceOptions device;  // where the decoder runs, and the encoder unless encoder_device is set
  // Set (a model with vision): the encoder gets a device object of its own, so that it can run
  // beside the decoder (engine/encoder_worker.h): on a GPU the same name gives a second stream,
  // library handles and workspaces on the same GPU; on the CPU, a compute team of `threads` of
  // its own (pin it to cores the decoder's team does not use).
  std::optional<kernels::DeviceOptions> encoder_device;
};

struct Model {
  std::string dir;
  core::ModelConfig config;
  core::PreprocessorConfig preprocessor;  // defaults for a text-only model (never used)
  std::vector<int32_t> eos_token_ids;  // generation_config.json's eos_token_id (list or one), else config's
  SamplingDefaults sampling_defaults;  // generation_config.json's, as transformers' generate() reads them
  llm::Tokenizer tokenizer;
  std::unique_ptr<vision::VisionEncoder> encoder;  // null for a text-only model
  std::unique_ptr<llm::Decoder> decoder;
  ModelOptions options;
  std::unique_ptr<kernels::Device> device;  // what the decoder (and the encoder, unless below) runs on
  llm::ChatStyle chat_style;  // from the checkpoint's chat template (its default system turn)
  std::unique_ptr<kernels::Device> encoder_device;  // the encoder's own (options.encoder_device), or null

  // How the preprocessing's bytes become pixel values (what the encoder needs to take images as bytes).
  vision::PixelNormalization pixel_normalization() const { return {preprocessor.image_mean, preprocessor.image_std}; }

  // The device the encoder runs on.
  kernels::Device& encoder_runs_on() const { return encoder_device != nullptr ? *encoder_device : *device; }

  // The encoder and the decoder go before the device they hold.
  ~Model() {
    encoder.reset();
    decoder.reset();
  }
};

// Loads everything from `dir` (config.json, preprocessor_config.json for VL models,
// generation_config.json when present, tokenizer.json, the chat template, safetensors). Errors name
// the file and field.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, const ModelOptions& options);

}  // namespace iris::engine
