// A serialized iris.v1.GenerateRequest, as it arrives on the wire -> request validation (field by
// field, against the server's limits) -> the prompt build a server worker runs (image decode and
// preprocessing, chat template, tokenization, image slots, M-RoPE positions). The model is the
// test checkpoint's configs and tokenizer (no weights: the build needs none). Properties: an
// accepted request's prompt is within the limits, every image's slot is a run of image tokens of
// the size its grid says, and the positions cover every token.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/model_config.h"
#include "engine/model.h"
#include "engine/prompt_builder.h"
#include "google/protobuf/stubs/logging.h"
#include "iris/v1/iris.pb.h"
#include "llm/tokenizer.h"
#include "server/request_conversion.h"
#include "server/server_options.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

template <typename T>
T OrDie(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "cannot load the test checkpoint: %s\n", std::string(v.status().message()).c_str());
    std::abort();
  }
  return std::move(*v);
}

const iris::engine::Model& TheModel() {
  static const iris::engine::Model* model = [] {
    const std::string dir = IRIS_TEST_DATA "/tiny-qwen2.5-vl";
    auto* m = new iris::engine::Model{dir, OrDie(iris::core::LoadModelConfig(dir)),
                                      OrDie(iris::core::LoadPreprocessorConfig(dir)), {}, {},
                                      OrDie(iris::llm::Tokenizer::Load(dir)), nullptr, nullptr, {}, nullptr};
    // Small images keep each input in milliseconds; requests may only lower it further.
    m->preprocessor.max_pixels = 256 * 28 * 28;
    return m;
  }();
  return *model;
}

iris::server::RequestLimits FuzzLimits() {
  iris::server::RequestLimits limits;
  limits.max_image_bytes = 1 << 20;
  limits.max_image_pixels = 4 << 20;
  limits.max_images_per_request = 4;
  limits.max_prompt_tokens = 4096;
  return limits;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in string fields is an expected parse failure; protobuf's log line for each one
  // would only slow the fuzzer down.
  google::protobuf::SetLogHandler(nullptr);
  TheModel();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const iris::server::RequestLimits limits = FuzzLimits();
  const iris::engine::Model& model = TheModel();
  iris::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const auto validated = iris::server::ValidateRequest(request, limits, model.config.text.vocab_size);
  if (!validated.ok()) {
    IRIS_FUZZ_CHECK(validated.status().code() == absl::StatusCode::kInvalidArgument,
                    "validation failed with %s", validated.status().ToString().c_str());
    return 0;
  }
  IRIS_FUZZ_CHECK(validated->sampling.max_tokens >= 1 && validated->sampling.max_tokens <= limits.max_tokens,
                  "max_tokens %ld accepted", long(validated->sampling.max_tokens));

  const auto prompt =
      iris::engine::BuildPrompt(model, validated->messages, iris::server::PromptLimitsFor(limits));
  if (!prompt.ok()) {
    IRIS_FUZZ_CHECK(prompt.status().code() == absl::StatusCode::kInvalidArgument,
                    "prompt build failed with %s", prompt.status().ToString().c_str());
    return 0;
  }
  const int64_t length = static_cast<int64_t>(prompt->ids.size());
  IRIS_FUZZ_CHECK(length > 0 && length <= limits.max_prompt_tokens, "%ld prompt tokens", long(length));
  IRIS_FUZZ_CHECK(static_cast<int>(prompt->images.size()) <= limits.max_images_per_request, "%zu images",
                  prompt->images.size());
  const int64_t merge2 = int64_t{model.config.vision.spatial_merge_size} * model.config.vision.spatial_merge_size;
  int64_t previous_end = 0;
  for (const auto& image : prompt->images) {
    const auto& g = image.grid_thw;
    IRIS_FUZZ_CHECK(image.pad_begin >= previous_end && image.pad_end <= length &&
                        image.pad_end - image.pad_begin == g[0] * g[1] * g[2] / merge2,
                    "image slot [%ld, %ld) for grid (%ld, %ld, %ld)", long(image.pad_begin),
                    long(image.pad_end), long(g[0]), long(g[1]), long(g[2]));
    for (int64_t i = image.pad_begin; i < image.pad_end; ++i) {
      IRIS_FUZZ_CHECK(prompt->ids[i] == model.config.image_token_id, "slot token %ld is %d", long(i),
                      prompt->ids[i]);
    }
    IRIS_FUZZ_CHECK(image.rgb != nullptr && image.rgb->numel() == g[1] * g[2] * model.config.vision.patch_size *
                                                                   model.config.vision.patch_size * 3,
                    "the image's bytes do not match the grid");
    previous_end = image.pad_end;
  }
  for (const auto& axis : prompt->positions.positions) {
    IRIS_FUZZ_CHECK(static_cast<int64_t>(axis.size()) == length, "%zu positions for %ld tokens", axis.size(),
                    long(length));
  }
  return 0;
}
