// The vision transformer of Qwen2.5-VL and Qwen2-VL: patch embed, 2-D rotary, window and
// full-attention blocks, merger, inverse window order. The towers differ only in data the
// VisionConfig carries (the blocks' norm and MLP kind, whether any block is windowed), so one
// encoder runs both. Several images of different sizes go through one forward
// (varlen). Device-free: every step is an op on the kernels::Device it was loaded for; the
// activations are named buffers on that device, allocated once for a patch capacity.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "kernels/linear.h"
#include "vision/encoder_plan.h"
#include "vision/pixel_table.h"

namespace iris::vision {

// The encoder-path techniques, each a runtime switch so that its effect can be measured. The names
// are the public ones (flags, GetModelInfo); what each removes is said here per case.
struct EncoderTechniques {
  // On: q and k rotated together in one op inside the qkv output, with the plan's cos/sin (built
  // once per forward). Off: the tables recomputed for every layer and q, k rotated by two ops.
  bool fused_rotary = true;
  // How attention gets q, k, v (see QkvPadding). On: kNone where attention takes the model's head
  // dim (the CPU kernel takes 80), else kOnePass to EncoderOptions::padded_head_dim. Off: the
  // usual way, kPerTensor to padded_head_dim (96 when that is 0).
  bool parallel_qkv_padding = true;
  // On: the plan (window index, both cu_seqlens sets, cos/sin) built once per distinct grid_thw
  // list, mirrored to the device once and shared by all layers. Off: built and mirrored again for
  // every layer of every forward.
  bool cached_cu_seqlens = true;
};

// What the encoder does with q, k, v between the qkv projection and attention.
enum class QkvPadding {
  kNone,       // attention reads q, k, v in place in the qkv output (no copy, no un-pad)
  kOnePass,    // one op splits and pads all three into head-major buffers; output un-padded
  kPerTensor,  // three ops, one per tensor, then the output un-padded
};

struct EncoderOptions {
  kernels::ComputeType compute = kernels::ComputeType::kBF16;
  EncoderTechniques techniques;
  // The head dim attention runs at when q/k/v are padded; 0 = the model's own (no padding needed,
  // as on the CPU), in which case the unfused path pads to 96 (aligned tiles).
  int padded_head_dim = 0;
  // Pad the MLP intermediate size up to a multiple of this (zero weights: exact); 0 = never.
  int intermediate_multiple = 64;
  // Patches one forward can hold: the activation buffers are allocated for this many at load
  // (ReserveActivations changes it). A forward over more is refused.
  int64_t max_patches = 16384;
};

// How the preprocessing turns an image's bytes into pixel values (PreprocessorConfig's image_mean
// and image_std, after the rescale by 1/255): what the encoder needs to take images as bytes.
struct PixelNormalization {
  std::array<float, 3> mean = {};
  std::array<float, 3> std = {};
  bool operator==(const PixelNormalization&) const = default;
};

// The padding the switches resolve to for this model's head dim.
QkvPadding ResolveQkvPadding(const EncoderOptions& options, int head_dim);

struct EncoderStats {
  int64_t forwards = 0;
  int64_t plan_cache_hits = 0;
  int64_t plan_cache_misses = 0;
};

// The grid lists whose recorded forwards a GPU encoder keeps by default (EnableGraphs), each with
// its plan's device arrays (the memory plan counts them: core::MemoryBudgets::encoder_graphs).
inline constexpr int kEncoderGraphsKept = 16;

class VisionEncoder {
 public:
  // Loads `visual.*` tensors from the checkpoint (HF names) and prepares the kernels.
  static absl::StatusOr<std::unique_ptr<VisionEncoder>> Load(kernels::Device& device,
                                                             const core::Checkpoint& checkpoint,
                                                             const core::VisionConfig& config,
                                                             const EncoderOptions& options);
  ~VisionEncoder();

  // Re-allocates the activation buffers for forwards of up to `max_patches` patches (at setup,
  // e.g. from the engine's encoder budget; never in a forward).
  absl::Status ReserveActivations(int64_t max_patches);
  int64_t max_patches() const { return max_patches_; }

  // pixel_values: F32 [patches, C*T*P*P], the images' rows concatenated in order; grid_thw one
  // entry per image. Returns F32 [merged tokens, out_hidden] in each image's raster order, in host memory.
  // INVALID_ARGUMENT for a bad grid or more patches than max_patches(). Begin, Advance until
  // done, Finish in one call (abandons a resumable forward in progress).
  absl::StatusOr<core::Tensor> Forward(const core::Tensor& pixel_values,
                                       std::span<const GridThw> grid_thw);

