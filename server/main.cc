// iris-server: serves one Qwen2.5-VL checkpoint over gRPC (iris.v1.Iris, grpc.health.v1, server
// reflection) until SIGTERM or SIGINT, then shuts down gracefully and exits 0.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/command_line.h"
#include "core/cpu_affinity.h"
#include "core/parallel_for.h"
#include "core/status_macros.h"
#include "engine/engine.h"
#include "engine/memory_check.h"
#include "engine/model.h"
#include "server/metrics.h"
#include "server/server.h"
#include "server/server_options.h"
#include "vision/pixel_bounds.h"

ABSL_FLAG(std::string, model, "", "model folder (config.json, tokenizer.json, *.safetensors, ...)");
ABSL_FLAG(std::string, dtype, "bf16", "compute mode: bf16 (fast, the default) or f32");
ABSL_FLAG(std::string, device, "cpu", "where the model runs: cpu, or cuda / cuda:N (a GPU, in a build with the CUDA backend)");
ABSL_FLAG(std::string, cpu_isa, "", "CPU device: highest instruction set of iris's kernels, avx2 | avx512 | avx512_bf16 "
          "(empty = what the processor has, or the IRIS_CPU_ISA variable)");
ABSL_FLAG(std::string, attention, "flash", "with --device cuda: the encoder's varlen attention in bf16, flash (iris's "
          "tensor-core kernel) or cudnn (cuDNN's SDPA operation, cuDNN 9.15 or later)");
ABSL_FLAG(std::string, prefill_attention, "tensor-cores",
          "with --device cuda and bf16: how prompts (prefill rows) attend over the KV cache, tensor-cores (64 rows a "
          "block) or cuda-cores (a block per row and head, the decode kernel)");
ABSL_FLAG(std::string, decode_attention, "cuda-cores",
          "with --device cuda and bf16: how decode rows attend over the KV cache, cuda-cores (a block per row and q "
          "head), tensor-cores (for a batch of more rows x q heads than SMs, a block per row and kv head, its q heads "
          "one tile's rows) or tensor-cores-every-batch; not yet timed on a GPU");
ABSL_FLAG(std::string, decode_rotary, "separate",
          "with --device cuda: a step of decode rows only rotates q and k and writes the KV cache in a launch of its "
          "own (separate, faster at large batches on an H200), inside its paged attention (fused: one launch a "
          "layer fewer, the same results) or as the qkv GEMV's epilogue (gemv: one launch fewer at batches of up to "
          "4, the same results; not yet timed on a GPU)");
ABSL_FLAG(std::string, hopper_gemm, "off",
          "with --device cuda on an H100/H200 (compute capability 9.0) and bf16: which matmuls run iris's own Hopper "
          "GEMM instead of cuBLASLt: off, swiglu (the gated MLPs' gate_up with the SiLU·mul fused: no gate_up output "
          "in memory, one launch fewer a layer) or all (also every other matmul without a GELU); not yet timed on a GPU");
ABSL_FLAG(bool, flash_pipeline, true,
          "with --device cuda and bf16: the encoder's flash attention runs its pipelined kernel (the next K/V tile "
          "copied to shared memory while the warps compute; same result; 6-15% faster encodes on an H200)");
ABSL_FLAG(bool, matmul_tuning, false,
          "with --device cuda: matmuls of encoder- and prefill-sized rows run the fastest of cuBLASLt's candidates, "
          "timed once per shape at warm-up (not yet timed on a GPU)");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on (0.0.0.0 or :: for every interface)");
ABSL_FLAG(int32_t, port, 50051, "port to listen on (0 = any free port, printed when ready)");
ABSL_FLAG(int32_t, http_port, -1, "OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models, "
          "/health, /metrics) on this port, same host, limits, token and TLS as gRPC (-1 = off, 0 = any free port)");
ABSL_FLAG(int32_t, metrics_port, -1, "Prometheus /metrics (and /health) alone on this port, for when --http-port is "
          "off (-1 = off, 0 = any free port)");
ABSL_FLAG(double, http_read_timeout_s, 30, "HTTP: seconds a client has to send a request's header and body");
ABSL_FLAG(double, http_write_timeout_s, 60, "HTTP: seconds one write to a slow reader may take before the "
          "connection is closed (and its request cancelled)");
