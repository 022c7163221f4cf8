#include "vision/vision_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/memory_plan.h"
#include "core/parallel_for.h"
#include "core/status_macros.h"
#include "core/weights.h"
#include "kernels/attention.h"
#include "kernels/attention_projection.h"
#include "kernels/elementwise.h"
#include "kernels/gated_mlp.h"
#include "kernels/qkv_bf16.h"
#include "kernels/patch_rows.h"
#include "kernels/qkv_pad.h"
#include "kernels/rotary.h"
#include "kernels/rows.h"
#include "vision/pixel_table.h"

namespace iris::vision {

using core::DType;
using core::Tensor;
using kernels::Epilogue;
using kernels::Linear;

// One block of either tower: the config picks the norm (RMSNorm, or LayerNorm with the biases
// below) and the MLP (gate_up → SiLU·mul → down, or fc1 → QuickGELU → down = fc2).
struct VisionEncoder::Block {
  Tensor norm1, norm2;            // F32 [hidden]
  Tensor norm1_bias, norm2_bias;  // F32 [hidden], LayerNorm only
  std::unique_ptr<Linear> qkv, proj;
  std::unique_ptr<Linear> gate_up;  // gated SiLU MLP
  std::unique_ptr<Linear> fc1;      // QuickGELU MLP
  std::unique_ptr<Linear> down;     // down_proj or fc2
};

// The named activation buffers of one forward, F32 on the device, sized for max_patches rows.
struct VisionEncoder::Activations {
  Tensor embedded;   // [n, hidden] patch embeddings in processor order
  Tensor hidden;     // [n, hidden] the residual stream, window order
  Tensor normed;     // [n, hidden]
  Tensor qkv;        // [n, 3 * hidden]
  Tensor attn;       // [n, hidden]
  Tensor gate_up;    // [n, 2 * padded intermediate]
  Tensor act;        // [n, padded intermediate]
  Tensor cos, sin;   // [n, head_dim / 2] tables recomputed per layer (fused_rotary off)
  Tensor cos_host, sin_host;  // their host staging
  Tensor pad_q, pad_k, pad_v, pad_out;  // [n * heads * padded head dim] (padding paths)
  Tensor fc1;        // [n / unit, unit * hidden]
  Tensor window_out; // [n / unit, out_hidden] merger output, window order
  // Where the device is not the host (a GPU): the output in raster order, and its pinned host
  // staging. Kept, not made per forward: pinned memory is taken and freed with device-wide waits.
  Tensor raster, raster_host;
  // The blocks' RMSNorm hand-off (kernels::RmsNormHandoff; a GPU, bf16, RMSNorm blocks): [n,
  // hidden] bf16 rows (in an f32 tensor's bytes) and [n, handoff_parts] partial sums. Norm2's is
  // written by proj and read by gate_up within a piece; the next block's norm1 by down and read
  // by its qkv; both in the same rows, each after the other's reader.
  Tensor norm_rows, norm_partials;
  int handoff_parts = 0;  // 0: no hand-off
};

// The plan's arrays as the device holds them (the same storage on the CPU).
struct VisionEncoder::DevicePlan {
  std::shared_ptr<const EncoderPlan> host;
  Tensor window_index, cu_seqlens, cu_window_seqlens, cos, sin;
  std::span<const int32_t> Span(const Tensor& t) const {
    return {t.data<int32_t>(), static_cast<size_t>(t.numel())};
  }
};

namespace {
bool SameGrids(std::span<const GridThw> a, std::span<const GridThw> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}
}  // namespace

// The recorded forwards (EnableGraphs), by grid list.
struct VisionEncoder::Graphs {
  struct Entry {
    std::vector<GridThw> grids;
    int direct = 0;                          // forwards of this list run directly so far
    std::shared_ptr<const DevicePlan> plan;  // the plan arrays the graph reads (kept alive)
    std::unique_ptr<kernels::DeviceGraph> graph;
    uint64_t last_use = 0;
  };
  int max_graphs = 0;
  bool paused = false;
  std::vector<std::unique_ptr<Entry>> entries;  // grid lists seen, at most 4 * max_graphs
  Tensor input;       // U8: every forward from bytes, at one address
  Tensor input_host;  // U8, pinned: the bytes staged for input's asynchronous upload
  // Whether an upload from input_host may still be running (set by BeginRgb; EndInRaster's wait on
  // the stream clears it): BeginRgb waits before it rewrites the staging.
  bool upload_pending = false;
  uint64_t clock = 0;
  int64_t replays = 0;

  // The entry for `grids`, made if new (the least recently used dropped first; `device` waited
  // for before a graph is destroyed, which a replay may still be running).
  Entry& Find(std::span<const GridThw> grids, kernels::Device& device) {
    ++clock;
    for (auto& e : entries) {
      if (SameGrids(e->grids, grids)) {
        e->last_use = clock;
        return *e;
      }
    }
    // A list met once costs a counter: up to 4 * max_graphs of them (RecordGraph bounds the graphs).
    if (static_cast<int>(entries.size()) >= 4 * max_graphs) {
      auto oldest = std::min_element(entries.begin(), entries.end(),
                                     [](const auto& a, const auto& b) { return a->last_use < b->last_use; });
      if ((*oldest)->graph != nullptr) device.Synchronize();
      entries.erase(oldest);
    }
    auto e = std::make_unique<Entry>();
    e->grids.assign(grids.begin(), grids.end());
    e->last_use = clock;
    entries.push_back(std::move(e));
    return *entries.back();
  }