  // The same forward from the images' bytes, as the preprocessing leaves them (vision::Preprocess's
  // rgb): rgb U8, the images resized to their grids and packed back to back (image i is
  // grid_thw[i][1] * P rows of grid_thw[i][2] * P pixels, RGB interleaved; t must be 1). The
  // encoder makes the pixel_values rows on its own device during patch embedding
  // (kernels::PatchRows, the same bits as vision::PixelValues), so a GPU receives the bytes only.
  absl::StatusOr<core::Tensor> ForwardRgb(const core::Tensor& rgb, std::span<const GridThw> grid_thw,
                                          const PixelNormalization& normalization);

  // The same forward in resumable pieces, so that an engine can interleave it with decoding: each
  // Advance runs the next pieces — row ranges of one stage (patch embed; a block's norm + qkv +
  // rotary; its attention + proj + MLP; the merger) — up to a FLOP allowance, at least one piece.
  // Between calls the activations stay in the encoder's buffers. Every op is row-independent, and
  // a block's attention pieces start only when all its q/k/v rows are made, so the result is
  // bit-identical to Forward's however the rows are cut. One forward in progress at a time.
  absl::Status Begin(const core::Tensor& pixel_values, std::span<const GridThw> grid_thw);
  // Begin from the images' bytes (as ForwardRgb).
  absl::Status BeginRgb(const core::Tensor& rgb, std::span<const GridThw> grid_thw,
                        const PixelNormalization& normalization);
  bool in_progress() const { return run_ != nullptr; }
  bool done() const;  // in progress and every piece run: Finish next
  // Runs pieces worth up to `max_flops` (estimated as CountFlops does; at least one piece; a
  // forward replayed from a graph runs whole). Returns the FLOPs run. FAILED_PRECONDITION when no
  // forward is in progress.
  absl::StatusOr<double> Advance(double max_flops);
  // Advances the forward in progress to its end (done()), or abandons it on an error.
  absl::Status AdvanceToEnd();
  // FLOPs left in the forward in progress (0 when none).
  double remaining_flops() const;
  // The embeddings once done(); ends the forward either way.
  absl::StatusOr<core::Tensor> Finish();
  // The same embeddings as one tensor per image of the forward (F32 [its merged tokens,
  // out_hidden], raster order), each in host memory of its own: what a cache keeps per image, made
  // without a copy of the whole output first on a GPU. Ends the forward either way.
  absl::StatusOr<std::vector<core::Tensor>> FinishImages();
  void Abandon();

  // Forwards from bytes (BeginRgb) replayed from recorded device graphs (CUDA graphs), one per grid
  // list: on a GPU a forward is hundreds of launches, whose host time rather than their work bounds
  // a small image's encode. A grid list's first forward runs directly; its second runs directly
  // and is then recorded (issued again into a graph, which runs nothing: the direct run gave every
  // buffer its size); from the third on, Advance replays it as one launch. Every forward from bytes
  // then uploads them into one kept buffer, so that a graph finds its input at one address. Graphs
  // need the cached plan and the fused rotary (the defaults: with either off a forward uploads
  // tables per layer and runs directly) and no block observer. They hold the device's settings of
  // their recording: set_techniques and ReserveActivations drop them, and after changing a device
  // setting, EnableGraphs again. Up to `max_graphs` grid lists are kept, the least recently used
  // dropped first. UNIMPLEMENTED on a device that records no graphs; INVALID_ARGUMENT for
  // max_graphs below 1.
  absl::Status EnableGraphs(int max_graphs = kEncoderGraphsKept);
  void DisableGraphs();
  // While paused, forwards run directly and the graphs are kept (a benchmark's same-run
  // comparison of forwards with and without them).
  void PauseGraphs(bool paused);
  int graphs() const;             // recorded graphs held
  int64_t graph_replays() const;  // forwards replayed from one

  // Called after each block with the hidden states (window order, [patches, hidden]); for tests.
  using BlockObserver = std::function<void(int block, const float* hidden, int64_t rows)>;
  void set_block_observer(BlockObserver observer) { observer_ = std::move(observer); }

  void set_techniques(const EncoderTechniques& t);
  const EncoderOptions& options() const { return options_; }
  const core::VisionConfig& config() const { return config_; }
  // Values in a pixel_values row: C * T * P * P.
  int64_t patch_dim() const {
    return int64_t{config_.in_channels} * config_.temporal_patch_size * config_.patch_size * config_.patch_size;
  }
  const EncoderStats& stats() const { return stats_; }
  // FLOPs of one forward for the given grids (matmuls + attention), for benchmarks.
  double CountFlops(std::span<const GridThw> grid_thw) const;

