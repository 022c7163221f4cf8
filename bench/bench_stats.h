// The statistics the benchmarks report their runs by.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace iris::bench {

// The median of v (the mean of the middle two for an even count); v non-empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace iris::bench
