// Runs a StepPlan on the model: encoder work, then one decoder forward over the plan's rows. The
// encoder work is either the plan's images in one varlen forward for the admitted sequences
// (interleave_encoder off, no worker), or the encode job in flight: a job starts when a plan lists
// images and, at its end, puts the embeddings in the encoder cache and hands them to the waiting
// sequences it was for. A job runs either here, a slice per step by the step's FLOP allowance
// (interleave_encoder on), or on the EncoderWorker, beside the steps (a step only polls it). It
// samples nothing and changes no sequence's progress: that is ProcessOutputs' job.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "engine/encoder_cache.h"
#include "engine/encoder_worker.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "llm/decoder.h"
#include "llm/kv_cache.h"
#include "vision/encoder_plan.h"

namespace iris::engine {

struct RequestState;

struct StepResult {
  // Admitted sequences left without their image embeddings (the encoder failed), with why. They
  // are not in the decoder forward.
  absl::flat_hash_map<const Sequence*, absl::Status> image_errors;
  // The decoder forward failed: every sequence in it ends with this.
  absl::Status decoder_status;
  // float32 [rows that sample, vocab]: one row per sampling work item that ran, in plan order; or,
  // when every one of them is picked where the logits are (RequestState::PicksWhereLogitsAre),
  // int32 [rows that sample]: the picks themselves.
  core::Tensor logits;

  // Interleaved: waiting sequences (by id) whose encode job failed, with why.
  std::vector<std::pair<std::string, absl::Status>> job_errors;
  bool encode_job_ended = false;  // the job in flight ended this step (done, failed or abandoned)
  int64_t decoder_rows = 0;       // the decoder forward's rows and time (0: none ran)
  int64_t decoder_logit_rows = 0; // of those rows, the ones sampled (their logits computed)
  double decoder_ms = 0;
  double encoder_flops = 0;       // encoder work run this step (interleaved), and its time
  double encoder_slice_ms = 0;

  // For the stats.
  int64_t images_encoded = 0;     // by the encoder forward that ended this step (0: none did)
  double encode_ms = 0;           // that forward's time (all its slices)
  int64_t encoder_cache_hits = 0;   // admitted sequences' images found cached or already in the batch
  int64_t encoder_cache_misses = 0;

  bool ran(const ScheduledWork& w) const { return !image_errors.contains(w.seq); }
};

class StepRunner {
 public:
  // The model, caches and plans' sequences (RequestStates) outlive the runner.
  // `scheduler` finds the sequences an encode job is for (they may finish while it runs).
  // `interleave_encoder` as the scheduler's option of that name. `worker` (may be null; outlives
  // the runner): encode jobs run there instead of in slices on this thread. `sample_on_device`:
  // EngineOptions::sample_on_device, resolved.
  StepRunner(Model* model, llm::KvCache* cache, EncoderCache* encoder_cache, const Scheduler* scheduler,
             bool interleave_encoder, EncoderWorker* worker = nullptr, bool sample_on_device = false);
  ~StepRunner();

  // `encoder_flops`: how much of the encode job in flight this step may run here (at least one
  // piece; unused when the job runs on the worker).
  StepResult Run(const StepPlan& plan, double encoder_flops = std::numeric_limits<double>::infinity());
  bool encoding() const { return job_ != nullptr; }
  // Whether images are encoded by jobs (interleaved, or on the worker) rather than in the step
  // that admits their request.
  bool encode_jobs() const { return interleave_encoder_ || worker_ != nullptr; }

 private:
  struct EncodeJob;
  // Embeddings made by this step's encoder work, by content hash.
  using Embeddings = absl::flat_hash_map<std::string, std::shared_ptr<const core::Tensor>>;
  // What AttachImages did: images the sequence still needed, those it got, whether any came fresh.
  struct Attached {
    int64_t needed = 0;
    int64_t attached = 0;
    bool from_fresh = false;
  };

  void EncodeImages(const StepPlan& plan, StepResult& result);
  // One image's embeddings (VisionEncoder::FinishImages makes them apart), into the encoder cache
  // and `fresh`, as they are.
  void StoreEmbeddings(core::Tensor image, const std::string& content_hash, Embeddings& fresh);
  // Gives `s` the embeddings of each image it still needs, from `fresh` or the cache; an image in
  // neither stays unattached.
  Attached AttachImages(RequestState& s, const Embeddings& fresh);
  // Admitted sequences take their embeddings from `fresh` (this step's forward) or the cache.
  void AttachAdmitted(const StepPlan& plan, const Embeddings& fresh, double encode_ms, const absl::Status& status,
                      StepResult& result);
  // Interleaved encoding: start the plan's job, advance the one in flight, end it.
  void StartJob(const StepPlan& plan, StepResult& result);
  void AdvanceJob(double encoder_flops, StepResult& result);
  void EndJob(absl::StatusOr<std::vector<core::Tensor>> out, StepResult& result);
  // Stops the job's forward where it runs (the worker, or this thread's encoder).
  void StopJobWork();
  // The images' bytes packed into one tensor (VisionEncoder::BeginRgb's input) and their grids, in order.
  static void GatherRgb(const std::vector<ImageToEncode>& images, core::Tensor* rgb,
                        std::vector<vision::GridThw>* grids);
  // The decoder call: `work`'s rows as one DecoderBatch (token ids, M-RoPE positions, KV slots and
  // block tables, image rows from the sequences' embeddings), one forward, logits of the rows that
  // sample (the decoder's buffer: valid until the next step).
  absl::StatusOr<core::Tensor> RunDecoder(const std::vector<ScheduledWork>& work);

  Model* model_;
  llm::KvCache* cache_;
  EncoderCache* encoder_cache_;
  const Scheduler* scheduler_;
  bool interleave_encoder_;
  bool sample_on_device_;
  EncoderWorker* worker_;
  llm::DecoderBatch batch_;  // refilled every step; its vectors keep their capacity
  std::unique_ptr<EncodeJob> job_;  // the encode job in flight (interleaved)
};

}  // namespace iris::engine
