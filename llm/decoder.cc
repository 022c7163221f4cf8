#include "llm/decoder.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/bf16.h"
#include "core/status_macros.h"
#include "core/weights.h"
#include "kernels/elementwise.h"
#include "kernels/paged_attention.h"
#include "kernels/rotary.h"
#include "llm/mrope.h"

namespace iris::llm {

using core::DType;
using core::Tensor;
using kernels::Epilogue;
using kernels::Linear;

struct Decoder::Layer {
  Tensor input_norm, post_norm;  // F32 [hidden]
  std::unique_ptr<Linear> qkv;   // [(heads + 2 kv_heads) * head_dim, hidden], with bias
  std::unique_ptr<Linear> o;     // [hidden, heads * head_dim], no bias
  std::unique_ptr<Linear> gate_up;  // [2 * inter, hidden]: gate rows then up rows
  std::unique_ptr<Linear> down;     // [hidden, inter]
};

namespace {

enum Slot { kHidden, kNormed, kQkv, kAttn, kGateUp, kAct, kLogitRows, kFinal, kNumSlots };

absl::Status ValidateConfig(const core::TextConfig& c) {
  if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 ||
      c.num_key_value_heads <= 0 || c.intermediate_size <= 0 || c.vocab_size <= 0) {
    return absl::InvalidArgumentError("text config: hidden_size, num_hidden_layers, num_attention_heads, "
                                      "num_key_value_heads, intermediate_size and vocab_size must be positive");
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("text config: hidden_size ", c.hidden_size,
                                                   " is not a multiple of num_attention_heads ",
                                                   c.num_attention_heads));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("text config: num_attention_heads ", c.num_attention_heads,
                                                   " is not a multiple of num_key_value_heads ",
                                                   c.num_key_value_heads));
  }
  if (c.head_dim() % 2 != 0 || c.head_dim() > 256) {
    return absl::InvalidArgumentError(absl::StrCat("text config: head_dim ", c.head_dim(),
                                                   " must be even and at most 256"));
  }
  int sum = 0;
  for (int s : c.mrope_section) sum += s;
  if (c.mrope_section.size() != 3 || sum != c.head_dim() / 2) {
    return absl::InvalidArgumentError(absl::StrCat("text config: rope_scaling.mrope_section must have 3 entries "
                                                   "summing to head_dim/2 = ", c.head_dim() / 2));
  }
  return absl::OkStatus();
}

}  // namespace

Decoder::Decoder(const core::TextConfig& config, const DecoderOptions& options)
    : config_(config), options_(options) {}

Decoder::~Decoder() = default;

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Load(const core::Checkpoint& ckpt,
                                                       const core::TextConfig& config,
                                                       const DecoderOptions& options) {
  IRIS_RETURN_IF_ERROR(ValidateConfig(config));
  std::unique_ptr<Decoder> dec(new Decoder(config, options));
  const auto compute = options.compute;
  const int64_t h = config.hidden_size, inter = config.intermediate_size, d = config.head_dim();
  const int64_t qd = int64_t{config.num_attention_heads} * d, kvd = int64_t{config.num_key_value_heads} * d;

  IRIS_ASSIGN_OR_RETURN(dec->embed_, core::GetWeight(ckpt, "model.embed_tokens.weight", {config.vocab_size, h}));
  dec->layers_.resize(config.num_hidden_layers);
  for (int i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer& l = dec->layers_[i];
    IRIS_ASSIGN_OR_RETURN(Tensor n1, core::GetWeight(ckpt, p + "input_layernorm.weight", {h}));
    IRIS_ASSIGN_OR_RETURN(Tensor n2, core::GetWeight(ckpt, p + "post_attention_layernorm.weight", {h}));
    l.input_norm = n1.ToF32();
    l.post_norm = n2.ToF32();

    IRIS_ASSIGN_OR_RETURN(Tensor qw, core::GetWeight(ckpt, p + "self_attn.q_proj.weight", {qd, h}));
    IRIS_ASSIGN_OR_RETURN(Tensor kw, core::GetWeight(ckpt, p + "self_attn.k_proj.weight", {kvd, h}));
    IRIS_ASSIGN_OR_RETURN(Tensor vw, core::GetWeight(ckpt, p + "self_attn.v_proj.weight", {kvd, h}));
    IRIS_ASSIGN_OR_RETURN(Tensor qb, core::GetWeight(ckpt, p + "self_attn.q_proj.bias", {qd}));
    IRIS_ASSIGN_OR_RETURN(Tensor kb, core::GetWeight(ckpt, p + "self_attn.k_proj.bias", {kvd}));
    IRIS_ASSIGN_OR_RETURN(Tensor vb, core::GetWeight(ckpt, p + "self_attn.v_proj.bias", {kvd}));
    IRIS_ASSIGN_OR_RETURN(Tensor qkv_w, core::ConcatRows({&qw, &kw, &vw}));
    Tensor qb32 = qb.ToF32().Reshaped({qd, 1}), kb32 = kb.ToF32().Reshaped({kvd, 1}),
           vb32 = vb.ToF32().Reshaped({kvd, 1});
    IRIS_ASSIGN_OR_RETURN(Tensor qkv_b, core::ConcatRows({&qb32, &kb32, &vb32}));
    Tensor qkv_bias = qkv_b.Reshaped({qd + 2 * kvd});
    IRIS_ASSIGN_OR_RETURN(l.qkv, Linear::Create(qkv_w, &qkv_bias, compute));

    IRIS_ASSIGN_OR_RETURN(Tensor ow, core::GetWeight(ckpt, p + "self_attn.o_proj.weight", {h, qd}));
    IRIS_ASSIGN_OR_RETURN(l.o, Linear::Create(ow, nullptr, compute));

    IRIS_ASSIGN_OR_RETURN(Tensor gw, core::GetWeight(ckpt, p + "mlp.gate_proj.weight", {inter, h}));
    IRIS_ASSIGN_OR_RETURN(Tensor uw, core::GetWeight(ckpt, p + "mlp.up_proj.weight", {inter, h}));
    IRIS_ASSIGN_OR_RETURN(Tensor gu_w, core::ConcatRows({&gw, &uw}));
    IRIS_ASSIGN_OR_RETURN(l.gate_up, Linear::Create(gu_w, nullptr, compute));
    IRIS_ASSIGN_OR_RETURN(Tensor dw, core::GetWeight(ckpt, p + "mlp.down_proj.weight", {h, inter}));
    IRIS_ASSIGN_OR_RETURN(l.down, Linear::Create(dw, nullptr, compute));
  }
  IRIS_ASSIGN_OR_RETURN(Tensor fn, core::GetWeight(ckpt, "model.norm.weight", {h}));
  dec->final_norm_ = fn.ToF32();
  if (config.tie_word_embeddings && !ckpt.Has("lm_head.weight")) {
    IRIS_ASSIGN_OR_RETURN(dec->lm_head_, Linear::Create(dec->embed_, nullptr, compute));
  } else {
    IRIS_ASSIGN_OR_RETURN(Tensor lw, core::GetWeight(ckpt, "lm_head.weight", {config.vocab_size, h}));
    IRIS_ASSIGN_OR_RETURN(dec->lm_head_, Linear::Create(lw, nullptr, compute));
  }
  dec->buffers_.resize(kNumSlots);
  return dec;
}

