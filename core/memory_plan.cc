#include "core/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace iris::core {
namespace {

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Gb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}

void AddVision(const VisionConfig& v, std::vector<TensorShape>* out) {
  auto add = [out](std::string name, std::vector<int64_t> shape) { out->push_back({std::move(name), std::move(shape)}); };
  const int64_t hv = v.hidden_size, iv = v.intermediate_size;
  const int unit = v.spatial_merge_size * v.spatial_merge_size;
  const bool layer_norm = v.norm == VisionNorm::kLayerNorm;
  add("visual.patch_embed.proj.weight", {hv, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size});
  for (int i = 0; i < v.depth; ++i) {
    const std::string b = absl::StrCat("visual.blocks.", i, ".");
    for (const char* norm : {"norm1", "norm2"}) {
      add(b + norm + ".weight", {hv});
      if (layer_norm) add(b + norm + ".bias", {hv});
    }
    add(b + "attn.qkv.weight", {3 * hv, hv});
    add(b + "attn.qkv.bias", {3 * hv});
    add(b + "attn.proj.weight", {hv, hv});
    add(b + "attn.proj.bias", {hv});
    if (v.mlp == VisionMlp::kQuickGelu) {
      add(b + "mlp.fc1.weight", {iv, hv});
      add(b + "mlp.fc1.bias", {iv});
      add(b + "mlp.fc2.weight", {hv, iv});
      add(b + "mlp.fc2.bias", {hv});
    } else {
      for (const char* proj : {"gate_proj", "up_proj"}) {
        add(b + "mlp." + proj + ".weight", {iv, hv});
        add(b + "mlp." + proj + ".bias", {iv});
      }
      add(b + "mlp.down_proj.weight", {hv, iv});
      add(b + "mlp.down_proj.bias", {hv});
    }
  }
  add("visual.merger.ln_q.weight", {hv});
  if (layer_norm) add("visual.merger.ln_q.bias", {hv});
  add("visual.merger.mlp.0.weight", {unit * hv, unit * hv});
  add("visual.merger.mlp.0.bias", {unit * hv});
  add("visual.merger.mlp.2.weight", {v.out_hidden_size, unit * hv});
  add("visual.merger.mlp.2.bias", {v.out_hidden_size});
}

void AddText(const TextConfig& t, std::vector<TensorShape>* out) {
  auto add = [out](std::string name, std::vector<int64_t> shape) { out->push_back({std::move(name), std::move(shape)}); };
  const int64_t h = t.hidden_size, inter = t.intermediate_size, d = t.head_dim();
  const int64_t q = int64_t{t.num_attention_heads} * d, kv = int64_t{t.num_key_value_heads} * d;
  add("model.embed_tokens.weight", {t.vocab_size, h});
  for (int j = 0; j < t.num_hidden_layers; ++j) {
    const std::string l = absl::StrCat("model.layers.", j, ".");
    add(l + "self_attn.q_proj.weight", {q, h});
    add(l + "self_attn.q_proj.bias", {q});
    add(l + "self_attn.k_proj.weight", {kv, h});
    add(l + "self_attn.k_proj.bias", {kv});
    add(l + "self_attn.v_proj.weight", {kv, h});
    add(l + "self_attn.v_proj.bias", {kv});
    add(l + "self_attn.o_proj.weight", {h, q});
    add(l + "mlp.gate_proj.weight", {inter, h});
    add(l + "mlp.up_proj.weight", {inter, h});
    add(l + "mlp.down_proj.weight", {h, inter});
    add(l + "input_layernorm.weight", {h});
    add(l + "post_attention_layernorm.weight", {h});
  }
  add("model.norm.weight", {h});
  if (!t.tie_word_embeddings) add("lm_head.weight", {t.vocab_size, h});
}

// The first integer after `key` in a /proc or /sys file; -1 when absent.
int64_t ReadNumberAfter(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream rest(line.substr(key.size()));
    int64_t v = -1;
    if (rest >> v) return v;
  }
  return -1;
}

}  // namespace

