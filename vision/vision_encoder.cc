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

namespace iris::vision {

using core::DType;
using core::Tensor;
using kernels::Epilogue;
using kernels::Linear;

struct VisionEncoder::Block {
  Tensor norm1, norm2;  // F32 [hidden]
  std::unique_ptr<Linear> qkv, proj, gate_up, down;
};

namespace {

enum Slot { kHidden, kNormed, kQkv, kAttn, kGateUp, kAct, kCos, kSin, kPadQ, kPadK, kPadV, kPadOut, kFc1, kNumSlots };

int64_t RoundUp(int64_t x, int64_t m) { return m <= 0 ? x : (x + m - 1) / m * m; }

}  // namespace

VisionEncoder::VisionEncoder(const core::VisionConfig& config, const EncoderOptions& options)
    : config_(config), options_(options), plan_cache_(config) {}

VisionEncoder::~VisionEncoder() = default;

absl::StatusOr<std::unique_ptr<VisionEncoder>> VisionEncoder::Load(const core::Checkpoint& ckpt,
                                                                   const core::VisionConfig& config,
                                                                   const EncoderOptions& options) {
  std::unique_ptr<VisionEncoder> enc(new VisionEncoder(config, options));
  const auto compute = options.compute;
  const int64_t hv = config.hidden_size, iv = config.intermediate_size;
  const int64_t patch_dim = int64_t{config.in_channels} * config.temporal_patch_size *
                            config.patch_size * config.patch_size;
  IRIS_ASSIGN_OR_RETURN(Tensor pe, core::GetWeight(ckpt, "visual.patch_embed.proj.weight",
                                             {hv, config.in_channels, config.temporal_patch_size,
                                              config.patch_size, config.patch_size}));
  IRIS_ASSIGN_OR_RETURN(enc->patch_embed_, Linear::Create(pe.Reshaped({hv, patch_dim}), nullptr, compute));

  const int64_t ip = RoundUp(iv, options.intermediate_multiple);
  enc->padded_intermediate_ = ip;
  enc->blocks_.resize(config.depth);
  for (int i = 0; i < config.depth; ++i) {
    const std::string p = absl::StrCat("visual.blocks.", i, ".");
    Block& b = enc->blocks_[i];
    IRIS_ASSIGN_OR_RETURN(Tensor n1, core::GetWeight(ckpt, p + "norm1.weight", {hv}));
    IRIS_ASSIGN_OR_RETURN(Tensor n2, core::GetWeight(ckpt, p + "norm2.weight", {hv}));
    b.norm1 = n1.ToF32();
    b.norm2 = n2.ToF32();
    IRIS_ASSIGN_OR_RETURN(Tensor qkv_w, core::GetWeight(ckpt, p + "attn.qkv.weight", {3 * hv, hv}));
    IRIS_ASSIGN_OR_RETURN(Tensor qkv_b, core::GetWeight(ckpt, p + "attn.qkv.bias", {3 * hv}));
    Tensor qkv_bias = qkv_b.ToF32();
    IRIS_ASSIGN_OR_RETURN(b.qkv, Linear::Create(qkv_w, &qkv_bias, compute));
    IRIS_ASSIGN_OR_RETURN(Tensor proj_w, core::GetWeight(ckpt, p + "attn.proj.weight", {hv, hv}));
    IRIS_ASSIGN_OR_RETURN(Tensor proj_b, core::GetWeight(ckpt, p + "attn.proj.bias", {hv}));
    Tensor proj_bias = proj_b.ToF32();
    IRIS_ASSIGN_OR_RETURN(b.proj, Linear::Create(proj_w, &proj_bias, compute));

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
    IRIS_ASSIGN_OR_RETURN(b.gate_up, Linear::Create(gu_w, &gu_b, compute));

    IRIS_ASSIGN_OR_RETURN(Tensor down_w, core::GetWeight(ckpt, p + "mlp.down_proj.weight", {hv, iv}));
    IRIS_ASSIGN_OR_RETURN(Tensor down_b, core::GetWeight(ckpt, p + "mlp.down_proj.bias", {hv}));
    Tensor down_pad = Tensor::Zeros(down_w.dtype(), {hv, ip});
    const size_t es = core::DTypeSize(down_w.dtype());
    for (int64_t r = 0; r < hv; ++r) {
      std::memcpy(static_cast<char*>(down_pad.raw()) + r * ip * es,
                  static_cast<const char*>(down_w.raw()) + r * iv * es, iv * es);
    }
    Tensor down_bias = down_b.ToF32();
    IRIS_ASSIGN_OR_RETURN(b.down, Linear::Create(down_pad, &down_bias, compute));
  }
  const int unit = config.spatial_merge_size * config.spatial_merge_size;
  const int64_t mh = hv * unit;
  IRIS_ASSIGN_OR_RETURN(Tensor lnq, core::GetWeight(ckpt, "visual.merger.ln_q.weight", {hv}));
  enc->merger_norm_ = lnq.ToF32();
  IRIS_ASSIGN_OR_RETURN(Tensor fc1_w, core::GetWeight(ckpt, "visual.merger.mlp.0.weight", {mh, mh}));
  IRIS_ASSIGN_OR_RETURN(Tensor fc1_b, core::GetWeight(ckpt, "visual.merger.mlp.0.bias", {mh}));
  Tensor fc1_bias = fc1_b.ToF32();
  IRIS_ASSIGN_OR_RETURN(enc->merger_fc1_, Linear::Create(fc1_w, &fc1_bias, compute));
  IRIS_ASSIGN_OR_RETURN(Tensor fc2_w, core::GetWeight(ckpt, "visual.merger.mlp.2.weight", {config.out_hidden_size, mh}));
  IRIS_ASSIGN_OR_RETURN(Tensor fc2_b, core::GetWeight(ckpt, "visual.merger.mlp.2.bias", {config.out_hidden_size}));
  Tensor fc2_bias = fc2_b.ToF32();
  IRIS_ASSIGN_OR_RETURN(enc->merger_fc2_, Linear::Create(fc2_w, &fc2_bias, compute));
  enc->buffers_.resize(kNumSlots);
  return enc;
}

float* VisionEncoder::Buffer(int slot, int64_t floats) {
  Tensor& t = buffers_[slot];
  if (t.numel() < floats) t = Tensor::Empty(DType::kF32, {floats});
  return t.data<float>();
}

void VisionEncoder::Attention(const EncoderPlan& plan, bool full, int64_t n) {
  const int heads = config_.num_heads, d = config_.head_dim();
  const int64_t hv = config_.hidden_size;
  float* qkv = Buffer(kQkv, n * 3 * hv);
  float* out = Buffer(kAttn, n * hv);
  kernels::AttentionArgs a;
  a.num_heads = heads;
  a.num_kv_heads = heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.cu_seqlens = full ? std::span<const int32_t>(plan.cu_seqlens) : std::span<const int32_t>(plan.cu_window_seqlens);
  a.max_seqlen = full ? plan.max_seqlen : plan.max_window_seqlen;
  // bf16 mode: q·kᵀ and p·v as bf16 dot products (f32 softmax and accumulation).
  a.bf16 = options_.compute == kernels::ComputeType::kBF16;
  if (options_.techniques.parallel_qkv_padding) {
    // The CPU kernel takes head_dim as it is: no padding pass at all, q/k/v read in place.
    a.q = {qkv, 3 * hv, d};
    a.k = {qkv + hv, 3 * hv, d};
    a.v = {qkv + 2 * hv, 3 * hv, d};
    a.out = out;
    a.out_row_stride = hv;
    a.head_dim = d;
    kernels::VarlenAttention(a);
    return;
  }
  // The usual path: q, k, v each split and padded separately into head-major buffers, attention
  // at the padded head dim, then the output sliced back.
  const int dp = std::max(d, options_.unfused_padded_head_dim);
  float* pq = Buffer(kPadQ, heads * n * dp);
  float* pk = Buffer(kPadK, heads * n * dp);
  float* pv = Buffer(kPadV, heads * n * dp);
  float* po = Buffer(kPadOut, n * heads * dp);
  kernels::PadOneOfQkv(qkv, n, heads, d, dp, 0, pq);
  kernels::PadOneOfQkv(qkv, n, heads, d, dp, 1, pk);
  kernels::PadOneOfQkv(qkv, n, heads, d, dp, 2, pv);
  a.q = {pq, dp, n * dp};
  a.k = {pk, dp, n * dp};
  a.v = {pv, dp, n * dp};
  a.out = po;
  a.out_row_stride = int64_t{heads} * dp;
  a.head_dim = dp;
  kernels::VarlenAttention(a);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    for (int h = 0; h < heads; ++h) {
      std::memcpy(out + r * hv + h * d, po + r * heads * dp + h * dp, d * sizeof(float));
    }
  }
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
  std::shared_ptr<const EncoderPlan> plan;
  if (tech.cached_cu_seqlens) {
    IRIS_ASSIGN_OR_RETURN(plan, plan_cache_.Get(grid_thw));
    stats_.plan_cache_hits = plan_cache_.hits();
    stats_.plan_cache_misses = plan_cache_.misses();
  } else {
    IRIS_ASSIGN_OR_RETURN(plan, BuildEncoderPlan(config_, grid_thw));
  }
  const int64_t n = plan->num_patches;
  if (pixel_values.dim(0) != n) {
    return absl::InvalidArgumentError(absl::StrCat("pixel_values has ", pixel_values.dim(0),
                                                   " rows but grid_thw implies ", n, " patches"));
  }
  ++stats_.forwards;
  const int unit = config_.spatial_merge_size * config_.spatial_merge_size;
  const int heads = config_.num_heads, d = config_.head_dim();

