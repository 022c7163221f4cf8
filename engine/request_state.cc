#include "engine/request_state.h"

#include <utility>

#include "absl/time/clock.h"

namespace iris::engine {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

void RequestState::SetFinal(llm::FinishReason reason, const absl::Status& status) {
  RequestOutput& out = pending;
  out.request_id = req.id;
  out.finished = true;
  out.finish_reason = status.ok() ? reason : (reason == llm::FinishReason::kCancelled ? reason : llm::FinishReason::kError);
  out.status = status;
  if (reason == llm::FinishReason::kLength || reason == llm::FinishReason::kCancelled) {
    out.text += detok->Flush();
    out.text += stop->Flush();
  }
  out.usage.prompt_tokens = prompt_len;
  out.usage.image_tokens = req.prompt.num_image_tokens();
  out.usage.completion_tokens = num_generated;
  const absl::Time now = absl::Now();
  Timings& t = out.timings;
  if (first_scheduled != absl::InfinitePast()) {
    t.queue_ms = Ms(first_scheduled - arrival);
    if (prompt_done != absl::InfinitePast()) t.prefill_ms = Ms(prompt_done - first_scheduled);
  } else {
    t.queue_ms = Ms(now - arrival);
  }
  t.encode_ms = encode_ms;
  if (first_token != absl::InfinitePast()) t.first_token_ms = Ms(first_token - arrival);
  t.total_ms = Ms(now - arrival);
}

RequestOutput& Outbox::For(RequestState& s) {
  if (!s.has_pending) {
    s.has_pending = true;
    s.pending.request_id = s.req.id;
    ready.push_back(&s);
  }
  return s.pending;
}

void Outbox::Deliver() {
  for (RequestState* s : ready) {
    s->has_pending = false;
    if (s->req.on_output) s->req.on_output(std::move(s->pending));
    s->pending = RequestOutput{};
  }
  ready.clear();
  finished.clear();
}

}  // namespace iris::engine