std::vector<TensorShape> ExpectedTensors(const ModelConfig& config) {
  std::vector<TensorShape> out;
  if (config.has_vision() || !config.has_text) AddVision(config.vision, &out);
  if (config.has_text) AddText(config.text, &out);
  return out;
}

int64_t CountParameters(const ModelConfig& config) {
  int64_t n = 0;
  for (const TensorShape& t : ExpectedTensors(config)) n += Numel(t.shape);
  return n;
}

absl::Status CheckCheckpointTensors(const ModelConfig& config, const Checkpoint& checkpoint) {
  for (const TensorShape& t : ExpectedTensors(config)) {
    if (!checkpoint.Has(t.name)) {
      // A tied head may still be stored (some exports keep it): only its absence when untied is an error.
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: tensor ", t.name, " is missing (the config implies ",
                                                     ExpectedTensors(config).size(), " tensors)"));
    }
    absl::StatusOr<Tensor> got = checkpoint.Get(t.name);
    if (!got.ok()) return got.status();
    if (got->shape() != t.shape) {
      std::string want = "[";
      for (size_t i = 0; i < t.shape.size(); ++i) absl::StrAppend(&want, i ? ", " : "", t.shape[i]);
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: tensor ", t.name, " has shape ", got->ShapeString(),
                                                     ", the config implies ", want, "]"));
    }
  }
  return absl::OkStatus();
}

namespace {
int64_t RoundUp8(int64_t n) { return (n + 7) / 8 * 8; }  // a bf16 matmul input's row stride
}  // namespace

int64_t EncoderPlanBytes(const VisionConfig& vision, int64_t patches) {
  const int64_t merged = patches / (int64_t{vision.spatial_merge_size} * vision.spatial_merge_size);
  // window_index (a merged token each), cu_seqlens and cu_window_seqlens (a sequence per merged
  // token at most, plus the leading 0), cos and sin (head_dim / 2 floats a patch each).
  return 4 * (merged + 2 * (merged + 1) + patches * int64_t{vision.head_dim()});
}

int64_t EncoderNormHandoffParts(const VisionConfig& vision) { return (int64_t{vision.hidden_size} + 127) / 128; }

int64_t EncoderNormHandoffBytes(const VisionConfig& vision, int64_t patches, bool gpu, bool f32_compute) {
  if (!gpu || f32_compute || vision.norm != VisionNorm::kRmsNorm) return 0;
  return patches * (2 * int64_t{vision.hidden_size} + 4 * EncoderNormHandoffParts(vision));
}

