#include "engine/warm_up.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "llm/decoder.h"
#include "vision/encoder_plan.h"
#include "vision/vision_encoder.h"

namespace iris::engine {
namespace {

absl::Status WarmUpDecoder(llm::Decoder& decoder, llm::KvCache& cache) {
  const int block_size = cache.shape().block_size;
  const int64_t rows = std::min(decoder.max_tokens(), cache.shape().num_blocks * block_size);
  if (rows <= 0) return absl::OkStatus();
  llm::BlockTable table;
  IRIS_RETURN_IF_ERROR(cache.Reserve(&table, rows));
  llm::DecoderBatch batch;
  batch.Clear(static_cast<int>(table.blocks.size()));
  absl::Status status = batch.AddSequence(table, block_size, rows, /*want_logits=*/true);
  if (status.ok()) {
    batch.token_ids.assign(rows, 0);
    for (auto& axis : batch.positions) {
      axis.resize(rows);
      for (int64_t i = 0; i < rows; ++i) axis[i] = i;
    }
    status = decoder.Forward(batch, &cache).status();
  }
  cache.Release(&table);
  return status;
}

absl::Status WarmUpEncoder(vision::VisionEncoder& encoder, const core::VisionConfig& config, EncoderWorker* worker) {
  // One image: a grid of whole merge units with at most max_patches() patches, as square as it
  // can be.
  const int64_t merge = config.spatial_merge_size;
  const int64_t units = std::max<int64_t>(1, encoder.max_patches() / (merge * merge));
  const int64_t side = std::max<int64_t>(1, static_cast<int64_t>(std::sqrt(static_cast<double>(units))));
  const vision::GridThw grid = {1, side * merge, (units / side) * merge};
  const int64_t n = grid[1] * grid[2];
  const int64_t patch_dim = int64_t{config.in_channels} * config.temporal_patch_size * config.patch_size * config.patch_size;
  core::Tensor pixels = core::Tensor::Zeros(core::DType::kF32, {n, patch_dim});
  if (worker != nullptr) {
    IRIS_RETURN_IF_ERROR(worker->Submit(std::move(pixels), {grid}));
    return worker->Wait().embeddings.status();
  }
  return encoder.Forward(pixels, std::span<const vision::GridThw>(&grid, 1)).status();
}

}  // namespace

absl::Status WarmUp(Model& model, llm::KvCache& cache, EncoderWorker* encoder_worker) {
  if (model.encoder != nullptr) {
    if (absl::Status s = WarmUpEncoder(*model.encoder, model.config.vision, encoder_worker); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("warm-up encoder forward: ", s.message()));
    }
  }
  if (absl::Status s = WarmUpDecoder(*model.decoder, cache); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("warm-up decoder step: ", s.message()));
  }
  IRIS_RETURN_IF_ERROR(model.encoder_runs_on().status());
  return model.device->status();
}

}  // namespace iris::engine