ABSL_FLAG(double, http_idle_timeout_s, 60, "HTTP: seconds a kept-alive connection may wait for its next request");
ABSL_FLAG(int32_t, max_num_seqs, 64, "sequences decoded together at most");
ABSL_FLAG(int64_t, max_num_batched_tokens, 2048, "decoder rows per engine step (prefill chunks + decodes)");
ABSL_FLAG(int64_t, kv_cache_bytes, 1ll << 30, "KV cache size in bytes (all layers, K and V)");
ABSL_FLAG(double, gpu_memory_fraction, 0,
          "with --device cuda: size the KV cache to fill this fraction of the GPU's memory after the weights "
          "and activations (0: use --kv-cache-bytes)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "KV cache pages: auto (bf16 with --dtype bf16, f32 with --dtype f32), bf16 or f32");
ABSL_FLAG(int32_t, kv_block_size, 16, "tokens per KV cache block");
ABSL_FLAG(int64_t, encoder_cache_bytes, 256ll << 20, "image embeddings kept for reuse, in bytes");
ABSL_FLAG(int64_t, max_encoder_patches_per_step, 16384, "vision patches per encoder forward");
ABSL_FLAG(bool, check_memory, true,
          "before loading, estimate the memory the model takes (weights, KV cache, activations) and refuse to "
          "start when it exceeds what the machine has available");
ABSL_FLAG(bool, interleave_encoder, true, "encode images in pieces between decode steps and size prefill chunks, so "
          "running requests keep getting tokens (false: whole images in the admitting step)");
ABSL_FLAG(double, step_budget_ms, 0, "with --interleave-encoder: target time of an engine step while requests decode "
          "(0 = auto: twice the measured decode-only step, at least 20 ms)");
ABSL_FLAG(bool, enforce_eager, false,
          "run every decoder step and encoder forward as issued: no decode-only steps replayed from CUDA graphs "
          "(on a GPU they are recorded at start, one per padded batch size), and no encoder forwards replayed "
          "from the graph recorded for their grid list");
ABSL_FLAG(std::string, sample_on_device, "auto",
          "draw sampled requests' tokens (temperature, top-k, top-p) where the logits are, so only ids leave the "
          "device: auto (on a GPU, not on the CPU), true or false");
ABSL_FLAG(int64_t, max_graph_context, 8192,
          "longest sequence (tokens) a decode graph serves; longer ones decode without one");
ABSL_FLAG(std::string, step_trace, "", "write one JSON line per engine step here (what it ran, how long each part took)");
ABSL_FLAG(bool, enable_prefix_caching, true,
          "share the KV blocks of common prompt prefixes between requests (images keyed by content)");
ABSL_FLAG(int64_t, max_queue, 1024, "requests waiting (being prepared or queued) before RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_images_per_request, 16, "images in one request");
ABSL_FLAG(int64_t, max_image_bytes, 20ll << 20, "encoded size of one image, in bytes");
ABSL_FLAG(int64_t, max_image_pixels, 64ll << 20, "decoded width * height of one image (checked from its header)");
ABSL_FLAG(int64_t, max_prompt_tokens, 32768, "prompt tokens, image tokens included");
ABSL_FLAG(int64_t, max_tokens, 4096, "largest sampling.max_tokens a request may ask for");
ABSL_FLAG(int64_t, default_max_tokens, 16, "tokens generated when a request does not set sampling.max_tokens");
ABSL_FLAG(std::string, generation_config, "auto",
          "what a request's unset sampling fields (temperature, top_p, top_k, repetition_penalty) take: auto = the "
          "model's generation_config.json, read as transformers' generate() reads it; none = greedy, no penalty");
ABSL_FLAG(int64_t, max_model_len, 0, "prompt + max_tokens (0 = the model's max_position_embeddings)");
ABSL_FLAG(int64_t, max_message_bytes, 64ll << 20, "size of one request message, in bytes");
ABSL_FLAG(int64_t, min_pixels, 0, "smallest resize target per image (0 = the checkpoint's); requests may only raise it");
ABSL_FLAG(int64_t, max_pixels, 0, "largest resize target per image (0 = the checkpoint's); requests may only lower it");
ABSL_FLAG(int32_t, workers, 0, "threads decoding images and building prompts (0 = one per core, of --worker-cpus when set)");
ABSL_FLAG(std::string, engine_cpus, "", "CPUs (Linux list syntax, e.g. 0-3,8) for the engine thread and its compute team "
          "(empty = not pinned); the team's size defaults to their count unless OMP_NUM_THREADS is set");
ABSL_FLAG(std::string, encoder_cpus, "auto", "with --device cpu: 'shared': the vision encoder gets its own thread and "
          "compute team on the engine's cores, which the two split while both have work and either takes whole while "
          "the other is idle, so images are encoded beside the running requests' decoding; or CPUs (e.g. 3 or 6-7, "
          "with --engine-cpus, apart from them) for a team of its own; 'off' (or empty): the encoder runs in slices "
          "between engine steps; 'auto': shared where the engine has two or more CPUs and --interleave-encoder is on, else off");
ABSL_FLAG(bool, encoder_stream, true, "with --device cuda: the vision encoder on a CUDA stream of its own, issued by a "
          "thread of its own, so that an image being encoded overlaps the running requests' decoding (false: in "
          "slices between engine steps, as on the CPU)");
ABSL_FLAG(std::string, worker_cpus, "", "CPUs (e.g. 4-7) for the request workers, gRPC and every other thread but the "
          "engine's (empty = not pinned)");
ABSL_FLAG(double, grace_period_s, 30, "seconds in-flight requests get to finish after SIGTERM/SIGINT");
ABSL_FLAG(std::string, auth_token_file, "", "file holding a bearer token every call must send");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS (with --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls-cert");
ABSL_FLAG(bool, fused_rotary, true, "encoder technique: rotary q/k fused in one pass, tables once per forward");
ABSL_FLAG(bool, parallel_qkv_padding, true, "encoder technique: q/k/v padded in one parallel pass");
ABSL_FLAG(bool, cached_cu_seqlens, true, "encoder technique: cu_seqlens and window plans cached per grid");

namespace iris {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read \"", path, "\""));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status CheckPositive(int64_t value, const char* flag) {
  if (value <= 0) return absl::InvalidArgumentError(absl::StrCat(flag, " must be positive, got ", value));
  return absl::OkStatus();
}

absl::StatusOr<server::ServerOptions> ServerOptionsFromFlags() {
  server::ServerOptions o;
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  if (o.port < 0 || o.port > 65535) return absl::InvalidArgumentError(absl::StrCat("--port must be in [0, 65535], got ", o.port));
  o.dtype = absl::GetFlag(FLAGS_dtype);
  if (o.dtype != "bf16" && o.dtype != "f32") {
    return absl::InvalidArgumentError(absl::StrCat("--dtype must be bf16 or f32, got \"", o.dtype, "\""));
  }
  server::RequestLimits& l = o.limits;
  l.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  l.max_image_bytes = absl::GetFlag(FLAGS_max_image_bytes);
  l.max_image_pixels = absl::GetFlag(FLAGS_max_image_pixels);
  l.max_images_per_request = absl::GetFlag(FLAGS_max_images_per_request);
  l.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  l.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  l.default_max_tokens = absl::GetFlag(FLAGS_default_max_tokens);
  IRIS_RETURN_IF_ERROR(CheckPositive(l.max_message_bytes, "--max-message-bytes"));
  IRIS_RETURN_IF_ERROR(CheckPositive(l.max_image_bytes, "--max-image-bytes"));
  IRIS_RETURN_IF_ERROR(CheckPositive(l.max_image_pixels, "--max-image-pixels"));
  if (l.max_images_per_request < 0) return absl::InvalidArgumentError("--max-images-per-request must be >= 0");
  IRIS_RETURN_IF_ERROR(CheckPositive(l.max_prompt_tokens, "--max-prompt-tokens"));
  IRIS_RETURN_IF_ERROR(CheckPositive(l.max_tokens, "--max-tokens"));
  IRIS_RETURN_IF_ERROR(CheckPositive(l.default_max_tokens, "--default-max-tokens"));
  o.http_port = absl::GetFlag(FLAGS_http_port);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  for (auto [port, flag] : {std::pair(o.http_port, "--http-port"), std::pair(o.metrics_port, "--metrics-port")}) {
    if (port < -1 || port > 65535) return absl::InvalidArgumentError(absl::StrCat(flag, " must be in [-1, 65535], got ", port));
  }
  for (auto [seconds, flag, out] : {std::tuple(absl::GetFlag(FLAGS_http_read_timeout_s), "--http-read-timeout-s", &o.http_read_timeout),
                                    std::tuple(absl::GetFlag(FLAGS_http_write_timeout_s), "--http-write-timeout-s", &o.http_write_timeout),
                                    std::tuple(absl::GetFlag(FLAGS_http_idle_timeout_s), "--http-idle-timeout-s", &o.http_idle_timeout)}) {
    if (!(seconds > 0)) return absl::InvalidArgumentError(absl::StrCat(flag, " must be positive"));
    *out = absl::Seconds(seconds);
  }
  o.workers = absl::GetFlag(FLAGS_workers);
  if (o.workers < 0) return absl::InvalidArgumentError("--workers must be >= 0");
  if (o.workers == 0) o.workers = std::max(1u, std::thread::hardware_concurrency());
  const double grace = absl::GetFlag(FLAGS_grace_period_s);
  if (!(grace >= 0)) return absl::InvalidArgumentError("--grace-period-s must be >= 0");
  o.grace_period = absl::Seconds(grace);
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    IRIS_ASSIGN_OR_RETURN(std::string token, ReadFile(absl::GetFlag(FLAGS_auth_token_file), "--auth-token-file"));
    o.auth_token = std::string(absl::StripAsciiWhitespace(token));
    if (o.auth_token.empty()) return absl::InvalidArgumentError("--auth-token-file: the file is empty");
  }
  if (absl::GetFlag(FLAGS_tls_cert).empty() != absl::GetFlag(FLAGS_tls_key).empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    IRIS_ASSIGN_OR_RETURN(o.tls_cert_pem, ReadFile(absl::GetFlag(FLAGS_tls_cert), "--tls-cert"));
    IRIS_ASSIGN_OR_RETURN(o.tls_key_pem, ReadFile(absl::GetFlag(FLAGS_tls_key), "--tls-key"));
  }
  return o;
}

absl::StatusOr<engine::EngineOptions> EngineOptionsFromFlags() {
  engine::EngineOptions e;
  e.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  e.kv_block_size = absl::GetFlag(FLAGS_kv_block_size);
  IRIS_ASSIGN_OR_RETURN(e.kv_cache_dtype, engine::KvCacheDTypeFromName(absl::GetFlag(FLAGS_kv_cache_dtype)));
  e.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  e.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  e.max_encoder_patches_per_step = absl::GetFlag(FLAGS_max_encoder_patches_per_step);
  e.encoder_cache_bytes = absl::GetFlag(FLAGS_encoder_cache_bytes);
  e.max_queue = absl::GetFlag(FLAGS_max_queue);
  e.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  e.interleave_encoder = absl::GetFlag(FLAGS_interleave_encoder);
  e.step_budget_ms = absl::GetFlag(FLAGS_step_budget_ms);
  e.step_trace_path = absl::GetFlag(FLAGS_step_trace);
  if (!(e.step_budget_ms >= 0)) return absl::InvalidArgumentError("--step-budget-ms must be >= 0");
  e.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  if (absl::GetFlag(FLAGS_enforce_eager)) {
    e.decode_graphs = false;
    e.encoder_graphs = false;
  }
  if (const std::string on_device = absl::GetFlag(FLAGS_sample_on_device); on_device == "true") {
    e.sample_on_device = true;
  } else if (on_device == "false") {
    e.sample_on_device = false;
  } else if (on_device != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--sample-on-device must be auto, true or false, got \"", on_device, "\""));
  }
  e.max_graph_context = absl::GetFlag(FLAGS_max_graph_context);
  IRIS_RETURN_IF_ERROR(CheckPositive(e.max_graph_context, "--max-graph-context"));
  IRIS_RETURN_IF_ERROR(CheckPositive(e.kv_cache_bytes, "--kv-cache-bytes"));
  IRIS_RETURN_IF_ERROR(CheckPositive(e.kv_block_size, "--kv-block-size"));
  IRIS_RETURN_IF_ERROR(CheckPositive(e.max_num_batched_tokens, "--max-num-batched-tokens"));
  IRIS_RETURN_IF_ERROR(CheckPositive(e.max_num_seqs, "--max-num-seqs"));
  IRIS_RETURN_IF_ERROR(CheckPositive(e.max_encoder_patches_per_step, "--max-encoder-patches-per-step"));
  IRIS_RETURN_IF_ERROR(CheckPositive(e.max_queue, "--max-queue"));
  if (e.encoder_cache_bytes < 0) return absl::InvalidArgumentError("--encoder-cache-bytes must be >= 0");
  if (e.max_model_len < 0) return absl::InvalidArgumentError("--max-model-len must be >= 0");
  return e;
}

