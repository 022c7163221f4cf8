// The memory check iris-server and iris-generate run before loading a checkpoint: its config and
// tensor list (headers only) are checked, the memory the model will take at the engine's budgets
// is estimated (core/memory_plan.h) and compared with what the machine has left.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/memory_plan.h"
#include "engine/engine.h"
#include "engine/model.h"

namespace iris::engine {

struct MemoryCheck {
  core::MemoryBudgets budgets;
  core::MemoryEstimate estimate;
  int64_t available = -1;  // bytes; -1 when it could not be read (then nothing is refused)
  std::string Describe() const;  // the estimate and what is available, one line
};

// INVALID_ARGUMENT for a config or tensor list iris cannot load; RESOURCE_EXHAUSTED (naming the
// flags) when the model does not fit in `available_bytes` (< 0: the device's free memory — the
// host's for the CPU, core::AvailableMemoryBytes; a GPU's from the driver, which also makes a
// missing or unusable GPU fail here, before anything is loaded). gpu_memory_fraction > 0 (a GPU
// only): the KV cache is sized from it (core::KvCacheBytesForFraction) instead of
// engine.kv_cache_bytes, and the result's budgets.kv_cache_bytes is the size to use.
absl::StatusOr<MemoryCheck> CheckMemoryBeforeLoad(const std::string& dir, const ModelOptions& model,
                                                  const EngineOptions& engine, int64_t available_bytes = -1,
                                                  const std::string& kv_cache_flag = "--kv-cache-bytes",
                                                  double gpu_memory_fraction = 0);

}  // namespace iris::engine
