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

// Pseudo-random image bytes, not zeros: a GPU tuning its matmuls times them on the pixel values
// made of these, and a matmul of zeros runs faster than one of real data.
uint8_t WarmUpByte(int64_t i) { return static_cast<uint8_t>((static_cast<uint32_t>(i) * 2654435761u) >> 24); }

absl::Status WarmUpDecoderStep(llm::Decoder& decoder, llm::KvCache& cache, int64_t rows) {
  const int block_size = cache.shape().block_size;
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

// A step at the budget (the activations' largest), then one at each smaller row count the device
// asks for (Device::WarmUpRowCounts).
absl::Status WarmUpDecoder(llm::Decoder& decoder, llm::KvCache& cache, const kernels::Device& device) {
  const int64_t rows = std::min(decoder.max_tokens(), cache.shape().num_blocks * int64_t{cache.shape().block_size});
  if (rows <= 0) return absl::OkStatus();
  std::vector<int64_t> counts = device.WarmUpRowCounts(rows);
  std::reverse(counts.begin(), counts.end());
  for (const int64_t n : counts) IRIS_RETURN_IF_ERROR(WarmUpDecoderStep(decoder, cache, std::min(n, rows)));
  return absl::OkStatus();
}

absl::Status WarmUpEncoderForward(vision::VisionEncoder& encoder, const core::VisionConfig& config,
                                  EncoderWorker* worker, int64_t max_patches,
                                  const vision::PixelNormalization& normalization) {
  // One image, as the engine's forwards take it (its bytes): a grid of whole merge units with at
  // most max_patches patches, as square as it can be.
  const int64_t merge = config.spatial_merge_size;
  const int64_t units = std::max<int64_t>(1, max_patches / (merge * merge));
  const int64_t side = std::max<int64_t>(1, static_cast<int64_t>(std::sqrt(static_cast<double>(units))));
  const vision::GridThw grid = {1, side * merge, (units / side) * merge};
  const int64_t bytes = grid[1] * config.patch_size * grid[2] * config.patch_size * 3;
  core::Tensor rgb = core::Tensor::Empty(core::DType::kU8, {bytes});
  for (int64_t i = 0; i < bytes; ++i) rgb.data<uint8_t>()[i] = WarmUpByte(i);
  if (worker != nullptr) {
    IRIS_RETURN_IF_ERROR(worker->Submit(std::move(rgb), {grid}, normalization));
    return worker->Wait().images.status();
  }
  return encoder.ForwardRgb(rgb, std::span<const vision::GridThw>(&grid, 1), normalization).status();
}

// A forward at max_patches(), then one at each smaller patch count the encoder's device asks for.
absl::Status WarmUpEncoder(vision::VisionEncoder& encoder, const core::VisionConfig& config, EncoderWorker* worker,
                           const kernels::Device& device, const vision::PixelNormalization& normalization) {
  std::vector<int64_t> counts = device.WarmUpRowCounts(encoder.max_patches());
  std::reverse(counts.begin(), counts.end());
  for (const int64_t n : counts) IRIS_RETURN_IF_ERROR(WarmUpEncoderForward(encoder, config, worker, n, normalization));
  return absl::OkStatus();
}

}  // namespace

absl::Status WarmUp(Model& model, llm::KvCache& cache, EncoderWorker* encoder_worker) {
  if (model.encoder != nullptr) {
    if (absl::Status s = WarmUpEncoder(*model.encoder, model.config.vision, encoder_worker, model.encoder_runs_on(),
                                       model.pixel_normalization());
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("warm-up encoder forward: ", s.message()));
    }
  }
  if (absl::Status s = WarmUpDecoder(*model.decoder, cache, *model.device); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("warm-up decoder step: ", s.message()));
  }
  IRIS_RETURN_IF_ERROR(model.encoder_runs_on().status());
  return model.device->status();
}

}  // namespace iris::engine