  // Patch embedding, then rows regrouped into window order (groups of `unit` patches).
  float* embedded = Buffer(kNormed, n * hv);
  patch_embed_->Forward(pixel_values.data<float>(), n, embedded);
  float* hidden = Buffer(kHidden, n * hv);
  const int64_t group = unit * hv;
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < plan->num_merged; ++m) {
    std::memcpy(hidden + m * group, embedded + int64_t{plan->window_index[m]} * group, group * sizeof(float));
  }

  const int64_t ip = padded_intermediate_;
  for (int l = 0; l < config_.depth; ++l) {
    const Block& b = blocks_[l];
    std::shared_ptr<const EncoderPlan> layer_plan = plan;
    if (!tech.cached_cu_seqlens) {
      IRIS_ASSIGN_OR_RETURN(layer_plan, BuildEncoderPlan(config_, grid_thw));
    }
    float* normed = Buffer(kNormed, n * hv);
    kernels::RmsNorm(hidden, b.norm1.data<float>(), n, hv, config_.rms_norm_eps, normed);
    float* qkv = Buffer(kQkv, n * 3 * hv);
    b.qkv->Forward(normed, n, qkv);
    const kernels::HeadsView q{qkv, 3 * hv, heads}, k{qkv + hv, 3 * hv, heads};
    if (tech.fused_rotary) {
      kernels::RotaryQK(q, k, n, d, layer_plan->cos.data<float>(), layer_plan->sin.data<float>());
    } else {
      float* cos = Buffer(kCos, n * d / 2);
      float* sin = Buffer(kSin, n * d / 2);
      ComputeRotaryTables(config_, *layer_plan, cos, sin);
      kernels::Rotary(q, n, d, cos, sin);
      kernels::Rotary(k, n, d, cos, sin);
    }
    Attention(*layer_plan, config_.IsFullAttention(l), n);
    b.proj->Forward(Buffer(kAttn, n * hv), n, hidden, Epilogue::kAccumulate);
    kernels::RmsNorm(hidden, b.norm2.data<float>(), n, hv, config_.rms_norm_eps, normed);
    float* gu = Buffer(kGateUp, n * 2 * ip);
    b.gate_up->Forward(normed, n, gu);
    float* act = Buffer(kAct, n * ip);
    kernels::SiluMulRows(gu, n, ip, act);
    b.down->Forward(act, n, hidden, Epilogue::kAccumulate);
    if (observer_) observer_(l, hidden, n);
  }

  // Merger: RMSNorm, every `unit` consecutive rows as one vector, MLP with GELU.
  const int64_t merged = plan->num_merged;
  float* normed = Buffer(kNormed, n * hv);
  kernels::RmsNorm(hidden, merger_norm_.data<float>(), n, hv, config_.rms_norm_eps, normed);
  float* fc1 = Buffer(kFc1, merged * unit * hv);
  merger_fc1_->Forward(normed, merged, fc1, Epilogue::kGeluErf);
  const int64_t out_dim = config_.out_hidden_size;
  float* window_out = Buffer(kQkv, merged * out_dim);
  merger_fc2_->Forward(fc1, merged, window_out);
  Tensor out = Tensor::Empty(DType::kF32, {merged, out_dim});
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < merged; ++m) {
    std::memcpy(o + int64_t{plan->window_index[m]} * out_dim, window_out + m * out_dim, out_dim * sizeof(float));
  }
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
