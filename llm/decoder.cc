#include "llm/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/weights.h"
#include "kernels/elementwise.h"
#include "kernels/gated_mlp.h"
#include "kernels/paged_attention.h"
#include "kernels/rotary.h"
#include "kernels/rows.h"
#include "kernels/sample_rows.h"
#include "kernels/staged_upload.h"
#include "llm/decode_graph.h"
#include "llm/mrope.h"

namespace iris::llm {

using core::DType;
using core::Tensor;
using kernels::Epilogue;
using kernels::Linear;
using kernels::LinearInput;

struct Decoder::Layer {
  Tensor input_norm, post_norm;  // F32 [hidden]
  std::unique_ptr<Linear> qkv;   // [(heads + 2 kv_heads) * head_dim, hidden], with bias
  std::unique_ptr<Linear> o;     // [hidden, heads * head_dim], no bias
  std::unique_ptr<Linear> gate_up;  // [2 * inter, hidden]: gate rows then up rows
  std::unique_ptr<Linear> down;     // [hidden, inter]
};

// The named activation buffers of one step, F32 on the device.
struct Decoder::Activations {
  int64_t max_tokens = 0, max_logit_rows = 0;
  Tensor hidden;       // [T, hidden] the residual stream
  Tensor normed;       // [T, hidden]
  Tensor qkv;          // [T, (heads + 2 kv heads) * head_dim]
  Tensor attn;         // [T, heads * head_dim]
  Tensor gate_up;      // [T, 2 * intermediate]
  Tensor act;          // [T, intermediate]
  Tensor final_rows;   // [T, hidden] final norm of every row (observer only)
  Tensor logit_hidden; // [R, hidden]
  Tensor logits;       // [R, vocab]
  Tensor embeds;       // [T, hidden] given input embeddings (image rows), device copy
  Tensor picks;        // I32 [R] the picks of a picks_only step
  Tensor host_logits;  // [R, vocab] pinned host copy of logits, where the device's memory is not the host's
  Tensor host_picks;   // I32 [R] pinned host copy of picks (likewise)
  // The packed logit edits of a picks_only step (kernels::LogitEdits::Pack): staged on the
  // host, copied to the device. Grown when a step's edits do not fit (a few KB per penalized row).
  Tensor edits_host;
  Tensor edits_device;
  // A sampled picks_only step's draws (kernels::RowDraw [R] as bytes), staged and on the device.
  Tensor draws_host;
  Tensor draws_device;
  std::unique_ptr<kernels::StagedUpload> upload;  // the step's ids, metadata and rotary tables
  bool logits_to_host = false;
};

void DecoderBatch::Clear(int max_blocks) {
  token_ids.clear();
  for (auto& p : positions) p.clear();
  slot_mapping.clear();
  query_start.assign(1, 0);
  context_lens.clear();
  block_tables.clear();
  max_blocks_per_seq = max_blocks;
  logit_rows.clear();
  embed_rows.clear();
  embeds.clear();
  picks_only = false;
  logit_edits.Clear();
  draws.clear();
}

absl::Status DecoderBatch::AddSequence(const BlockTable& table, int block_size, int64_t num_new, bool want_logits) {
  const int64_t blocks = static_cast<int64_t>(table.blocks.size());
  if (num_new <= 0 || num_new > table.num_tokens || block_size <= 0 ||
      (table.num_tokens + block_size - 1) / block_size > blocks) {
    return absl::InvalidArgumentError("DecoderBatch: a sequence's block table does not hold its new tokens");
  }
  if (blocks > max_blocks_per_seq) {
    return absl::InvalidArgumentError(absl::StrCat("DecoderBatch: a sequence has ", blocks, " blocks, the batch ",
                                                   "allows ", max_blocks_per_seq));
  }
  const int64_t first = table.num_tokens - num_new;
  for (int64_t i = first; i < table.num_tokens; ++i) {
    slot_mapping.push_back(int64_t{table.blocks[i / block_size]} * block_size + i % block_size);
  }
  block_tables.insert(block_tables.end(), table.blocks.begin(), table.blocks.end());
  block_tables.resize(block_tables.size() + (max_blocks_per_seq - blocks), 0);
  context_lens.push_back(static_cast<int32_t>(table.num_tokens));
  query_start.push_back(static_cast<int32_t>(query_start.back() + num_new));
  if (want_logits) logit_rows.push_back(query_start.back() - 1);
  return absl::OkStatus();
}

namespace {

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

Decoder::Decoder(kernels::Device& device, const core::TextConfig& config, const DecoderOptions& options)
    : device_(device), config_(config), options_(options) {}

Decoder::~Decoder() = default;

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Load(kernels::Device& device, const core::Checkpoint& ckpt,
                                                       const core::TextConfig& config,
                                                       const DecoderOptions& options) {
  IRIS_RETURN_IF_ERROR(ValidateConfig(config));
  std::unique_ptr<Decoder> dec(new Decoder(device, config, options));
  const auto compute = options.compute;
  const int64_t h = config.hidden_size, inter = config.intermediate_size, d = config.head_dim();
  const int64_t qd = int64_t{config.num_attention_heads} * d, kvd = int64_t{config.num_key_value_heads} * d;

  IRIS_ASSIGN_OR_RETURN(Tensor embed, core::GetWeight(ckpt, "model.embed_tokens.weight", {config.vocab_size, h}));
  IRIS_ASSIGN_OR_RETURN(dec->embed_, device.Mirror(embed));
  dec->layers_.resize(config.num_hidden_layers);
  for (int i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer& l = dec->layers_[i];
    IRIS_ASSIGN_OR_RETURN(Tensor n1, core::GetWeight(ckpt, p + "input_layernorm.weight", {h}));
    IRIS_ASSIGN_OR_RETURN(Tensor n2, core::GetWeight(ckpt, p + "post_attention_layernorm.weight", {h}));
    IRIS_ASSIGN_OR_RETURN(l.input_norm, device.Mirror(n1.ToF32()));
    IRIS_ASSIGN_OR_RETURN(l.post_norm, device.Mirror(n2.ToF32()));

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
    IRIS_ASSIGN_OR_RETURN(l.qkv, Linear::Create(device, qkv_w, &qkv_bias, compute));

    IRIS_ASSIGN_OR_RETURN(Tensor ow, core::GetWeight(ckpt, p + "self_attn.o_proj.weight", {h, qd}));
    IRIS_ASSIGN_OR_RETURN(l.o, Linear::Create(device, ow, nullptr, compute));

    IRIS_ASSIGN_OR_RETURN(Tensor gw, core::GetWeight(ckpt, p + "mlp.gate_proj.weight", {inter, h}));
    IRIS_ASSIGN_OR_RETURN(Tensor uw, core::GetWeight(ckpt, p + "mlp.up_proj.weight", {inter, h}));
    IRIS_ASSIGN_OR_RETURN(Tensor gu_w, core::ConcatRows({&gw, &uw}));
    IRIS_ASSIGN_OR_RETURN(l.gate_up, Linear::Create(device, gu_w, nullptr, compute));
    IRIS_ASSIGN_OR_RETURN(Tensor dw, core::GetWeight(ckpt, p + "mlp.down_proj.weight", {h, inter}));
    IRIS_ASSIGN_OR_RETURN(l.down, Linear::Create(device, dw, nullptr, compute));
  }
  IRIS_ASSIGN_OR_RETURN(Tensor fn, core::GetWeight(ckpt, "model.norm.weight", {h}));
  IRIS_ASSIGN_OR_RETURN(dec->final_norm_, device.Mirror(fn.ToF32()));
  if (config.tie_word_embeddings && !ckpt.Has("lm_head.weight")) {
    IRIS_ASSIGN_OR_RETURN(dec->lm_head_, Linear::Create(device, embed, nullptr, compute));
  } else {
    IRIS_ASSIGN_OR_RETURN(Tensor lw, core::GetWeight(ckpt, "lm_head.weight", {config.vocab_size, h}));
    IRIS_ASSIGN_OR_RETURN(dec->lm_head_, Linear::Create(device, lw, nullptr, compute));
  }
  IRIS_RETURN_IF_ERROR(dec->ReserveActivations(options.max_tokens, options.max_logit_rows));
  return dec;
}

absl::Status Decoder::Embed(std::span<const int32_t> ids, float* out) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at index ", i,
                                                     " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  kernels::EmbeddingLookup(device_, embed_, ids, out);
  return absl::OkStatus();
}

absl::Status Decoder::ReserveActivations(int64_t max_tokens, int64_t max_logit_rows) {
  if (max_tokens <= 0 || max_logit_rows <= 0) {
    return absl::InvalidArgumentError("decoder: max_tokens and max_logit_rows must be positive");
  }
  const core::TextConfig& c = config_;
  const int64_t T = max_tokens, R = max_logit_rows, h = c.hidden_size, d = c.head_dim();
  auto act = std::make_unique<Activations>();
  act->max_tokens = T;
  act->max_logit_rows = R;
  auto alloc = [&](Tensor* t, int64_t floats) -> absl::Status {
    IRIS_ASSIGN_OR_RETURN(*t, device_.Allocate(DType::kF32, {floats}));
    return absl::OkStatus();
  };
  IRIS_RETURN_IF_ERROR(alloc(&act->hidden, T * h));
  IRIS_RETURN_IF_ERROR(alloc(&act->normed, T * h));
  IRIS_RETURN_IF_ERROR(alloc(&act->qkv, T * (c.num_attention_heads + 2 * int64_t{c.num_key_value_heads}) * d));
  IRIS_RETURN_IF_ERROR(alloc(&act->attn, T * c.num_attention_heads * d));
  IRIS_RETURN_IF_ERROR(alloc(&act->gate_up, T * 2 * c.intermediate_size));
  IRIS_RETURN_IF_ERROR(alloc(&act->act, T * c.intermediate_size));
  IRIS_RETURN_IF_ERROR(alloc(&act->final_rows, T * h));
  IRIS_RETURN_IF_ERROR(alloc(&act->logit_hidden, R * h));
  IRIS_RETURN_IF_ERROR(alloc(&act->logits, R * c.vocab_size));
  IRIS_RETURN_IF_ERROR(alloc(&act->embeds, T * h));
  IRIS_ASSIGN_OR_RETURN(act->picks, device_.Allocate(DType::kI32, {R}));
  const int64_t draw_words = R * static_cast<int64_t>(sizeof(kernels::RowDraw) / sizeof(int32_t));
  IRIS_ASSIGN_OR_RETURN(act->draws_host, device_.AllocateStaging(DType::kI32, {draw_words}));
  IRIS_ASSIGN_OR_RETURN(act->draws_device, device_.Allocate(DType::kI32, {draw_words}));
  act->upload = std::make_unique<kernels::StagedUpload>(device_);
  if (device_.kind() != kernels::DeviceKind::kCpu) {
    IRIS_ASSIGN_OR_RETURN(act->host_logits, device_.AllocateStaging(DType::kF32, {R * c.vocab_size}));
    IRIS_ASSIGN_OR_RETURN(act->host_picks, device_.AllocateStaging(DType::kI32, {R}));
    act->logits_to_host = true;
  }
  act_ = std::move(act);
  graphs_.reset();  // recorded with the old buffers' addresses and capacities
  return absl::OkStatus();
}

int64_t Decoder::max_tokens() const { return act_->max_tokens; }

KvCacheShape Decoder::CacheShape(int64_t num_blocks, int block_size, core::DType dtype) const {
  KvCacheShape s;
  s.dtype = dtype;
  s.num_layers = config_.num_hidden_layers;
  s.num_kv_heads = config_.num_key_value_heads;
  s.head_dim = config_.head_dim();
  s.block_size = block_size;
  s.num_blocks = num_blocks;
  return s;
}

absl::Status Decoder::Validate(const DecoderBatch& b, const KvCache& cache) const {
  const KvCacheShape& cs = cache.shape();
  const core::TextConfig& c = config_;
  if (cs.num_layers != c.num_hidden_layers || cs.num_kv_heads != c.num_key_value_heads || cs.head_dim != c.head_dim()) {
    return absl::InvalidArgumentError("Decoder::Forward: the KV cache was made for another model shape");
  }
  const int64_t T = b.num_rows();
  const int S = b.num_seqs();
  if (T > act_->max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("Decoder::Forward: ", T, " rows exceed the decoder's capacity of ",
                                                   act_->max_tokens, " (max_tokens)"));
  }
  if (!b.logit_edits.empty() && (!b.picks_only || b.logit_edits.rows() != static_cast<int64_t>(b.logit_rows.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("Decoder::Forward: ", b.logit_edits.rows(), " rows of logit edits for ",
                                                   b.logit_rows.size(), " logit rows",
                                                   b.picks_only ? "" : " (edits need picks_only)"));
  }
  if (!b.draws.empty() && (!b.picks_only || b.draws.size() != b.logit_rows.size())) {
    return absl::InvalidArgumentError(absl::StrCat("Decoder::Forward: ", b.draws.size(), " draws for ",
                                                   b.logit_rows.size(), " logit rows",
                                                   b.picks_only ? "" : " (draws need picks_only)"));
  }
  for (size_t i = 0; i < b.draws.size(); ++i) {
    const kernels::RowDraw& d = b.draws[i];
    if (!(d.temperature >= 0.f && d.temperature <= 100.f) || d.top_k < 0 || !(d.top_p > 0.f && d.top_p <= 1.f) ||
        !(d.uniform >= 0.0 && d.uniform < 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Decoder::Forward: draws[", i, "] out of range (temperature ", d.temperature, " in [0, 100], top_k ", d.top_k,
          " >= 0, top_p ", d.top_p, " in (0, 1], uniform ", d.uniform, " in [0, 1))"));
    }
  }
  if (static_cast<int64_t>(b.logit_rows.size()) > act_->max_logit_rows) {
    return absl::InvalidArgumentError(absl::StrCat("Decoder::Forward: ", b.logit_rows.size(), " logit rows exceed ",
                                                   "the decoder's capacity of ", act_->max_logit_rows,
                                                   " (max_logit_rows)"));
  }
  for (int a = 0; a < 3; ++a) {
    if (static_cast<int64_t>(b.positions[a].size()) != T) {
      return absl::InvalidArgumentError(absl::StrCat("Decoder::Forward: ", b.positions[a].size(), " positions on axis ",
                                                     a, " for ", T, " rows"));
    }
  }
  if (static_cast<int64_t>(b.slot_mapping.size()) != T || static_cast<int>(b.query_start.size()) != S + 1 ||
      b.query_start.back() != T || static_cast<int64_t>(b.block_tables.size()) != int64_t{S} * b.max_blocks_per_seq) {
    return absl::InvalidArgumentError("Decoder::Forward: the batch's per-row and per-sequence arrays disagree");
  }
  for (int32_t id : b.token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("Decoder::Forward: token id ", id, " outside the vocabulary [0, ",
                                                     c.vocab_size, ")"));
    }
  }
  const int64_t num_slots = cs.num_blocks * cs.block_size;
  for (int64_t slot : b.slot_mapping) {
    if (slot < 0 || slot >= num_slots) return absl::InvalidArgumentError("Decoder::Forward: a KV slot is out of range");
  }
  for (int32_t block : b.block_tables) {
    if (block < 0 || block >= cs.num_blocks) return absl::InvalidArgumentError("Decoder::Forward: a block id is out of range");
  }
  for (int s = 0; s < S; ++s) {
    const int64_t q_len = b.query_start[s + 1] - b.query_start[s];
    if (q_len <= 0 || q_len > b.context_lens[s] ||
        (b.context_lens[s] + cs.block_size - 1) / cs.block_size > b.max_blocks_per_seq) {
      return absl::InvalidArgumentError("Decoder::Forward: a sequence's block table does not hold its new tokens");
    }
  }
  for (int32_t r : b.logit_rows) {
    if (r < 0 || r >= T) return absl::InvalidArgumentError("Decoder::Forward: a logit row is out of range");
  }
  if (static_cast<int64_t>(b.embed_rows.size()) > T ||
      b.embeds.size() != b.embed_rows.size() * static_cast<size_t>(c.hidden_size)) {
    return absl::InvalidArgumentError("Decoder::Forward: embeds do not hold one row per embed_rows entry");
  }
  for (int32_t r : b.embed_rows) {
    if (r < 0 || r >= T) return absl::InvalidArgumentError("Decoder::Forward: an embed row is out of range");
  }
  return absl::OkStatus();
}

