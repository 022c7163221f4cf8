// The Qwen2 text decoder of Qwen2.5-VL: token embeddings, layers of RMSNorm → GQA attention
// (q/k/v with bias, M-RoPE) over the paged KV cache → RMSNorm → SwiGLU MLP, final norm and lm_head
// (tied to the embeddings or not). One Forward runs one scheduler step: any mix of prefill chunks
// and decode tokens from many sequences, packed row after row, described by one DecoderBatch.
// Device-free: every step is an op on the kernels::Device it was loaded for; activations are
// named buffers allocated once for a row capacity.
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
#include "kernels/logit_edits.h"
#include "kernels/row_draw.h"
#include "kernels/staged_upload.h"
#include "llm/kv_cache.h"

namespace iris::llm {

struct DecoderOptions {
  kernels::ComputeType compute = kernels::ComputeType::kBF16;
  // Rows one step can hold (the engine's max_num_batched_tokens) and rows whose logits one step
  // returns (its max_num_seqs): the activation buffers are allocated for these at load.
  int64_t max_tokens = 2048;
  int64_t max_logit_rows = 256;
};

// One step's inputs, filled by the engine (or a test) and read by Decoder::Forward: plain host
// arrays, the attention metadata already flat (what a device holds a copy of). clear() keeps
// capacity, so a batch reused step after step stops allocating once it has seen the budgets.
struct DecoderBatch {
  // Per row, T rows in all.
  std::vector<int32_t> token_ids;
  std::vector<int64_t> positions[3];   // M-RoPE t, h, w of each row
  std::vector<int64_t> slot_mapping;   // the KV cache slot each row's k/v is written to
  // Per sequence, S in all: sequence s owns rows [query_start[s], query_start[s + 1]).
  std::vector<int32_t> query_start = {0};
  std::vector<int32_t> context_lens;   // tokens in its cache after this step, the new ones included
  std::vector<int32_t> block_tables;   // [S, max_blocks_per_seq], unused entries 0
  int max_blocks_per_seq = 0;
  std::vector<int32_t> logit_rows;     // rows whose logits Forward returns, in this order
  // Rows whose input embedding is given here (image tokens) instead of looked up by token id.
  std::vector<int32_t> embed_rows;
  std::vector<float> embeds;           // [embed_rows.size(), hidden]
  // Every logit row is picked where the logits are: Forward returns the picks, int32
  // [logit_rows.size()], instead of the logits, which then never leave the device. First
  // logit_edits (empty, or a row per logit row: llm::Sampler::AddEdits) are applied; then with
  // `draws` empty each row's pick is its argmax (every row greedy: llm::Sampler::PicksByArgmax),
  // else draws (a row per logit row: llm::Sampler::NextDraw) are drawn by kernels::SampleRows.
  bool picks_only = false;
  kernels::LogitEdits logit_edits;
  std::vector<kernels::RowDraw> draws;

  int64_t num_rows() const { return static_cast<int64_t>(token_ids.size()); }
  int num_seqs() const { return static_cast<int>(context_lens.size()); }
  // Empties the batch for a step whose sequences have at most `max_blocks_per_seq` blocks.
  void Clear(int max_blocks_per_seq);
  // Adds a sequence's bookkeeping for its next `num_new` rows, whose k/v go to the last num_new
  // token slots of `table` (already reserved: table.num_tokens counts them); with want_logits its
  // last row's logits are returned. The caller appends the rows' token ids and positions.
  // INVALID_ARGUMENT when the table does not hold them or has more blocks than the batch allows.
  absl::Status AddSequence(const BlockTable& table, int block_size, int64_t num_new, bool want_logits);
};

// Decode-only steps from recorded graphs (llm/decode_graph.h says which steps and how they are
// padded).
struct DecodeGraphOptions {
  // The padded batch sizes, ascending, each at most max_logit_rows and max_tokens; empty:
  // DecodeGraphBatchSizes of the smaller of the two.
  std::vector<int> batch_sizes;
  // The block-table width of every graph (KV blocks a sequence may have); a step with a longer
  // sequence runs without a graph. Each step uploads batch size x this many block ids.
  int max_blocks_per_seq = 0;
  // Record each size's step and replay it (the device must capture graphs), or run the same padded
  // steps directly: what a graph computes, on a device without graphs (the CPU's tests of it).
  bool capture = true;
};

class Decoder {
 public:
  // Loads `model.*` (and `lm_head.weight` unless tied) with HF names; q/k/v and gate/up are fused
  // into one projection each.
  static absl::StatusOr<std::unique_ptr<Decoder>> Load(kernels::Device& device, const core::Checkpoint& checkpoint,
                                                       const core::TextConfig& config,
                                                       const DecoderOptions& options);
  ~Decoder();

