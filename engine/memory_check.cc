#include "engine/memory_check.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/device.h"
#include "vision/vision_encoder.h"

namespace iris::engine {

std::string MemoryCheck::Describe() const {
  std::string out = core::DescribeMemory(estimate, budgets);
  if (available >= 0) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "; %.2f GB available", static_cast<double>(available) / 1e9);
    out += buf;
  }
  return out;
}

absl::StatusOr<MemoryCheck> CheckMemoryBeforeLoad(const std::string& dir, const ModelOptions& model,
                                                  const EngineOptions& engine, int64_t available_bytes,
                                                  const std::string& kv_cache_flag, double gpu_memory_fraction) {
  IRIS_ASSIGN_OR_RETURN(core::ModelConfig config, core::LoadModelConfig(dir));
  IRIS_ASSIGN_OR_RETURN(core::Checkpoint ckpt, core::Checkpoint::Open(dir));
  IRIS_RETURN_IF_ERROR(core::CheckCheckpointTensors(config, ckpt));
  MemoryCheck check;
  check.budgets.f32_compute = model.compute == kernels::ComputeType::kF32;
  check.budgets.kv_cache_bytes = engine.kv_cache_bytes;
  check.budgets.kv_cache_flag = kv_cache_flag;
  check.budgets.max_num_batched_tokens = engine.max_num_batched_tokens;
  check.budgets.max_num_seqs = engine.max_num_seqs;
  check.budgets.max_encoder_patches = engine.max_encoder_patches_per_step;
  if (config.has_vision()) {  // Engine::Create sizes the encoder for the largest image too
    IRIS_ASSIGN_OR_RETURN(core::PreprocessorConfig pre, core::LoadPreprocessorConfig(dir));
    check.budgets.max_encoder_patches = std::max(check.budgets.max_encoder_patches,
                                                 pre.max_pixels / (int64_t{pre.patch_size} * pre.patch_size));
  }
  const bool on_cpu = model.device.name == "cpu";
  check.budgets.gpu = !on_cpu;
  check.budgets.encoder_device_apart = model.encoder_device.has_value();
  check.budgets.gpu_matmul_tuning = !on_cpu && model.device.matmul_tuning;
  // Engine::Create enables the encoder's graphs on a GPU unless told not to.
  check.budgets.encoder_graphs = !on_cpu && engine.encoder_graphs.value_or(true) ? vision::kEncoderGraphsKept : 0;
  check.estimate = core::EstimateMemory(config, check.budgets);
  if (gpu_memory_fraction > 0 && on_cpu) {
    return absl::InvalidArgumentError("--gpu-memory-fraction sizes a GPU's KV cache: it needs --device cuda");
  }
  if (!on_cpu) {
    IRIS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Device> device, kernels::CreateDevice(model.device));
    IRIS_ASSIGN_OR_RETURN(const kernels::DeviceMemory memory, device->Memory());
    if (gpu_memory_fraction > 0) {
      IRIS_ASSIGN_OR_RETURN(check.budgets.kv_cache_bytes,
                            core::KvCacheBytesForFraction(gpu_memory_fraction, memory.total_bytes,
                                                          memory.free_bytes, check.estimate));
      check.budgets.kv_cache_flag = "--gpu-memory-fraction";
      check.estimate = core::EstimateMemory(config, check.budgets);
    }
    check.available = available_bytes >= 0 ? available_bytes : memory.free_bytes;
  } else if (available_bytes >= 0) {
    check.available = available_bytes;
  } else if (absl::StatusOr<int64_t> a = core::AvailableMemoryBytes(); a.ok()) {
    check.available = *a;
  }
  if (check.available >= 0) {
    absl::Status fits = core::CheckMemoryFits(check.estimate, check.budgets, check.available);
    if (!fits.ok()) return absl::ResourceExhaustedError(absl::StrCat(dir, ": ", fits.message()));
  }
  return check;
}

}  // namespace iris::engine