// Where a staged step's inputs are on the device, and the host sizes its launches take.
struct Decoder::StepInputs {
  int64_t rows = 0, logit_rows = 0;
  std::span<const int32_t> ids, logit_index, embed_index;
  std::span<const int64_t> slots;
  const float* cos = nullptr;
  const float* sin = nullptr;
  kernels::PagedMetadata md;
};

// The decode graphs: one per padded batch size, each recorded for one KV cache and reading its
// inputs from `upload`'s buffer, which is reserved for the largest size and so never moves.
struct Decoder::Graphs {
  DecodeGraphOptions options;
  std::unique_ptr<kernels::StagedUpload> upload;
  DecoderBatch padded;
  struct Recorded {
    std::unique_ptr<kernels::DeviceGraph> graph;
    const void* kv = nullptr;      // the KV cache it writes and reads (its first pool's address:
                                   // the cache object may move, its pools do not)
    const void* inputs = nullptr;  // the upload buffer's device address it reads
  };
  absl::flat_hash_map<int, Recorded> recorded;
  int64_t steps = 0;
  bool paused = false;
};

absl::StatusOr<Decoder::StepInputs> Decoder::Stage(const DecoderBatch& batch, kernels::StagedUpload& up) {
  const core::TextConfig& c = config_;
  const int64_t rows = batch.num_rows();
  // One cos/sin table per step, built on the host from the positions and shared by every layer.
  std::vector<int64_t> positions;
  positions.reserve(3 * rows);
  for (const auto& axis : batch.positions) positions.insert(positions.end(), axis.begin(), axis.end());
  IRIS_ASSIGN_OR_RETURN(RotaryTable rope, BuildMropeTable(positions, rows, static_cast<int>(c.head_dim()),
                                                          c.mrope_section, c.rope_theta));

  // The step's flat arrays and tables, sent to the device in one transfer (on the CPU: copied
  // into the buffer the ops read); each is then read at its device address. The same batch
  // shape always gives the same offsets (what a graph's replay relies on).
  up.Clear();
  struct Array32 {
    size_t offset;
    size_t size;
  };
  auto add32 = [&up](const std::vector<int32_t>& v) { return Array32{up.Add(std::span<const int32_t>(v)), v.size()}; };
  const Array32 ids = add32(batch.token_ids), query_start = add32(batch.query_start),
                context_lens = add32(batch.context_lens), block_tables = add32(batch.block_tables),
                logit_index = add32(batch.logit_rows), embed_index = add32(batch.embed_rows);
  const size_t slots = up.Add(std::span<const int64_t>(batch.slot_mapping));
  const size_t cos = up.Add(std::span<const float>(rope.cos)), sin = up.Add(std::span<const float>(rope.sin));
  IRIS_RETURN_IF_ERROR(up.Upload());
  auto span32 = [&up](const Array32& a) { return std::span<const int32_t>(up.At<int32_t>(a.offset), a.size); };

  StepInputs in;
  in.rows = rows;
  in.logit_rows = static_cast<int64_t>(batch.logit_rows.size());
  in.ids = span32(ids);
  in.logit_index = span32(logit_index);
  in.embed_index = span32(embed_index);
  in.slots = std::span<const int64_t>(up.At<int64_t>(slots), static_cast<size_t>(rows));
  in.cos = up.At<float>(cos);
  in.sin = up.At<float>(sin);
  kernels::PagedMetadata& md = in.md;
  md.num_seqs = batch.num_seqs();
  md.query_start = span32(query_start);
  md.context_lens = span32(context_lens);
  md.block_tables = span32(block_tables);
  md.max_blocks_per_seq = batch.max_blocks_per_seq;
  kernels::SetHostSummaries(batch.query_start, batch.context_lens, md);
  if (!batch.embed_rows.empty()) {
    device_.CopyToDevice(batch.embeds.data(), act_->embeds.data<float>(), batch.embeds.size() * sizeof(float));
  }
  return in;
}

