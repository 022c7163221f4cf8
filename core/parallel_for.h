// A parallel loop for host work (preprocessing, plans) that degrades to one thread instead of stalling when the
// machine is busy: the calling thread works through the items itself and is joined by pooled
// helper threads as they wake up; it waits only for items a helper has already started, never
// for a helper that has not been scheduled yet (an OpenMP region joins its whole team, so one
// descheduled thread delays the region by a scheduler tick or more).
#pragma once

#include <cstddef>

#include "absl/functional/function_ref.h"

namespace iris::core {

// Threads ParallelFor uses at most: OMP_NUM_THREADS when set (as the kernels' thread team),
// else the cores this process may run on; at least 1.
int ParallelWorkers();

// Calls body(item, worker) once for every item in [0, n), items claimed in increasing order,
// one at a time. `worker` is in [0, ParallelWorkers()) and identifies the thread for the call's
// duration (0 is the caller), so per-worker scratch can be indexed by it. Returns when every
// item is done. Nested or concurrent calls run on the calling thread alone.
void ParallelFor(int n, absl::FunctionRef<void(int item, int worker)> body);

// memcpy(dst, src, bytes) in 1 MiB pieces over ParallelFor's workers: one thread's copy runs at a
// fraction of the memory's bandwidth (a GPU encoder's output for eight 448² images, 16.8 MB, took
// ~1.8 ms to copy on one core of the development machine; the forward itself ~28 ms on an H200).
// dst and src must not overlap.
void ParallelCopy(void* dst, const void* src, size_t bytes);

}  // namespace iris::core
