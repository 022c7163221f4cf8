// CPU sets for pinning threads: Linux CPU list syntax ("0-3,8", as taskset -c takes and
// /proc/<pid>/status prints in Cpus_allowed_list), checked against the CPUs this process may run
// on, and applied to a thread. Threads a pinned thread creates afterwards inherit its set (the
// kernel copies the mask at clone), which is how an OpenMP team started by a pinned thread
// stays on that thread's CPUs when OMP_PROC_BIND/OMP_PLACES are not set.
#pragma once

#include <pthread.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace iris::core {

// Sorted, distinct CPU numbers.
using CpuList = std::vector<int>;

// "0-3,8" -> {0, 1, 2, 3, 8}: items N or N-M (N <= M) separated by commas, repeats allowed.
// INVALID_ARGUMENT naming `flag` for an empty list or item, anything but digits and one '-',
// a reversed range, or a CPU number beyond what a cpu_set_t holds.
absl::StatusOr<CpuList> ParseCpuList(absl::string_view text, absl::string_view flag);

// {0, 1, 2, 3, 8} -> "0-3,8" (the kernel's Cpus_allowed_list spelling).
std::string FormatCpuList(const CpuList& cpus);

// The CPUs the calling thread may run on (sched_getaffinity).
absl::StatusOr<CpuList> AllowedCpus();

// INVALID_ARGUMENT naming `flag` and the allowed list when a CPU of `cpus` is not in `allowed`.
absl::Status CheckCpusAllowed(const CpuList& cpus, const CpuList& allowed, absl::string_view flag);

// Restricts `thread` to `cpus` (pthread_setaffinity_np); `name` goes into the error.
absl::Status PinThread(pthread_t thread, const CpuList& cpus, absl::string_view name);

}  // namespace iris::core
