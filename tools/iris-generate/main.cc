// iris-generate: one chat in, generated text out, through the engine (as the server runs it).
//   iris-generate --model DIR (--prompt TEXT [--image FILE...] | --messages FILE.json)
//                 [--max-tokens N] [--greedy | --temperature T [--top-p P] [--top-k K] [--seed S]]
//                 [--repetition-penalty R] [--generation-config auto|none] [--dtype f32|bf16]
//                 [--kv-cache-dtype auto|bf16|f32]
//                 [--min-pixels N] [--max-pixels N] [--dump OUT.safetensors] [--stream]
// The text goes to stdout (as it is generated with --stream), a summary to stderr. --dump writes
// the prompt's input_ids [L], position_ids [3, L] (M-RoPE) or [1, L] (text-only models) and the logits at the last prompt position.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/command_line.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "engine/engine.h"
#include "engine/memory_check.h"
#include "engine/model.h"
#include "engine/prompt_builder.h"
#include "engine/request.h"
#include "llm/sampler.h"
#include "vision/pixel_bounds.h"

ABSL_FLAG(std::string, model, "", "model folder (config.json, tokenizer.json, *.safetensors, ...)");
ABSL_FLAG(std::string, prompt, "", "the user's text (one user message; images given with --image come first)");
ABSL_FLAG(std::vector<std::string>, image, {}, "image file for --prompt; repeat --image for several images");
ABSL_FLAG(std::string, messages, "",
          "chat as JSON: [{\"role\", \"content\": text or [{\"type\":\"text\",\"text\":...} | "
          "{\"type\":\"image\",\"image\":PATH}]}]; relative paths are taken from the file's folder");
ABSL_FLAG(int64_t, max_tokens, -1, "most tokens to generate (default: the model's max_new_tokens, else 128)");
ABSL_FLAG(std::string, device, "cpu", "where the model runs: cpu, or cuda / cuda:N (a GPU, in a build with the CUDA backend)");
ABSL_FLAG(std::string, cpu_isa, "", "CPU device: highest instruction set of iris's kernels, avx2 | avx512 | avx512_bf16");
ABSL_FLAG(bool, greedy, false, "greedy decoding (temperature 0)");
ABSL_FLAG(double, temperature, -1, "sampling temperature (0 = greedy; default: the model's)");
ABSL_FLAG(std::string, generation_config, "auto",
          "what the sampling settings not given here (--temperature/--greedy, --top-p, --top-k, "
          "--repetition-penalty) take: auto = the model's generation_config.json, read as transformers' generate() "
          "reads it, as iris-server does; none = greedy, no penalty");
ABSL_FLAG(double, top_p, -1,
          "nucleus sampling: keep the most likely tokens up to this probability (1 = off; default: the model's)");
ABSL_FLAG(int32_t, top_k, -1, "keep the k most likely tokens (0 = off; default: the model's)");
ABSL_FLAG(int64_t, seed, -1, "sampling seed (default: random)");
ABSL_FLAG(double, repetition_penalty, -1, "HF repetition penalty (1 = off; default: the model's)");
ABSL_FLAG(std::string, dtype, "bf16", "compute mode: bf16 (fast) or f32 (matches the reference to ~1e-5)");
ABSL_FLAG(std::string, dump, "", "write input_ids, position_ids and the last prompt position's logits here");
ABSL_FLAG(int64_t, min_pixels, -1, "per-image minimum pixels after resize (default: the checkpoint's)");
ABSL_FLAG(int64_t, max_pixels, -1, "per-image maximum pixels after resize (default: the checkpoint's)");
ABSL_FLAG(bool, stream, false, "print the text as it is generated");
ABSL_FLAG(int64_t, kv_cache_mib, 256, "KV cache size in MiB");
ABSL_FLAG(bool, enable_prefix_caching, true, "share the KV blocks of common prompt prefixes (engine option)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto", "KV cache pages: auto (as --dtype), bf16 or f32");

namespace {

using namespace iris;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", ec.message()));
  if (static_cast<int64_t>(size) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is ", size, " bytes, over the limit of ", max_bytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string bytes(size, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (in.gcount() != static_cast<std::streamsize>(bytes.size())) {
    return absl::DataLossError(absl::StrCat("cannot read ", path, ": short read"));
  }
  return bytes;
}

constexpr int64_t kDefaultMaxTokens = 128;  // where neither --max-tokens nor the model's max_new_tokens says

