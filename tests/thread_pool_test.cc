#include "core/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace iris::core {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskOnce) {
  std::vector<std::atomic<int>> runs(1000);
  {
    ThreadPool pool(3);
    EXPECT_EQ(pool.num_threads(), 3);
    for (int i = 0; i < 1000; ++i) pool.Schedule([&runs, i] { runs[i].fetch_add(1); });
  }  // the destructor runs what is queued
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(runs[i].load(), 1) << i;
}

TEST(ThreadPoolTest, TasksRunOffTheCallerAndInParallel) {
  ThreadPool pool(2);
  absl::Notification first_started, second_ran;
  std::atomic<bool> on_caller{false};
  const std::thread::id caller = std::this_thread::get_id();
  // The first task blocks until the second has run: only possible with two workers.
  pool.Schedule([&] {
    on_caller = on_caller || std::this_thread::get_id() == caller;
    first_started.Notify();
    second_ran.WaitForNotification();
  });
  first_started.WaitForNotification();
  pool.Schedule([&] {
    on_caller = on_caller || std::this_thread::get_id() == caller;
    second_ran.Notify();
  });
  EXPECT_TRUE(second_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(on_caller.load());
}

TEST(ThreadPoolTest, QueuedCountsTasksNotStarted) {
  absl::Notification release;
  ThreadPool pool(1);
  absl::Notification started;
  pool.Schedule([&] {
    started.Notify();
    release.WaitForNotification();
  });
  started.WaitForNotification();
  pool.Schedule([] {});
  pool.Schedule([] {});
  EXPECT_EQ(pool.queued(), 2);
  release.Notify();
}

TEST(ThreadPoolTest, ZeroThreadsMeansOne) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  std::atomic<int> ran{0};
  absl::Notification done;
  pool.Schedule([&] { ran = 1; done.Notify(); });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace iris::core
