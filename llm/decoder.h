// The Qwen2 text decoder of Qwen2.5-VL on the CPU: token embeddings, layers of RMSNorm → GQA
// attention (q/k/v with bias, M-RoPE) over the paged KV cache → RMSNorm → SwiGLU MLP, final norm and
// lm_head (tied to the embeddings or not). One Forward runs one scheduler step: any mix of prefill
// chunks and decode tokens from many sequences, packed row after row.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "kernels/linear.h"
#include "llm/kv_cache.h"

namespace iris::llm {

struct DecoderOptions {
  kernels::ComputeType compute = kernels::ComputeType::kBF16;
};

// One sequence's part of a step: its next `num_new` tokens (consecutive rows of the step). Its
// block table must already hold them: table->num_tokens = tokens before them + num_new.
struct DecoderSequence {
  const BlockTable* table = nullptr;
  int64_t num_new = 0;
  bool want_logits = false;  // logits of its last new token
};

struct DecoderStep {
  // [T, hidden] float32, T = sum of num_new: token embeddings, with image embeddings already in
  // the image-pad rows (see Decoder::Embed).
  const float* input_embeds = nullptr;
  // M-RoPE positions, axis-major: positions[axis * T + row], axis 0 = t, 1 = h, 2 = w.
  std::span<const int64_t> positions;
  std::span<const DecoderSequence> sequences;
};

class Decoder {
 public:
  // Loads `model.*` (and `lm_head.weight` unless tied) with HF names; q/k/v and gate/up are fused
  // into one projection each.
  static absl::StatusOr<std::unique_ptr<Decoder>> Load(const core::Checkpoint& checkpoint,
                                                       const core::TextConfig& config,
                                                       const DecoderOptions& options);
  ~Decoder();

  const core::TextConfig& config() const { return config_; }
  const DecoderOptions& options() const { return options_; }
  int64_t hidden_size() const { return config_.hidden_size; }
  int64_t vocab_size() const { return config_.vocab_size; }

  // out[i, :] = embedding row of ids[i] as float32. INVALID_ARGUMENT for an id outside the vocab.
  absl::Status Embed(std::span<const int32_t> ids, float* out) const;

  // The KV cache shape this decoder needs for `num_blocks` blocks of `block_size` tokens.
  KvCacheShape CacheShape(int64_t num_blocks, int block_size) const;

  // Runs one step: writes the new tokens' k/v into `cache` and returns float32
  // [number of sequences with want_logits, vocab] logits, in sequence order.
  absl::StatusOr<core::Tensor> Forward(const DecoderStep& step, KvCache* cache);

  // For tests: called with the hidden states [T, hidden] after each layer (layer 0..n-1), and with
  // the final-norm output of every row (layer = n).
  using LayerObserver = std::function<void(int layer, const float* hidden, int64_t rows)>;
  void set_layer_observer(LayerObserver observer) { observer_ = std::move(observer); }

  // Weight bytes one decode step reads (all layers and lm_head, in the compute dtype), for benchmarks.
  int64_t WeightBytesPerStep() const;
  // FLOPs of the matmuls for `tokens` rows of which `logit_rows` reach lm_head (benchmarks).
  double MatmulFlops(int64_t tokens, int64_t logit_rows) const;

 private:
  struct Layer;
  Decoder(const core::TextConfig& config, const DecoderOptions& options);
  float* Buffer(int slot, int64_t floats);

  core::TextConfig config_;
  DecoderOptions options_;
  core::Tensor embed_;  // [vocab, hidden] as stored (mmap view)
  std::vector<Layer> layers_;
  core::Tensor final_norm_;  // F32 [hidden]
  std::unique_ptr<kernels::Linear> lm_head_;
  LayerObserver observer_;
  std::vector<core::Tensor> buffers_;
};

}  // namespace iris::llm