// --engine-cpus and --worker-cpus, parsed and checked against the CPUs this process may run on.
struct CpuPlan {
  core::CpuList engine;   // empty: not pinned
  core::CpuList encoder;  // empty: the encoder runs on the engine's team (or shares its cores)
  bool encoder_shared = false;  // --encoder-cpus shared
  core::CpuList workers;  // empty: not pinned
  core::CpuList allowed;  // the process's CPUs at startup
};

absl::Status ParseCpuFlag(const std::string& text, const char* flag, const core::CpuList& allowed,
                          core::CpuList* cpus) {
  if (text.empty()) return absl::OkStatus();
  IRIS_ASSIGN_OR_RETURN(*cpus, core::ParseCpuList(text, flag));
  return core::CheckCpusAllowed(*cpus, allowed, flag);
}

absl::StatusOr<CpuPlan> CpuPlanFromFlags() {
  CpuPlan plan;
  IRIS_ASSIGN_OR_RETURN(plan.allowed, core::AllowedCpus());
  IRIS_RETURN_IF_ERROR(ParseCpuFlag(absl::GetFlag(FLAGS_engine_cpus), "--engine-cpus", plan.allowed, &plan.engine));
  // libgomp binds its team to places itself when these are set: the team would leave the set.
  for (const char* var : {"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"}) {
    if (!plan.engine.empty() && std::getenv(var) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--engine-cpus: ", var, " is set, and OpenMP would bind the "
                                                     "compute team by it instead; unset it or drop the flag"));
    }
  }
  const std::string encoder_flag = absl::GetFlag(FLAGS_encoder_cpus);
  if (encoder_flag == "auto") {
    // The cores the engine's team will have: --engine-cpus, else OMP_NUM_THREADS or every CPU of
    // the process (as the CPU device sizes its team).
    int cores = static_cast<int>(!plan.engine.empty() ? plan.engine.size() : plan.allowed.size());
    if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr && plan.engine.empty()) {
      cores = std::atoi(omp);
    }
    // --interleave-encoder=false asks for whole images in the admitting step: no worker then.
    plan.encoder_shared = absl::GetFlag(FLAGS_device) == "cpu" && cores >= 2 && absl::GetFlag(FLAGS_interleave_encoder);
  } else if (encoder_flag == "shared") {
    plan.encoder_shared = true;
  } else if (encoder_flag != "off") {
    IRIS_RETURN_IF_ERROR(
        ParseCpuFlag(absl::GetFlag(FLAGS_encoder_cpus), "--encoder-cpus", plan.allowed, &plan.encoder));
  }
  if (!plan.encoder.empty()) {
    // Two compute teams on shared cores would wait on each other's barriers.
    if (plan.engine.empty()) {
      return absl::InvalidArgumentError("--encoder-cpus needs --engine-cpus (the decoder's team would use every core)");
    }
    for (int cpu : plan.encoder) {
      if (std::find(plan.engine.begin(), plan.engine.end(), cpu) != plan.engine.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--encoder-cpus and --engine-cpus share CPU ", cpu, "; give the encoder cores of its own"));
      }
    }
  }
  IRIS_RETURN_IF_ERROR(ParseCpuFlag(absl::GetFlag(FLAGS_worker_cpus), "--worker-cpus", plan.allowed, &plan.workers));
  return plan;
}

