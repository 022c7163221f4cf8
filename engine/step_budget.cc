#include "engine/step_budget.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace iris::engine {
namespace {

constexpr double kDecay = 0.95;     // per observation: about the last 20 steps count
constexpr double kMinSlope = 1e-4;  // ms per row: a floor so that allowances stay finite

double Det3(const double m[3][3]) {
  return m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) +
         m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
}

}  // namespace

void StepBudget::ObserveDecoder(int64_t tokens, int64_t logit_rows, double ms) {
  const double x[3] = {1, static_cast<double>(tokens), static_cast<double>(logit_rows)};
  for (int i = 0; i < 3; ++i) {
    v_[i] = kDecay * v_[i] + x[i] * ms;
    for (int j = 0; j < 3; ++j) m_[i][j] = kDecay * m_[i][j] + x[i] * x[j];
  }
}

void StepBudget::ObserveEncoder(double flops, double ms) {
  if (flops <= 0 || ms <= 0) return;
  const double rate = ms / flops;
  encoder_ms_per_flop_ = encoder_ms_per_flop_ == 0 ? rate : 0.8 * encoder_ms_per_flop_ + 0.2 * rate;
}

DecoderCost StepBudget::decoder_cost() const {
  DecoderCost c;
  const double s0 = m_[0][0];
  if (s0 <= 0) return c;
  // Three parameters when the steps seen vary tokens and logit rows independently (prefill
  // chunks beside decode rows)...
  const double det = Det3(m_);
  const double scale = m_[0][0] * m_[1][1] * m_[2][2];
  if (det > 1e-6 * scale) {
    double sol[3];
    for (int k = 0; k < 3; ++k) {
      double mk[3][3];
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) mk[i][j] = j == k ? v_[i] : m_[i][j];
      }
      sol[k] = Det3(mk) / det;
    }
    if (sol[0] >= 0 && sol[1] >= kMinSlope && sol[2] >= 0) return {sol[0], sol[1], sol[2]};
  }
  // ...otherwise a line in tokens alone, every row costed like a decode row (an upper bound for
  // prefill rows); rows that hardly varied give no slope: then all the time is per row.
  const double sx = m_[0][1], sxx = m_[1][1], sy = v_[0], sxy = v_[1];
  const double det2 = s0 * sxx - sx * sx;
  double a = 0, b = 0;
  if (det2 > 1e-9 * s0 * sxx) {
    b = (s0 * sxy - sx * sy) / det2;
    a = (sy - b * sx) / s0;
  }
  if (b < kMinSlope || a < 0) {
    b = std::max(kMinSlope, sx > 0 ? sy / sx : kMinSlope);
    a = std::max(0.0, (sy - b * sx) / s0);
  }
  return {a, b, 0};
}

StepSlices StepBudget::Next(int64_t decode_rows, bool prefill_pending, bool encoder_pending) const {
  StepSlices s;
  s.encoder_flops = std::numeric_limits<double>::infinity();
  // Nothing decoding (no one to delay), or nothing measured yet: unbounded.
  if (decode_rows == 0 || m_[0][0] <= 0) return s;
  const DecoderCost cost = decoder_cost();
  const double decode_ms = cost.fixed_ms + cost.decode_row_ms() * static_cast<double>(decode_rows);
  s.target_ms = options_.step_budget_ms > 0 ? options_.step_budget_ms
                                            : std::max(options_.min_step_ms, 2 * decode_ms);
  const double spare = std::max(0.0, s.target_ms - decode_ms);
  const int sides = (prefill_pending ? 1 : 0) + (encoder_pending ? 1 : 0);
  const double share = sides > 0 ? spare / sides : 0;
  s.prefill_tokens = std::max<int64_t>(
      options_.min_prefill_tokens,
      static_cast<int64_t>(std::min(share / cost.token_ms, static_cast<double>(INT64_MAX / 2))));
  // Unmeasured encoder: one piece (Advance runs at least one) tells its rate.
  s.encoder_flops = encoder_ms_per_flop_ > 0 ? share / encoder_ms_per_flop_ : 0;
  return s;
}

}  // namespace iris::engine
