// The engine's start-up forwards on an accelerator: one decoder step at the step budget and one
// encoder forward at its largest size (and smaller ones where the device asks), run before the
// engine takes requests. Whatever a forward allocates or loads on first use (a GPU's activation
// scratch at its largest, the kernels' modules, the matmul algorithms, tuned ones included) then
// happens at start, where running out of device memory is a clear error from Engine::Create,
// never in the middle of a request. It leaves no trace: its KV blocks are released and no prefix
// or encoder cache entry is made.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/encoder_worker.h"
#include "engine/model.h"
#include "llm/kv_cache.h"

namespace iris::engine {

// One decoder step of min(its max_tokens(), what the cache holds) rows of one sequence (its last
// row's logits computed), and, for a model with vision, one encoder forward of about its
// max_patches() patches (one image's grid, pseudo-random pixels): the sizes their activations
// were reserved for. Then a step or forward at each smaller row count its device asks for
// (Device::WarmUpRowCounts: a GPU tuning its matmuls, every row bucket). The device's first error is returned. `encoder_worker` (may be null): the encoder
// has a device of its own and this worker issues its forward.
absl::Status WarmUp(Model& model, llm::KvCache& cache, EncoderWorker* encoder_worker = nullptr);

}  // namespace iris::engine