  const core::TextConfig& config() const { return config_; }
  const DecoderOptions& options() const { return options_; }
  int64_t hidden_size() const { return config_.hidden_size; }
  int64_t vocab_size() const { return config_.vocab_size; }

  // out[i, :] = embedding row of ids[i] as float32 (device memory). INVALID_ARGUMENT for an id
  // outside the vocab.
  absl::Status Embed(std::span<const int32_t> ids, float* out) const;

  // Re-allocates the activation buffers for steps of up to `max_tokens` rows and
  // `max_logit_rows` logit rows (at setup, e.g. from the engine's budgets; never in a step). Decode
  // graphs are dropped (enable them again after).
  absl::Status ReserveActivations(int64_t max_tokens, int64_t max_logit_rows);
  // The rows a step may have: the activations' capacity.
  int64_t max_tokens() const;

  // The KV cache shape this decoder needs for `num_blocks` blocks of `block_size` tokens, its pools
  // of `dtype` (kF32 or kBF16; Forward reads and writes either).
  KvCacheShape CacheShape(int64_t num_blocks, int block_size, core::DType dtype = core::DType::kF32) const;

  // Runs one step: writes the new tokens' k/v into `cache` and returns float32
  // [logit_rows.size(), vocab] logits in the batch's logit_rows order (with picks_only: int32
  // [logit_rows.size()] greedy picks), in the decoder's own host buffer (a GPU's come back into
  // pinned memory): valid until the next Forward. INVALID_ARGUMENT
  // for an inconsistent batch or one over capacity; a device's failed op (status()) is returned.
  absl::StatusOr<core::Tensor> Forward(const DecoderBatch& batch, KvCache* cache);

  // Decode-only steps from now on run padded to graph sizes (replayed from a graph per size, made
  // on a size's first step or by CaptureDecodeGraphs), others as before; graphs made before are
  // dropped. INVALID_ARGUMENT for sizes outside [1, max_logit_rows] or not ascending, or a width
  // below 1; UNIMPLEMENTED with capture on a device that records no graphs. Not with a layer observer.
  absl::Status EnableDecodeGraphs(const DecodeGraphOptions& options);
  // Makes every size's graph now, for steps on `cache` (each size's padded step is run once, on
  // padding rows only, and then recorded): the engine calls it at start, after its warm-up.
  absl::Status CaptureDecodeGraphs(KvCache* cache);
  // While paused, every step runs as given and the graphs are kept (a benchmark's same-run
  // comparison of steps with and without them).
  void PauseDecodeGraphs(bool paused);
  // Graphs held, and steps that ran padded to a graph size (replayed, or the first of their size).
  int decode_graphs() const;
  int64_t decode_graph_steps() const;

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
  struct Activations;
  struct StepInputs;
  struct Graphs;
  Decoder(kernels::Device& device, const core::TextConfig& config, const DecoderOptions& options);
  absl::Status Validate(const DecoderBatch& batch, const KvCache& cache) const;
  // The batch's arrays, rotary tables and given embeddings sent to the device through `upload`.
  absl::StatusOr<StepInputs> Stage(const DecoderBatch& batch, kernels::StagedUpload& upload);
  // The step's device work from the input embeddings to the logits: ops only, no host wait or read
  // of device memory (what a graph records).
  void Run(const StepInputs& in, KvCache* cache);
  // The first `logit_rows` rows' logits (or greedy picks), where the caller reads them.
  absl::StatusOr<core::Tensor> Results(int64_t logit_rows, const DecoderBatch& batch);
  absl::StatusOr<core::Tensor> ForwardPadded(const DecoderBatch& batch, int size, KvCache* cache);

  kernels::Device& device_;
  core::TextConfig config_;
  DecoderOptions options_;
  core::Tensor embed_;  // [vocab, hidden] as stored (mmap view)
  std::vector<Layer> layers_;
  core::Tensor final_norm_;  // F32 [hidden]
  std::unique_ptr<kernels::Linear> lm_head_;
  LayerObserver observer_;
  std::unique_ptr<Activations> act_;
  std::unique_ptr<Graphs> graphs_;  // set by EnableDecodeGraphs
};

}  // namespace iris::llm