// Pins the main thread to the worker CPUs first, so that every thread it starts from here on
// (model loading's OpenMP team, ParallelFor's helpers, the request workers, gRPC's threads)
// inherits them; the engine thread is then pinned to the engine CPUs (or back to all of the
// process's when only --worker-cpus is given) and its compute team inherits those.
absl::Status ApplyCpuPlan(const CpuPlan& plan, engine::EngineOptions& engine_options,
                          engine::ModelOptions& model_options, server::ServerOptions& options) {
  if (!plan.workers.empty()) {
    IRIS_RETURN_IF_ERROR(core::PinThread(pthread_self(), plan.workers, "main thread"));
    core::ParallelWorkers();  // starts ParallelFor's helper threads now, from this thread
    if (absl::GetFlag(FLAGS_workers) == 0) options.workers = static_cast<int>(plan.workers.size());
  }
  engine_options.cpus = !plan.engine.empty() ? plan.engine : !plan.workers.empty() ? plan.allowed : core::CpuList{};
  if (!plan.engine.empty() && std::getenv("OMP_NUM_THREADS") == nullptr) {
    model_options.device.threads = static_cast<int>(plan.engine.size());  // one team thread per engine CPU
  }
  if (plan.encoder_shared) {
    // The encoder thread on the engine's CPUs (its device, as large as the decoder's: ApplyEncoderDevice).
    engine_options.encoder_cpus = engine_options.cpus;
    engine_options.share_encoder_cores = true;
  }
  if (!plan.encoder.empty()) {
    model_options.encoder_device = kernels::DeviceOptions{.name = "cpu",
                                                          .threads = static_cast<int>(plan.encoder.size()),
                                                          .cpu_isa = absl::GetFlag(FLAGS_cpu_isa),
                                                          .attention = "",
                                                          .prefill_attention = "",
                                                          .decode_attention = "",
                                                          .decode_rotary = "",
                                                          .flash_pipeline = true,
                                                          .matmul_tuning = false,
                                                          .hopper_gemm = ""};
    engine_options.encoder_cpus = plan.encoder;
  }
  return absl::OkStatus();
}

