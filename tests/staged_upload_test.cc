// kernels::StagedUpload on the CPU device: each added array lands at its 64-byte aligned offset
// intact, the buffer keeps its address while steps fit and grows (keeping results right) when one
// does not, and Clear starts a new step's layout.
#include "kernels/staged_upload.h"

#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"

namespace iris::kernels {
namespace {

TEST(StagedUploadTest, ArraysLandIntactAtAlignedOffsets) {
  StagedUpload up(DefaultCpuDevice());
  std::vector<int32_t> ids(13);
  std::iota(ids.begin(), ids.end(), -6);
  const std::vector<int64_t> slots = {1, int64_t{1} << 40, -3};
  std::vector<float> table(100);
  std::iota(table.begin(), table.end(), 0.5f);
  const std::vector<int32_t> none;
  up.Clear();
  const size_t o_ids = up.Add(std::span<const int32_t>(ids));
  const size_t o_none = up.Add(std::span<const int32_t>(none));
  const size_t o_slots = up.Add(std::span<const int64_t>(slots));
  const size_t o_table = up.Add(std::span<const float>(table));
  for (size_t o : {o_ids, o_none, o_slots, o_table}) EXPECT_EQ(o % 64, 0u);
  EXPECT_LT(o_ids, o_slots);
  EXPECT_GE(o_slots, o_ids + ids.size() * sizeof(int32_t));
  ASSERT_TRUE(up.Upload().ok());
  EXPECT_EQ(std::vector<int32_t>(up.At<int32_t>(o_ids), up.At<int32_t>(o_ids) + ids.size()), ids);
  EXPECT_EQ(std::vector<int64_t>(up.At<int64_t>(o_slots), up.At<int64_t>(o_slots) + slots.size()), slots);
  EXPECT_EQ(std::vector<float>(up.At<float>(o_table), up.At<float>(o_table) + table.size()), table);
}

TEST(StagedUploadTest, KeepsItsAddressWhileStepsFitAndGrowsWhenOneDoesNot) {
  StagedUpload up(DefaultCpuDevice());
  std::vector<int32_t> small(100, 7);
  up.Clear();
  const size_t o = up.Add(std::span<const int32_t>(small));
  ASSERT_TRUE(up.Upload().ok());
  const int32_t* first = up.At<int32_t>(o);
  const size_t capacity = up.capacity();
  EXPECT_GE(capacity, up.bytes());
  // A smaller step: same address, new contents.
  std::vector<int32_t> smaller(50, 9);
  up.Clear();
  const size_t o2 = up.Add(std::span<const int32_t>(smaller));
  ASSERT_TRUE(up.Upload().ok());
  EXPECT_EQ(up.At<int32_t>(o2), first);
  EXPECT_EQ(up.capacity(), capacity);
  EXPECT_EQ(up.At<int32_t>(o2)[49], 9);
  // A step past the capacity: a larger buffer, every array right.
  std::vector<int32_t> big(capacity, 0);
  std::iota(big.begin(), big.end(), 0);
  up.Clear();
  const size_t a = up.Add(std::span<const int32_t>(smaller));
  const size_t b = up.Add(std::span<const int32_t>(big));
  ASSERT_TRUE(up.Upload().ok());
  EXPECT_GT(up.capacity(), capacity);
  EXPECT_GE(up.capacity(), up.bytes());
  EXPECT_EQ(up.At<int32_t>(a)[0], 9);
  EXPECT_EQ(std::vector<int32_t>(up.At<int32_t>(b), up.At<int32_t>(b) + big.size()), big);
}

}  // namespace
}  // namespace iris::kernels
