#include "engine/model.h"

#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "engine/generation_config.h"

namespace iris::engine {

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, const ModelOptions& options) {
  IRIS_ASSIGN_OR_RETURN(core::ModelConfig config, core::LoadModelConfig(dir));
  if (!config.has_text) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/config.json has no text model (a vision-only checkpoint)"));
  }
  core::PreprocessorConfig pre;
  if (config.has_vision()) {
    IRIS_ASSIGN_OR_RETURN(pre, core::LoadPreprocessorConfig(dir));
    if (config.vision.out_hidden_size != config.text.hidden_size) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "/config.json: vision_config.out_hidden_size ",
                                                     config.vision.out_hidden_size, " differs from hidden_size ",
                                                     config.text.hidden_size));
    }
  }
  IRIS_ASSIGN_OR_RETURN(GenerationConfig generation, LoadGenerationConfig(dir, config));
  IRIS_ASSIGN_OR_RETURN(llm::Tokenizer tokenizer, llm::Tokenizer::Load(dir));
  IRIS_ASSIGN_OR_RETURN(llm::ChatStyle style, llm::LoadChatStyle(dir));
  std::unique_ptr<Model> model(new Model{dir, config, pre, std::move(generation.eos_token_ids), generation.sampling,
                                         std::move(tokenizer), nullptr, nullptr, options, nullptr, std::move(style),
                                         nullptr});
  IRIS_ASSIGN_OR_RETURN(core::Checkpoint ckpt, core::Checkpoint::Open(dir));
  IRIS_ASSIGN_OR_RETURN(model->device, kernels::CreateDevice(options.device));
  if (config.has_vision()) {
    if (options.encoder_device.has_value()) {
      IRIS_ASSIGN_OR_RETURN(model->encoder_device, kernels::CreateDevice(*options.encoder_device));
      if (model->encoder_device->kind() != model->device->kind()) {
        return absl::InvalidArgumentError(absl::StrCat("the encoder's device \"", options.encoder_device->name,
                                                       "\" is not the kind of the decoder's (\"", options.device.name,
                                                       "\"): the memory plan counts one kind"));
      }
    }
    vision::EncoderOptions eo;
    eo.compute = options.compute;
    eo.techniques = options.techniques;
    IRIS_ASSIGN_OR_RETURN(model->encoder,
                          vision::VisionEncoder::Load(model->encoder_runs_on(), ckpt, config.vision, eo));
  }
  llm::DecoderOptions dopt;
  dopt.compute = options.compute;
  IRIS_ASSIGN_OR_RETURN(model->decoder, llm::Decoder::Load(*model->device, ckpt, config.text, dopt));
  return model;
}

}  // namespace iris::engine
