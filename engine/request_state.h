// A request in flight on the engine thread: the scheduler's Sequence plus what running it and
// turning its logits into outputs need (the request, image embeddings, sampler, detokenizer, stop
// checker, timings), and the outbox that hands a step's outputs out once per request.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/tensor.h"
#include "engine/request.h"
#include "engine/sequence.h"
#include "llm/incremental_detokenizer.h"
#include "llm/sampler.h"

namespace iris::engine {

struct RequestState : Sequence {
  Request req;
  std::vector<std::shared_ptr<const core::Tensor>> image_embeds;  // per prompt image once attached
  std::unique_ptr<llm::Sampler> sampler;
  std::unique_ptr<llm::StopChecker> stop;
  std::unique_ptr<llm::IncrementalDetokenizer> detok;
  int64_t num_generated = 0;
  bool logits_captured = false;
  // The output gathered during a step (see Outbox).
  RequestOutput pending;
  bool has_pending = false;
  // Timings.
  absl::Time arrival;
  absl::Time first_scheduled = absl::InfinitePast();
  absl::Time prompt_done = absl::InfinitePast();
  absl::Time first_token = absl::InfinitePast();
  double encode_ms = 0;

  // Makes `pending` the final output: finish reason, status, held-back text (on length and
  // cancel), usage and timings.
  void SetFinal(llm::FinishReason reason, const absl::Status& status);

  // Nobody asked for its logits themselves, and its next token is their argmax or (with
  // `device_draws`) a draw a device can make: the decoder may pick it where the logits are
  // (DecoderBatch::picks_only).
  bool PicksWhereLogitsAre(bool device_draws) const {
    return (sampler->PicksByArgmax() || device_draws) && !(req.capture_prompt_logits && !logits_captured);
  }
};

// The engine only gives the scheduler RequestStates.
inline RequestState& AsRequest(Sequence* seq) { return static_cast<RequestState&>(*seq); }

// Outputs gathered during a step, handed out together at its end: one per request per step.
struct Outbox {
  // `s`'s output for this step, started on first use.
  RequestOutput& For(RequestState& s);
  // Calls each request's callback once with its output, then drops the finished requests.
  void Deliver();

  std::vector<RequestState*> ready;  // in the order they got an output
  std::vector<std::unique_ptr<Sequence>> finished;  // ended since the last delivery
};

}  // namespace iris::engine
