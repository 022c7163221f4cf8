#include "core/cpu_affinity.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace iris::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

CpuList ThreadCpus() {
  absl::StatusOr<CpuList> cpus = AllowedCpus();
  EXPECT_TRUE(cpus.ok()) << cpus.status();
  return cpus.ok() ? *cpus : CpuList{};
}

TEST(CpuAffinityTest, ParsesLinuxCpuLists) {
  EXPECT_THAT(*ParseCpuList("0", "--f"), ElementsAre(0));
  EXPECT_THAT(*ParseCpuList("0-3,8", "--f"), ElementsAre(0, 1, 2, 3, 8));
  EXPECT_THAT(*ParseCpuList("8,0-1,1,10-10", "--f"), ElementsAre(0, 1, 8, 10));  // sorted, repeats merged
  EXPECT_THAT(*ParseCpuList("1023", "--f"), ElementsAre(1023));
}

TEST(CpuAffinityTest, RefusesBadListsNamingTheFlag) {
  const std::pair<const char*, const char*> bad[] = {
      {"", "empty CPU list"},          {"1,", "empty item"},
      {",1", "empty item"},            {"1,,2", "empty item"},
      {"a", "not a CPU number"},       {"-1", "not a CPU number"},
      {"1-", "not a CPU number"},      {"1-2-3", "not a CPU number"},
      {" 1", "not a CPU number"},      {"+1", "not a CPU number"},
      {"0x1", "not a CPU number"},     {"3-1", "ends before it starts"},
      {"1024", "beyond the largest"},  {"0-99999999", "not a CPU number"},
  };
  for (const auto& [text, why] : bad) {
    absl::StatusOr<CpuList> parsed = ParseCpuList(text, "--engine-cpus");
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr("--engine-cpus: ")) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr(why)) << text;
  }
}

// Format and parse agree with a set-based reference on random sets.
TEST(CpuAffinityTest, FormatRoundTripsRandomSets) {
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(FormatCpuList({5}), "5");
  EXPECT_EQ(FormatCpuList({1, 3, 4}), "1,3-4");
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::set<int> want;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) want.insert(static_cast<int>(rng() % 64));
    const CpuList list(want.begin(), want.end());
    if (list.empty()) continue;
    const std::string text = FormatCpuList(list);
    absl::StatusOr<CpuList> back = ParseCpuList(text, "--f");
    ASSERT_TRUE(back.ok()) << text << ": " << back.status();
    EXPECT_EQ(*back, list) << text;
    // Canonical: one item per run of consecutive CPUs.
    int runs = 0;
    for (size_t i = 0; i < list.size(); ++i) runs += i == 0 || list[i] != list[i - 1] + 1;
    EXPECT_EQ(static_cast<int>(std::count(text.begin(), text.end(), ',')) + 1, runs) << text;
  }
}

TEST(CpuAffinityTest, ChecksAgainstTheAllowedSet) {
  EXPECT_TRUE(CheckCpusAllowed({0, 1}, {0, 1, 2}, "--f").ok());
  absl::Status s = CheckCpusAllowed({1, 3, 4, 7}, {0, 1, 2}, "--worker-cpus");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--worker-cpus: CPUs 3-4,7 not among the CPUs this process may run on (0-2)");
  const CpuList allowed = ThreadCpus();
  ASSERT_FALSE(allowed.empty());
  EXPECT_TRUE(CheckCpusAllowed(allowed, allowed, "--f").ok());
  EXPECT_FALSE(CheckCpusAllowed({allowed.back() + 1}, allowed, "--f").ok());
}

// A pinned thread's later threads (std::thread, and the OpenMP team of a parallel region it
// starts) inherit its CPUs: what iris-server relies on for the engine's compute team.
TEST(CpuAffinityTest, PinnedThreadAndItsOpenMpTeamStayOnItsCpus) {
  const CpuList allowed = ThreadCpus();
  const CpuList one = {allowed.front()};
  CpuList in_thread, in_child;
  std::vector<CpuList> in_team;
  std::thread t([&] {
    // Set from inside: the test checks inheritance, PinThread is checked below from outside.
    ASSERT_TRUE(PinThread(pthread_self(), one, "test thread").ok());
    in_thread = ThreadCpus();
    std::thread([&] { in_child = ThreadCpus(); }).join();
    in_team.resize(3);
#pragma omp parallel num_threads(3)
    in_team[omp_get_thread_num()] = ThreadCpus();
  });
  t.join();
  EXPECT_EQ(in_thread, one);
  EXPECT_EQ(in_child, one);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(in_team[i], one) << "team member " << i;
  EXPECT_EQ(ThreadCpus(), allowed);  // the test's own thread is untouched
}

TEST(CpuAffinityTest, PinsAnotherThread) {
  const CpuList allowed = ThreadCpus();
  const CpuList last = {allowed.back()};
  std::atomic<bool> go{false};
  CpuList seen;
  std::thread t([&] {
    while (!go.load()) std::this_thread::yield();
    seen = ThreadCpus();
  });
  absl::Status pinned = PinThread(t.native_handle(), last, "test thread");
  go = true;
  t.join();
  ASSERT_TRUE(pinned.ok()) << pinned;
  EXPECT_EQ(seen, last);
}

}  // namespace
}  // namespace iris::core
