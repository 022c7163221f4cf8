// The CPU op of kernels::SampleRows: each step of the draw (kernels/sample_rows.h) as its
// definition reads, without the shortcuts of llm::Sampler (chunk skips, radix selects) or of the
// CUDA kernel (threshold searches): a third way to the same picks, which the tests hold the other
// two to.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/logit_scan.h"

namespace iris::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// The first index of the largest value, NaN never winning; 0 when nothing is above -inf (the
// greedy pick's op).
int32_t Argmax(CpuDevice& dev, const float* x, int64_t n) {
  int32_t id = 0;
  ArgmaxRows(dev, x, 1, n, &id);
  return id;
}

int32_t DrawRow(CpuDevice& dev, float* x, int64_t vocab, const RowDraw& d) {
  if (d.greedy()) return Argmax(dev, x, vocab);
  float m = kNegInf;
  for (int64_t i = 0; i < vocab; ++i) {
    x[i] = NanAsNegInf(x[i]) / d.temperature;
    m = std::max(m, x[i]);
  }
  if (m == kNegInf || m == kPosInf) return Argmax(dev, x, vocab);

  // The candidates: values >= the k-th largest.
  float kth = kNegInf;
  if (d.top_k > 0 && d.top_k < vocab) {
    std::vector<float> sorted(x, x + vocab);
    std::nth_element(sorted.begin(), sorted.begin() + (d.top_k - 1), sorted.end(), std::greater<float>());
    kth = sorted[static_cast<size_t>(d.top_k - 1)];
  }
  std::vector<float> q(static_cast<size_t>(vocab));
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    q[i] = x[i] >= kth ? Exp(x[i] - m) : 0.f;
    total += q[i];
  }

  // The nucleus: the prefix of the tokens by (q descending, id ascending) whose mass reaches
  // `need`; `last` is its last value and `ties` how many of its values equal it.
  float last = 0.f;
  int64_t ties = 0;
  if (d.top_p < 1.f) {
    const double need = NucleusNeed(d.top_p, total);
    std::vector<std::pair<float, int32_t>> order;
    for (int64_t i = 0; i < vocab; ++i) {
      if (q[i] > 0.f) order.emplace_back(q[i], static_cast<int32_t>(i));
    }
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    double cum = 0.0;
    size_t kept = order.size();
    for (size_t j = 0; j < order.size(); ++j) {
      cum += order[j].first;
      if (cum >= need) {
        kept = j + 1;
        break;
      }
    }
    last = order[kept - 1].first;
    for (size_t j = 0; j < kept; ++j) ties += order[j].first == last ? 1 : 0;
  }

  double nucleus = 0.0;
  for (int64_t i = 0; i < vocab; ++i) nucleus += q[i] > last ? q[i] : 0.0;
  for (int64_t t = 0; t < ties; ++t) nucleus += last;
  const double target = d.uniform * nucleus;
  double cum = 0.0;
  int64_t final_token = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!(q[i] > last)) continue;
    cum += q[i];
    final_token = i;
    if (target < cum) return static_cast<int32_t>(i);
  }
  for (int64_t i = 0, seen = 0; i < vocab && seen < ties; ++i) {
    if (q[i] != last) continue;
    ++seen;
    cum += last;
    final_token = i;
    if (target < cum) return static_cast<int32_t>(i);
  }
  // Only when rounding put the target at the very end: the walk's last token.
  return final_token >= 0 ? static_cast<int32_t>(final_token) : 0;
}

}  // namespace

void SampleRows(CpuDevice& dev, float* logits, int64_t rows, int64_t vocab, const RowDraw* draws, int32_t* out) {
#pragma omp parallel for num_threads(dev.threads()) schedule(dynamic, 1) if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) out[r] = DrawRow(dev, logits + r * vocab, vocab, draws[r]);
}

}  // namespace iris::kernels::cpu