// The encoder's own device: --encoder-cpus (the CPU, set by ApplyCpuPlan) or, on a GPU, a second
// stream unless --encoder-stream=false.
absl::Status ApplyEncoderDevice(const CpuPlan& plan, engine::ModelOptions& model_options) {
  const bool gpu = model_options.device.name != "cpu";
  if (gpu && plan.encoder_shared) {
    return absl::InvalidArgumentError(absl::StrCat("--encoder-cpus shared is for --device cpu; on ",
                                                   model_options.device.name,
                                                   " the encoder gets a stream of its own (--encoder-stream)"));
  }
  if (plan.encoder_shared) model_options.encoder_device = model_options.device;
  if (gpu && !plan.encoder.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--encoder-cpus is for --device cpu; on ", model_options.device.name,
                                                   " the encoder gets a stream of its own (--encoder-stream)"));
  }
  if (gpu && absl::GetFlag(FLAGS_encoder_stream)) model_options.encoder_device = model_options.device;
  return absl::OkStatus();
}

// The server's --min-pixels/--max-pixels tighten the checkpoint's bounds for every request.
absl::Status ApplyPixelBounds(engine::Model& model) {
  std::optional<int64_t> min_px, max_px;
  if (absl::GetFlag(FLAGS_min_pixels) > 0) min_px = absl::GetFlag(FLAGS_min_pixels);
  if (absl::GetFlag(FLAGS_max_pixels) > 0) max_px = absl::GetFlag(FLAGS_max_pixels);
  if (absl::GetFlag(FLAGS_min_pixels) < 0 || absl::GetFlag(FLAGS_max_pixels) < 0) {
    return absl::InvalidArgumentError("--min-pixels and --max-pixels must be >= 0 (0 = the checkpoint's)");
  }
  absl::StatusOr<vision::ResolvedPixelBounds> bounds = vision::ResolvePixelBounds(model.preprocessor, min_px, max_px);
  if (!bounds.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--min-pixels/--max-pixels: ", bounds.status().message()));
  }
  model.preprocessor.min_pixels = bounds->min_pixels;
  model.preprocessor.max_pixels = bounds->max_pixels;
  return absl::OkStatus();
}

