// What a checkpoint needs before it is loaded: the tensors its config implies (names and shapes,
// checked against a checkpoint's headers without reading any weight) and the memory iris will
// take for it — weights in the compute dtype, the KV cache, the activation buffers at the
// configured budgets — against the memory the machine has left. Loading a model that does not
// fit is refused with a message naming the flag to change, instead of being killed mid-load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "core/safetensors.h"

namespace iris::core {

struct TensorShape {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor the loaders read for this config, HF names, in model order (visual.* for VL
// families, then model.*, lm_head.weight unless the embeddings are tied).
std::vector<TensorShape> ExpectedTensors(const ModelConfig& config);
int64_t CountParameters(const ModelConfig& config);

// Each expected tensor is in the checkpoint with its shape (headers only). INVALID_ARGUMENT
// naming the first missing or misshapen tensor.
absl::Status CheckCheckpointTensors(const ModelConfig& config, const Checkpoint& checkpoint);

struct MemoryBudgets {
  bool f32_compute = false;            // --dtype f32 (weights kept as f32) or bf16
  int64_t kv_cache_bytes = 0;          // --kv-cache-bytes
  std::string kv_cache_flag = "--kv-cache-bytes";  // the flag that sets it, for messages
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 256;
  int64_t max_encoder_patches = 16384; // the encoder's buffers (the engine's budget or the largest image)
  bool gpu = false;                    // the model runs on a GPU: its matmul scratch and workspace count too
  // The encoder has a device object of its own (a second stream on the GPU, with its own
  // workspace and matmul scratch): on a GPU both sides' are counted, not the larger one.
  bool encoder_device_apart = false;
  // --matmul-tuning on a GPU: the first call of a matmul shape times cuBLASLt's candidates into a
  // scratch output of its size (f32), freed into the device's pool after: the largest counts.
  bool gpu_matmul_tuning = false;
  // On a GPU the encoder's recorded forwards (a graph per grid list, up to this many kept) keep
  // their plans' device arrays alive: each counts as a plan of max_encoder_patches patches.
  int encoder_graphs = 0;
};

// An encoder plan's arrays (vision::EncoderPlan: window index, both cu_seqlens sets, cos/sin) for
// `patches` patches, whatever the grid list: at most one frame and one window per merged token.
int64_t EncoderPlanBytes(const VisionConfig& vision, int64_t patches);

// The vision blocks' RMSNorm hand-off (kernels::RmsNormHandoff) for `patches` rows, kept where a
// GPU runs a bf16 tower whose blocks norm by RMSNorm (0 elsewhere): bf16 rows of the hidden size
// and a partial sum of squares for every 128 of its columns (the Hopper GEMM's narrowest tile).
int64_t EncoderNormHandoffParts(const VisionConfig& vision);
int64_t EncoderNormHandoffBytes(const VisionConfig& vision, int64_t patches, bool gpu, bool f32_compute);

// cuBLASLt's matmul workspace on a GPU (kernels/cuda/cuda_device.h keeps one of this size).
inline constexpr int64_t kGpuMatmulWorkspaceBytes = int64_t{32} << 20;

struct MemoryEstimate {
  int64_t parameters = 0;
  int64_t weight_bytes = 0;                // the copies made at load, in the compute dtype
  int64_t kv_cache_bytes = 0;
  int64_t decoder_activation_bytes = 0;
  int64_t encoder_activation_bytes = 0;    // 0 without a vision tower
  // On a GPU: the buffer a bf16 matmul's f32 input rows are converted into (the largest input of
  // a step or an encoder forward at the budgets, twice over: it grows by doubling), and cuBLASLt's
  // workspace; one of each per device object (two when the encoder's device is apart). 0 on the
  // CPU, whose matmuls read the f32 rows themselves. With matmul tuning, also the largest
  // matmul output at the budgets (the tuning's scratch output), per device object.
  int64_t gpu_workspace_bytes = 0;
  int64_t total() const {
    return weight_bytes + kv_cache_bytes + decoder_activation_bytes + encoder_activation_bytes + gpu_workspace_bytes;
  }
};

MemoryEstimate EstimateMemory(const ModelConfig& config, const MemoryBudgets& budgets);
// "weights 15.23 GB (bf16) + KV cache 1.07 GB + activations 0.52 GB = 16.82 GB"
std::string DescribeMemory(const MemoryEstimate& estimate, const MemoryBudgets& budgets);

// Memory this process can still take: MemAvailable from /proc/meminfo, lowered to the cgroup
// (v2) limit's headroom when there is one. NOT_FOUND when neither can be read.
absl::StatusOr<int64_t> AvailableMemoryBytes();

// RESOURCE_EXHAUSTED when the estimate exceeds `available`, naming the parts, the flags that set
// them (--kv-cache-bytes, --max-num-batched-tokens, --max-encoder-patches-per-step, --dtype) and
// what --kv-cache-bytes would fit.
absl::Status CheckMemoryFits(const MemoryEstimate& estimate, const MemoryBudgets& budgets, int64_t available);

// --gpu-memory-fraction: the KV cache gets what is left of fraction x the device's total once
// the weights and activations of `estimate` (its kv_cache_bytes ignored) are placed, and no more
// than is free. INVALID_ARGUMENT for a fraction outside (0, 1]; RESOURCE_EXHAUSTED when nothing
// is left for the cache (naming what took it).
absl::StatusOr<int64_t> KvCacheBytesForFraction(double fraction, int64_t device_total, int64_t device_free,
                                                const MemoryEstimate& estimate);

}  // namespace iris::core