// The sampling flags given on the command line, the rest (left at their -1 defaults) from
// `defaults` (the model's generation_config.json, or iris's own with --generation-config none): as
// iris-server fills a request's unset fields. Given values are checked by Validate.
absl::StatusOr<llm::SamplingParams> SamplingFromFlags(const engine::SamplingDefaults& defaults) {
  llm::SamplingParams s;
  const int64_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
  s.max_tokens = max_tokens != -1 ? max_tokens : defaults.max_tokens > 0 ? defaults.max_tokens : kDefaultMaxTokens;
  const double temperature = absl::GetFlag(FLAGS_temperature);
  s.temperature = defaults.temperature;
  if (absl::GetFlag(FLAGS_greedy)) {
    if (temperature > 0) return absl::InvalidArgumentError("--greedy and --temperature exclude each other");
    s.temperature = 0.f;
  } else if (temperature >= 0) {
    s.temperature = static_cast<float>(temperature);
  }
  const double top_p = absl::GetFlag(FLAGS_top_p), penalty = absl::GetFlag(FLAGS_repetition_penalty);
  s.top_p = top_p != -1 ? static_cast<float>(top_p) : defaults.top_p;
  s.top_k = absl::GetFlag(FLAGS_top_k) != -1 ? absl::GetFlag(FLAGS_top_k) : defaults.top_k;
  if (absl::GetFlag(FLAGS_seed) >= 0) s.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  s.repetition_penalty = penalty != -1 ? static_cast<float>(penalty) : defaults.repetition_penalty;
  absl::Status st = s.Validate();
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("sampling: ", st.message()));
  return s;
}

// The chat from --prompt/--image or --messages.
absl::StatusOr<std::vector<engine::ChatInputMessage>> MessagesFromFlags(const std::vector<std::string>& images) {
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  const std::string messages_file = absl::GetFlag(FLAGS_messages);
  const bool has_prompt = !prompt.empty() || !images.empty();
  if (has_prompt && !messages_file.empty()) {
    return absl::InvalidArgumentError("give either --prompt (with --image) or --messages, not both");
  }
  std::vector<engine::ChatInputMessage> messages;
  if (!messages_file.empty()) {
    IRIS_ASSIGN_OR_RETURN(std::string text, ReadFile(messages_file, 16ll << 20));
    const std::string base = std::filesystem::path(messages_file).parent_path().string();
    auto parsed = engine::ParseMessagesJson(text, base);
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(), absl::StrCat(messages_file, ": ", parsed.status().message()));
    }
    messages = std::move(*parsed);
  } else if (has_prompt) {
    engine::ChatInputMessage user;
    user.role = "user";
    const vision::DecodeLimits limits;
    for (const std::string& path : images) {
      engine::ChatInputPart part;
      part.kind = engine::ChatInputPart::Kind::kImage;
      auto bytes = ReadFile(path, limits.max_bytes);
      if (!bytes.ok()) return absl::Status(bytes.status().code(), absl::StrCat("--image: ", bytes.status().message()));
      part.image_bytes = std::move(*bytes);
      user.parts.push_back(std::move(part));
    }
    if (!prompt.empty()) {
      engine::ChatInputPart text;
      text.text = prompt;
      user.parts.push_back(std::move(text));
    }
    messages.push_back(std::move(user));
  } else {
    return absl::InvalidArgumentError("one of --prompt or --messages is required");
  }
  std::optional<int64_t> min_px, max_px;
  if (absl::GetFlag(FLAGS_min_pixels) >= 0) min_px = absl::GetFlag(FLAGS_min_pixels);
  if (absl::GetFlag(FLAGS_max_pixels) >= 0) max_px = absl::GetFlag(FLAGS_max_pixels);
  for (auto& m : messages) {
    for (auto& p : m.parts) {
      if (p.kind != engine::ChatInputPart::Kind::kImage) continue;
      if (!p.min_pixels.has_value()) p.min_pixels = min_px;
      if (!p.max_pixels.has_value()) p.max_pixels = max_px;
    }
  }
  return messages;
}

// With --prompt, "messages[0].content[k]" means the k-th --image: name the file instead.
absl::Status NameImageFile(const absl::Status& status, const std::vector<std::string>& images) {
  if (!absl::GetFlag(FLAGS_messages).empty()) return status;
  const absl::string_view message = status.message();
  for (size_t k = 0; k < images.size(); ++k) {
    const std::string prefix = absl::StrCat("messages[0].content[", k, "]");
    if (absl::StartsWith(message, prefix)) {
      absl::string_view rest = message.substr(prefix.size());
      if (absl::StartsWith(rest, ".image")) rest.remove_prefix(6);
      return absl::Status(status.code(), absl::StrCat("--image ", images[k], rest));
    }
  }
  return status;
}