  // The plan a recorded graph of `grids` holds (null if none): its arrays are where the graph
  // reads them, and the same values a new plan of the list would have.
  std::shared_ptr<const DevicePlan> HeldPlan(std::span<const GridThw> grids) const {
    for (const auto& e : entries) {
      if (e->plan != nullptr && SameGrids(e->grids, grids)) return e->plan;
    }
    return nullptr;
  }
};

namespace {

int64_t RoundUp(int64_t x, int64_t m) { return m <= 0 ? x : (x + m - 1) / m * m; }

// [out, in] with zero columns in..padded_in (exact: the padded inputs are zero or multiply zero).
Tensor PadColumns(const Tensor& w, int64_t padded_in) {
  const int64_t out = w.dim(0), in = w.dim(1);
  Tensor padded = Tensor::Zeros(w.dtype(), {out, padded_in});
  const size_t es = core::DTypeSize(w.dtype());
  for (int64_t r = 0; r < out; ++r) {
    std::memcpy(static_cast<char*>(padded.raw()) + r * padded_in * es,
                static_cast<const char*>(w.raw()) + r * in * es, in * es);
  }
  return padded;
}

// A norm's weight (and, for LayerNorm, its bias) as F32 device tensors.
absl::Status LoadNorm(kernels::Device& device, const core::Checkpoint& ckpt, const core::VisionConfig& config,
                      const std::string& prefix, int64_t dim, Tensor* weight, Tensor* bias) {
  IRIS_ASSIGN_OR_RETURN(Tensor w, core::GetWeight(ckpt, prefix + ".weight", {dim}));
  IRIS_ASSIGN_OR_RETURN(*weight, device.Mirror(w.ToF32()));
  if (config.norm == core::VisionNorm::kLayerNorm) {
    IRIS_ASSIGN_OR_RETURN(Tensor b, core::GetWeight(ckpt, prefix + ".bias", {dim}));
    IRIS_ASSIGN_OR_RETURN(*bias, device.Mirror(b.ToF32()));
  }
  return absl::OkStatus();
}

// A host vector as a tensor view that keeps the plan alive.
Tensor ViewOf(const std::vector<int32_t>& v, const std::shared_ptr<const EncoderPlan>& owner) {
  return Tensor::View(const_cast<int32_t*>(v.data()), DType::kI32, {static_cast<int64_t>(v.size())}, owner);
}

}  // namespace

QkvPadding ResolveQkvPadding(const EncoderOptions& options, int head_dim) {
  const bool needs_padding = options.padded_head_dim > head_dim;
  if (options.techniques.parallel_qkv_padding) return needs_padding ? QkvPadding::kOnePass : QkvPadding::kNone;
  return QkvPadding::kPerTensor;
}

VisionEncoder::VisionEncoder(kernels::Device& device, const core::VisionConfig& config, const EncoderOptions& options)
    : device_(device), config_(config), options_(options), plan_cache_(config) {}

VisionEncoder::~VisionEncoder() = default;

absl::StatusOr<std::unique_ptr<VisionEncoder>> VisionEncoder::Load(kernels::Device& device,
                                                                   const core::Checkpoint& ckpt,
                                                                   const core::VisionConfig& config,
                                                                   const EncoderOptions& options) {
  std::unique_ptr<VisionEncoder> enc(new VisionEncoder(device, config, options));
  const auto compute = options.compute;
  const int64_t hv = config.hidden_size, iv = config.intermediate_size;
  IRIS_ASSIGN_OR_RETURN(Tensor pe, core::GetWeight(ckpt, "visual.patch_embed.proj.weight",
                                             {hv, config.in_channels, config.temporal_patch_size,
                                              config.patch_size, config.patch_size}));
  IRIS_ASSIGN_OR_RETURN(enc->patch_embed_,
                        Linear::Create(device, pe.Reshaped({hv, enc->patch_dim()}), nullptr, compute));

  const int64_t ip = RoundUp(iv, options.intermediate_multiple);
  enc->padded_intermediate_ = ip;
  enc->blocks_.resize(config.depth);
  for (int i = 0; i < config.depth; ++i) {
    const std::string p = absl::StrCat("visual.blocks.", i, ".");
    Block& b = enc->blocks_[i];
    IRIS_RETURN_IF_ERROR(LoadNorm(device, ckpt, config, p + "norm1", hv, &b.norm1, &b.norm1_bias));
    IRIS_RETURN_IF_ERROR(LoadNorm(device, ckpt, config, p + "norm2", hv, &b.norm2, &b.norm2_bias));
    IRIS_ASSIGN_OR_RETURN(Tensor qkv_w, core::GetWeight(ckpt, p + "attn.qkv.weight", {3 * hv, hv}));
    IRIS_ASSIGN_OR_RETURN(Tensor qkv_b, core::GetWeight(ckpt, p + "attn.qkv.bias", {3 * hv}));
    Tensor qkv_bias = qkv_b.ToF32();
    IRIS_ASSIGN_OR_RETURN(b.qkv, Linear::Create(device, qkv_w, &qkv_bias, compute));
    IRIS_ASSIGN_OR_RETURN(Tensor proj_w, core::GetWeight(ckpt, p + "attn.proj.weight", {hv, hv}));
    IRIS_ASSIGN_OR_RETURN(Tensor proj_b, core::GetWeight(ckpt, p + "attn.proj.bias", {hv}));
    Tensor proj_bias = proj_b.ToF32();
    IRIS_ASSIGN_OR_RETURN(b.proj, Linear::Create(device, proj_w, &proj_bias, compute));

    if (config.mlp == core::VisionMlp::kQuickGelu) {
      // fc1 padded to ip rows by zero rows (quick_gelu(0) = 0) and fc2 to ip columns: exact.
      IRIS_ASSIGN_OR_RETURN(Tensor fc1_w, core::GetWeight(ckpt, p + "mlp.fc1.weight", {iv, hv}));
      IRIS_ASSIGN_OR_RETURN(Tensor fc1_b, core::GetWeight(ckpt, p + "mlp.fc1.bias", {iv}));
      Tensor fc1_pad = Tensor::Zeros(fc1_w.dtype(), {ip, hv});
      core::CopyRows(fc1_w, &fc1_pad, 0);
      Tensor fc1_bias = Tensor::Zeros(DType::kF32, {ip});
      Tensor f1b = fc1_b.ToF32();
      std::memcpy(fc1_bias.data<float>(), f1b.data<float>(), iv * sizeof(float));
      IRIS_ASSIGN_OR_RETURN(b.fc1, Linear::Create(device, fc1_pad, &fc1_bias, compute));
      IRIS_ASSIGN_OR_RETURN(Tensor fc2_w, core::GetWeight(ckpt, p + "mlp.fc2.weight", {hv, iv}));
      IRIS_ASSIGN_OR_RETURN(Tensor fc2_b, core::GetWeight(ckpt, p + "mlp.fc2.bias", {hv}));
      Tensor fc2_bias = fc2_b.ToF32();
      IRIS_ASSIGN_OR_RETURN(b.down, Linear::Create(device, PadColumns(fc2_w, ip), &fc2_bias, compute));
      continue;
    }
    // gate and up fused into one [2*ip, hv] projection; rows iv..ip of each half are zero, so
    // silu(0) * 0 = 0 and the padded columns of down add nothing: the result is exact.
    IRIS_ASSIGN_OR_RETURN(Tensor gate_w, core::GetWeight(ckpt, p + "mlp.gate_proj.weight", {iv, hv}));
    IRIS_ASSIGN_OR_RETURN(Tensor gate_b, core::GetWeight(ckpt, p + "mlp.gate_proj.bias", {iv}));
    IRIS_ASSIGN_OR_RETURN(Tensor up_w, core::GetWeight(ckpt, p + "mlp.up_proj.weight", {iv, hv}));
    IRIS_ASSIGN_OR_RETURN(Tensor up_b, core::GetWeight(ckpt, p + "mlp.up_proj.bias", {iv}));
    if (gate_w.dtype() != up_w.dtype()) {
      return absl::InvalidArgumentError(p + "mlp: gate_proj and up_proj dtypes differ");
    }
    Tensor gu_w = Tensor::Zeros(gate_w.dtype(), {2 * ip, hv});
    core::CopyRows(gate_w, &gu_w, 0);
    core::CopyRows(up_w, &gu_w, ip);
    Tensor gu_b = Tensor::Zeros(DType::kF32, {2 * ip});
    Tensor gb = gate_b.ToF32(), ub = up_b.ToF32();
    std::memcpy(gu_b.data<float>(), gb.data<float>(), iv * sizeof(float));
    std::memcpy(gu_b.data<float>() + ip, ub.data<float>(), iv * sizeof(float));
    IRIS_ASSIGN_OR_RETURN(b.gate_up, Linear::Create(device, gu_w, &gu_b, compute));

    IRIS_ASSIGN_OR_RETURN(Tensor down_w, core::GetWeight(ckpt, p + "mlp.down_proj.weight", {hv, iv}));
    IRIS_ASSIGN_OR_RETURN(Tensor down_b, core::GetWeight(ckpt, p + "mlp.down_proj.bias", {hv}));
    Tensor down_bias = down_b.ToF32();
    IRIS_ASSIGN_OR_RETURN(b.down, Linear::Create(device, PadColumns(down_w, ip), &down_bias, compute));
  }
  const int unit = config.spatial_merge_size * config.spatial_merge_size;
  const int64_t mh = hv * unit;
  IRIS_RETURN_IF_ERROR(
      LoadNorm(device, ckpt, config, "visual.merger.ln_q", hv, &enc->merger_norm_, &enc->merger_norm_bias_));
  IRIS_ASSIGN_OR_RETURN(Tensor fc1_w, core::GetWeight(ckpt, "visual.merger.mlp.0.weight", {mh, mh}));
  IRIS_ASSIGN_OR_RETURN(Tensor fc1_b, core::GetWeight(ckpt, "visual.merger.mlp.0.bias", {mh}));
  Tensor fc1_bias = fc1_b.ToF32();
  IRIS_ASSIGN_OR_RETURN(enc->merger_fc1_, Linear::Create(device, fc1_w, &fc1_bias, compute));
  IRIS_ASSIGN_OR_RETURN(Tensor fc2_w, core::GetWeight(ckpt, "visual.merger.mlp.2.weight", {config.out_hidden_size, mh}));
  IRIS_ASSIGN_OR_RETURN(Tensor fc2_b, core::GetWeight(ckpt, "visual.merger.mlp.2.bias", {config.out_hidden_size}));
  Tensor fc2_bias = fc2_b.ToF32();
  IRIS_ASSIGN_OR_RETURN(enc->merger_fc2_, Linear::Create(device, fc2_w, &fc2_bias, compute));
  IRIS_RETURN_IF_ERROR(enc->ReserveActivations(options.max_patches));
  return enc;
}

absl::Status VisionEncoder::ReserveActivations(int64_t max_patches) {
  const int unit = config_.spatial_merge_size * config_.spatial_merge_size;
  if (max_patches < unit) {
    return absl::InvalidArgumentError(absl::StrCat("max_patches ", max_patches, " holds no merged token of ", unit,
                                                   " patches"));
  }
  const int64_t n = max_patches, hv = config_.hidden_size, d = config_.head_dim();
  const int64_t dp = std::max<int64_t>({d, options_.padded_head_dim, 96});
  const int64_t pad = n * config_.num_heads * dp;
  auto act = std::make_unique<Activations>();
  auto alloc = [&](Tensor* t, int64_t floats) -> absl::Status {
    IRIS_ASSIGN_OR_RETURN(*t, device_.Allocate(DType::kF32, {floats}));
    return absl::OkStatus();
  };
  IRIS_RETURN_IF_ERROR(alloc(&act->embedded, n * hv));
  IRIS_RETURN_IF_ERROR(alloc(&act->hidden, n * hv));
  IRIS_RETURN_IF_ERROR(alloc(&act->normed, n * hv));
  // qkv's buffer also holds the patch rows made from images' bytes while the patches are embedded.
  IRIS_RETURN_IF_ERROR(alloc(&act->qkv, n * std::max(3 * hv, patch_dim())));
  IRIS_RETURN_IF_ERROR(alloc(&act->attn, n * hv));
  // The fused gate/up output exists only for the gated MLP (fc1 writes straight into act).
  const bool gated = config_.mlp == core::VisionMlp::kGatedSilu;
  IRIS_RETURN_IF_ERROR(alloc(&act->gate_up, gated ? n * 2 * padded_intermediate_ : 1));
  IRIS_RETURN_IF_ERROR(alloc(&act->act, n * padded_intermediate_));
  IRIS_RETURN_IF_ERROR(alloc(&act->cos, n * d / 2));
  IRIS_RETURN_IF_ERROR(alloc(&act->sin, n * d / 2));
  IRIS_ASSIGN_OR_RETURN(act->cos_host, device_.AllocateStaging(DType::kF32, {n * d / 2}));
  IRIS_ASSIGN_OR_RETURN(act->sin_host, device_.AllocateStaging(DType::kF32, {n * d / 2}));
  for (Tensor* t : {&act->pad_q, &act->pad_k, &act->pad_v, &act->pad_out}) IRIS_RETURN_IF_ERROR(alloc(t, pad));
  IRIS_RETURN_IF_ERROR(alloc(&act->fc1, n * hv));
  IRIS_RETURN_IF_ERROR(alloc(&act->window_out, n / unit * config_.out_hidden_size));
  const bool f32 = options_.compute == kernels::ComputeType::kF32;
  if (const int64_t bytes = core::EncoderNormHandoffBytes(config_, n, device_.kind() != kernels::DeviceKind::kCpu, f32);
      bytes > 0) {
    act->handoff_parts = static_cast<int>(core::EncoderNormHandoffParts(config_));
    IRIS_RETURN_IF_ERROR(alloc(&act->norm_rows, n * hv / 2 + 1));
    IRIS_RETURN_IF_ERROR(alloc(&act->norm_partials, n * act->handoff_parts));
  }
  if (device_.kind() != kernels::DeviceKind::kCpu) {
    IRIS_RETURN_IF_ERROR(alloc(&act->raster, n / unit * config_.out_hidden_size));
    IRIS_ASSIGN_OR_RETURN(act->raster_host, device_.AllocateStaging(DType::kF32, {n / unit * config_.out_hidden_size}));
  }
  if (graphs_ != nullptr) {  // recorded on the old buffers, and the input sized for the old capacity
    device_.Synchronize();
    run_.reset();
    graphs_->entries.clear();
    IRIS_RETURN_IF_ERROR(AllocateGraphInput(*graphs_, max_patches));
  }
  act_ = std::move(act);
  max_patches_ = max_patches;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const VisionEncoder::DevicePlan>> VisionEncoder::MirrorPlan(
    std::shared_ptr<const EncoderPlan> plan) {
  auto dp = std::make_shared<DevicePlan>();
  IRIS_ASSIGN_OR_RETURN(dp->window_index, device_.Mirror(ViewOf(plan->window_index, plan)));
  IRIS_ASSIGN_OR_RETURN(dp->cu_seqlens, device_.Mirror(ViewOf(plan->cu_seqlens, plan)));
  IRIS_ASSIGN_OR_RETURN(dp->cu_window_seqlens, device_.Mirror(ViewOf(plan->cu_window_seqlens, plan)));
  IRIS_ASSIGN_OR_RETURN(dp->cos, device_.Mirror(plan->cos));
  IRIS_ASSIGN_OR_RETURN(dp->sin, device_.Mirror(plan->sin));
  dp->host = std::move(plan);
  return std::shared_ptr<const DevicePlan>(std::move(dp));
}

// The stages of a forward, in order; a block is kQkv, kPad (padding paths only), kAttend.
enum class VisionEncoder::Stage { kEmbed, kQkv, kPad, kAttend, kMerger, kDone };

struct VisionEncoder::Run {
  Tensor pixels;                            // the caller's pixel values as the device holds them
  // Begun from bytes instead: the images' bytes on the device, and where each one's lie.
  struct Image {
    int64_t offset = 0;  // its first byte in rgb
    int64_t row0 = 0;    // its first patch row in the forward
    kernels::PatchGrid grid;
  };
  Tensor rgb;
  std::vector<Image> images;
  // With graphs: the recorded forward to replay, or the entry to record this forward for.
  Graphs::Entry* replay = nullptr;
  Graphs::Entry* record = nullptr;
  std::vector<GridThw> grids;               // the plan rebuilt per layer (cached_cu_seqlens off); the images' rows
  std::shared_ptr<const DevicePlan> plan;   // the forward's plan
  std::shared_ptr<const DevicePlan> layer;  // this layer's (the same, unless rebuilt per layer)
  int64_t n = 0;                            // patches
  int l = 0;                                // the block the stage belongs to
  Stage stage = Stage::kEmbed;
  int64_t row = 0;                          // the stage's next row
  double attention_flops_per_row[2] = {0, 0};  // window, full: mean over the rows
  // q, k, v held as bf16 rows in the qkv buffer's bytes (kernels/qkv_bf16.h): fixed for the
  // forward, so that every piece writes the form the attention reads.
  bool qkv_bf16 = false;
  // The next block's norm1 handed on by this block's down (kAttend pieces) for rows
  // [0, norm1_made), norm1_parts partials a row: its qkv pieces inside them read it.
  int64_t norm1_made = 0;
  int norm1_parts = 0;
};

void VisionEncoder::AttentionAndProj(const Block& b, const DevicePlan& plan, bool full, int64_t n, int64_t r0,
                                     int64_t r1, float* h, kernels::RmsNormHandoff* next) {
  const int heads = config_.num_heads, d = config_.head_dim();
  const int64_t hv = config_.hidden_size;
  float* qkv = act_->qkv.data<float>();
  float* out = act_->attn.data<float>();
  kernels::AttentionArgs a;
  a.num_heads = heads;
  a.num_kv_heads = heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.cu_seqlens = plan.Span(full ? plan.cu_seqlens : plan.cu_window_seqlens);
  a.max_seqlen = full ? plan.host->max_seqlen : plan.host->max_window_seqlen;
  a.q_begin = r0;
  a.q_end = r1;
  a.num_rows = n;
  // bf16 mode: q·kᵀ and p·v as bf16 dot products (f32 softmax and accumulation).
  a.bf16 = options_.compute == kernels::ComputeType::kBF16;
  const QkvPadding padding = ResolveQkvPadding(options_, d);
  if (padding == QkvPadding::kNone) {
    if (run_->qkv_bf16) {
      const uint16_t* q16 = reinterpret_cast<const uint16_t*>(qkv);
      a.q = {nullptr, 3 * hv, d, q16};
      a.k = {nullptr, 3 * hv, d, q16 + hv};
      a.v = {nullptr, 3 * hv, d, q16 + 2 * hv};
    } else {
      a.q = {qkv, 3 * hv, d};
      a.k = {qkv + hv, 3 * hv, d};
      a.v = {qkv + 2 * hv, 3 * hv, d};
    }
    a.out = out;
    a.out_row_stride = hv;
    a.head_dim = d;
    // (On a GPU the attention may write proj's bf16 input rows itself: kernels/attention_projection.h.)
    kernels::AttendAndProject(device_, a, *b.proj, h, next);
    return;
  }
  if (next != nullptr) next->parts = 0;
  // q, k, v in head-major buffers padded to dp (PadAll), attention at dp, the output sliced back.
  const int dp = options_.padded_head_dim > d ? options_.padded_head_dim : std::max(d, 96);
  float* po = act_->pad_out.data<float>();
  a.q = {act_->pad_q.data<float>(), dp, n * dp};
  a.k = {act_->pad_k.data<float>(), dp, n * dp};
  a.v = {act_->pad_v.data<float>(), dp, n * dp};
  a.out = po;
  a.out_row_stride = int64_t{heads} * dp;
  a.head_dim = dp;
  kernels::VarlenAttention(device_, a);
  kernels::UnpadHeads(device_, po + r0 * heads * dp, r1 - r0, heads, d, dp, out + r0 * hv);
  b.proj->Forward(out + r0 * hv, r1 - r0, h, Epilogue::kAccumulate);
}

void VisionEncoder::PadAll(int64_t n) {
  const int heads = config_.num_heads, d = config_.head_dim();
  const int dp = options_.padded_head_dim > d ? options_.padded_head_dim : std::max(d, 96);
  const float* qkv = act_->qkv.data<float>();
  float* pq = act_->pad_q.data<float>();
  float* pk = act_->pad_k.data<float>();
  float* pv = act_->pad_v.data<float>();
  if (ResolveQkvPadding(options_, d) == QkvPadding::kOnePass) {
    kernels::PadQkv(device_, qkv, n, heads, d, dp, pq, pk, pv);
  } else {
    kernels::PadOneOfQkv(device_, qkv, n, heads, d, dp, 0, pq);
    kernels::PadOneOfQkv(device_, qkv, n, heads, d, dp, 1, pk);
    kernels::PadOneOfQkv(device_, qkv, n, heads, d, dp, 2, pv);
  }
}

absl::StatusOr<Tensor> VisionEncoder::Forward(const Tensor& pixel_values, std::span<const GridThw> grid_thw) {
  run_.reset();
  IRIS_RETURN_IF_ERROR(Begin(pixel_values, grid_thw));
  IRIS_RETURN_IF_ERROR(AdvanceToEnd());
  return Finish();
}

absl::StatusOr<Tensor> VisionEncoder::ForwardRgb(const Tensor& rgb, std::span<const GridThw> grid_thw,
                                                 const PixelNormalization& normalization) {
  run_.reset();
  IRIS_RETURN_IF_ERROR(BeginRgb(rgb, grid_thw, normalization));
  IRIS_RETURN_IF_ERROR(AdvanceToEnd());
  return Finish();
}

absl::StatusOr<std::unique_ptr<VisionEncoder::Run>> VisionEncoder::NewRun(std::span<const GridThw> grid_thw) {
  auto run = std::make_unique<Run>();
  if (options_.techniques.cached_cu_seqlens) {
    // The last forward's plan while the list repeats; else the plan a recorded graph of the list
    // holds (lists alternate between graphs: no rebuild and upload a replay would not read);
    // else the host plan (the cache's, rebuilt on a miss) mirrored.
    if (device_plan_ != nullptr && SameGrids(device_plan_->host->grid_thw, grid_thw)) {
      ++held_plan_hits_;
    } else if (std::shared_ptr<const DevicePlan> held = graphs_ != nullptr ? graphs_->HeldPlan(grid_thw) : nullptr) {
      device_plan_ = std::move(held);
      ++held_plan_hits_;
    } else {
      IRIS_ASSIGN_OR_RETURN(std::shared_ptr<const EncoderPlan> host, plan_cache_.Get(grid_thw));
      IRIS_ASSIGN_OR_RETURN(device_plan_, MirrorPlan(std::move(host)));
    }
    stats_.plan_cache_hits = plan_cache_.hits() + held_plan_hits_;
    stats_.plan_cache_misses = plan_cache_.misses();
    run->plan = device_plan_;
  } else {
    IRIS_ASSIGN_OR_RETURN(std::shared_ptr<const EncoderPlan> host, BuildEncoderPlan(config_, grid_thw));
    IRIS_ASSIGN_OR_RETURN(run->plan, MirrorPlan(std::move(host)));
  }
  const int64_t n = run->plan->host->num_patches;
  if (n > max_patches_) {
    return absl::InvalidArgumentError(absl::StrCat("grid_thw: ", n, " patches in one forward exceed the encoder's ",
                                                   "capacity of ", max_patches_, " (max_patches)"));
  }
  run->grids.assign(grid_thw.begin(), grid_thw.end());
  run->layer = run->plan;
  run->n = n;
  run->qkv_bf16 = !blocks_.empty() && ResolveQkvPadding(options_, config_.head_dim()) == QkvPadding::kNone &&
                  kernels::KeepsQkvInBf16(device_, *blocks_[0].qkv, options_.compute == kernels::ComputeType::kBF16);
  // Attention FLOPs per query row: 4 * hidden * its sequence's length, averaged over the rows.
  const EncoderPlan& host = *run->plan->host;
  int i = 0;
  for (const std::vector<int32_t>* cu : {&host.cu_window_seqlens, &host.cu_seqlens}) {
    double sum = 0;
    for (size_t s = 1; s < cu->size(); ++s) {
      const double len = (*cu)[s] - (*cu)[s - 1];
      sum += len * len;
    }
    run->attention_flops_per_row[i++] = n > 0 ? 4.0 * config_.hidden_size * sum / n : 0;
  }
  return run;
}

absl::Status VisionEncoder::Begin(const Tensor& pixel_values, std::span<const GridThw> grid_thw) {
  if (run_ != nullptr) return absl::FailedPreconditionError("an encoder forward is already in progress");
  if (pixel_values.dtype() != DType::kF32 || pixel_values.rank() != 2 || pixel_values.dim(1) != patch_dim()) {
    return absl::InvalidArgumentError(absl::StrCat("pixel_values must be F32 [patches, ", patch_dim(), "], got ",
                                                   core::DTypeName(pixel_values.dtype()), " ",
                                                   pixel_values.ShapeString()));
  }
  IRIS_ASSIGN_OR_RETURN(std::unique_ptr<Run> run, NewRun(grid_thw));
  if (pixel_values.dim(0) != run->n) {
    return absl::InvalidArgumentError(absl::StrCat("pixel_values has ", pixel_values.dim(0),
                                                   " rows but grid_thw implies ", run->n, " patches"));
  }
  IRIS_ASSIGN_OR_RETURN(run->pixels, device_.Mirror(pixel_values));
  ++stats_.forwards;
  run_ = std::move(run);
  return absl::OkStatus();
}

absl::Status VisionEncoder::BeginRgb(const Tensor& rgb, std::span<const GridThw> grid_thw,
                                     const PixelNormalization& normalization) {
  if (run_ != nullptr) return absl::FailedPreconditionError("an encoder forward is already in progress");
  if (rgb.dtype() != DType::kU8) {
    return absl::InvalidArgumentError(absl::StrCat("rgb must be U8 (the images' bytes), got ",
                                                   core::DTypeName(rgb.dtype()), " ", rgb.ShapeString()));
  }
  IRIS_ASSIGN_OR_RETURN(std::unique_ptr<Run> run, NewRun(grid_thw));  // the grids checked
  const int p = config_.patch_size;
  int64_t bytes = 0, row0 = 0;
  for (size_t i = 0; i < grid_thw.size(); ++i) {
    const GridThw& g = grid_thw[i];
    if (g[0] != 1) {
      return absl::InvalidArgumentError(absl::StrCat("grid_thw[", i, "]: t is ", g[0],
                                                     "; a forward from bytes takes images only (t = 1)"));
    }
    Run::Image im;
    im.offset = bytes;
    im.row0 = row0;
    im.grid = kernels::PatchGrid{p, config_.temporal_patch_size, config_.spatial_merge_size, g[1] * p, g[2] * p};
    bytes += im.grid.height * im.grid.width * 3;
    row0 += im.grid.rows();
    run->images.push_back(im);
  }
  if (rgb.numel() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("rgb has ", rgb.numel(), " bytes but grid_thw implies ", bytes,
                                                   " (each image resized to its grid, 3 bytes a pixel)"));
  }
  IRIS_RETURN_IF_ERROR(UsePixelTable(normalization));
  if (graphs_ != nullptr && !graphs_->paused && options_.techniques.cached_cu_seqlens &&
      options_.techniques.fused_rotary && !observer_) {
    // The bytes at the one address every graph reads them from, through the pinned staging: copied
    // there over several threads, then uploaded behind nothing (from pageable memory the driver
    // stages them itself, on one thread, before the call returns).
    if (graphs_->upload_pending) device_.Synchronize();  // a forward abandoned before its end
    core::ParallelCopy(graphs_->input_host.raw(), rgb.raw(), static_cast<size_t>(bytes));
    device_.CopyToDevice(graphs_->input_host.raw(), graphs_->input.raw(), static_cast<size_t>(bytes));
    graphs_->upload_pending = true;
    IRIS_RETURN_IF_ERROR(device_.status());
    run->rgb = graphs_->input;
    Graphs::Entry& e = graphs_->Find(grid_thw, device_);
    if (e.graph != nullptr) {
      run->replay = &e;
    } else if (++e.direct >= 2) {
      run->record = &e;
    }
  } else {
    IRIS_ASSIGN_OR_RETURN(run->rgb, device_.Mirror(rgb));
  }
  ++stats_.forwards;
  run_ = std::move(run);
  return absl::OkStatus();
}

absl::Status VisionEncoder::UsePixelTable(const PixelNormalization& normalization) {
  if (table_normalization_ == normalization) return absl::OkStatus();
  if (pixel_table_.raw() == nullptr) {
    IRIS_ASSIGN_OR_RETURN(pixel_table_, device_.Allocate(DType::kF32, {kPixelTableSize}));
  }
  pixel_table_host_ = PixelTable(normalization.mean, normalization.std);
  device_.CopyToDevice(pixel_table_host_.data(), pixel_table_.data<float>(), sizeof(pixel_table_host_));
  IRIS_RETURN_IF_ERROR(device_.status());
  table_normalization_ = normalization;
  return absl::OkStatus();
}

absl::Status VisionEncoder::AllocateGraphInput(Graphs& g, int64_t max_patches) {
  const int64_t p = config_.patch_size, bytes = max_patches * p * p * 3;  // a forward's bytes at most
  IRIS_ASSIGN_OR_RETURN(g.input, device_.Allocate(DType::kU8, {bytes}));
  IRIS_ASSIGN_OR_RETURN(g.input_host, device_.AllocateStaging(DType::kU8, {bytes}));
  g.upload_pending = false;
  return absl::OkStatus();
}

absl::Status VisionEncoder::EnableGraphs(int max_graphs) {
  if (!device_.records_graphs()) {
    return absl::UnimplementedError(absl::StrCat("encoder graphs: ", device_.Describe(), " records no graphs"));
  }
  if (max_graphs < 1) return absl::InvalidArgumentError(absl::StrCat("encoder graphs: max_graphs ", max_graphs, " < 1"));
  auto g = std::make_unique<Graphs>();
  g->max_graphs = max_graphs;
  IRIS_RETURN_IF_ERROR(AllocateGraphInput(*g, max_patches_));
  graphs_ = std::move(g);
  return absl::OkStatus();
}

void VisionEncoder::DisableGraphs() {
  if (graphs_ == nullptr) return;
  device_.Synchronize();  // a replay may still be running
  run_.reset();           // a forward in progress may point into them
  graphs_.reset();
}

void VisionEncoder::PauseGraphs(bool paused) {
  if (graphs_ != nullptr) graphs_->paused = paused;
}

int VisionEncoder::graphs() const {
  int n = 0;
  if (graphs_ != nullptr) {
    for (const auto& e : graphs_->entries) n += e->graph != nullptr;
  }
  return n;
}

int64_t VisionEncoder::graph_replays() const { return graphs_ != nullptr ? graphs_->replays : 0; }

void VisionEncoder::set_techniques(const EncoderTechniques& t) {
  options_.techniques = t;
  if (graphs_ != nullptr) {  // recorded under the old ones
    device_.Synchronize();
    run_.reset();
    graphs_->entries.clear();
  }
}

absl::Status VisionEncoder::RecordGraph() {
  Run& r = *run_;
  Graphs::Entry& e = *r.record;
  r.record = nullptr;
  // The same pieces again from the start, recorded and not run (the direct run's results stay).
  r.stage = Stage::kEmbed;
  r.l = 0;
  r.row = 0;
  r.layer = r.plan;
  // At the bound, the least recently used graph goes first (its list keeps its count).
  Graphs::Entry* lru = nullptr;
  int recorded = 0;
  for (const auto& x : graphs_->entries) {
    if (x->graph == nullptr) continue;
    ++recorded;
    if (lru == nullptr || x->last_use < lru->last_use) lru = x.get();
  }
  if (recorded >= graphs_->max_graphs && lru != nullptr) {
    device_.Synchronize();  // a replay of it may still be running
    lru->graph.reset();
    lru->plan.reset();
  }
  IRIS_RETURN_IF_ERROR(device_.BeginCapture());
  const absl::Status issued = Advance(std::numeric_limits<double>::infinity()).status();
  absl::StatusOr<std::unique_ptr<kernels::DeviceGraph>> graph = device_.EndCapture();
  IRIS_RETURN_IF_ERROR(issued);
  IRIS_RETURN_IF_ERROR(graph.status());
  e.graph = std::move(*graph);
  e.plan = r.plan;
  return absl::OkStatus();
}

void VisionEncoder::MakePatchRows(int64_t r0, int64_t r1, float* out) {
  const Run& r = *run_;
  const int64_t width = patch_dim();
  for (const Run::Image& im : r.images) {
    const int64_t a = std::max(r0, im.row0), b = std::min(r1, im.row0 + im.grid.rows());
    if (a >= b) continue;
    kernels::PatchRows(device_, r.rgb.data<uint8_t>() + im.offset, im.grid, pixel_table_.data<float>(), a - im.row0,
                       b - im.row0, out + (a - r0) * width);
  }
}

absl::Status VisionEncoder::AdvanceToEnd() {
  while (!done()) {
    if (absl::StatusOr<double> ran = Advance(std::numeric_limits<double>::infinity()); !ran.ok()) {
      run_.reset();
      return ran.status();
    }
  }
  return absl::OkStatus();
}

void VisionEncoder::Abandon() { run_.reset(); }

bool VisionEncoder::done() const { return run_ != nullptr && run_->stage == Stage::kDone; }

int64_t VisionEncoder::StageRows(Stage s) const {
  const int unit = config_.spatial_merge_size * config_.spatial_merge_size;
  switch (s) {
    case Stage::kPad: return 1;  // one piece
    case Stage::kMerger: return run_->n / unit;
    case Stage::kDone: return 0;
    default: return run_->n;
  }
}

double VisionEncoder::StageFlopsPerRow(Stage s, int l) const {
  const double hv = config_.hidden_size, ip = static_cast<double>(padded_intermediate_);
  const double unit = config_.spatial_merge_size * config_.spatial_merge_size;
  switch (s) {
    case Stage::kEmbed: return 2 * static_cast<double>(patch_dim()) * hv;
    case Stage::kQkv: return 2 * hv * 3 * hv;
    case Stage::kPad: return 0;
    case Stage::kAttend:
      return 2 * hv * hv + 2 * hv * (config_.mlp == core::VisionMlp::kGatedSilu ? 2 : 1) * ip + 2 * ip * hv +
             run_->attention_flops_per_row[config_.IsFullAttention(l) ? 1 : 0];
    case Stage::kMerger: return 2 * (unit * hv) * (unit * hv) + 2 * (unit * hv) * config_.out_hidden_size;
    case Stage::kDone: return 0;
  }
  return 0;
}

std::pair<VisionEncoder::Stage, int> VisionEncoder::Following(Stage s, int l) const {
  const bool padding = ResolveQkvPadding(options_, config_.head_dim()) != QkvPadding::kNone;
  switch (s) {
    case Stage::kEmbed: return {Stage::kQkv, 0};
    case Stage::kQkv: return {padding ? Stage::kPad : Stage::kAttend, l};
    case Stage::kPad: return {Stage::kAttend, l};
    case Stage::kAttend: return l + 1 < config_.depth ? std::pair{Stage::kQkv, l + 1} : std::pair{Stage::kMerger, l};
    case Stage::kMerger:
    case Stage::kDone: return {Stage::kDone, l};
  }
  return {Stage::kDone, l};
}

double VisionEncoder::remaining_flops() const {
  if (run_ == nullptr) return 0;
  // The current stage's rest, then every later stage whole.
  double left = StageFlopsPerRow(run_->stage, run_->l) * static_cast<double>(StageRows(run_->stage) - run_->row);
  for (auto [s, l] = Following(run_->stage, run_->l); s != Stage::kDone; std::tie(s, l) = Following(s, l)) {
    left += StageFlopsPerRow(s, l) * static_cast<double>(StageRows(s));
  }
  return left;
}

absl::Status VisionEncoder::NextStage() {
  Run& r = *run_;
  if (r.stage == Stage::kAttend && observer_) observer_(r.l, act_->hidden.data<float>(), r.n);
  std::tie(r.stage, r.l) = Following(r.stage, r.l);
  r.row = 0;
  if (r.stage == Stage::kQkv && !options_.techniques.cached_cu_seqlens && r.l > 0) {
    // The technique off: the plan built and mirrored again for this layer.
    IRIS_ASSIGN_OR_RETURN(std::shared_ptr<const EncoderPlan> host, BuildEncoderPlan(config_, r.grids));
    IRIS_ASSIGN_OR_RETURN(r.layer, MirrorPlan(std::move(host)));
  }
  return absl::OkStatus();
}

void VisionEncoder::Norm(const float* x, const Tensor& weight, const Tensor& bias, int64_t rows, float* y) {
  const int64_t hv = config_.hidden_size;
  if (config_.norm == core::VisionNorm::kLayerNorm) {
    kernels::LayerNorm(device_, x, weight.data<float>(), bias.data<float>(), rows, hv, config_.rms_norm_eps, y);
  } else {
    kernels::RmsNorm(device_, x, weight.data<float>(), rows, hv, config_.rms_norm_eps, y);
  }
}

kernels::LinearInput VisionEncoder::NormedInput(const float* x, const Tensor& weight, const Tensor& bias, int64_t rows,
                                               float* staging, const kernels::RmsNormHandoff* handed) {
  if (config_.norm == core::VisionNorm::kLayerNorm) {
    Norm(x, weight, bias, rows, staging);
    return kernels::LinearInput::Plain(staging);
  }
  return kernels::LinearInput::RmsNorm(x, weight.data<float>(), config_.rms_norm_eps, staging, handed);
}

std::optional<kernels::RmsNormHandoff> VisionEncoder::NormHandoff(const Tensor& weight, int64_t r0) {
  Activations& A = *act_;
  if (A.handoff_parts == 0) return std::nullopt;
  const int64_t hv = config_.hidden_size;
  kernels::RmsNormHandoff h;
  h.weight = weight.data<float>();
  h.eps = config_.rms_norm_eps;
  h.rows = reinterpret_cast<uint16_t*>(A.norm_rows.data<float>()) + r0 * hv;
  h.ld = hv;
  h.partials = A.norm_partials.data<float>() + r0 * A.handoff_parts;
  h.max_parts = A.handoff_parts;
  return h;
}

absl::Status VisionEncoder::RunPiece(int64_t r0, int64_t r1) {
  Run& r = *run_;
  const int64_t hv = config_.hidden_size, n = r.n, rows = r1 - r0;
  const int unit = config_.spatial_merge_size * config_.spatial_merge_size;
  const int heads = config_.num_heads, d = config_.head_dim();
  const int64_t ip = padded_intermediate_;
  Activations& A = *act_;
  float* hidden = A.hidden.data<float>();
  float* normed = A.normed.data<float>();
  float* qkv = A.qkv.data<float>();
  const DevicePlan& plan = *r.layer;
  switch (r.stage) {
    case Stage::kEmbed: {
      // Patch embedding; once all rows are embedded, regrouped into window order.
      float* embedded = A.embedded.data<float>();
      const float* patch_rows = qkv;
      if (r.images.empty()) {
        patch_rows = r.pixels.data<float>() + r0 * patch_dim();
      } else {  // begun from bytes: the rows made here, in qkv's buffer (free until block 0)
        MakePatchRows(r0, r1, qkv);
      }
      patch_embed_->Forward(patch_rows, rows, embedded + r0 * hv);
      if (r1 == n) kernels::GatherRows(device_, embedded, unit * hv, r.plan->Span(r.plan->window_index), hidden);
      break;
    }
    case Stage::kQkv: {
      const Block& b = blocks_[r.l];
      if (r0 == 0 && !options_.techniques.fused_rotary) {
        // The technique off: this layer's tables computed on the host and uploaded.
        ComputeRotaryTables(config_, *plan.host, A.cos_host.data<float>(), A.sin_host.data<float>());
        const size_t table_bytes = static_cast<size_t>(n) * (d / 2) * sizeof(float);
        device_.CopyToDevice(A.cos_host.data<float>(), A.cos.data<float>(), table_bytes);
        device_.CopyToDevice(A.sin_host.data<float>(), A.sin.data<float>(), table_bytes);
      }
      // The norm handed on by the block before's down, where it made these rows.
      std::optional<kernels::RmsNormHandoff> norm1;
      if (r.l > 0 && r1 <= r.norm1_made) {
        norm1 = NormHandoff(b.norm1, r0);
        if (norm1) norm1->parts = r.norm1_parts;
      }
      const kernels::LinearInput in =
          NormedInput(hidden + r0 * hv, b.norm1, b.norm1_bias, rows, normed + r0 * hv, norm1 ? &*norm1 : nullptr);
      const int64_t t0 = r0 * (d / 2);
      kernels::HeadsView q, k;
      if (r.qkv_bf16) {
        // Row r's bf16 values at r * 3 hv of the buffer's bytes read as bf16 (its first half).
        uint16_t* out = reinterpret_cast<uint16_t*>(qkv) + r0 * 3 * hv;
        if (options_.techniques.fused_rotary) {
          // The projection and the rotary together (in the matmul's epilogue where the device can).
          kernels::LinearForwardToBf16Rotary(device_, *b.qkv, in, rows, out, 3 * hv,
                                             {heads, d, plan.cos.data<float>() + t0, plan.sin.data<float>() + t0});
          break;
        }
        kernels::LinearForwardToBf16(device_, *b.qkv, in, rows, out, 3 * hv);
        q = {nullptr, 3 * hv, heads, out};
        k = {nullptr, 3 * hv, heads, out + hv};
      } else {
        float* out = qkv + r0 * 3 * hv;
        kernels::LinearForward(device_, *b.qkv, in, rows, out);
        q = {out, 3 * hv, heads};
        k = {out + hv, 3 * hv, heads};
      }
      if (options_.techniques.fused_rotary) {
        kernels::RotaryQK(device_, q, k, rows, d, plan.cos.data<float>() + t0, plan.sin.data<float>() + t0);
      } else {
        kernels::Rotary(device_, q, rows, d, A.cos.data<float>() + t0, A.sin.data<float>() + t0);
        kernels::Rotary(device_, k, rows, d, A.cos.data<float>() + t0, A.sin.data<float>() + t0);
      }
      break;
    }
    case Stage::kPad: PadAll(n); break;
    case Stage::kAttend: {
      const Block& b = blocks_[r.l];
      float* h = hidden + r0 * hv;
      // RMSNorm hand-offs (a GPU's Hopper GEMM; kernels::RmsNormHandoff): proj hands norm2 to
      // gate_up, down the next block's norm1 to its qkv.
      std::optional<kernels::RmsNormHandoff> norm2 = NormHandoff(b.norm2, r0);
      AttentionAndProj(b, plan, config_.IsFullAttention(r.l), n, r0, r1, h, norm2 ? &*norm2 : nullptr);
      const kernels::LinearInput nr = NormedInput(h, b.norm2, b.norm2_bias, rows, normed + r0 * hv,
                                                  norm2 && norm2->parts > 0 ? &*norm2 : nullptr);
      float* act = A.act.data<float>() + r0 * ip;
      std::optional<kernels::RmsNormHandoff> norm1;
      if (r.l + 1 < config_.depth) norm1 = NormHandoff(blocks_[r.l + 1].norm1, r0);
      if (b.fc1 != nullptr) {
        kernels::LinearForward(device_, *b.fc1, nr, rows, act);
        kernels::QuickGelu(device_, act, rows * ip, act);
        b.down->Forward(act, rows, h, Epilogue::kAccumulate);
        norm1.reset();
      } else {
        kernels::GatedMlp(device_, *b.gate_up, *b.down, nr, rows, {A.gate_up.data<float>() + r0 * 2 * ip, act}, h,
                          norm1 ? &*norm1 : nullptr);
      }
      // Rows [0, norm1_made) handed on with one count of partials, piece after piece from row 0.
      if (r0 == 0) r.norm1_made = 0;
      if (norm1 && norm1->parts > 0 && r0 == r.norm1_made && (r0 == 0 || norm1->parts == r.norm1_parts)) {
        r.norm1_made = r1;
        r.norm1_parts = norm1->parts;
      }
      break;
    }
    case Stage::kMerger: {
      // ln_q, every `unit` consecutive rows as one vector, MLP with GELU; rows are merged tokens.
      const int64_t mh = hv * unit;
      float* nr = normed + r0 * mh;
      Norm(hidden + r0 * mh, merger_norm_, merger_norm_bias_, rows * unit, nr);
      float* fc1 = A.fc1.data<float>() + r0 * mh;
      merger_fc1_->Forward(nr, rows, fc1, Epilogue::kGeluErf);
      merger_fc2_->Forward(fc1, rows, A.window_out.data<float>() + r0 * config_.out_hidden_size);
      break;
    }
    case Stage::kDone: break;
  }
  return absl::OkStatus();
}

absl::StatusOr<double> VisionEncoder::Advance(double max_flops) {
  if (run_ == nullptr) return absl::FailedPreconditionError("no encoder forward in progress (Begin first)");
  if (run_->replay != nullptr && run_->stage != Stage::kDone) {  // the whole forward, one launch
    const double flops = remaining_flops();
    IRIS_RETURN_IF_ERROR(run_->replay->graph->Replay());
    ++graphs_->replays;
    run_->stage = Stage::kDone;
    return flops;
  }
  // Pieces are cut at multiples of this many rows (the last piece of a stage excepted), so that
  // each matmul keeps a useful height.
  constexpr int64_t kGranule = 64;
  double ran = 0;
  bool first = true;
  while (run_->stage != Stage::kDone) {
    const int64_t left = StageRows(run_->stage) - run_->row;
    if (left <= 0) {
      IRIS_RETURN_IF_ERROR(NextStage());
      continue;
    }
    const double per_row = StageFlopsPerRow(run_->stage, run_->l);
    int64_t rows = left;
    if (per_row > 0 && ran + per_row * static_cast<double>(left) > max_flops) {
      const double fit = std::max(0.0, (max_flops - ran) / per_row);
      rows = fit >= static_cast<double>(left) ? left : static_cast<int64_t>(fit) / kGranule * kGranule;
      if (rows == 0) {
        if (!first) break;  // the allowance is spent
        rows = std::min(left, kGranule);
      }
    }
    const int64_t r0 = run_->row;
    IRIS_RETURN_IF_ERROR(RunPiece(r0, r0 + rows));
    run_->row += rows;
    ran += per_row * static_cast<double>(rows);
    first = false;
    if (run_->row == StageRows(run_->stage)) IRIS_RETURN_IF_ERROR(NextStage());
  }
  return ran;
}

absl::StatusOr<const float*> VisionEncoder::EndInRaster(std::unique_ptr<Run>* ended, Tensor* made) {
  if (!done()) {
    run_.reset();
    return absl::FailedPreconditionError("the encoder forward is not done (Advance until done)");
  }
  if (run_->record != nullptr) {
    if (absl::Status s = RecordGraph(); !s.ok()) {
      run_.reset();
      return s;
    }
  }
  *ended = std::move(run_);
  const Run& r = **ended;
  // Back to raster order.
  const int64_t merged = r.plan->host->num_merged, out_dim = config_.out_hidden_size;
  const std::span<const int32_t> order = r.plan->Span(r.plan->window_index);
  if (device_.kind() == kernels::DeviceKind::kCpu) {
    *made = Tensor::Empty(DType::kF32, {merged, out_dim});
    kernels::ScatterRows(device_, act_->window_out.data<float>(), out_dim, order, made->data<float>());
    return made->data<float>();
  }
  // The engine and the tools keep embeddings in plain host memory (the encoder cache, the
  // decoder's given rows): a GPU's result comes back through the kept staging, and the wait is
  // for this device's stream only.
  kernels::ScatterRows(device_, act_->window_out.data<float>(), out_dim, order, act_->raster.data<float>());
  const size_t bytes = static_cast<size_t>(merged * out_dim) * sizeof(float);
  device_.CopyToHost(act_->raster.data<float>(), act_->raster_host.data<float>(), bytes);  // waits
  if (graphs_ != nullptr) graphs_->upload_pending = false;
  IRIS_RETURN_IF_ERROR(device_.status());
  return act_->raster_host.data<float>();
}

absl::StatusOr<Tensor> VisionEncoder::Finish() {
  std::unique_ptr<Run> r;
  Tensor made;
  IRIS_ASSIGN_OR_RETURN(const float* raster, EndInRaster(&r, &made));
  if (made.raw() != nullptr) return made;
  Tensor out = Tensor::Empty(DType::kF32, {r->plan->host->num_merged, config_.out_hidden_size});
  core::ParallelCopy(out.data<float>(), raster, out.nbytes());
  return out;
}

absl::StatusOr<std::vector<Tensor>> VisionEncoder::FinishImages() {
  std::unique_ptr<Run> r;
  Tensor made;
  IRIS_ASSIGN_OR_RETURN(const float* raster, EndInRaster(&r, &made));
  const int64_t unit = int64_t{config_.spatial_merge_size} * config_.spatial_merge_size, out_dim = config_.out_hidden_size;
  std::vector<Tensor> images;
  images.reserve(r->grids.size());
  int64_t row = 0;
  for (const GridThw& g : r->grids) {
    const int64_t rows = g[0] * g[1] * g[2] / unit;
    Tensor image = Tensor::Empty(DType::kF32, {rows, out_dim});
    core::ParallelCopy(image.data<float>(), raster + row * out_dim, image.nbytes());
    images.push_back(std::move(image));
    row += rows;
  }
  return images;
}

double VisionEncoder::CountFlops(std::span<const GridThw> grid_thw) const {
  const double hv = config_.hidden_size, iv = config_.intermediate_size;
  auto plan = BuildEncoderPlan(config_, grid_thw);
  if (!plan.ok()) return 0;
  const double n = static_cast<double>((*plan)->num_patches);
  auto attention = [&](const std::vector<int32_t>& cu) {
    double s = 0;
    for (size_t i = 1; i < cu.size(); ++i) {
      const double len = cu[i] - cu[i - 1];
      s += 4.0 * len * len * hv;  // QKᵀ and P·V over all heads
    }
    return s;
  };
  double flops = 2 * n * static_cast<double>(patch_dim()) * hv;
  for (int l = 0; l < config_.depth; ++l) {
    flops += 2 * n * hv * (3 * hv + hv + (config_.mlp == core::VisionMlp::kGatedSilu ? 3 : 2) * iv);
    flops += attention(config_.IsFullAttention(l) ? (*plan)->cu_seqlens : (*plan)->cu_window_seqlens);
  }
  const double unit = config_.spatial_merge_size * config_.spatial_merge_size;
  const double m = n / unit;
  flops += 2 * m * (unit * hv) * (unit * hv) + 2 * m * (unit * hv) * config_.out_hidden_size;
  return flops;
}

}  // namespace iris::vision
