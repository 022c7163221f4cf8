#include "kernels/cuda/matmul_tuning.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace iris::kernels::cuda {

int64_t MatmulRowBucket(int64_t m) {
  return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(m, 1))));
}

std::vector<int64_t> MatmulTuneWarmUpRows(int64_t max_rows) {
  std::vector<int64_t> rows;
  for (int64_t b = kMatmulTuneMinRows; b < max_rows; b *= 2) rows.push_back(b);
  rows.push_back(max_rows);
  return rows;
}

std::optional<TunedChoice> PickFastestCandidate(int n, int rounds,
                                                const std::function<std::optional<double>(int)>& time) {
  if (n <= 0 || rounds <= 0) return std::nullopt;
  std::vector<std::vector<double>> seconds(n);
  std::vector<bool> failed(n, false);
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < n; ++i) {
      if (failed[i]) continue;
      const std::optional<double> t = time(i);
      if (!t.has_value()) {
        failed[i] = true;
        continue;
      }
      seconds[i].push_back(*t);
    }
  }
  TunedChoice choice;
  choice.medians.assign(n, std::numeric_limits<double>::infinity());
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (failed[i]) continue;
    std::vector<double>& v = seconds[i];
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    choice.medians[i] = v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
    if (best < 0 || choice.medians[i] < choice.medians[best]) best = i;
  }
  if (best < 0) return std::nullopt;
  choice.index = best;
  return choice;
}

std::optional<MatmulAlgoBits> MatmulAlgoTable::Find(const MatmulTuneKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second.algo;
}

void MatmulAlgoTable::Store(const TunedMatmul& tuned) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.insert_or_assign(tuned.key, tuned);
}

std::vector<TunedMatmul> MatmulAlgoTable::Entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TunedMatmul> out;
  out.reserve(entries_.size());
  for (const auto& [key, tuned] : entries_) out.push_back(tuned);
  return out;
}

}  // namespace iris::kernels::cuda
