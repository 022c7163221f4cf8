// A parallel loop for host work (preprocessing, plans) that degrades to one thread instead of stalling when the
// machine is busy: the calling thread works through the items itself and is joined by pooled
// helper threads as they wake up; it waits only for items a helper has already started, never
// for a helper that has not been scheduled yet (an OpenMP region joins its whole team, so one
// descheduled thread delays the region by a scheduler tick or more).
#pragma once

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

}  // namespace iris::core
