#include "core/parallel_for.h"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

namespace iris::core {
namespace {

struct Job {
  Job(int n, absl::FunctionRef<void(int, int)> body) : n(n), body(body) {}

  // Claims and runs items until none is left. A helper that arrives after the last claim
  // touches nothing but the counters (the job is kept alive by its shared_ptr).
  void Work(int worker) {
    for (;;) {
      const int i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      body(i, worker);
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == n) done.notify_all();
    }
  }

  bool Unclaimed() const { return next.load(std::memory_order_relaxed) < n; }

  const int n;
  const absl::FunctionRef<void(int, int)> body;  // valid until done == n: the caller waits
  std::atomic<int> next{0};
  std::atomic<int> done{0};
};

// OMP_NUM_THREADS's first number when set (what the kernels' thread team uses), else the cores
// in this process's affinity mask.
int WantedWorkers() {
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Helper threads, started once and never stopped (they sleep between jobs). One job at a time.
class Pool {
 public:
  explicit Pool(int helpers) {
    for (int i = 1; i <= helpers; ++i) {
      try {
        std::thread([this, i] { Loop(i); }).detach();
      } catch (const std::system_error&) {
        break;  // fewer helpers (none at worst): the callers do the work themselves
      }
      helpers_ = i;
    }
  }

  int helpers() const { return helpers_; }

  // False while another job still has unclaimed items.
  bool Post(std::shared_ptr<Job> job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (current_ != nullptr && current_->Unclaimed()) return false;
    current_ = std::move(job);
    ++generation_;
    cv_.notify_all();
    return true;
  }

  void Finish(const Job* job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (current_.get() == job) current_.reset();
  }

 private:
  void Loop(int worker) {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = current_;
      }
      if (job != nullptr) job->Work(worker);
    }
  }

  int helpers_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Job> current_;
  uint64_t generation_ = 0;
};

Pool& GetPool() {
  static Pool* pool = new Pool(WantedWorkers() - 1);  // never destroyed
  return *pool;
}

}  // namespace

int ParallelWorkers() { return GetPool().helpers() + 1; }

void ParallelFor(int n, absl::FunctionRef<void(int item, int worker)> body) {
  if (n <= 0) return;
  Pool& pool = GetPool();
  auto job = n > 1 && pool.helpers() > 0 ? std::make_shared<Job>(n, body) : nullptr;
  if (job == nullptr || !pool.Post(job)) {
    for (int i = 0; i < n; ++i) body(i, 0);
    return;
  }
  job->Work(0);
  // Only items a helper has started remain: spin briefly, then sleep until the last is done.
  int spins = 0;
  for (int d = job->done.load(std::memory_order_acquire); d != n;
       d = job->done.load(std::memory_order_acquire)) {
    if (++spins < 2000) {
      _mm_pause();
    } else {
      job->done.wait(d, std::memory_order_acquire);
    }
  }
  pool.Finish(job.get());
}

void ParallelCopy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kPiece = size_t{1} << 20;
  const size_t pieces = (bytes + kPiece - 1) / kPiece;
  if (pieces <= 1) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return;
  }
  ParallelFor(static_cast<int>(std::min<size_t>(pieces, 1 << 30)), [&](int item, int) {
    // (pieces past 2^30 MiB cannot be: host memory is smaller.)
    const size_t at = static_cast<size_t>(item) * kPiece;
    std::memcpy(static_cast<char*>(dst) + at, static_cast<const char*>(src) + at, std::min(kPiece, bytes - at));
  });
}

}  // namespace iris::core
