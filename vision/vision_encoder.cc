#include "vision/vision_encoder.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/weights.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/qkv_pad.h"
#include "kernels/rotary.h"
#include "kernels/rows.h"

namespace iris::vision {

using core::DType;
using core::Tensor;
using kernels::Epilogue;
using kernels::Linear;

struct VisionEncoder::Block {
  Tensor norm1, norm2;  // F32 [hidden]
  std::unique_ptr<Linear> qkv, proj, gate_up, down;
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

int64_t RoundUp(int64_t x, int64_t m) { return m <= 0 ? x : (x + m - 1) / m * m; }

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
  const int64_t patch_dim = int64_t{config.in_channels} * config.temporal_patch_size *
                            config.patch_size * config.patch_size;
  IRIS_ASSIGN_OR_RETURN(Tensor pe, core::GetWeight(ckpt, "visual.patch_embed.proj.weight",
                                             {hv, config.in_channels, config.temporal_patch_size,
                                              config.patch_size, config.patch_size}));
  IRIS_ASSIGN_OR_RETURN(enc->patch_embed_, Linear::Create(device, pe.Reshaped({hv, patch_dim}), nullptr, compute));

  const int64_t ip = RoundUp(iv, options.intermediate_multiple);
  enc->padded_intermediate_ = ip;
  enc->blocks_.resize(config.depth);
  for (int i = 0; i < config.depth; ++i) {
    const std::string p = absl::StrCat("visual.blocks.", i, ".");
    Block& b = enc->blocks_[i];
    IRIS_ASSIGN_OR_RETURN(Tensor n1, core::GetWeight(ckpt, p + "norm1.weight", {hv}));
    IRIS_ASSIGN_OR_RETURN(Tensor n2, core::GetWeight(ckpt, p + "norm2.weight", {hv}));
    IRIS_ASSIGN_OR_RETURN(b.norm1, device.Mirror(n1.ToF32()));
    IRIS_ASSIGN_OR_RETURN(b.norm2, device.Mirror(n2.ToF32()));
    IRIS_ASSIGN_OR_RETURN(Tensor qkv_w, core::GetWeight(ckpt, p + "attn.qkv.weight", {3 * hv, hv}));
    IRIS_ASSIGN_OR_RETURN(Tensor qkv_b, core::GetWeight(ckpt, p + "attn.qkv.bias", {3 * hv}));
    Tensor qkv_bias = qkv_b.ToF32();
    IRIS_ASSIGN_OR_RETURN(b.qkv, Linear::Create(device, qkv_w, &qkv_bias, compute));
    IRIS_ASSIGN_OR_RETURN(Tensor proj_w, core::GetWeight(ckpt, p + "attn.proj.weight", {hv, hv}));
    IRIS_ASSIGN_OR_RETURN(Tensor proj_b, core::GetWeight(ckpt, p + "attn.proj.bias", {hv}));
    Tensor proj_bias = proj_b.ToF32();
    IRIS_ASSIGN_OR_RETURN(b.proj, Linear::Create(device, proj_w, &proj_bias, compute));

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
    Tensor down_pad = Tensor::Zeros(down_w.dtype(), {hv, ip});
    const size_t es = core::DTypeSize(down_w.dtype());
    for (int64_t r = 0; r < hv; ++r) {
      std::memcpy(static_cast<char*>(down_pad.raw()) + r * ip * es,
                  static_cast<const char*>(down_w.raw()) + r * iv * es, iv * es);
    }
    Tensor down_bias = down_b.ToF32();
    IRIS_ASSIGN_OR_RETURN(b.down, Linear::Create(device, down_pad, &down_bias, compute));
  }
  const int unit = config.spatial_merge_size * config.spatial_merge_size;
  const int64_t mh = hv * unit;
  IRIS_ASSIGN_OR_RETURN(Tensor lnq, core::GetWeight(ckpt, "visual.merger.ln_q.weight", {hv}));
  IRIS_ASSIGN_OR_RETURN(enc->merger_norm_, device.Mirror(lnq.ToF32()));
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
  IRIS_RETURN_IF_ERROR(alloc(&act->qkv, n * 3 * hv));
  IRIS_RETURN_IF_ERROR(alloc(&act->attn, n * hv));
  IRIS_RETURN_IF_ERROR(alloc(&act->gate_up, n * 2 * padded_intermediate_));
  IRIS_RETURN_IF_ERROR(alloc(&act->act, n * padded_intermediate_));
  IRIS_RETURN_IF_ERROR(alloc(&act->cos, n * d / 2));
  IRIS_RETURN_IF_ERROR(alloc(&act->sin, n * d / 2));
  IRIS_ASSIGN_OR_RETURN(act->cos_host, device_.AllocateStaging(DType::kF32, {n * d / 2}));
  IRIS_ASSIGN_OR_RETURN(act->sin_host, device_.AllocateStaging(DType::kF32, {n * d / 2}));
  for (Tensor* t : {&act->pad_q, &act->pad_k, &act->pad_v, &act->pad_out}) IRIS_RETURN_IF_ERROR(alloc(t, pad));
  IRIS_RETURN_IF_ERROR(alloc(&act->fc1, n * hv));
  IRIS_RETURN_IF_ERROR(alloc(&act->window_out, n / unit * config_.out_hidden_size));
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

void VisionEncoder::Attention(const DevicePlan& plan, bool full, int64_t n) {
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
  // bf16 mode: q·kᵀ and p·v as bf16 dot products (f32 softmax and accumulation).
  a.bf16 = options_.compute == kernels::ComputeType::kBF16;
  const QkvPadding padding = ResolveQkvPadding(options_, d);
  if (padding == QkvPadding::kNone) {
    a.q = {qkv, 3 * hv, d};
    a.k = {qkv + hv, 3 * hv, d};
    a.v = {qkv + 2 * hv, 3 * hv, d};
    a.out = out;
    a.out_row_stride = hv;
    a.head_dim = d;
    kernels::VarlenAttention(device_, a);
    return;
  }
  // q, k, v split into head-major buffers padded to dp, attention at dp, the output sliced back.
  const int dp = options_.padded_head_dim > d ? options_.padded_head_dim : std::max(d, 96);
  float* pq = act_->pad_q.data<float>();
  float* pk = act_->pad_k.data<float>();
  float* pv = act_->pad_v.data<float>();
  float* po = act_->pad_out.data<float>();
  if (padding == QkvPadding::kOnePass) {
    kernels::PadQkv(device_, qkv, n, heads, d, dp, pq, pk, pv);
  } else {
    kernels::PadOneOfQkv(device_, qkv, n, heads, d, dp, 0, pq);
    kernels::PadOneOfQkv(device_, qkv, n, heads, d, dp, 1, pk);
    kernels::PadOneOfQkv(device_, qkv, n, heads, d, dp, 2, pv);
  }
  a.q = {pq, dp, n * dp};
  a.k = {pk, dp, n * dp};
  a.v = {pv, dp, n * dp};
  a.out = po;
  a.out_row_stride = int64_t{heads} * dp;
  a.head_dim = dp;
  kernels::VarlenAttention(device_, a);
  kernels::UnpadHeads(device_, po, n, heads, d, dp, out);
}

absl::StatusOr<Tensor> VisionEncoder::Forward(const Tensor& pixel_values, std::span<const GridThw> grid_thw) {
  const int64_t hv = config_.hidden_size;
  const int64_t patch_dim = int64_t{config_.in_channels} * config_.temporal_patch_size *
                            config_.patch_size * config_.patch_size;
  if (pixel_values.dtype() != DType::kF32 || pixel_values.rank() != 2 || pixel_values.dim(1) != patch_dim) {
    return absl::InvalidArgumentError(absl::StrCat("pixel_values must be F32 [patches, ", patch_dim,
                                                   "], got ", core::DTypeName(pixel_values.dtype()), " ",
                                                   pixel_values.ShapeString()));
  }
  const EncoderTechniques tech = options_.techniques;
  std::shared_ptr<const DevicePlan> plan;
  if (tech.cached_cu_seqlens) {
    IRIS_ASSIGN_OR_RETURN(std::shared_ptr<const EncoderPlan> host, plan_cache_.Get(grid_thw));
    stats_.plan_cache_hits = plan_cache_.hits();
    stats_.plan_cache_misses = plan_cache_.misses();
    if (device_plan_ == nullptr || device_plan_->host != host) {
      IRIS_ASSIGN_OR_RETURN(device_plan_, MirrorPlan(std::move(host)));
    }
    plan = device_plan_;
  } else {
    IRIS_ASSIGN_OR_RETURN(std::shared_ptr<const EncoderPlan> host, BuildEncoderPlan(config_, grid_thw));
    IRIS_ASSIGN_OR_RETURN(plan, MirrorPlan(std::move(host)));
  }
  const int64_t n = plan->host->num_patches;
  if (pixel_values.dim(0) != n) {
    return absl::InvalidArgumentError(absl::StrCat("pixel_values has ", pixel_values.dim(0),
                                                   " rows but grid_thw implies ", n, " patches"));
  }
  if (n > max_patches_) {
    return absl::InvalidArgumentError(absl::StrCat("grid_thw: ", n, " patches in one forward exceed the encoder's ",
                                                   "capacity of ", max_patches_, " (max_patches)"));
  }
  ++stats_.forwards;
  const int unit = config_.spatial_merge_size * config_.spatial_merge_size;
  const int heads = config_.num_heads, d = config_.head_dim();
  Activations& A = *act_;
  float* hidden = A.hidden.data<float>();
  float* normed = A.normed.data<float>();
  float* qkv = A.qkv.data<float>();

  // Patch embedding, then rows regrouped into window order (groups of `unit` patches).
  float* embedded = A.embedded.data<float>();
  IRIS_ASSIGN_OR_RETURN(const Tensor pixels, device_.Mirror(pixel_values));
  patch_embed_->Forward(pixels.data<float>(), n, embedded);
  kernels::GatherRows(device_, embedded, unit * hv, plan->Span(plan->window_index), hidden);

  const int64_t ip = padded_intermediate_;
  for (int l = 0; l < config_.depth; ++l) {
    const Block& b = blocks_[l];
    std::shared_ptr<const DevicePlan> layer_plan = plan;
    if (!tech.cached_cu_seqlens) {
      IRIS_ASSIGN_OR_RETURN(std::shared_ptr<const EncoderPlan> host, BuildEncoderPlan(config_, grid_thw));
      IRIS_ASSIGN_OR_RETURN(layer_plan, MirrorPlan(std::move(host)));
    }
    kernels::RmsNorm(device_, hidden, b.norm1.data<float>(), n, hv, config_.rms_norm_eps, normed);
    b.qkv->Forward(normed, n, qkv);
    const kernels::HeadsView q{qkv, 3 * hv, heads}, k{qkv + hv, 3 * hv, heads};
    if (tech.fused_rotary) {
      kernels::RotaryQK(device_, q, k, n, d, layer_plan->cos.data<float>(), layer_plan->sin.data<float>());
    } else {
      float* cos = A.cos.data<float>();
      float* sin = A.sin.data<float>();
      ComputeRotaryTables(config_, *layer_plan->host, A.cos_host.data<float>(), A.sin_host.data<float>());
      const size_t table_bytes = static_cast<size_t>(n) * (d / 2) * sizeof(float);
      device_.CopyToDevice(A.cos_host.data<float>(), cos, table_bytes);
      device_.CopyToDevice(A.sin_host.data<float>(), sin, table_bytes);
      kernels::Rotary(device_, q, n, d, cos, sin);
      kernels::Rotary(device_, k, n, d, cos, sin);
    }
    Attention(*layer_plan, config_.IsFullAttention(l), n);
    b.proj->Forward(A.attn.data<float>(), n, hidden, Epilogue::kAccumulate);
    kernels::RmsNorm(device_, hidden, b.norm2.data<float>(), n, hv, config_.rms_norm_eps, normed);
    float* gu = A.gate_up.data<float>();
    b.gate_up->Forward(normed, n, gu);
    float* act = A.act.data<float>();
    kernels::SiluMulRows(device_, gu, n, ip, act);
    b.down->Forward(act, n, hidden, Epilogue::kAccumulate);
    if (observer_) observer_(l, hidden, n);
  }

  // Merger: RMSNorm, every `unit` consecutive rows as one vector, MLP with GELU.
  const int64_t merged = plan->host->num_merged;
  kernels::RmsNorm(device_, hidden, merger_norm_.data<float>(), n, hv, config_.rms_norm_eps, normed);
  float* fc1 = A.fc1.data<float>();
  merger_fc1_->Forward(normed, merged, fc1, Epilogue::kGeluErf);
  const int64_t out_dim = config_.out_hidden_size;
  float* window_out = A.window_out.data<float>();
  merger_fc2_->Forward(fc1, merged, window_out);
  // Back to raster order, into memory the caller owns.
  IRIS_ASSIGN_OR_RETURN(Tensor out, device_.Allocate(DType::kF32, {merged, out_dim}));
  kernels::ScatterRows(device_, window_out, out_dim, plan->Span(plan->window_index), out.data<float>());
  return out;
}

double VisionEncoder::CountFlops(std::span<const GridThw> grid_thw) const {
  const double hv = config_.hidden_size, iv = config_.intermediate_size;
  const double patch_dim = double{1.0} * config_.in_channels * config_.temporal_patch_size *
                           config_.patch_size * config_.patch_size;
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
  double flops = 2 * n * patch_dim * hv;
  for (int l = 0; l < config_.depth; ++l) {
    flops += 2 * n * hv * (3 * hv + hv + 3 * iv);
    flops += attention(config_.IsFullAttention(l) ? (*plan)->cu_seqlens : (*plan)->cu_window_seqlens);
  }
  const double unit = config_.spatial_merge_size * config_.spatial_merge_size;
  const double m = n / unit;
  flops += 2 * m * (unit * hv) * (unit * hv) + 2 * m * (unit * hv) * config_.out_hidden_size;
  return flops;
}

}  // namespace iris::vision
