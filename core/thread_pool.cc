#include "core/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

namespace iris::core {

ThreadPool::ThreadPool(int num_threads, const char* name) {
  const int n = std::max(1, num_threads);
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([this] { WorkLoop(); });
    if (name[0] != '\0') pthread_setname_np(threads_.back().native_handle(), name);
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

int64_t ThreadPool::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(tasks_.size());
}

void ThreadPool::WorkLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stopping_ || !p->tasks_.empty(); },
          this));
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace iris::core