MemoryEstimate EstimateMemory(const ModelConfig& config, const MemoryBudgets& b) {
  MemoryEstimate e;
  int64_t widest_input = 0;          // elements of the decoder's largest matmul input at the budgets
  int64_t widest_encoder_input = 0;  // and the encoder's
  int64_t widest_output = 0;          // elements of the decoder's largest matmul output (matmul tuning)
  int64_t widest_encoder_output = 0;  // and the encoder's
  const int64_t wb = b.f32_compute ? 4 : 2;
  const int64_t stored = config.torch_dtype == "float32" ? 4 : 2;
  e.parameters = CountParameters(config);
  if (config.has_text) {
    const TextConfig& t = config.text;
    // The embedding table stays mapped from the file (its rows are read where needed); every
    // projection, lm_head and a tied head's copy of the table are made in the compute dtype.
    const int64_t embed = t.vocab_size * t.hidden_size;
    e.weight_bytes = (e.parameters - embed) * wb + embed * stored + (t.tie_word_embeddings ? embed * wb : 0);
    const int64_t h = t.hidden_size, d = t.head_dim();
    const int64_t per_row = 5 * h + (t.num_attention_heads + 2 * int64_t{t.num_key_value_heads}) * d +
                            int64_t{t.num_attention_heads} * d + 3 * int64_t{t.intermediate_size};
    e.decoder_activation_bytes = 4 * (b.max_num_batched_tokens * per_row + b.max_num_seqs * (h + t.vocab_size));
    widest_input = b.max_num_batched_tokens *
                   RoundUp8(std::max({h, int64_t{t.num_attention_heads} * d, int64_t{t.intermediate_size}}));
    // qkv, gate_up (fused: twice the intermediate size) or o/down at the token budget; lm_head's
    // logits at the sequence budget.
    widest_output = std::max(
        b.max_num_batched_tokens *
            std::max({h, (t.num_attention_heads + 2 * int64_t{t.num_key_value_heads}) * d, 2 * int64_t{t.intermediate_size}}),
        b.max_num_seqs * t.vocab_size);
  } else {
    e.weight_bytes = e.parameters * wb;
  }
  e.kv_cache_bytes = b.kv_cache_bytes;
  if (config.has_vision()) {
    const VisionConfig& v = config.vision;
    const int64_t n = b.max_encoder_patches, hv = v.hidden_size, d = v.head_dim();
    const int64_t ip = (v.intermediate_size + 63) / 64 * 64;
    const int64_t dp = std::max<int64_t>(d, 96);
    const int unit = v.spatial_merge_size * v.spatial_merge_size;
    // qkv's buffer also holds the patch rows made from images' bytes during patch embedding.
    const int64_t patch_floats = int64_t{v.in_channels} * v.temporal_patch_size * v.patch_size * v.patch_size;
    const int64_t floats = n * (5 * hv + std::max(3 * hv, patch_floats) + 3 * ip + 2 * d) + 4 * n * v.num_heads * dp +
                           n / unit * v.out_hidden_size;
    // A GPU also keeps the output in raster order before it is copied back (VisionEncoder::Finish),
    // and the images' bytes at the one address its encoder graphs read them from.
    // (The forward's own plan is among the floats: 2 d a patch.) On a GPU the graphs' plans too.
    e.encoder_activation_bytes = 4 * (floats + (b.gpu ? n / unit * v.out_hidden_size : 0)) +
                                 (b.gpu ? n * v.patch_size * v.patch_size * 3 + b.encoder_graphs * EncoderPlanBytes(v, n)
                                        : 0) +
                                 EncoderNormHandoffBytes(v, n, b.gpu, b.f32_compute);
    // Per patch row the widest matmul input is the patch embedding's, the padded MLP's down
    // projection's or the hidden size (the merger's 4-row inputs are as wide per patch).
    const int64_t patch_dim = int64_t{v.in_channels} * v.temporal_patch_size * v.patch_size * v.patch_size;
    widest_encoder_input = n * RoundUp8(std::max({hv, ip, patch_dim}));
    // qkv or the padded gate_up per patch row (the merger's outputs are narrower per patch).
    widest_encoder_output = n * std::max(3 * hv, 2 * ip);
  }
  if (b.gpu) {
    auto scratch = [&](int64_t input, int64_t output) {
      return kGpuMatmulWorkspaceBytes + (b.f32_compute ? 0 : 2 * 2 * input) + (b.gpu_matmul_tuning ? 4 * output : 0);
    };
    e.gpu_workspace_bytes = b.encoder_device_apart && config.has_vision()
                                ? scratch(widest_input, widest_output) + scratch(widest_encoder_input, widest_encoder_output)
                                : scratch(std::max(widest_input, widest_encoder_input),
                                          std::max(widest_output, widest_encoder_output));
  }
  return e;
}

std::string DescribeMemory(const MemoryEstimate& e, const MemoryBudgets& b) {
  char params[32];
  std::snprintf(params, sizeof params, "%.2f B", static_cast<double>(e.parameters) / 1e9);
  return absl::StrCat("weights ", Gb(e.weight_bytes), " (", b.f32_compute ? "f32" : "bf16", ", ", params,
                      " parameters) + KV cache ", Gb(e.kv_cache_bytes),
                      " + activations ", Gb(e.decoder_activation_bytes + e.encoder_activation_bytes),
                      e.gpu_workspace_bytes > 0 ? absl::StrCat(" + GPU workspace ", Gb(e.gpu_workspace_bytes)) : "",
                      " = ", Gb(e.total()));
}

