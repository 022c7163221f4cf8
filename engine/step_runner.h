// Runs a StepPlan on the model: the plan's images in one varlen encoder forward (their embeddings
// go to the encoder cache and to the admitted sequences), then one decoder forward over the plan's
// rows. It samples nothing and changes no sequence's progress: that is ProcessOutputs' job.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "engine/encoder_cache.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "llm/decoder.h"
#include "llm/kv_cache.h"

namespace iris::engine {

struct StepResult {
  // Admitted sequences left without their image embeddings (the encoder failed), with why. They
  // are not in the decoder forward.
  absl::flat_hash_map<const Sequence*, absl::Status> image_errors;
  // The decoder forward failed: every sequence in it ends with this.
  absl::Status decoder_status;
  // float32 [rows that sample, vocab]: one row per sampling work item that ran, in plan order.
  core::Tensor logits;

  // For the stats.
  int64_t images_encoded = 0;     // in this step's encoder forward (0: there was none)
  double encode_ms = 0;
  int64_t encoder_cache_hits = 0;   // admitted sequences' images found cached or already in the batch
  int64_t encoder_cache_misses = 0;

  bool ran(const ScheduledWork& w) const { return !image_errors.contains(w.seq); }
};

class StepRunner {
 public:
  // The model, caches and plans' sequences (RequestStates) outlive the runner.
  StepRunner(Model* model, llm::KvCache* cache, EncoderCache* encoder_cache)
      : model_(model), cache_(cache), encoder_cache_(encoder_cache) {}

  StepResult Run(const StepPlan& plan);

 private:
  void EncodeImages(const StepPlan& plan, StepResult& result);
  // The decoder call: `work`'s rows as one DecoderBatch (token ids, M-RoPE positions, KV slots and
  // block tables, image rows from the sequences' embeddings), one forward, logits of the rows that
  // sample (the decoder's buffer: valid until the next step).
  absl::StatusOr<core::Tensor> RunDecoder(const std::vector<ScheduledWork>& work);

  Model* model_;
  llm::KvCache* cache_;
  EncoderCache* encoder_cache_;
  llm::DecoderBatch batch_;  // refilled every step; its vectors keep their capacity
};

}  // namespace iris::engine