// position_ids in the reference's shape: [3, L] for M-RoPE models, [1, L] for text-only ones.
absl::Status WriteDump(const std::string& path, const engine::Prompt& prompt, const std::vector<float>& logits,
                       int position_rows) {
  const int64_t L = static_cast<int64_t>(prompt.ids.size());
  if (logits.empty()) return absl::InternalError("the engine returned no prompt logits for --dump");
  core::Tensor ids = core::Tensor::Empty(core::DType::kI64, {L});
  for (int64_t i = 0; i < L; ++i) ids.data<int64_t>()[i] = prompt.ids[i];
  core::Tensor pos = core::Tensor::Empty(core::DType::kI64, {position_rows, L});
  for (int a = 0; a < position_rows; ++a) {
    const auto& axis = prompt.positions.positions[a];
    if (static_cast<int64_t>(axis.size()) != L) return absl::InternalError("positions and ids differ in length");
    std::memcpy(pos.data<int64_t>() + a * L, axis.data(), L * sizeof(int64_t));
  }
  core::Tensor lg = core::Tensor::Empty(core::DType::kF32, {static_cast<int64_t>(logits.size())});
  std::memcpy(lg.data<float>(), logits.data(), logits.size() * sizeof(float));
  return core::WriteSafetensors(path, {{"input_ids", ids}, {"position_ids", pos}, {"logits", lg}},
                                {{"format", "np"}});
}

// Collects a request's outputs on the engine thread, hands them to the main thread.
class OutputQueue {
 public:
  void Push(engine::RequestOutput out) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(out));
  }
  engine::RequestOutput Pop() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](std::deque<engine::RequestOutput>* q) { return !q->empty(); }, &queue_));
    engine::RequestOutput out = std::move(queue_.front());
    queue_.pop_front();
    return out;
  }

 private:
  absl::Mutex mu_;
  std::deque<engine::RequestOutput> queue_ ABSL_GUARDED_BY(mu_);
};

// Submits and prints each piece of text as it arrives; returns everything merged.
absl::StatusOr<engine::RequestOutput> GenerateStreaming(engine::Engine& eng, engine::Request request) {
  auto queue = std::make_shared<OutputQueue>();
  request.on_output = [queue](engine::RequestOutput out) { queue->Push(std::move(out)); };
  IRIS_RETURN_IF_ERROR(eng.Submit(std::move(request)));
  engine::RequestOutput merged;
  for (;;) {
    engine::RequestOutput out = queue->Pop();
    if (!out.text.empty()) {
      std::fwrite(out.text.data(), 1, out.text.size(), stdout);
      std::fflush(stdout);
    }
    merged.request_id = out.request_id;
    merged.token_ids.insert(merged.token_ids.end(), out.token_ids.begin(), out.token_ids.end());
    merged.text += out.text;
    if (!out.prompt_logits.empty()) merged.prompt_logits = std::move(out.prompt_logits);
    if (out.finished) {
      merged.finished = true;
      merged.finish_reason = out.finish_reason;
      merged.status = out.status;
      merged.usage = out.usage;
      merged.timings = out.timings;
      return merged;
    }
  }
}