absl::Status Decoder::Embed(std::span<const int32_t> ids, float* out) const {
  const int64_t h = config_.hidden_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " at index ", i,
                                                     " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
    float* row = out + static_cast<int64_t>(i) * h;
    switch (embed_.dtype()) {
      case DType::kF32:
        std::memcpy(row, embed_.data<float>() + id * h, h * sizeof(float));
        break;
      case DType::kBF16: {
        const uint16_t* src = embed_.data<uint16_t>() + id * h;
        for (int64_t j = 0; j < h; ++j) row[j] = core::Bf16ToFloat(src[j]);
        break;
      }
      default: {
        const uint16_t* src = embed_.data<uint16_t>() + id * h;
        for (int64_t j = 0; j < h; ++j) row[j] = core::F16ToFloat(src[j]);
        break;
      }
    }
  }
  return absl::OkStatus();
}

KvCacheShape Decoder::CacheShape(int64_t num_blocks, int block_size) const {
  KvCacheShape s;
  s.num_layers = config_.num_hidden_layers;
  s.num_kv_heads = config_.num_key_value_heads;
  s.head_dim = config_.head_dim();
  s.block_size = block_size;
  s.num_blocks = num_blocks;
  return s;
}

float* Decoder::Buffer(int slot, int64_t floats) {
  Tensor& t = buffers_[slot];
  if (t.numel() < floats) t = Tensor::Empty(DType::kF32, {floats});
  return t.data<float>();
}