std::string CpuPlanText(const CpuPlan& plan) {
  std::string text;
  if (!plan.engine.empty()) absl::StrAppend(&text, ", engine on CPUs ", core::FormatCpuList(plan.engine));
  if (!plan.encoder.empty()) absl::StrAppend(&text, ", encoder on CPUs ", core::FormatCpuList(plan.encoder));
  if (plan.encoder_shared) absl::StrAppend(&text, ", encoder sharing the engine's cores");
  if (!plan.workers.empty()) absl::StrAppend(&text, ", workers on CPUs ", core::FormatCpuList(plan.workers));
  return text;
}

absl::Status Run(const sigset_t& stop_signals) {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  IRIS_ASSIGN_OR_RETURN(server::ServerOptions options, ServerOptionsFromFlags());
  IRIS_ASSIGN_OR_RETURN(engine::EngineOptions engine_options, EngineOptionsFromFlags());
  IRIS_ASSIGN_OR_RETURN(const CpuPlan cpu_plan, CpuPlanFromFlags());
  IRIS_ASSIGN_OR_RETURN(const bool model_sampling,
                        engine::UsesModelSamplingDefaults(absl::GetFlag(FLAGS_generation_config)));

  const absl::Time t0 = absl::Now();
  engine::ModelOptions model_options;
  IRIS_RETURN_IF_ERROR(ApplyCpuPlan(cpu_plan, engine_options, model_options, options));
  model_options.compute = options.dtype == "f32" ? kernels::ComputeType::kF32 : kernels::ComputeType::kBF16;
  model_options.techniques.fused_rotary = absl::GetFlag(FLAGS_fused_rotary);
  model_options.techniques.parallel_qkv_padding = absl::GetFlag(FLAGS_parallel_qkv_padding);
  model_options.techniques.cached_cu_seqlens = absl::GetFlag(FLAGS_cached_cu_seqlens);
  model_options.device.name = absl::GetFlag(FLAGS_device);
  model_options.device.cpu_isa = absl::GetFlag(FLAGS_cpu_isa);
  model_options.device.attention = absl::GetFlag(FLAGS_attention) == "flash" ? "" : absl::GetFlag(FLAGS_attention);
  model_options.device.prefill_attention =
      absl::GetFlag(FLAGS_prefill_attention) == "tensor-cores" ? "" : absl::GetFlag(FLAGS_prefill_attention);
  model_options.device.decode_attention =
      absl::GetFlag(FLAGS_decode_attention) == "cuda-cores" ? "" : absl::GetFlag(FLAGS_decode_attention);
  model_options.device.decode_rotary =
      absl::GetFlag(FLAGS_decode_rotary) == "separate" ? "" : absl::GetFlag(FLAGS_decode_rotary);
  model_options.device.flash_pipeline = absl::GetFlag(FLAGS_flash_pipeline);
  model_options.device.matmul_tuning = absl::GetFlag(FLAGS_matmul_tuning);
  model_options.device.hopper_gemm = absl::GetFlag(FLAGS_hopper_gemm) == "off" ? "" : absl::GetFlag(FLAGS_hopper_gemm);
  IRIS_RETURN_IF_ERROR(ApplyEncoderDevice(cpu_plan, model_options));
  const double gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  if (gpu_memory_fraction != 0 && !absl::GetFlag(FLAGS_check_memory)) {
    return absl::InvalidArgumentError("--gpu-memory-fraction is applied by the memory plan: drop --check-memory=false");
  }
  if (absl::GetFlag(FLAGS_check_memory)) {  // before loading: refuse what would not fit
    IRIS_ASSIGN_OR_RETURN(const engine::MemoryCheck memory,
                          engine::CheckMemoryBeforeLoad(dir, model_options, engine_options, -1, "--kv-cache-bytes",
                                                        gpu_memory_fraction));
    engine_options.kv_cache_bytes = memory.budgets.kv_cache_bytes;
    std::fprintf(stderr, "iris-server: memory plan: %s\n", memory.Describe().c_str());
  }
  IRIS_ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model, engine::LoadModel(dir, model_options));
  std::string device = model->device->Describe();
  if (model->encoder_device != nullptr) {
    absl::StrAppend(&device, ", the encoder beside it on ", model->encoder_device->Describe());
  }
  if (!model->config.has_text) return absl::InvalidArgumentError(absl::StrCat("--model: ", dir, " has no text model (vision-only checkpoint)"));
  IRIS_RETURN_IF_ERROR(ApplyPixelBounds(*model));
  if (model_sampling) options.limits.sampling_defaults = model->sampling_defaults;
  const engine::SamplingDefaults& sampling = options.limits.sampling_defaults;
  std::fprintf(stderr, "iris-server: requests' unset sampling fields: %s (%s)\n", sampling.Describe().c_str(),
               sampling.source.empty() ? "iris's defaults" : sampling.source.c_str());
  options.metrics = std::make_shared<server::Metrics>();
  engine_options.on_step = [metrics = options.metrics](double step_ms, double encoder_ms, int64_t forwards,
                                                       int64_t images) {
    metrics->StepRan(step_ms, encoder_ms, forwards, images);
  };
  IRIS_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                        engine::Engine::Create(std::move(model), engine_options));
  const engine::EngineStats stats = engine->stats();
  const llm::KvCacheShape kv_shape = engine->kv_cache_shape();
  const std::string kv_dtype = kv_shape.dtype == core::DType::kBF16 ? "bf16" : "f32";
  const double kv_mib = static_cast<double>(kv_shape.BytesPerBlock()) * kv_shape.num_blocks / (1 << 20);
  const int64_t max_model_len = engine->max_model_len();
  IRIS_ASSIGN_OR_RETURN(std::unique_ptr<server::Server> server, server::Server::Start(std::move(engine), options));
  std::fprintf(stderr,
               "iris-server: model %s (%s) on %s, %lld KV blocks of %d tokens (%s, %.0f MiB, prefix caching %s), "
               "max_model_len %lld, %d workers, loaded in %.1f s%s%s%s\n",
               dir.c_str(), options.dtype.c_str(), device.c_str(), static_cast<long long>(stats.kv_blocks_total),
               engine_options.kv_block_size, kv_dtype.c_str(), kv_mib,
               engine_options.enable_prefix_caching ? "on" : "off", static_cast<long long>(max_model_len),
               options.workers,
               absl::ToDoubleSeconds(absl::Now() - t0), options.tls_cert_pem.empty() ? "" : ", TLS",
               options.auth_token.empty() ? "" : ", bearer token required", CpuPlanText(cpu_plan).c_str());
  if (server->http_port() != 0) {
    std::fprintf(stderr, "iris-server: HTTP listening on %s:%d\n", options.host.c_str(), server->http_port());
  }
  if (server->metrics_port() != 0) {
    std::fprintf(stderr, "iris-server: metrics listening on %s:%d\n", options.host.c_str(), server->metrics_port());
  }
  std::fprintf(stderr, "iris-server: listening on %s:%d\n", options.host.c_str(), server->port());
  std::fflush(stderr);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::fprintf(stderr, "iris-server: %s received, draining (grace period %.0f s)\n",
               signal_number == SIGINT ? "SIGINT" : "SIGTERM", absl::ToDoubleSeconds(options.grace_period));
  const int64_t cancelled = server->Shutdown();
  std::fprintf(stderr, "iris-server: stopped (%lld request(s) cancelled at the end of the grace period)\n",
               static_cast<long long>(cancelled));
  return absl::OkStatus();
}

}  // namespace
}  // namespace iris

int main(int argc, char** argv) {
  // Block the stop signals before any thread starts, so every thread inherits the mask and only
  // the sigwait in Run() sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::SetProgramUsageMessage(
      "serves a Qwen2.5-VL checkpoint over gRPC (iris.v1.Iris, grpc.health.v1, reflection) and, with --http-port, "
      "the OpenAI-compatible HTTP API\n"
      "  iris-server --model DIR [--dtype bf16|f32] [--host 127.0.0.1] [--port 50051] [limits...]");
  if (absl::Status parsed = iris::core::ParseFlags(argc, argv); !parsed.ok()) {
    std::fprintf(stderr, "iris-server: %s\n", std::string(parsed.message()).c_str());
    return 1;
  }
  absl::Status status = iris::Run(stop_signals);
  if (!status.ok()) {
    std::fprintf(stderr, "iris-server: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
