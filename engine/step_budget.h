// How much encoder and prefill work one engine step may take on beside the running requests'
// decode rows, so that a step — and so every running request's next token — stays near a time
// target. Learns the costs from measured steps: the decoder's time as a + b·tokens + c·logit_rows
// (exponentially weighted least squares: a prefill row costs b, a decode row b + c, since only
// rows that sample pay for the lm_head — on a CPU most of a decode row's cost), the encoder's as
// milliseconds per FLOP (its pieces report their FLOPs).
//
// Policy: decode rows always run; with nothing decoding there is no one to delay, so the step is
// unbounded. Otherwise the target is --step-budget-ms, or (0, auto) twice the estimated
// decode-only step; what the decode rows leave is split evenly between encoder and prefill work
// when both are pending (all to one when only it is), and each gets at least a minimum slice
// (one encoder piece, min_prefill_tokens) however tight the target, so neither side starves.
#pragma once

#include <cstdint>

namespace iris::engine {

struct StepBudgetOptions {
  double step_budget_ms = 0;       // 0: auto (twice the decode-only step, at least min_step_ms)
  double min_step_ms = 20;         // auto's floor
  int64_t min_prefill_tokens = 32; // a prefill slice never smaller (when prefill is pending)
};

struct StepSlices {
  int64_t prefill_tokens = INT64_MAX;  // cap on prefill rows this step
  double encoder_flops = 0;            // allowance for the encode job (inf: unbounded)
  double target_ms = 0;                // 0: unbounded step
};

// The decoder's learned cost line.
struct DecoderCost {
  double fixed_ms = 0;      // per forward, whatever its rows (reading the weights)
  double token_ms = 0;      // per row
  double logit_row_ms = 0;  // per row whose logits are computed (the lm_head)
  double decode_row_ms() const { return token_ms + logit_row_ms; }
};

class StepBudget {
 public:
  explicit StepBudget(const StepBudgetOptions& options) : options_(options) {}

  StepSlices Next(int64_t decode_rows, bool prefill_pending, bool encoder_pending) const;

  // A decoder forward over `tokens` rows, `logit_rows` of them sampled, took `ms`; an encoder
  // slice of `flops` took `ms`.
  void ObserveDecoder(int64_t tokens, int64_t logit_rows, double ms);
  void ObserveEncoder(double flops, double ms);

  // The learned costs (for stats and tests).
  DecoderCost decoder_cost() const;
  bool measured() const { return m_[0][0] > 0; }  // a decoder step observed
  double encoder_ms_per_gflop() const { return encoder_ms_per_flop_ * 1e9; }

 private:
  StepBudgetOptions options_;
  // Weighted moments of (1, tokens, logit rows) and ms; weights decay by kDecay per observation.
  double m_[3][3] = {};
  double v_[3] = {};
  double encoder_ms_per_flop_ = 0;  // 0: not measured yet
};

}  // namespace iris::engine