absl::Status Run(const std::vector<std::string>& images) {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype != "f32" && dtype != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--dtype must be f32 or bf16, got \"", dtype, "\""));
  }
  if (absl::GetFlag(FLAGS_kv_cache_mib) <= 0) return absl::InvalidArgumentError("--kv-cache-mib must be positive");
  IRIS_ASSIGN_OR_RETURN(const engine::KvCacheDType kv_dtype,
                        engine::KvCacheDTypeFromName(absl::GetFlag(FLAGS_kv_cache_dtype)));
  IRIS_ASSIGN_OR_RETURN(const bool model_sampling,
                        engine::UsesModelSamplingDefaults(absl::GetFlag(FLAGS_generation_config)));
  // The flags' own checks before the model loads (iris's defaults stand in for the model's).
  IRIS_RETURN_IF_ERROR(SamplingFromFlags(engine::SamplingDefaults{}).status());
  IRIS_ASSIGN_OR_RETURN(std::vector<engine::ChatInputMessage> messages, MessagesFromFlags(images));

  const auto t0 = Clock::now();
  engine::ModelOptions model_options;
  model_options.compute = dtype == "f32" ? kernels::ComputeType::kF32 : kernels::ComputeType::kBF16;
  model_options.device.name = absl::GetFlag(FLAGS_device);
  model_options.device.cpu_isa = absl::GetFlag(FLAGS_cpu_isa);
  {  // before loading: refuse what would not fit (the engine below uses these budgets)
    engine::EngineOptions planned;
    planned.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_mib) << 20;
    planned.max_num_seqs = 4;
    IRIS_RETURN_IF_ERROR(engine::CheckMemoryBeforeLoad(dir, model_options, planned, -1, "--kv-cache-mib").status());
  }
  IRIS_ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model, engine::LoadModel(dir, model_options));
  const auto t1 = Clock::now();
  IRIS_ASSIGN_OR_RETURN(llm::SamplingParams sampling,
                        SamplingFromFlags(model_sampling ? model->sampling_defaults : engine::SamplingDefaults{}));
  {  // --min-pixels/--max-pixels against the model's bounds, even when no image uses them
    std::optional<int64_t> min_px, max_px;
    if (absl::GetFlag(FLAGS_min_pixels) >= 0) min_px = absl::GetFlag(FLAGS_min_pixels);
    if (absl::GetFlag(FLAGS_max_pixels) >= 0) max_px = absl::GetFlag(FLAGS_max_pixels);
    if (!model->config.has_vision() && (min_px.has_value() || max_px.has_value())) {
      return absl::InvalidArgumentError("--min-pixels/--max-pixels: this model is text-only (model_type qwen2)");
    }
    if (model->config.has_vision()) {
      IRIS_RETURN_IF_ERROR(vision::ResolvePixelBounds(model->preprocessor, min_px, max_px).status());
    }
  }
  const int position_rows = model->config.text.mrope ? 3 : 1;

  auto prompt = engine::BuildPrompt(*model, messages);
  if (!prompt.ok()) return NameImageFile(prompt.status(), images);
  const auto t2 = Clock::now();
  // Kept for --dump (the request takes its own copy).
  const engine::Prompt dumped = absl::GetFlag(FLAGS_dump).empty() ? engine::Prompt{} : *prompt;

  engine::EngineOptions options;
  options.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_mib) << 20;
  options.kv_cache_dtype = kv_dtype;
  options.encoder_cache_bytes = 64ll << 20;
  options.max_num_seqs = 4;
  options.max_queue = 4;
  options.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  IRIS_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> eng, engine::Engine::Create(std::move(model), options));

  engine::Request request;
  request.id = "iris-generate";
  request.prompt = std::move(*prompt);
  request.sampling = sampling;
  request.capture_prompt_logits = !absl::GetFlag(FLAGS_dump).empty();
  const bool stream = absl::GetFlag(FLAGS_stream);
  const auto t3 = Clock::now();
  absl::StatusOr<engine::RequestOutput> out =
      stream ? GenerateStreaming(*eng, std::move(request)) : engine::GenerateBlocking(*eng, std::move(request));
  const auto t4 = Clock::now();
  if (!out.ok()) return out.status();
  if (!out->status.ok()) return out->status;
  if (!stream) std::fwrite(out->text.data(), 1, out->text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  eng->Shutdown();

  if (!absl::GetFlag(FLAGS_dump).empty()) {
    IRIS_RETURN_IF_ERROR(WriteDump(absl::GetFlag(FLAGS_dump), dumped, out->prompt_logits, position_rows));
  }

  const engine::Usage& u = out->usage;
  const engine::Timings& tm = out->timings;
  const double decode_ms = tm.total_ms - tm.first_token_ms;
  const int64_t n = static_cast<int64_t>(out->token_ids.size());
  std::fprintf(stderr,
               "iris-generate: %lld tokens, finish %s; prompt %lld tokens (%lld image) in %zu message(s), dtype %s\n",
               static_cast<long long>(n), llm::FinishReasonName(out->finish_reason),
               static_cast<long long>(u.prompt_tokens), static_cast<long long>(u.image_tokens), messages.size(),
               dtype.c_str());
  std::fprintf(stderr,
               "iris-generate: load %.1f ms, prompt build %.1f ms; engine: queue %.1f ms, encode %.1f ms, "
               "prefill %.1f ms, first token %.1f ms, total %.1f ms",
               Ms(t0, t1), Ms(t1, t2), tm.queue_ms, tm.encode_ms, tm.prefill_ms, tm.first_token_ms, tm.total_ms);
  if (n > 1 && decode_ms > 0) std::fprintf(stderr, ", decode %.1f tok/s", (n - 1) * 1000.0 / decode_ms);
  std::fprintf(stderr, " (wall %.1f ms)\n", Ms(t3, t4));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "generates text with a Qwen2.5-VL model\n"
      "  iris-generate --model DIR (--prompt TEXT [--image FILE...] | --messages FILE.json)\n"
      "                [--max-tokens N] [--greedy | --temperature T [--top-p P] [--top-k K] [--seed S]]\n"
      "                [--repetition-penalty R] [--dtype f32|bf16] [--kv-cache-dtype auto|bf16|f32]\n"
      "                [--min-pixels N] [--max-pixels N] [--dump OUT.safetensors] [--stream]");
  std::vector<std::string> images = iris::core::TakeRepeatedFlag(&argc, argv, "image");
  if (absl::Status parsed = iris::core::ParseFlags(argc, argv); !parsed.ok()) {
    std::fprintf(stderr, "iris-generate: %s\n", std::string(parsed.message()).c_str());
    return 1;
  }
  for (const std::string& more : absl::GetFlag(FLAGS_image)) images.push_back(more);
  absl::Status status = Run(images);
  if (!status.ok()) {
    std::fprintf(stderr, "iris-generate: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
