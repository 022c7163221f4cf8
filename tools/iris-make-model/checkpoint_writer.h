// Writes a synthetic preset as a Hugging Face model folder: the JSON files and the bf16
// weights, streamed tensor by tensor into model.safetensors or, past a size limit, into
// model-0000K-of-0000N.safetensors shards plus model.safetensors.index.json.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "tools/iris-make-model/presets.h"

namespace iris::tools {

// Hugging Face's published checkpoints are cut into shards of at most a few GB.
inline constexpr uint64_t kDefaultMaxShardBytes = 4'000'000'000ull;

struct WriteOptions {
  std::string out_dir;
  bool vision_only = false;
  // A single model.safetensors when the weights fit, shards otherwise. A tensor larger than
  // this gets a shard of its own.
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // When set, tokenizer.json, tokenizer_config.json and chat_template.json are copied from
  // this folder (those present; the folder itself must exist).
  std::string tokenizer_from;
  // Only the JSON files (config, generation, preprocessor, tokenizer): no weights. The summary
  // still counts the tensors and parameters the checkpoint would hold.
  bool config_only = false;
};

struct WriteSummary {
  int64_t tensors = 0;
  int64_t parameters = 0;
  uint64_t bytes = 0;  // tensor data bytes (the index's total_size)
  int files = 0;       // safetensors files written
  int tokenizer_files = 0;
  double seconds = 0;
};

absl::StatusOr<WriteSummary> WriteSyntheticModel(const Preset& preset, const WriteOptions& options);

}  // namespace iris::tools