void Decoder::Run(const StepInputs& in, KvCache* cache) {
  const core::TextConfig& c = config_;
  const int64_t h = c.hidden_size, d = c.head_dim();
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t qkv_width = (nh + 2 * int64_t{nkv}) * d;
  const int64_t rows = in.rows;
  Activations& A = *act_;

  // Input rows: embeddings looked up by id, then the given (image) rows placed over theirs.
  float* x = A.hidden.data<float>();
  kernels::EmbeddingLookup(device_, embed_, in.ids, x);
  if (!in.embed_index.empty()) kernels::ScatterRows(device_, A.embeds.data<float>(), h, in.embed_index, x);
  float* normed = A.normed.data<float>();
  float* qkv = A.qkv.data<float>();
  float* attn = A.attn.data<float>();
  float* gu = A.gate_up.data<float>();
  float* act = A.act.data<float>();
  const bool bf16 = options_.compute == kernels::ComputeType::kBF16;
  const auto NormedInput = [&](const float* rows_in, const Tensor& norm_weight, float* staging) {
    return LinearInput::RmsNorm(rows_in, norm_weight.data<float>(), c.rms_norm_eps, staging);
  };
  const float scale = 1.f / std::sqrt(static_cast<float>(d));

  for (int li = 0; li < c.num_hidden_layers; ++li) {
    const Layer& l = layers_[li];
    // The norms and SiLU·mul go in as the input ops of the Linears after them (folded where the
    // device can: kernels/linear.h).
    kernels::PagedKvLayer kv = cache->layer(li);
    // The projection; on a device that folds them into it, the step's rotary and KV write too.
    const bool rotated = kernels::ProjectQkvRotaryWriteKv(device_, *l.qkv, NormedInput(x, l.input_norm, normed), rows,
                                                          qkv, nh, kv, in.md, in.cos, in.sin, in.slots);
    kernels::PagedAttentionArgs a;
    a.q = qkv;
    a.q_row_stride = qkv_width;
    a.out = attn;
    a.out_row_stride = nh * d;
    a.num_heads = nh;
    a.scale = scale;
    a.layer = kv;
    a.metadata = in.md;
    a.bf16 = bf16;
    // The attention waits on memory round trips, not bandwidth: the weights read next may stream
    // into the device's cache meanwhile (a hint; none by default).
    kernels::PrefetchWeights(device_, rows, {l.o.get(), l.gate_up.get()});
    // q and k rotated, the new k and v into the cache, then the attention (one launch on a GPU
    // where the step is decode rows only), unless the projection did the first two.
    if (rotated) {
      kernels::PagedAttention(device_, a);
    } else {
      kernels::RotaryPagedAttention(device_, a, {qkv, qkv_width, nh}, {qkv + nh * d, qkv_width, nkv},
                                    static_cast<int>(d), in.cos, in.sin, qkv + (nh + nkv) * d, qkv_width, in.slots);
    }
    l.o->Forward(attn, rows, x, Epilogue::kAccumulate);

    kernels::GatedMlp(device_, *l.gate_up, *l.down, NormedInput(x, l.post_norm, normed), rows, {gu, act}, x);
    if (observer_) observer_(li, x, rows);
  }
  if (observer_) {
    float* all = A.final_rows.data<float>();
    kernels::RmsNorm(device_, x, final_norm_.data<float>(), rows, h, c.rms_norm_eps, all);
    observer_(c.num_hidden_layers, all, rows);
  }

  // Final norm and lm_head only for the rows whose logits are wanted.
  if (in.logit_rows > 0) {
    float* last = A.logit_hidden.data<float>();
    kernels::GatherRows(device_, x, h, in.logit_index, last);
    kernels::LinearForward(device_, *lm_head_, NormedInput(last, final_norm_, last), in.logit_rows,
                           A.logits.data<float>());
  }
}

