#include "engine/model.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace iris::engine {
namespace {

// generation_config.json's eos_token_id (a number or a list); the config's when the file or the
// field is absent.
absl::StatusOr<std::vector<int32_t>> LoadEosIds(const std::string& dir, const core::ModelConfig& config) {
  const std::string path = (std::filesystem::path(dir) / "generation_config.json").string();
  std::vector<int32_t> ids;
  if (std::filesystem::exists(path)) {
    IRIS_ASSIGN_OR_RETURN(nlohmann::json j, core::ReadJsonFile(path));
    if (j.contains("eos_token_id")) {
      const nlohmann::json& e = j["eos_token_id"];
      if (e.is_number_integer()) {
        ids.push_back(e.get<int32_t>());
      } else if (e.is_array()) {
        for (const auto& v : e) {
          if (!v.is_number_integer()) {
            return absl::InvalidArgumentError(absl::StrCat(path, ": eos_token_id must hold integers"));
          }
          ids.push_back(v.get<int32_t>());
        }
      } else if (!e.is_null()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": eos_token_id must be an integer or a list"));
      }
    }
  }
  if (ids.empty()) ids.push_back(static_cast<int32_t>(config.eos_token_id));
  return ids;
}

}  // namespace

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
  IRIS_ASSIGN_OR_RETURN(std::vector<int32_t> eos, LoadEosIds(dir, config));
  IRIS_ASSIGN_OR_RETURN(llm::Tokenizer tokenizer, llm::Tokenizer::Load(dir));
  IRIS_ASSIGN_OR_RETURN(llm::ChatStyle style, llm::LoadChatStyle(dir));
  std::unique_ptr<Model> model(new Model{dir, config, pre, std::move(eos), std::move(tokenizer), nullptr,
                                         nullptr, options, nullptr, std::move(style), nullptr});
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
