// The SIMT suites run three times in CI: in the plain build (the values, over many shapes), under
// ASan + UBSan (scripts/sanitize.sh: an access outside a buffer) and under ThreadSanitizer
// (scripts/racecheck.sh: two threads of a block on one address with no barrier between). Under a
// sanitizer the harness runs 3-10x slower, and what the sanitizers look for shows in one shape
// per code path of a kernel: so there the heaviest tests run only the cases that between them
// take every path (each test names which, and why), and the plain build runs them all.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <initializer_list>
#include <vector>

namespace iris::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSimtSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSimtSanitized = true;
#else
inline constexpr bool kSimtSanitized = false;
#endif
#else
inline constexpr bool kSimtSanitized = false;
#endif

// Every case of `all`; under a sanitizer only those at the indices `kept`.
template <typename T, size_t N>
std::vector<T> SimtCases(const T (&all)[N], std::initializer_list<size_t> kept) {
  if (!kSimtSanitized) return std::vector<T>(all, all + N);
  std::vector<T> cases;
  for (const size_t i : kept) {
    if (i < N) {
      cases.push_back(all[i]);
    } else {
      ADD_FAILURE() << "kept case " << i << " of " << N;
    }
  }
  return cases;
}

}  // namespace iris::testing
