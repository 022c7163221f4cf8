// A fixed set of worker threads running queued tasks in FIFO order. The server uses it for the
// CPU work of a request that must stay off the gRPC and engine threads (image decode, resize,
// tokenization).
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace iris::core {

class ThreadPool {
 public:
  // At least one thread; a non-empty `name` (15 characters at most) names the threads for
  // /proc and top. They inherit the creating thread's CPU affinity.
  explicit ThreadPool(int num_threads, const char* name = "");
  ~ThreadPool();                         // runs what is queued, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> task);
  int num_threads() const { return static_cast<int>(threads_.size()); }
  int64_t queued() const;  // tasks not yet started

 private:
  void WorkLoop();

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace iris::core