absl::StatusOr<int64_t> AvailableMemoryBytes() {
  int64_t available = -1;
  const int64_t kb = ReadNumberAfter("/proc/meminfo", "MemAvailable:");
  if (kb >= 0) available = kb * 1024;
  // cgroup v2: memory.max ("max" when unlimited) minus what the group already uses.
  std::ifstream max_file("/sys/fs/cgroup/memory.max");
  std::string max_text;
  if (max_file >> max_text && max_text != "max") {
    const int64_t limit = std::atoll(max_text.c_str());
    int64_t current = 0;
    std::ifstream cur("/sys/fs/cgroup/memory.current");
    cur >> current;
    const int64_t headroom = std::max<int64_t>(0, limit - current);
    available = available < 0 ? headroom : std::min(available, headroom);
  }
  if (available < 0) return absl::NotFoundError("cannot read MemAvailable from /proc/meminfo");
  return available;
}

absl::Status CheckMemoryFits(const MemoryEstimate& e, const MemoryBudgets& b, int64_t available) {
  if (e.total() <= available) return absl::OkStatus();
  std::string msg = absl::StrCat("the model needs about ", Gb(e.total()), " (weights ", Gb(e.weight_bytes), " in ",
                                 b.f32_compute ? "f32" : "bf16", ", KV cache ", Gb(e.kv_cache_bytes),
                                 " (", b.kv_cache_flag, "), decoder activations ", Gb(e.decoder_activation_bytes),
                                 " (--max-num-batched-tokens, --max-num-seqs)");
  if (e.encoder_activation_bytes > 0) {
    absl::StrAppend(&msg, ", encoder activations ", Gb(e.encoder_activation_bytes), " (--max-encoder-patches-per-step)");
  }
  if (e.gpu_workspace_bytes > 0) {
    absl::StrAppend(&msg, ", GPU matmul workspace ", Gb(e.gpu_workspace_bytes),
                    " (bf16 copies of the largest inputs at those budgets, cuBLASLt)");
  }
  absl::StrAppend(&msg, ") but only ", Gb(available), " is available; ");
  const int64_t without_kv = e.total() - e.kv_cache_bytes;
  if (e.weight_bytes > available) {
    absl::StrAppend(&msg, "the weights alone do not fit",
                    b.f32_compute ? " (--dtype bf16 halves them)" : " on this machine");
  } else if (without_kv < available) {
    absl::StrAppend(&msg, "lower ", b.kv_cache_flag, " to at most ", available - without_kv, " bytes");
  } else {
    absl::StrAppend(&msg, "lower --max-num-batched-tokens / --max-encoder-patches-per-step, or ", b.kv_cache_flag);
  }
  return absl::ResourceExhaustedError(msg);
}

}  // namespace iris::core

namespace iris::core {

absl::StatusOr<int64_t> KvCacheBytesForFraction(double fraction, int64_t device_total, int64_t device_free,
                                                const MemoryEstimate& e) {
  if (!(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-memory-fraction must be in (0, 1], got ", fraction));
  }
  const int64_t without_kv = e.total() - e.kv_cache_bytes;
  const int64_t share = static_cast<int64_t>(fraction * static_cast<double>(device_total));
  // Never more than is free now (another process may hold part of the device).
  const int64_t room = std::min(share, device_free) - without_kv;
  if (room <= 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--gpu-memory-fraction ", fraction, " of ", Gb(device_total), " (", Gb(device_free),
        " free) leaves nothing for the KV cache: weights ", Gb(e.weight_bytes), ", decoder activations ",
        Gb(e.decoder_activation_bytes), " (--max-num-batched-tokens, --max-num-seqs), encoder activations ",
        Gb(e.encoder_activation_bytes), " (--max-encoder-patches-per-step) and the matmul workspace ",
        Gb(e.gpu_workspace_bytes), " take ", Gb(without_kv)));
  }
  return room;
}

}  // namespace iris::core
