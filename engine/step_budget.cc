#include "engine/step_budget.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace iris::engine {
namespace {

constexpr double kDecay = 0.95;   // per observation: about the last 20 steps count
constexpr double kMinSlope = 1e-4;  // ms per row: a floor so that allowances stay finite

}  // namespace

void StepBudget::ObserveDecoder(int64_t rows, double ms) {
  const double x = static_cast<double>(rows);
  s0_ = kDecay * s0_ + 1;
  sx_ = kDecay * sx_ + x;
  sy_ = kDecay * sy_ + ms;
  sxx_ = kDecay * sxx_ + x * x;
  sxy_ = kDecay * sxy_ + x * ms;
}

void StepBudget::ObserveEncoder(double flops, double ms) {
  if (flops <= 0 || ms <= 0) return;
  const double rate = ms / flops;
  encoder_ms_per_flop_ = encoder_ms_per_flop_ == 0 ? rate : 0.8 * encoder_ms_per_flop_ + 0.2 * rate;
}

void StepBudget::Fit(double* a, double* b) const {
  *a = 0;
  *b = 0;
  if (s0_ <= 0) return;
  const double det = s0_ * sxx_ - sx_ * sx_;
  // Rows that hardly varied give no slope: then all the time is per row (an upper bound).
  if (det > 1e-9 * s0_ * sxx_) {
    *b = (s0_ * sxy_ - sx_ * sy_) / det;
    *a = (sy_ - *b * sx_) / s0_;
  }
  if (*b < kMinSlope || *a < 0) {
    *b = std::max(kMinSlope, sx_ > 0 ? sy_ / sx_ : kMinSlope);
    *a = std::max(0.0, (sy_ - *b * sx_) / s0_);
  }
}

double StepBudget::decoder_fixed_ms() const {
  double a, b;
  Fit(&a, &b);
  return a;
}

double StepBudget::decoder_ms_per_row() const {
  double a, b;
  Fit(&a, &b);
  return b;
}

StepSlices StepBudget::Next(int64_t decode_rows, bool prefill_pending, bool encoder_pending) const {
  StepSlices s;
  s.encoder_flops = std::numeric_limits<double>::infinity();
  double a, b;
  Fit(&a, &b);
  // Nothing decoding (no one to delay), or nothing measured yet: unbounded.
  if (decode_rows == 0 || s0_ <= 0) return s;
  const double decode_ms = a + b * static_cast<double>(decode_rows);
  s.target_ms = options_.step_budget_ms > 0 ? options_.step_budget_ms
                                            : std::max(options_.min_step_ms, 2 * decode_ms);
  const double spare = std::max(0.0, s.target_ms - decode_ms);
  const int sides = (prefill_pending ? 1 : 0) + (encoder_pending ? 1 : 0);
  const double share = sides > 0 ? spare / sides : 0;
  s.prefill_tokens = std::max<int64_t>(options_.min_prefill_tokens, static_cast<int64_t>(share / b));
  // Unmeasured encoder: one piece (Advance runs at least one) tells its rate.
  s.encoder_flops = encoder_ms_per_flop_ > 0 ? share / encoder_ms_per_flop_ : 0;
  return s;
}

}  // namespace iris::engine