absl::StatusOr<Tensor> Decoder::Results(int64_t logit_rows, const DecoderBatch& batch) {
  const int64_t vocab = config_.vocab_size;
  Activations& A = *act_;
  Tensor logits = A.logits.Reshaped({A.max_logit_rows, vocab}).Rows(0, logit_rows);
  const kernels::LogitEdits& edits = batch.logit_edits;
  if (batch.picks_only) {
    // The rows are picked where the logits are: only the ids come back. A penalty or masked end
    // ids are applied there first.
    if (logit_rows > 0 && !edits.empty()) {
      const int64_t n = edits.PackedSize();
      if (A.edits_host.numel() < n) {
        const int64_t capacity = std::max<int64_t>(n, 2 * A.edits_host.numel());
        IRIS_ASSIGN_OR_RETURN(A.edits_host, device_.AllocateStaging(DType::kI32, {capacity}));
        IRIS_ASSIGN_OR_RETURN(A.edits_device, device_.Allocate(DType::kI32, {capacity}));
      }
      edits.Pack(A.edits_host.data<int32_t>());
      device_.CopyToDevice(A.edits_host.data<int32_t>(), A.edits_device.data<int32_t>(), static_cast<size_t>(n) * 4);
      kernels::EditLogitRows(device_, logits.data<float>(), logit_rows, vocab, edits.View(A.edits_device.data<int32_t>()));
    }
    Tensor picks = A.picks.Rows(0, logit_rows);
    if (logit_rows > 0 && batch.draws.empty()) {
      kernels::ArgmaxRows(device_, logits.data<float>(), logit_rows, vocab, picks.data<int32_t>());
    } else if (logit_rows > 0) {
      auto* staged = reinterpret_cast<kernels::RowDraw*>(A.draws_host.data<int32_t>());
      std::copy(batch.draws.begin(), batch.draws.end(), staged);
      const size_t bytes = batch.draws.size() * sizeof(kernels::RowDraw);
      device_.CopyToDevice(staged, A.draws_device.data<int32_t>(), bytes);
      kernels::SampleRows(device_, logits.data<float>(), logit_rows, vocab,
                          reinterpret_cast<const kernels::RowDraw*>(A.draws_device.data<int32_t>()),
                          picks.data<int32_t>());
    }
    if (A.logits_to_host) {
      Tensor host = A.host_picks.Rows(0, logit_rows);
      if (logit_rows > 0) device_.CopyToHost(picks.data<int32_t>(), host.data<int32_t>(), host.nbytes());
      picks = host;
    }
    IRIS_RETURN_IF_ERROR(device_.status());
    return picks;
  }
  if (A.logits_to_host) {
    // The sampler runs on the host: the logits come back (the copy waits for the step's work).
    Tensor host = A.host_logits.Reshaped({A.max_logit_rows, vocab}).Rows(0, logit_rows);
    if (logit_rows > 0) device_.CopyToHost(logits.data<float>(), host.data<float>(), host.nbytes());
    IRIS_RETURN_IF_ERROR(device_.status());
    return host;
  }
  IRIS_RETURN_IF_ERROR(device_.status());
  return logits;
}