absl::StatusOr<Tensor> Decoder::Forward(const DecoderStep& step, KvCache* cache) {
  const core::TextConfig& c = config_;
  const int64_t h = c.hidden_size, d = c.head_dim(), inter = c.intermediate_size;
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t qkv_width = (nh + 2 * int64_t{nkv}) * d;

  const KvCacheShape& cs = cache->shape();
  if (cs.num_layers != c.num_hidden_layers || cs.num_kv_heads != nkv || cs.head_dim != d) {
    return absl::InvalidArgumentError("Decoder::Forward: the KV cache was made for another model shape");
  }
  // Rows, slots and per-sequence attention descriptors.
  int64_t rows = 0, logit_rows = 0;
  std::vector<kernels::PagedSequence> seqs;
  seqs.reserve(step.sequences.size());
  std::vector<int64_t> slots;
  for (const DecoderSequence& s : step.sequences) {
    if (s.table == nullptr || s.num_new <= 0 || s.num_new > s.table->num_tokens ||
        cache->BlocksFor(s.table->num_tokens) > static_cast<int64_t>(s.table->blocks.size())) {
      return absl::InvalidArgumentError("Decoder::Forward: a sequence's block table does not hold its new tokens");
    }
    kernels::PagedSequence ps;
    ps.block_table = s.table->blocks;
    ps.context_len = s.table->num_tokens;
    ps.q_begin = rows;
    ps.q_len = s.num_new;
    seqs.push_back(ps);
    for (int64_t i = s.table->num_tokens - s.num_new; i < s.table->num_tokens; ++i) {
      slots.push_back(cache->Slot(*s.table, i));
    }
    rows += s.num_new;
    if (s.want_logits) ++logit_rows;
  }
  if (rows == 0) return Tensor::Empty(DType::kF32, {0, c.vocab_size});
  if (static_cast<int64_t>(step.positions.size()) != 3 * rows) {
    return absl::InvalidArgumentError(absl::StrCat("Decoder::Forward: ", step.positions.size(),
                                                   " positions for ", rows, " rows (need 3 per row)"));
  }
  // One cos/sin table per step, shared by every layer.
  IRIS_ASSIGN_OR_RETURN(RotaryTable rope, BuildMropeTable(step.positions, rows, static_cast<int>(d),
                                                          c.mrope_section, c.rope_theta));

  float* x = Buffer(kHidden, rows * h);
  std::memcpy(x, step.input_embeds, rows * h * sizeof(float));
  float* normed = Buffer(kNormed, rows * h);
  float* qkv = Buffer(kQkv, rows * qkv_width);
  float* attn = Buffer(kAttn, rows * nh * d);
  float* gu = Buffer(kGateUp, rows * 2 * inter);
  float* act = Buffer(kAct, rows * inter);
  const bool bf16 = options_.compute == kernels::ComputeType::kBF16;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));

  for (int li = 0; li < c.num_hidden_layers; ++li) {
    const Layer& l = layers_[li];
    kernels::RmsNorm(x, l.input_norm.data<float>(), rows, h, c.rms_norm_eps, normed);
    l.qkv->Forward(normed, rows, qkv);
    kernels::RotaryQK({qkv, qkv_width, nh}, {qkv + nh * d, qkv_width, nkv}, rows, static_cast<int>(d),
                      rope.cos.data(), rope.sin.data());
    kernels::PagedKvLayer kv = cache->layer(li);
    kernels::WritePagedKv(kv, qkv + nh * d, qkv_width, qkv + (nh + nkv) * d, qkv_width, slots);
    kernels::PagedAttentionArgs a;
    a.q = qkv;
    a.q_row_stride = qkv_width;
    a.out = attn;
    a.out_row_stride = nh * d;
    a.num_heads = nh;
    a.scale = scale;
    a.layer = kv;
    a.sequences = seqs;
    a.bf16 = bf16;
    kernels::PagedAttention(a);
    l.o->Forward(attn, rows, x, Epilogue::kAccumulate);

    kernels::RmsNorm(x, l.post_norm.data<float>(), rows, h, c.rms_norm_eps, normed);
    l.gate_up->Forward(normed, rows, gu);
    kernels::SiluMulRows(gu, rows, inter, act);
    l.down->Forward(act, rows, x, Epilogue::kAccumulate);
    if (observer_) observer_(li, x, rows);
  }
  if (observer_) {
    float* all = Buffer(kFinal, rows * h);
    kernels::RmsNorm(x, final_norm_.data<float>(), rows, h, c.rms_norm_eps, all);
    observer_(c.num_hidden_layers, all, rows);
  }

  // Final norm and lm_head only for the rows whose logits are wanted.
  Tensor logits = Tensor::Empty(DType::kF32, {logit_rows, c.vocab_size});
  if (logit_rows > 0) {
    float* last = Buffer(kLogitRows, logit_rows * h);
    int64_t row = 0, k = 0;
    for (const DecoderSequence& s : step.sequences) {
      row += s.num_new;
      if (s.want_logits) std::memcpy(last + (k++) * h, x + (row - 1) * h, h * sizeof(float));
    }
    kernels::RmsNorm(last, final_norm_.data<float>(), logit_rows, h, c.rms_norm_eps, last);
    lm_head_->Forward(last, logit_rows, logits.data<float>());
  }
  return logits;
}

int64_t Decoder::WeightBytesPerStep() const {
  const int64_t es = options_.compute == kernels::ComputeType::kBF16 ? 2 : 4;
  int64_t params = 0;
  for (const Layer& l : layers_) {
    for (const Linear* lin : {l.qkv.get(), l.o.get(), l.gate_up.get(), l.down.get()}) {
      params += lin->in_features() * lin->out_features();
    }
  }
  params += lm_head_->in_features() * lm_head_->out_features();
  return params * es;
}

double Decoder::MatmulFlops(int64_t tokens, int64_t logit_rows) const {
  double per_row = 0;
  for (const Layer& l : layers_) {
    for (const Linear* lin : {l.qkv.get(), l.o.get(), l.gate_up.get(), l.down.get()}) {
      per_row += 2.0 * lin->in_features() * lin->out_features();
    }
  }
  return per_row * tokens + 2.0 * lm_head_->in_features() * lm_head_->out_features() * logit_rows;
}

}  // namespace iris::llm