 private:
  struct Block;
  struct Activations;
  struct DevicePlan;
  struct Run;
  struct Graphs;
  enum class Stage;
  VisionEncoder(kernels::Device& device, const core::VisionConfig& config, const EncoderOptions& options);
  absl::StatusOr<std::shared_ptr<const DevicePlan>> MirrorPlan(std::shared_ptr<const EncoderPlan> plan);
  // A forward's plan and bookkeeping for grid_thw, its size checked against max_patches().
  absl::StatusOr<std::unique_ptr<Run>> NewRun(std::span<const GridThw> grid_thw);
  // The device's copy of the byte-to-value table for `normalization` (uploaded when it changes).
  absl::Status UsePixelTable(const PixelNormalization& normalization);
  // The forward just run directly, issued again into a graph for its grid list (run_ done).
  absl::Status RecordGraph();
  // g's input buffer and its pinned staging, for forwards of up to max_patches patches.
  absl::Status AllocateGraphInput(Graphs& g, int64_t max_patches);
  // Patch rows [r0, r1) of a forward begun from bytes, made into `out` (row r0 first).
  void MakePatchRows(int64_t r0, int64_t r1, float* out);
  // Attention for query rows [r0, r1) of the forward's n rows and block b's proj on it, added
  // into h (rows r0.. of the hidden state).
  void AttentionAndProj(const Block& b, const DevicePlan& plan, bool full, int64_t n, int64_t r0, int64_t r1,
                        float* h, kernels::RmsNormHandoff* next);
  void PadAll(int64_t n);
  // A stage's rows and FLOPs per row (stage s of block l); running rows [r0, r1) of the current one.
  int64_t StageRows(Stage s) const;
  double StageFlopsPerRow(Stage s, int l) const;
  // The stage after stage `s` of block `l`, and its block.
  std::pair<Stage, int> Following(Stage s, int l) const;
  absl::Status RunPiece(int64_t r0, int64_t r1);
  // The config's norm (RMSNorm, or LayerNorm with `bias`) of `rows` rows.
  void Norm(const float* x, const core::Tensor& weight, const core::Tensor& bias, int64_t rows, float* y);
  // x's rows normalised as the input of the Linear after the norm: RMSNorm goes in as that
  // Linear's input op (folded where the device can); LayerNorm runs here into `staging`.
  // `handed`: the same norm of these rows handed on (RMSNorm only; kernels::RmsNormHandoff).
  kernels::LinearInput NormedInput(const float* x, const core::Tensor& weight, const core::Tensor& bias, int64_t rows,
                                   float* staging, const kernels::RmsNormHandoff* handed = nullptr);
  // A hand-off of the RMSNorm with `weight` for the rows from r0 on, in the activations' buffers
  // (its parts 0: not made yet); none where the device keeps none (Activations::handoff_parts).
  std::optional<kernels::RmsNormHandoff> NormHandoff(const core::Tensor& weight, int64_t r0);
  absl::Status NextStage();
  // Ends the forward (done() checked): its output in raster order in host memory, [merged,
  // out_hidden]. On the CPU that memory is made in `*made`; on a GPU it is the kept pinned staging
  // (valid until the next forward). `*ended` keeps the forward's plan.
  absl::StatusOr<const float*> EndInRaster(std::unique_ptr<Run>* ended, core::Tensor* made);

  kernels::Device& device_;
  core::VisionConfig config_;
  EncoderOptions options_;
  std::unique_ptr<kernels::Linear> patch_embed_;
  std::vector<Block> blocks_;
  core::Tensor merger_norm_;
  core::Tensor merger_norm_bias_;  // LayerNorm ln_q only
  std::unique_ptr<kernels::Linear> merger_fc1_;
  std::unique_ptr<kernels::Linear> merger_fc2_;
  int64_t padded_intermediate_ = 0;
  EncoderPlanCache plan_cache_;
  int64_t held_plan_hits_ = 0;  // forwards that reused device_plan_ or a graph's plan, not the cache
  EncoderStats stats_;
  std::shared_ptr<const DevicePlan> device_plan_;  // the cached plan's device copy
  BlockObserver observer_;
  int64_t max_patches_ = 0;
  std::unique_ptr<Activations> act_;
  // The byte-to-value table on the device, for table_normalization_ (set once one is uploaded);
  // its host source stays here while a copy of it may be in flight.
  core::Tensor pixel_table_;
  std::array<float, kPixelTableSize> pixel_table_host_{};
  std::optional<PixelNormalization> table_normalization_;
  std::unique_ptr<Graphs> graphs_;  // set by EnableGraphs
  std::unique_ptr<Run> run_;  // the forward in progress
};

}  // namespace iris::vision