absl::StatusOr<Tensor> Decoder::Forward(const DecoderBatch& batch, KvCache* cache) {
  IRIS_RETURN_IF_ERROR(Validate(batch, *cache));
  if (batch.num_rows() == 0) return Results(0, batch);
  if (graphs_ != nullptr && !graphs_->paused && !observer_ && IsGraphableDecode(batch, graphs_->options.max_blocks_per_seq)) {
    if (const int size = DecodeGraphSize(graphs_->options.batch_sizes, batch.num_seqs()); size > 0) {
      return ForwardPadded(batch, size, cache);
    }
  }
  IRIS_ASSIGN_OR_RETURN(StepInputs in, Stage(batch, *act_->upload));
  Run(in, cache);
  return Results(in.logit_rows, batch);
}

absl::StatusOr<Tensor> Decoder::ForwardPadded(const DecoderBatch& batch, int size, KvCache* cache) {
  Graphs& g = *graphs_;
  PadDecodeBatch(batch, size, g.options.max_blocks_per_seq, &g.padded);
  IRIS_ASSIGN_OR_RETURN(StepInputs in, Stage(g.padded, *g.upload));
  if (batch.num_seqs() > 0) ++g.steps;  // not CaptureDecodeGraphs' padding-only steps
  Graphs::Recorded& rec = g.recorded[size];
  const void* inputs = g.upload->At<uint8_t>(0);
  const void* kv = cache->layer(0).k;
  if (rec.graph != nullptr && rec.kv == kv && rec.inputs == inputs) {
    IRIS_RETURN_IF_ERROR(rec.graph->Replay());
  } else {
    // A size's first step runs directly (which also gives every buffer its size: nothing may
    // grow while recording), and is then recorded for the next ones.
    rec.graph.reset();
    Run(in, cache);
    IRIS_RETURN_IF_ERROR(device_.status());
    if (g.options.capture) {
      IRIS_RETURN_IF_ERROR(device_.BeginCapture());
      Run(in, cache);
      IRIS_ASSIGN_OR_RETURN(rec.graph, device_.EndCapture());
      rec.kv = kv;
      rec.inputs = inputs;
    }
  }
  return Results(batch.num_seqs(), batch);
}

