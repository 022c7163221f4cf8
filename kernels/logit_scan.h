// The passes llm::Sampler makes over a whole row of logits (152k values for Qwen2) to pick a
// sampled token: host code on host memory (the sampler runs on the host whatever the device),
// vectorized (AVX2, the build's baseline, and the portable CPU kernels' exp). The row's maximum,
// e^(x - max) with its sums by chunk, the mass above a threshold, and the largest value of a chunk
// (so a scan for the few values above a threshold can skip the chunks that hold none). A pick made
// one value at a time with libm's exp and one running double sum took 0.4-0.8 ms a row, which for
// a batch of 64 sampled rows is longer than a GPU decode step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace iris::kernels {

// Values a row is scanned in, per chunk max or chunk sum.
constexpr int64_t kLogitChunk = 256;

// x, or -inf where x is NaN (a NaN logit counts as -inf: it is never picked).
inline float NanAsNegInf(float x) { return x == x ? x : -std::numeric_limits<float>::infinity(); }

// The largest value of x[0, n), NaN as -inf; -inf for n == 0.
float RowMax(const float* x, int64_t n);

// e^x as each lane of the portable CPU kernels' Exp8 computes it (kernels/exp_lane.h: about 1
// ulp, exactly 0 below -88 and for -inf, e^0 = 1): bit for bit ExpShiftedRow's values, and a
// device's (kernels::SampleRows).
float Exp(float x);

// probs[i] = Exp(NanAsNegInf(logits[i]) - shift) for i < n (8 values at a time by the portable
// kernels' Exp8), and chunk_sums[c] = the sum, in double, of probs' chunk c (values
// [c kLogitChunk, (c + 1) kLogitChunk)). Returns the sum of the chunk sums in chunk order: the
// total a walk over the chunk sums reaches at the end.
double ExpShiftedRow(const float* logits, int64_t n, float shift, float* probs, std::vector<double>& chunk_sums);

// For probabilities (values >= 0, no NaN): chunk_sums[c] = the sum, in double, of chunk c's values
// above `threshold`; *ties = how many values equal it. Returns the sum of the chunk sums in chunk
// order.
double MassAbove(const float* probs, int64_t n, float threshold, std::vector<double>& chunk_sums, int64_t* ties);

}  // namespace iris::kernels
