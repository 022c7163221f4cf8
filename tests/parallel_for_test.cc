// core::ParallelFor calls the body once per item whatever the pool, and core::ParallelCopy equals
// memcpy on sizes below, at and across its 1 MiB pieces.
#include "core/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace iris::core {
namespace {

TEST(ParallelForTest, EveryItemOnceOnAWorkerInRange) {
  for (const int n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> calls(static_cast<size_t>(n));
    std::atomic<bool> worker_in_range{true};
    ParallelFor(n, [&](int item, int worker) {
      calls[static_cast<size_t>(item)].fetch_add(1);
      if (worker < 0 || worker >= ParallelWorkers()) worker_in_range = false;
    });
    for (int i = 0; i < n; ++i) EXPECT_EQ(calls[static_cast<size_t>(i)].load(), 1) << "item " << i << " of " << n;
    EXPECT_TRUE(worker_in_range.load());
  }
}

TEST(ParallelForTest, ParallelCopyEqualsMemcpy) {
  constexpr size_t kMiB = size_t{1} << 20;
  for (const size_t bytes : {size_t{0}, size_t{1}, size_t{4097}, kMiB, kMiB + 1, 3 * kMiB - 5, 7 * kMiB + 3}) {
    std::vector<uint8_t> src(bytes + 2), dst(bytes + 2, 0xAB);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 20) * 7 + 1);
    ParallelCopy(dst.data() + 1, src.data() + 1, bytes);  // unaligned ends
    EXPECT_EQ(dst[0], 0xAB) << bytes;
    EXPECT_EQ(dst[bytes + 1], 0xAB) << bytes << ": wrote past the end";
    EXPECT_TRUE(std::equal(dst.begin() + 1, dst.begin() + 1 + static_cast<std::ptrdiff_t>(bytes), src.begin() + 1))
        << bytes;
  }
}

}  // namespace
}  // namespace iris::core