absl::Status Decoder::EnableDecodeGraphs(const DecodeGraphOptions& options) {
  auto g = std::make_unique<Graphs>();
  g->options = options;
  std::vector<int>& sizes = g->options.batch_sizes;
  if (sizes.empty()) {
    sizes = DecodeGraphBatchSizes(static_cast<int>(std::min(act_->max_logit_rows, act_->max_tokens)));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 1 || sizes[i] > act_->max_logit_rows || (i > 0 && sizes[i] <= sizes[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("decode graphs: batch sizes must ascend within [1, ",
                                                     act_->max_logit_rows, "] (max_logit_rows); got ", sizes[i]));
    }
  }
  if (sizes.back() > act_->max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("decode graphs: batch size ", sizes.back(), " exceeds the ",
                                                   act_->max_tokens, " rows of a step (max_tokens)"));
  }
  if (options.max_blocks_per_seq < 1) {
    return absl::InvalidArgumentError("decode graphs: max_blocks_per_seq must be at least 1");
  }
  if (options.capture && !device_.records_graphs()) {
    return absl::UnimplementedError(absl::StrCat("decode graphs: ", device_.Describe(), " records no graphs"));
  }
  // The inputs' buffer is sized for the largest step once: it keeps its address for every graph.
  g->upload = std::make_unique<kernels::StagedUpload>(device_);
  DecoderBatch none;
  none.Clear(options.max_blocks_per_seq);
  PadDecodeBatch(none, sizes.back(), options.max_blocks_per_seq, &g->padded);
  IRIS_RETURN_IF_ERROR(Stage(g->padded, *g->upload).status());
  graphs_ = std::move(g);
  return absl::OkStatus();
}

absl::Status Decoder::CaptureDecodeGraphs(KvCache* cache) {
  if (graphs_ == nullptr) return absl::FailedPreconditionError("decode graphs are not enabled");
  DecoderBatch none;
  none.Clear(graphs_->options.max_blocks_per_seq);
  for (int size : graphs_->options.batch_sizes) {
    // A step of padding rows only: it writes nothing into the cache.
    IRIS_RETURN_IF_ERROR(ForwardPadded(none, size, cache).status());
  }
  return device_.status();
}

void Decoder::PauseDecodeGraphs(bool paused) {
  if (graphs_ != nullptr) graphs_->paused = paused;
}

int Decoder::decode_graphs() const {
  if (graphs_ == nullptr) return 0;
  int n = 0;
  for (const auto& [size, rec] : graphs_->recorded) n += rec.graph != nullptr;
  return n;
}

int64_t Decoder::decode_graph_steps() const { return graphs_ == nullptr ? 0 : graphs_->steps; }

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
