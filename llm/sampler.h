// Next-token selection for one request: greedy or sampled (temperature, top-k, top-p) with a
// per-request seed, HF's repetition penalty, and the stop rules (stop ids, stop strings,
// max_tokens, ignore_eos) that end a generation with a reported finish reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/logit_edits.h"
#include "kernels/row_draw.h"

namespace iris::llm {

struct SamplingParams {
  // temperature 0 (or top_k 1) = greedy. Otherwise logits / temperature, then top-k, then top-p
  // (the smallest set of most likely tokens whose probability reaches top_p), then one draw.
  float temperature = 0.f;
  int top_k = 0;        // 0 = off
  float top_p = 1.f;    // 1 = off
  std::optional<uint64_t> seed;  // same seed + same logits = same tokens; unset = random
  // HF's rule: for every id present in the prompt or generated so far,
  // score < 0 ? score * penalty : score / penalty. 1 = off.
  float repetition_penalty = 1.f;
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS ids (unless ignore_eos)
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;
  // vLLM's min_tokens: until this many tokens are generated, the end ids (EOS unless ignore_eos,
  // and stop_token_ids) are masked out of sampling and stop strings are not looked for.
  int64_t min_tokens = 0;

  static constexpr size_t kMaxStopStrings = 16;
  static constexpr size_t kMaxStopStringBytes = 256;

  // INVALID_ARGUMENT naming the field and its range: temperature in [0, 100], top_k >= 0,
  // top_p in (0, 1], repetition_penalty in (0, 10], max_tokens >= 1, stop_token_ids >= 0, at most
  // kMaxStopStrings stop strings, each non-empty and at most kMaxStopStringBytes bytes.
  absl::Status Validate() const;
  bool greedy() const { return temperature == 0.f || top_k == 1; }
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "cancelled", "error", ""

class Sampler {
 public:
  // `prompt_ids` seed the repetition-penalty set (image pads included, as HF does); `eos_ids`
  // are masked, with the stop ids, while fewer than params.min_tokens tokens are generated.
  Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt_ids,
          absl::Span<const int32_t> eos_ids = {});

  // Picks the next token from `logits` (vocab > 0 floats; modified in place by the penalty and
  // temperature) and records it as generated. Order as HF generate: repetition penalty, then
  // argmax if greedy (lowest id wins ties), else temperature, top-k (ties with the k-th value are
  // kept, as HF and vLLM do), top-p (on the softmax of what top-k kept), softmax, one draw
  // u = (rng() >> 11) * 2^-53 from the request's generator, walking the kept tokens in
  // kernels/sample_rows.h's order. NaN logits count as -inf.
  int32_t Sample(float* logits, int64_t vocab);

  // True when Sample's next pick is the argmax of the logits once AddEdits' edits are applied
  // (greedy; with a repetition penalty or end ids masked for min_tokens, those are the edits), so
  // a device can pick it (kernels::EditLogitRows, kernels::ArgmaxRows) without the logits
  // leaving it.
  bool PicksByArgmax() const { return params_.greedy(); }
  // Appends this request's row of edits for its next pick to `edits`: the penalty on every id
  // seen so far, the end ids while fewer than min_tokens are generated (Sample's order and rule).
  void AddEdits(kernels::LogitEdits& edits) const;
  // The next pick's settings and uniform for a device to draw it where the logits are
  // (kernels::SampleRows, after AddEdits' edits): the generator advances as Sample's would, and
  // the device's pick is the one Sample makes from the same logits (up to the rounding of sums).
  // Follow it with Accept.
  kernels::RowDraw NextDraw();
  // Records `id`, picked elsewhere (the argmax while PicksByArgmax(), or NextDraw's draw), as
  // Sample would have.
  void Accept(int32_t id);

  const SamplingParams& params() const { return params_; }

 private:
  int32_t SampleFiltered(const float* logits, int64_t vocab, double u);  // u: the draw's uniform
  // The softmax draw over the whole row in id order, from probs_ and chunk_mass_ (ExpShiftedRow;
  // `total` its result).
  int32_t DrawInIdOrder(int64_t vocab, double total, double u);
  // top-p's draw from a flat row: the nucleus is every token of probs_ above `last` and as many
  // tokens equal to it, in id order, as the mass `need` takes (chunk_mass_ is overwritten).
  int32_t DrawAboveAndTies(int64_t vocab, float last, double need, double u);
  // The draws' walk over the tokens of probs_ above `floor` in id order, adding their mass to cum
  // and stepping over a chunk by its chunk_mass_ (which must be that chunk's mass above floor):
  // the first token at which cum passes `target`, or -1.
  int64_t WalkAbove(int64_t vocab, float floor, double target, double& cum) const;
  int32_t LastAbove(int64_t vocab, float floor) const;  // the last token above floor, else 0
  // Cuts `scratch_` to the top-p nucleus: its first `always` entries are kept, the rest are in
  // descending order; `total` is the candidates' mass (<= 0: the sum of `scratch_`).
  void KeepNucleus(size_t always, double total);
  double NucleusMass(double total) const;  // the mass top-p must reach
  float KthLargest(const float* logits, int64_t vocab, int64_t k);  // NaN as -inf; uses scratch_
  double Uniform();  // [0, 1), the same on every standard library

  SamplingParams params_;
  std::vector<int32_t> masked_before_min_;  // end ids, masked while generated_ < min_tokens
  int64_t generated_ = 0;
  absl::flat_hash_set<int32_t> seen_;  // prompt + generated ids (kept only with a penalty)
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;  // candidates (value, id), reused per call
  std::vector<float> probs_;                        // unnormalized probabilities, reused per call
  std::vector<int64_t> counts_;                     // top-k histograms of logit bits
  std::vector<double> mass_;                        // top-p histograms of probability mass
  std::vector<double> chunk_mass_;                  // probs_'s chunk sums (kernels/logit_scan.h)
};

// Decides when a generation ends. Fed each generated id and the text it completed (from the
// incremental detokenizer); returns the text to emit for that step, which is cut before a stop
// string and held back while the tail might still be the start of one (so a stop string never
// reaches the client, as in vLLM).
class StopChecker {
 public:
  // `eos_ids`: the model's end ids (generation_config.json's eos_token_id list).
  StopChecker(const SamplingParams& params, std::vector<int32_t> eos_ids);

  struct Step {
    std::string text;                  // safe to emit now
    FinishReason finish = FinishReason::kNone;
    std::string matched_stop;          // the stop string or "" (stop by id or length)
  };
  // `num_generated` counts this token. A stop id ends the generation and contributes no text
  // (text held back so far is released in that step). A stop string may span several pushes;
  // the earliest match wins. Reaching max_tokens without a stop finishes kLength and releases
  // the held text.
  Step Push(int32_t id, std::string_view text, int64_t num_generated);
  // At the end (finish by length or cancel): whatever was held back.
  std::string Flush();

 private:
  SamplingParams params_;
  std::vector<int32_t> eos_ids_;
  std::string held_;
};

}  // namespace iris::llm
