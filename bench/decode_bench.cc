// Text-decoder benchmark: decode steps/s for several batch sizes over a filled KV cache, the
// weight bytes a step reads per second as a share of this machine's memory read bandwidth
// (measured by this binary in the same run), and prefill tokens/s and TFLOP/s against the matmul
// peak (also measured here). A decode step reads every weight once, so at batch 1 its time is
// bounded below by weight bytes / bandwidth. Then each Linear of the model's shapes alone at
// M = batch, to show how much of a step the matmuls take and how close they come to the bandwidth.
// On a GPU, decode steps are replayed from CUDA graphs as the engine runs them (--graphs), and a
// table puts steps with and without graphs side by side, interleaved in the same run.
// Last, bf16 KV pages against f32 pages: decode steps of the largest batch at a few context lengths,
// the two caches' steps interleaved in the same run, and the tokens/s ratio.
//   decode_bench --model DIR [--dtype bf16|f32] [--kv_dtype auto|bf16|f32] [--batches 1,8,32]
//                [--context 512] [--steps 16] [--chunk 512] [--prompt 512] [--linears=false]
//                [--kv_compare_contexts 512,2048 (empty: no comparison)]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_device.h"
#include "bench/bench_machine.h"
#include "bench/bench_stats.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_linear.h"
#endif
#include "kernels/linear.h"
#include "kernels/memory_bandwidth.h"
#include "kernels/paged_attention.h"
#include "llm/decoder.h"
#include "llm/kv_cache.h"

ABSL_FLAG(std::string, model, "build/models/3b", "model folder (made by iris-make-model --preset small|3b)");
ABSL_FLAG(std::string, dtype, "bf16", "compute mode: bf16 or f32");
ABSL_FLAG(std::string, device, "cpu", "where the decoder runs: cpu, or cuda / cuda:N (a GPU: the bandwidth is its HBM's)");
ABSL_FLAG(std::string, kv_dtype, "auto", "KV cache pages of the main measurements: auto (as --dtype), bf16 or f32");
ABSL_FLAG(std::string, batches, "1,8,32", "decode batch sizes (sequences per step)");
ABSL_FLAG(std::string, kv_compare_contexts, "512,2048",
          "context lengths of the bf16-vs-f32 KV page comparison at the largest batch (empty: skip it)");
ABSL_FLAG(int, context, 512, "tokens already in the cache per sequence before the timed steps");
ABSL_FLAG(int, steps, 16, "timed decode steps per batch size (after 2 warm-up steps)");
ABSL_FLAG(int, chunk, 512, "prefill chunk (rows per step) used to fill the cache");
ABSL_FLAG(int, prompt, 512, "prompt length of the one-step prefill measurement");
ABSL_FLAG(int, prompt_repeats, 3, "repeats of the one-step prefill (best is reported)");
ABSL_FLAG(bool, graphs, true,
          "where the device records graphs (a GPU): decode steps replayed from CUDA graphs, as the engine runs them, "
          "and a same-run table of steps with and without them");
ABSL_FLAG(bool, linears, true,
          "also time each Linear of the model's shapes alone at M = each batch size (weights from DRAM); on a GPU, "
          "rows a GEMV takes are timed with both GEMV kernels and cuBLASLt");
ABSL_FLAG(bool, fold_inputs, true,
          "GPU: bf16 Linears apply the norm or SiLU·mul before them as they read x (false: the op's own launch "
          "first, to measure the fold)");
ABSL_FLAG(bool, bf16_handoff, true,
          "GPU: the gated MLP hands gate_up's output to the SiLU·mul as bf16 rows (prefill-sized rows; decode "
          "steps' GEMVs are not affected; false: f32 rows, to measure it)");
ABSL_FLAG(bool, paged_prefill_mma, true,
          "GPU, bf16 with bf16 KV pages: a step's prefill rows attend on the tensor cores (64 rows a block), not a "
          "block per (row, head) on the CUDA cores (false: the latter); the prompt row is also timed with the other "
          "setting in the same run");
ABSL_FLAG(std::string, decode_attention, "cuda-cores",
          "GPU, bf16 with bf16 KV pages: how decode rows attend, cuda-cores (a block per row and q head), tensor-cores "
          "(a large batch's rows with a kv head's q heads as one tile's rows) or tensor-cores-every-batch "
          "(CudaDevice::SetDecodeAttention); a same-run table times decode steps on the CUDA cores and on the tensor "
          "cores at every batch");
ABSL_FLAG(std::string, decode_rotary, "separate",
          "GPU: a step of decode rows only rotates q and k and writes the KV cache in a launch of its own (separate, "
          "the default), inside its paged attention (fused; CudaDevice::SetFusedDecodeRotary) or as the qkv GEMV's "
          "epilogue (gemv, batches of up to 4; CudaDevice::SetQkvGemvRotary); a same-run table times decode steps "
          "each way against separate at every batch");
ABSL_FLAG(bool, matmul_tuning, false,
          "GPU: prefill-sized matmuls (256 rows and more) run the fastest of cuBLASLt's candidates, timed on the first "
          "step of each shape (CudaDevice::SetMatmulTuning; the prompt row is the best of its repeats, so the tuning "
          "step is not counted); the tuned shapes' table follows the prefill table");
ABSL_FLAG(bool, early_start, true,
          "GPU: launch the GEMVs and the paged attention to start early (programmatic dependent launch, the default "
          "on sm_90+): the GEMVs' first weight pass and the attention's first keys are read while the kernel ahead "
          "finishes (false: launched plainly, to measure it)");
ABSL_FLAG(int, paged_attention_max_splits, 4,
          "GPU: at most this many blocks split one decode row's keys (per q head) in the CUDA-core paged "
          "attention, 1 .. 16 (4: the device's default)");
ABSL_FLAG(bool, paged_attention_lean, false,
          "GPU: the CUDA-core paged attention takes its lean kernel (two blocks an SM) where a step's grid holds "
          "more blocks than SMs (CudaDevice::SetPagedAttentionLean); a same-run table times decode steps both ways "
          "at every batch");
ABSL_FLAG(bool, step_breakdown, true,
          "GPU with graphs: what each op of a decode step costs inside the graph-replayed step (the step with "
          "that op's launches issued twice, minus the step), at the batches up to the GEMV limit");
ABSL_FLAG(double, weight_prefetch, 0.0,
          "GPU: the share of the L2 a decode step asks to fill with the weights of o and gate_up while its "
          "attention runs (CudaDevice::SetWeightPrefetchBytes; 0, the default: none)");
ABSL_FLAG(int, gemv_max_rows, -1, "GPU: bf16 Linears with at most this many rows run a GEMV (-1: the device's default)");
ABSL_FLAG(std::string, gemv_kernel, "auto",
          "GPU: which GEMV takes bf16 Linears of up to --gemv_max_rows rows: auto (the device's pick by rows and "
          "weight size; cuBLASLt where it is faster), or cuda_cores / pipelined / streamed / tensor_cores for every "
          "such call");

namespace {

using namespace iris;
using Clock = std::chrono::steady_clock;
using iris::bench::Median;

double Seconds(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

std::vector<int> ParseInts(const std::string& list, const char* flag) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(s, &v) || v <= 0) {
      std::fprintf(stderr, "decode_bench: bad %s entry: %s\n", flag, std::string(s).c_str());
      std::exit(1);
    }
    out.push_back(v);
  }
  return out;
}

// Random rows scaled like token embeddings (~0.02 std).
std::vector<float> RandomEmbeddings(int64_t rows, int64_t hidden, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.02f);
  std::vector<float> x(static_cast<size_t>(rows * hidden));
  for (float& v : x) v = dist(rng);
  return x;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "decode_bench: %s\n", what.c_str());
  std::exit(1);
}

// Room for one more token in each of `tables` (its next decode step's).
void ReserveNextToken(llm::KvCache& cache, const std::vector<llm::BlockTable*>& tables) {
  for (llm::BlockTable* t : tables) {
    if (auto st = cache.Reserve(t, t->num_tokens + 1); !st.ok()) Die(std::string(st.message()));
  }
}

// Each of `tables` back to `tokens` tokens (its blocks stay), so that the next measurement sees
// the same cache.
void ResetTokens(llm::KvCache& cache, const std::vector<llm::BlockTable*>& tables, int64_t tokens) {
  for (llm::BlockTable* t : tables) {
    if (auto st = cache.Reserve(t, tokens); !st.ok()) Die(std::string(st.message()));
  }
}

// One step over `tables` (each already holding its new tokens): token ids spread over the
// vocabulary, text positions (the same on the three M-RoPE axes), a greedy pick from every
// sequence's last new token's logits, made on the device as the engine does for greedy requests.
double RunStep(llm::Decoder& dec, llm::KvCache& cache, const std::vector<llm::BlockTable*>& tables,
               const std::vector<int64_t>& num_new) {
  static llm::DecoderBatch batch;  // reused, as the engine reuses its own
  size_t max_blocks = 0;
  for (const llm::BlockTable* t : tables) max_blocks = std::max(max_blocks, t->blocks.size());
  batch.Clear(static_cast<int>(max_blocks));
  batch.picks_only = true;
  for (size_t i = 0; i < tables.size(); ++i) {
    for (int64_t j = 0; j < num_new[i]; ++j) {
      const int64_t pos = tables[i]->num_tokens - num_new[i] + j;
      batch.token_ids.push_back(static_cast<int32_t>((pos * 7919 + static_cast<int64_t>(i) * 104729) % dec.vocab_size()));
      for (int axis = 0; axis < 3; ++axis) batch.positions[axis].push_back(pos);
    }
    const absl::Status added = batch.AddSequence(*tables[i], cache.shape().block_size, num_new[i], true);
    if (!added.ok()) Die(std::string(added.message()));
  }
  const auto t = Clock::now();
  auto logits = dec.Forward(batch, &cache);
  const double s = Seconds(t);
  if (!logits.ok()) Die(std::string(logits.status().message()));
  return s;
}

// A cache of `dtype` holding `batch` sequences of `context` tokens (random K/V rows written
// straight into every layer: a decode step's time does not depend on the values), with room for
// `extra` more tokens each.
llm::KvCache FilledCache(kernels::Device& dev, const llm::Decoder& dec, core::DType dtype, int batch, int context,
                         int extra, std::vector<llm::BlockTable>* tables) {
  const int block_size = 16;
  const int64_t blocks = int64_t{batch} * ((context + extra + block_size - 1) / block_size);
  auto cache = llm::KvCache::Create(dec.CacheShape(blocks, block_size, dtype), dev);
  if (!cache.ok()) Die(std::string(cache.status().message()));
  const core::TextConfig& tc = dec.config();
  const int64_t row = int64_t{tc.num_key_value_heads} * tc.head_dim();
  std::vector<float> rows(static_cast<size_t>(context * row));
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (float& x : rows) x = dist(rng);
  // Rows and slots where the device reads them (the same memory on the CPU); the rows once for all.
  auto up = [&dev](void* data, core::DType dtype, int64_t n) {
    auto t = dev.Mirror(core::Tensor::View(data, dtype, {n}, nullptr));
    if (!t.ok()) Die(std::string(t.status().message()));
    return *std::move(t);
  };
  const core::Tensor drows = up(rows.data(), core::DType::kF32, static_cast<int64_t>(rows.size()));
  tables->assign(batch, llm::BlockTable{});
  std::vector<int64_t> slots(context);
  for (llm::BlockTable& t : *tables) {
    if (auto st = cache->Reserve(&t, context); !st.ok()) Die(std::string(st.message()));
    for (int64_t i = 0; i < context; ++i) slots[i] = cache->Slot(t, i);
    const core::Tensor dslots = up(slots.data(), core::DType::kI64, context);
    for (int l = 0; l < tc.num_hidden_layers; ++l) {
      kernels::WritePagedKv(dev, cache->layer(l), drows.data<float>(), row, drows.data<float>(), row,
                            std::span<const int64_t>(dslots.data<int64_t>(), static_cast<size_t>(context)));
    }
  }
  return std::move(*cache);
}

struct KvCompareRow {
  int context;
  double f32_s, bf16_s;            // median step
  double f32_best_s, bf16_best_s;  // fastest step
};

// Decode steps of `batch` sequences at `context` tokens on f32 pages and on bf16 pages, one step of
// each in turn (so that both see the same machine), kWarmup untimed steps first.
KvCompareRow CompareKvDTypes(kernels::Device& dev, llm::Decoder& dec, int batch, int context, int steps, int warmup) {
  std::vector<llm::BlockTable> tables[2];
  llm::KvCache caches[2] = {FilledCache(dev, dec, core::DType::kF32, batch, context, warmup + steps, &tables[0]),
                            FilledCache(dev, dec, core::DType::kBF16, batch, context, warmup + steps, &tables[1])};
  std::vector<double> times[2];
  const std::vector<int64_t> ones(batch, 1);
  for (int i = 0; i < warmup + steps; ++i) {
    for (int d = 0; d < 2; ++d) {
      std::vector<llm::BlockTable*> tp;
      for (llm::BlockTable& t : tables[d]) tp.push_back(&t);
      ReserveNextToken(caches[d], tp);
      const double s = RunStep(dec, caches[d], tp, ones);
      if (i >= warmup) times[d].push_back(s);
    }
  }
  return {context, Median(times[0]), Median(times[1]), *std::min_element(times[0].begin(), times[0].end()),
          *std::min_element(times[1].begin(), times[1].end())};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_model);
  const bool bf16 = absl::GetFlag(FLAGS_dtype) != "f32";
  const int context = absl::GetFlag(FLAGS_context);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int chunk = std::max(1, absl::GetFlag(FLAGS_chunk));
  const int prompt = absl::GetFlag(FLAGS_prompt);
  constexpr int kWarmup = 2;
  const std::vector<int> batches = ParseInts(absl::GetFlag(FLAGS_batches), "--batches");
  const std::vector<int> kv_contexts = ParseInts(absl::GetFlag(FLAGS_kv_compare_contexts), "--kv_compare_contexts");
  const std::string kv_flag = absl::GetFlag(FLAGS_kv_dtype);
  if (kv_flag != "auto" && kv_flag != "bf16" && kv_flag != "f32") Die("--kv_dtype must be auto, bf16 or f32");
  const core::DType kv_dtype =
      kv_flag == "f32" || (kv_flag == "auto" && !bf16) ? core::DType::kF32 : core::DType::kBF16;
  const char* kv_name = kv_dtype == core::DType::kBF16 ? "bf16" : "f32";
  if (batches.empty() || context < 1 || steps < 1) Die("need --batches, --context >= 1 and --steps >= 1");
  const int max_batch = *std::max_element(batches.begin(), batches.end());

  auto config = core::LoadModelConfig(dir);
  auto ckpt = core::Checkpoint::Open(dir);
  if (!config.ok() || !ckpt.ok() || !config->has_text) {
    std::fprintf(stderr, "decode_bench: cannot load the text model of %s (%s). Make it with:\n"
                 "  iris-make-model --preset 3b --out %s\n", dir.c_str(),
                 !config.ok() ? std::string(config.status().message()).c_str()
                 : !ckpt.ok() ? std::string(ckpt.status().message()).c_str()
                              : "vision-only config",
                 dir.c_str());
    return 1;
  }
  const core::TextConfig& tc = config->text;
  llm::DecoderOptions options;
  options.compute = bf16 ? kernels::ComputeType::kBF16 : kernels::ComputeType::kF32;
  const auto load_start = Clock::now();
  // Room for the largest step below: a prompt or a context fill in one step, every sequence's logits.
  options.max_tokens = std::max({context, prompt, absl::GetFlag(FLAGS_chunk), max_batch});
  options.max_logit_rows = max_batch;
  std::unique_ptr<kernels::Device> own_device;
  absl::StatusOr<kernels::Device*> device = bench::DeviceNamed(absl::GetFlag(FLAGS_device), &own_device);
  if (!device.ok()) Die(std::string(device.status().message()));
  kernels::Device& dev = **device;
#ifdef IRIS_HAVE_CUDA
  if (dev.kind() == kernels::DeviceKind::kCuda) {
    kernels::cuda::CudaDevice& gpu = kernels::cuda::AsCuda(dev);
    if (const int rows = absl::GetFlag(FLAGS_gemv_max_rows); rows >= 0) {
      if (absl::Status s = gpu.SetGemvMaxRows(rows); !s.ok()) Die(std::string(s.message()));
    }
    gpu.SetFoldLinearInputs(absl::GetFlag(FLAGS_fold_inputs));
    gpu.SetBf16Handoff(absl::GetFlag(FLAGS_bf16_handoff));
    gpu.SetPagedPrefillMma(absl::GetFlag(FLAGS_paged_prefill_mma));
    gpu.SetMatmulTuning(absl::GetFlag(FLAGS_matmul_tuning));
    using DecodeAttention = kernels::cuda::CudaDevice::DecodeAttention;
    const std::string decode_attention = absl::GetFlag(FLAGS_decode_attention);
    if (decode_attention == "tensor-cores") {
      gpu.SetDecodeAttention(DecodeAttention::kTensorCores);
    } else if (decode_attention == "tensor-cores-every-batch") {
      gpu.SetDecodeAttention(DecodeAttention::kTensorCoresEveryBatch);
    } else if (decode_attention != "cuda-cores") {
      Die("--decode_attention must be cuda-cores, tensor-cores or tensor-cores-every-batch, got " + decode_attention);
    }
    const std::string decode_rotary = absl::GetFlag(FLAGS_decode_rotary);
    if (decode_rotary != "fused" && decode_rotary != "separate" && decode_rotary != "gemv") {
      Die("--decode_rotary must be separate, fused or gemv, got " + decode_rotary);
    }
    gpu.SetFusedDecodeRotary(decode_rotary == "fused");
    gpu.SetQkvGemvRotary(decode_rotary == "gemv");
    gpu.SetPagedAttentionLean(absl::GetFlag(FLAGS_paged_attention_lean));
    if (absl::Status s = gpu.SetPagedAttentionMaxSplits(absl::GetFlag(FLAGS_paged_attention_max_splits)); !s.ok()) {
      Die(std::string(s.message()));
    }
    if (const double share = absl::GetFlag(FLAGS_weight_prefetch); share != 0) {
      if (!(share > 0 && share <= 1)) Die("--weight_prefetch must be in [0, 1], got " + std::to_string(share));
      const auto bytes = static_cast<int64_t>(share * static_cast<double>(gpu.l2_bytes()));
      if (absl::Status s = gpu.SetWeightPrefetchBytes(bytes); !s.ok()) Die(std::string(s.message()));
    }
    // Off switches it off; on keeps the device's default (on where the GPU has it).
    if (!absl::GetFlag(FLAGS_early_start)) {
      if (absl::Status s = gpu.SetEarlyStart(false); !s.ok()) Die(std::string(s.message()));
    }
    const std::string kernel = absl::GetFlag(FLAGS_gemv_kernel);
    if (kernel == "cuda_cores") {
      gpu.ForceGemvKernel(kernels::cuda::GemvKernel::kCudaCores);
    } else if (kernel == "pipelined") {
      gpu.ForceGemvKernel(kernels::cuda::GemvKernel::kCudaCoresPipelined);
    } else if (kernel == "streamed") {
      gpu.ForceGemvKernel(kernels::cuda::GemvKernel::kCudaCoresStreamed);
    } else if (kernel == "tensor_cores") {
      gpu.ForceGemvKernel(kernels::cuda::GemvKernel::kTensorCores);
    } else if (kernel != "auto") {
      Die("--gemv_kernel must be auto, cuda_cores, pipelined, streamed or tensor_cores, got " + kernel);
    }
  }
#endif
  auto loaded = llm::Decoder::Load(dev, *ckpt, tc, options);
  if (!loaded.ok()) Die(std::string(loaded.status().message()));
  llm::Decoder& dec = **loaded;
  const double load_s = Seconds(load_start);
  const int64_t h = tc.hidden_size;

  const int threads = omp_get_max_threads();
  std::printf("machine: %s, %d OpenMP threads (%u hardware threads); load average at start %s\n",
              iris::bench::CpuName().c_str(), threads, std::thread::hardware_concurrency(), iris::bench::LoadAverage().c_str());
  std::printf("device: %s\n", dev.Describe().c_str());
  std::printf("model: %s (text: %d layers, hidden %d, %d heads / %d kv heads x %d, intermediate %d, vocab %lld), "
              "compute %s, KV pages %s, loaded in %.1f s\n",
              dir.c_str(), tc.num_hidden_layers, tc.hidden_size, tc.num_attention_heads, tc.num_key_value_heads,
              tc.head_dim(), tc.intermediate_size, static_cast<long long>(tc.vocab_size), bf16 ? "bf16" : "f32",
              kv_name, load_s);
  // The memory bandwidth is a peak like the matmul peak: measured again before and after every
  // decode row and the Linear table (10 passes of 1 GiB each time), and the best of all the
  // measurements of the run is the reference for every bandwidth ratio. On a shared machine other
  // work lowers single measurements (by up to half here); the best is what this machine can do.
  // The matmul peak for the prefill row is the better of its before/after measurements.
  std::vector<double> bw_all;
  auto measure_bw = [&bw_all, &dev] {
    bw_all.push_back(kernels::MeasureMemoryReadBandwidth(dev, int64_t{1} << 30, 10));
    return bw_all.back();
  };
  auto measure_peak = [&] { return kernels::MeasureMatmulPeakFlops(dev, options.compute, 2048, 5); };
  const double bw0 = measure_bw();
  const double peak0 = measure_peak();
  const char* gemm = dev.kind() == kernels::DeviceKind::kCuda ? "cuBLASLt" : "oneDNN";
  std::printf("memory read bandwidth (%d threads, 1 GiB, same run, first measurement): %.1f GB/s; matmul peak (%s %s, "
              "2048x2048x2048, same run): %.2f TFLOP/s\n\n",
              threads, bw0 / 1e9, gemm, bf16 ? "bf16" : "f32", peak0 / 1e12);
  std::fflush(stdout);

  // KV cache: max_batch sequences of context + twice the warm-up and timed tokens, plus the prompt.
  const int block_size = 16;
  const int64_t per_seq = context + 2 * (kWarmup + steps);  // the decode rows, then the graph comparison
  const int64_t blocks = max_batch * ((per_seq + block_size - 1) / block_size) + (prompt + block_size - 1) / block_size + 1;
  auto cache_or = llm::KvCache::Create(dec.CacheShape(blocks, block_size, kv_dtype), dev);
  if (!cache_or.ok()) Die(std::string(cache_or.status().message()));
  llm::KvCache& cache = *cache_or;

  // Fill: each sequence's `context` tokens as a prefill in chunks.
  std::vector<llm::BlockTable> tables(max_batch);
  double fill_s = 0;
  int64_t fill_tokens = 0, fill_steps = 0;
  for (int s = 0; s < max_batch; ++s) {
    for (int64_t done = 0; done < context;) {
      const int64_t n = std::min<int64_t>(chunk, context - done);
      if (auto st = cache.Reserve(&tables[s], done + n); !st.ok()) Die(std::string(st.message()));
      fill_s += RunStep(dec, cache, {&tables[s]}, {n});
      fill_tokens += n;
      ++fill_steps;
      done += n;
    }
  }

  // Prefill of one prompt as a single step (its matmuls are compute-bound: TFLOP/s vs the peak).
  // On a GPU in the bf16 mode over bf16 pages, also with the prefill rows' attention switched to the
  // other kernel (CudaDevice::SetPagedPrefillMma), in the same run.
  std::vector<double> prompt_s, prompt_other_s;
  double prompt_peak = 0;
  [[maybe_unused]] const bool prefill_switch = dev.kind() == kernels::DeviceKind::kCuda && bf16 && kv_dtype == core::DType::kBF16;
  auto time_prompt = [&](std::vector<double>* out) {
    for (int r = 0; r < std::max(1, absl::GetFlag(FLAGS_prompt_repeats)); ++r) {
      llm::BlockTable t;
      if (auto st = cache.Reserve(&t, prompt); !st.ok()) Die(std::string(st.message()));
      out->push_back(RunStep(dec, cache, {&t}, {prompt}));
      cache.Release(&t);
    }
  };
  if (prompt > 0) {
    prompt_peak = measure_peak();
    time_prompt(&prompt_s);
#ifdef IRIS_HAVE_CUDA
    if (prefill_switch) {
      kernels::cuda::CudaDevice& gpu = kernels::cuda::AsCuda(dev);
      gpu.SetPagedPrefillMma(!absl::GetFlag(FLAGS_paged_prefill_mma));
      time_prompt(&prompt_other_s);
      gpu.SetPagedPrefillMma(absl::GetFlag(FLAGS_paged_prefill_mma));
    }
#endif
    prompt_peak = std::max(prompt_peak, measure_peak());
  }
  std::printf("prefill (load average %s):\n", iris::bench::LoadAverage().c_str());
  std::printf("| prefill | tokens | steps | ms/step | tokens/s | matmul TFLOP/s | matmul peak TFLOP/s | of peak |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::printf("| cache fill, chunks of %d | %lld | %lld | %.1f | %.0f | %.2f | | |\n", chunk,
              static_cast<long long>(fill_tokens), static_cast<long long>(fill_steps), 1e3 * fill_s / fill_steps,
              fill_tokens / fill_s, dec.MatmulFlops(fill_tokens, fill_steps) / fill_s / 1e12);
  if (prompt > 0) {
    const double best = *std::min_element(prompt_s.begin(), prompt_s.end());
    const double tflops = dec.MatmulFlops(prompt, 1) / best / 1e12;
    std::printf("| %d-token prompt, one step (best of %zu) | %d | 1 | %.1f | %.0f | %.2f | %.2f | %.0f%% |\n", prompt,
                prompt_s.size(), prompt, 1e3 * best, prompt / best, tflops, prompt_peak / 1e12,
                100.0 * tflops * 1e12 / prompt_peak);
    if (!prompt_other_s.empty()) {
      const double other = *std::min_element(prompt_other_s.begin(), prompt_other_s.end());
      const bool mma = absl::GetFlag(FLAGS_paged_prefill_mma);
      std::printf("| the same, prefill attention on the %s (best of %zu) | %d | 1 | %.1f | %.0f | %.2f | %.2f | %.0f%% |\n",
                  mma ? "CUDA cores" : "tensor cores", prompt_other_s.size(), prompt, 1e3 * other, prompt / other,
                  dec.MatmulFlops(prompt, 1) / other / 1e12, prompt_peak / 1e12,
                  100.0 * dec.MatmulFlops(prompt, 1) / other / prompt_peak);
      std::printf("prefill attention on the tensor cores: %.2fx the prompt step's speed with it on the CUDA cores "
                  "(same run)\n",
                  mma ? other / best : best / other);
    }
  }
#ifdef IRIS_HAVE_CUDA
  if (dev.kind() == kernels::DeviceKind::kCuda) {
    if (const std::string tuned = kernels::cuda::TunedMatmulTable(kernels::cuda::AsCuda(dev)); !tuned.empty()) {
      std::printf("\nmatmuls tuned in this run (cuBLASLt's candidates timed on the step's operands):\n%s", tuned.c_str());
    }
  }
#endif
  std::printf("\n");
  std::fflush(stdout);

  // Decode graphs, one per batch size measured, as wide as the sequences get in this run.
  const bool graphs = absl::GetFlag(FLAGS_graphs) && dev.records_graphs();
  llm::DecodeGraphOptions g;
  if (graphs) {
    g.batch_sizes = batches;
    std::sort(g.batch_sizes.begin(), g.batch_sizes.end());
    g.batch_sizes.erase(std::unique(g.batch_sizes.begin(), g.batch_sizes.end()), g.batch_sizes.end());
    g.max_blocks_per_seq = static_cast<int>((per_seq + block_size - 1) / block_size);
    if (auto st = dec.EnableDecodeGraphs(g); !st.ok()) Die(std::string(st.message()));
  }

  // Decode: `b` sequences, one new token each per step, after kWarmup untimed steps.
  const double weight_bytes = static_cast<double>(dec.WeightBytesPerStep());
  const double kv_bytes_per_token =
      2.0 * tc.num_hidden_layers * tc.num_key_value_heads * tc.head_dim() * (kv_dtype == core::DType::kBF16 ? 2 : 4);
  struct DecodeRow {
    int batch;
    double med, best, kv_bytes;
  };
  std::vector<DecodeRow> decode_rows;
  std::vector<double> step_ms;  // median ms/step per entry of `batches`
  const std::string decode_load = iris::bench::LoadAverage();
  std::fprintf(stderr, "decode_bench: decode steps...\n");
  for (int b : batches) {
    std::vector<llm::BlockTable*> tp;
    for (int s = 0; s < b; ++s) tp.push_back(&tables[s]);
    const std::vector<int64_t> ones(b, 1);
    measure_bw();
    std::vector<double> times;
    double kv_tokens = 0;  // cached tokens attended to, summed over the timed steps
    for (int i = 0; i < kWarmup + steps; ++i) {
      ReserveNextToken(cache, tp);
      const double s = RunStep(dec, cache, tp, ones);
      if (i >= kWarmup) {
        times.push_back(s);
        for (const llm::BlockTable* t : tp) kv_tokens += static_cast<double>(t->num_tokens);
      }
    }
    measure_bw();
    ResetTokens(cache, tp, context);  // every batch size sees the same cache
    const double med = Median(times);
    const double best = *std::min_element(times.begin(), times.end());
    decode_rows.push_back({b, med, best, kv_tokens / steps * kv_bytes_per_token});
    step_ms.push_back(1e3 * med);
  }

  // Decode steps of `b` sequences under two settings, one step of each in turn (set(0), then
  // set(1), before each), after kWarmup untimed pairs: the median seconds of each. The cache is
  // reset after, so every comparison sees the same one.
  const auto alternating_steps = [&](int b, const std::function<void(int)>& set) {
    std::vector<llm::BlockTable*> tp;
    for (int s = 0; s < b; ++s) tp.push_back(&tables[s]);
    const std::vector<int64_t> ones(b, 1);
    std::vector<double> times[2];
    for (int i = 0; i < kWarmup + steps; ++i) {
      for (int k = 0; k < 2; ++k) {
        ReserveNextToken(cache, tp);
        set(k);
        const double s = RunStep(dec, cache, tp, ones);
        if (i >= kWarmup) times[k].push_back(s);
      }
    }
    ResetTokens(cache, tp, context);
    return std::pair<double, double>{Median(times[0]), Median(times[1])};
  };

  // Decode steps with and without graphs, one of each in turn at every batch size.
  struct GraphRow {
    int batch;
    double with_s, without_s;
  };
  std::vector<GraphRow> graph_rows;
  if (graphs) {
    std::fprintf(stderr, "decode_bench: with and without decode graphs...\n");
    for (int b : batches) {
      const auto [with_s, without_s] = alternating_steps(b, [&](int without) { dec.PauseDecodeGraphs(without == 1); });
      dec.PauseDecodeGraphs(false);
      graph_rows.push_back({b, with_s, without_s});
    }
  }

  // Decode steps with the decode rows' attention on the CUDA cores and on the tensor cores (a kv
  // head's q heads as one tile), alternating, at every batch (bf16 pages). Issued op by op (the
  // graphs recorded one setting).
  struct DecodeAttentionRow {
    int batch;
    double cuda_cores_s, tensor_cores_s;
    bool large;  // whether --decode_attention=tensor-cores takes this batch
  };
  std::vector<DecodeAttentionRow> decode_attention_rows;
#ifdef IRIS_HAVE_CUDA
  if (dev.kind() == kernels::DeviceKind::kCuda && bf16 && kv_dtype == core::DType::kBF16) {
    kernels::cuda::CudaDevice& gpu = kernels::cuda::AsCuda(dev);
    using DecodeAttention = kernels::cuda::CudaDevice::DecodeAttention;
    const DecodeAttention setting = gpu.decode_attention();
    std::fprintf(stderr, "decode_bench: decode attention on the CUDA cores and on the tensor cores...\n");
    for (int b : batches) {
      if (graphs) dec.PauseDecodeGraphs(true);
      const auto [cuda_cores_s, tensor_cores_s] = alternating_steps(b, [&](int tc_on) {
        gpu.SetDecodeAttention(tc_on == 1 ? DecodeAttention::kTensorCoresEveryBatch : DecodeAttention::kCudaCores);
      });
      if (graphs) dec.PauseDecodeGraphs(false);
      gpu.SetDecodeAttention(setting);
      decode_attention_rows.push_back(
          {b, cuda_cores_s, tensor_cores_s, int64_t{b} * tc.num_attention_heads > gpu.sm_count()});
    }
  }
#endif

  // Decode steps with the rotary and KV write inside the paged attention, and as the qkv GEMV's
  // epilogue, each alternating with a launch of their own, at every batch; issued op by op (the
  // graphs recorded one setting: a graph replay of each is gpu_ab.sh's --variant
  // "fused_rotary: --decode_rotary=fused", or =gemv).
  struct DecodeRotaryRow {
    int batch;
    double fused_s, separate_s, gemv_s, gemv_separate_s;
  };
  std::vector<DecodeRotaryRow> decode_rotary_rows;
#ifdef IRIS_HAVE_CUDA
  if (dev.kind() == kernels::DeviceKind::kCuda) {
    kernels::cuda::CudaDevice& gpu = kernels::cuda::AsCuda(dev);
    const bool fused_setting = gpu.fused_decode_rotary(), gemv_setting = gpu.qkv_gemv_rotary();
    std::fprintf(stderr, "decode_bench: decode rotary in the attention, in the qkv GEMV and on its own...\n");
    for (int b : batches) {
      if (graphs) dec.PauseDecodeGraphs(true);
      gpu.SetQkvGemvRotary(false);
      const auto [fused_s, separate_s] =
          alternating_steps(b, [&](int separate) { gpu.SetFusedDecodeRotary(separate == 0); });
      gpu.SetFusedDecodeRotary(false);
      const auto [gemv_s, gemv_separate_s] =
          alternating_steps(b, [&](int separate) { gpu.SetQkvGemvRotary(separate == 0); });
      if (graphs) dec.PauseDecodeGraphs(false);
      gpu.SetFusedDecodeRotary(fused_setting);
      gpu.SetQkvGemvRotary(gemv_setting);
      decode_rotary_rows.push_back({b, fused_s, separate_s, gemv_s, gemv_separate_s});
    }
  }
#endif

  // Decode steps with the lean paged attention and with the default kernel, alternating, at every
  // batch, issued op by op (below one wave of blocks the two are the same launch).
  struct LeanRow {
    int batch;
    double lean_s, default_s;
  };
  std::vector<LeanRow> lean_rows;
#ifdef IRIS_HAVE_CUDA
  if (dev.kind() == kernels::DeviceKind::kCuda) {
    kernels::cuda::CudaDevice& gpu = kernels::cuda::AsCuda(dev);
    const bool setting = gpu.paged_attention_lean();
    std::fprintf(stderr, "decode_bench: the lean paged attention and the default kernel...\n");
    for (int b : batches) {
      if (graphs) dec.PauseDecodeGraphs(true);
      const auto [lean_s, default_s] =
          alternating_steps(b, [&](int plain) { gpu.SetPagedAttentionLean(plain == 0); });
      if (graphs) dec.PauseDecodeGraphs(false);
      gpu.SetPagedAttentionLean(setting);
      lean_rows.push_back({b, lean_s, default_s});
    }
  }
#endif

  // What each op of a decode step costs inside the graph-replayed step (METHOD.md's differences):
  // the step with that op's launches issued twice (CudaDevice::SetLaunchRepeat) against the step
  // as it is, each setting's graphs recorded afresh, the settings in turn for two rounds (median
  // of `steps` steps each, the two rounds' medians averaged). Only the ops iris's own kernels run:
  // the GEMVs (batches up to the GEMV limit), the decode rotary + KV write where it is a launch of
  // its own, the paged attention.
  struct BreakdownRow {
    int batch;
    std::string op;
    int per_step;
    double plain_s, twice_s;
  };
  std::vector<BreakdownRow> breakdown_rows;
#ifdef IRIS_HAVE_CUDA
  if (dev.kind() == kernels::DeviceKind::kCuda && graphs && absl::GetFlag(FLAGS_step_breakdown)) {
    kernels::cuda::CudaDevice& gpu = kernels::cuda::AsCuda(dev);
    using Repeat = kernels::cuda::CudaDevice::LaunchRepeat;
    using Op = kernels::cuda::CudaDevice::RepeatedOp;
    const int64_t hd = tc.head_dim(), heads = tc.num_attention_heads, kv_heads = tc.num_key_value_heads;
    const int layers = tc.num_hidden_layers;
    struct Variant {
      std::string name;
      Repeat repeat;
      int per_step;
    };
    std::fprintf(stderr, "decode_bench: each op of a step twice...\n");
    for (int b : batches) {
      if (b > kernels::cuda::kGemvMaxRowsPerLaunch) continue;
      std::vector<Variant> variants = {{"(the step as it is)", Repeat{}, 0}};
      const struct {
        const char* name;
        int64_t out, in;
        int per_step;
      } gemvs[] = {{"qkv GEMV", (heads + 2 * kv_heads) * hd, h, layers},
                   {"o GEMV", h, heads * hd, layers},
                   {"gate_up GEMV", 2 * int64_t{tc.intermediate_size}, h, layers},
                   {"down GEMV", h, tc.intermediate_size, layers},
                   {"lm_head GEMV", tc.vocab_size, h, 1}};
      for (const auto& lin : gemvs) {
        if (gpu.GemvFor(b, lin.out, lin.in)) {
          variants.push_back({lin.name, Repeat{Op::kGemv, lin.out, lin.in, 2}, lin.per_step});
        }
      }
      if (!gpu.fused_decode_rotary() && !(gpu.qkv_gemv_rotary() && b <= kernels::cuda::kGemvRotaryKvMaxRows)) {
        variants.push_back({"rotary + KV write", Repeat{Op::kDecodeRotary, 0, 0, 2}, layers});
      }
      variants.push_back({"paged attention", Repeat{Op::kPagedAttention, 0, 0, 2}, layers});
      std::vector<llm::BlockTable*> tp;
      for (int s2 = 0; s2 < b; ++s2) tp.push_back(&tables[s2]);
      const std::vector<int64_t> ones(b, 1);
      std::vector<double> sum(variants.size(), 0.0);
      constexpr int kRounds = 2;
      for (int round = 0; round < kRounds; ++round) {
        for (size_t v = 0; v < variants.size(); ++v) {
          gpu.SetLaunchRepeat(variants[v].repeat);
          if (auto st = dec.EnableDecodeGraphs(g); !st.ok()) Die(std::string(st.message()));
          std::vector<double> times;
          for (int i = 0; i < kWarmup + steps; ++i) {
            ReserveNextToken(cache, tp);
            const double t = RunStep(dec, cache, tp, ones);
            if (i >= kWarmup) times.push_back(t);
          }
          ResetTokens(cache, tp, context);
          sum[v] += Median(times) / kRounds;
        }
      }
      gpu.SetLaunchRepeat(Repeat{});
      if (auto st = dec.EnableDecodeGraphs(g); !st.ok()) Die(std::string(st.message()));
      for (size_t v = 1; v < variants.size(); ++v) {
        breakdown_rows.push_back({b, variants[v].name, variants[v].per_step, sum[0], sum[v]});
      }
    }
  }
#endif

  // Each Linear of the model's shapes alone at M = each batch size, with random weights cycled
  // through enough copies (>= 256 MB) that every call reads its weights from DRAM, as in a step.
  struct Shape {
    const char* name;
    int64_t out, in;
    int per_step;
  };
  const int64_t d = tc.head_dim(), nh = tc.num_attention_heads, nkv = tc.num_key_value_heads;
  const std::vector<Shape> shapes = {
      {"qkv", (nh + 2 * nkv) * d, h, tc.num_hidden_layers},
      {"o", h, nh * d, tc.num_hidden_layers},
      {"gate_up", 2 * int64_t{tc.intermediate_size}, h, tc.num_hidden_layers},
      {"down", h, tc.intermediate_size, tc.num_hidden_layers},
      {"lm_head", tc.vocab_size, h, 1},
  };
  const int64_t es = bf16 ? 2 : 4;
  struct LinearRow {
    int m;
    std::string name, shape;
    double bytes, sec, flops;
    int per_step;
    // Where a GEMV took the call (a GPU): the same call on each GEMV kernel and through cuBLASLt;
    // else 0.
    double cuda_cores_sec, pipelined_sec, streamed_sec, tensor_cores_sec, cublas_sec;
  };
  std::vector<std::vector<LinearRow>> linear_rows(batches.size());
  const std::string linear_load = iris::bench::LoadAverage();
  if (absl::GetFlag(FLAGS_linears)) {
    std::fprintf(stderr, "decode_bench: Linear alone...\n");
    std::vector<float> x_host = RandomEmbeddings(max_batch, std::max<int64_t>(h, tc.intermediate_size), 3);
    auto x_or = dev.Mirror(core::Tensor::View(x_host.data(), core::DType::kF32,
                                              {static_cast<int64_t>(x_host.size())}, nullptr));
    if (!x_or.ok()) Die(std::string(x_or.status().message()));
    const float* x = x_or->data<float>();
    for (const Shape& s : shapes) {
      const int64_t bytes = s.out * s.in * es;
      const int copies = static_cast<int>(std::max<int64_t>(1, ((int64_t{256} << 20) + bytes - 1) / bytes));
      std::vector<std::unique_ptr<kernels::Linear>> lins;
      {
        core::Tensor w = core::Tensor::Empty(core::DType::kF32, {s.out, s.in});
        std::mt19937 rng(4);
        std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
        float* wp = w.data<float>();
        for (int64_t i = 0; i < s.out * s.in; ++i) wp[i] = dist(rng);
        for (int c = 0; c < copies; ++c) {
          auto lin = kernels::Linear::Create(dev, w, nullptr, options.compute);
          if (!lin.ok()) Die(std::string(lin.status().message()));
          lins.push_back(std::move(*lin));
        }
      }
      auto y_or = dev.Allocate(core::DType::kF32, {max_batch * s.out});
      if (!y_or.ok()) Die(std::string(y_or.status().message()));
      float* y = y_or->data<float>();
      // The mean call of a run of calls with one synchronisation at its end (a GPU's calls are only
      // enqueued, and a wait after each would time the launch, not the kernel), best of 3 runs.
      const auto time_calls = [&](int m) {
        for (int c = 0; c < copies; ++c) lins[c]->Forward(x, m, y);  // primitives, warm-up
        dev.Synchronize();
        const int calls = std::max(2 * copies, 32);
        double best = 1e30;
        for (int run = 0; run < 3; ++run) {
          const auto t0 = Clock::now();
          for (int i = 0; i < calls; ++i) lins[i % copies]->Forward(x, m, y);
          dev.Synchronize();
          best = std::min(best, Seconds(t0) / calls);
        }
        return best;
      };
      for (size_t bi = 0; bi < batches.size(); ++bi) {
        const int m = batches[bi];
        const double sec = time_calls(m);
        double cuda_cores_sec = 0, pipelined_sec = 0, streamed_sec = 0, tensor_cores_sec = 0, cublas_sec = 0;
#ifdef IRIS_HAVE_CUDA
        if (dev.kind() == kernels::DeviceKind::kCuda && bf16) {
          using kernels::cuda::GemvKernel;
          kernels::cuda::CudaDevice& gpu = kernels::cuda::AsCuda(dev);
          const int gemv_rows = gpu.gemv_max_rows();
          const std::optional<GemvKernel> forced = gpu.forced_gemv_kernel();
          if (m <= gemv_rows) {
            gpu.ForceGemvKernel(GemvKernel::kCudaCores);
            cuda_cores_sec = time_calls(m);
            gpu.ForceGemvKernel(GemvKernel::kCudaCoresPipelined);
            pipelined_sec = time_calls(m);
            gpu.ForceGemvKernel(GemvKernel::kCudaCoresStreamed);
            streamed_sec = time_calls(m);
            gpu.ForceGemvKernel(GemvKernel::kTensorCores);
            tensor_cores_sec = time_calls(m);
            gpu.ForceGemvKernel(std::nullopt);
            (void)gpu.SetGemvMaxRows(0);
            cublas_sec = time_calls(m);
            (void)gpu.SetGemvMaxRows(gemv_rows);
            gpu.ForceGemvKernel(forced);
          }
        }
#endif
        linear_rows[bi].push_back({m, s.name, std::to_string(s.out) + " x " + std::to_string(s.in),
                                   static_cast<double>(bytes), sec, 2.0 * m * s.out * s.in, s.per_step,
                                   cuda_cores_sec, pipelined_sec, streamed_sec, tensor_cores_sec, cublas_sec});
      }
    }
    measure_bw();
  }

  // The tables, against the best bandwidth of the run.
  const double bw = *std::max_element(bw_all.begin(), bw_all.end());
  const double bw_min = *std::min_element(bw_all.begin(), bw_all.end());
  std::printf("memory read bandwidth, the reference for the ratios below: %.1f GB/s (best of %zu measurements "
              "through this run, each the best of 10 passes over 1 GiB; they ranged %.1f-%.1f GB/s)\n\n",
              bw / 1e9, bw_all.size(), bw_min / 1e9, bw / 1e9);
  std::printf("decode, context %d per sequence (load average %s; ms/step is the median of %d steps; KV = the "
              "%s K and V rows attended to, on average over the timed steps):\n",
              context, decode_load.c_str(), steps, kv_name);
  std::printf("| batch | ms/step | best ms | steps/s | tokens/s | weights GB/step | weights GB/s | of bandwidth | KV MB/step "
              "| (weights+KV) GB/s | of bandwidth | matmul TFLOP/s |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const DecodeRow& r : decode_rows) {
    std::printf("| %d | %.2f | %.2f | %.2f | %.1f | %.3f | %.1f | %.0f%% | %.1f | %.1f | %.0f%% | %.3f |\n", r.batch,
                1e3 * r.med, 1e3 * r.best, 1.0 / r.med, r.batch / r.med, weight_bytes / 1e9, weight_bytes / r.med / 1e9,
                100.0 * weight_bytes / r.med / bw, r.kv_bytes / 1e6, (weight_bytes + r.kv_bytes) / r.med / 1e9,
                100.0 * (weight_bytes + r.kv_bytes) / r.med / bw, dec.MatmulFlops(r.batch, r.batch) / r.med / 1e12);
  }
  if (graphs) {
    std::printf("\ndecode steps from CUDA graphs (%d recorded, one per batch size) and issued op by op, context "
                "~%d, the two kinds of step interleaved (median of %d each):\n", dec.decode_graphs(), context, steps);
    std::printf("| batch | with graphs ms/step | without ms/step | tokens/s with | without | with / without tokens/s |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const GraphRow& r : graph_rows) {
      std::printf("| %d | %.3f | %.3f | %.0f | %.0f | %.2fx |\n", r.batch, 1e3 * r.with_s, 1e3 * r.without_s,
                  r.batch / r.with_s, r.batch / r.without_s, r.without_s / r.with_s);
    }
  } else {
    std::printf("\ndecode graphs: %s\n", dev.records_graphs() ? "off (--graphs=false)" : "this device records none");
  }
  if (!breakdown_rows.empty()) {
    std::printf("\neach op of a decode step inside the graph-replayed step: the step with that op's launches issued "
                "twice minus the step as it is (context ~%d; each setting's graphs recorded afresh, two rounds of %d "
                "steps each, medians averaged). A GEMV's second read of its weight may find part of it in the L2 "
                "(all of qkv's and o's): theirs are lower bounds. The rest is what no repeated op covers (the "
                "embedding, the pick, the gaps):\n"
                "| batch | op | launches a step | step ms | with it twice ms | us a launch in the step | ms a step | "
                "share of the step |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
                context, steps);
    for (size_t i = 0; i < breakdown_rows.size();) {
      const int b = breakdown_rows[i].batch;
      const double step = breakdown_rows[i].plain_s;
      double covered = 0;
      for (; i < breakdown_rows.size() && breakdown_rows[i].batch == b; ++i) {
        const BreakdownRow& r = breakdown_rows[i];
        const double each = (r.twice_s - r.plain_s) / r.per_step;
        covered += each * r.per_step;
        std::printf("| %d | %s | %d | %.3f | %.3f | %.2f | %.3f | %.0f%% |\n", b, r.op.c_str(), r.per_step, 1e3 * step,
                    1e3 * r.twice_s, 1e6 * each, 1e3 * each * r.per_step, 100.0 * each * r.per_step / step);
      }
      std::printf("| %d | the rest | | %.3f | | | %.3f | %.0f%% |\n", b, 1e3 * step, 1e3 * (step - covered),
                  100.0 * (step - covered) / step);
    }
  }
  if (!decode_attention_rows.empty()) {
    std::printf("\ndecode attention: a block per (row, q head) on the CUDA cores against a kv head's q heads as one "
                "tile on the tensor cores (split over blocks where few rows), decode steps issued op by op, "
                "alternating (median of %d each); --decode_attention=tensor-cores takes the batches marked yes:\n"
                "| batch | CUDA cores ms/step | tensor cores ms/step | tokens/s, CUDA cores | tensor cores | speed-up | "
                "tensor-cores takes it |\n| ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
                steps);
    for (const DecodeAttentionRow& r : decode_attention_rows) {
      std::printf("| %d | %.3f | %.3f | %.0f | %.0f | %.2fx | %s |\n", r.batch, 1e3 * r.cuda_cores_s,
                  1e3 * r.tensor_cores_s, r.batch / r.cuda_cores_s, r.batch / r.tensor_cores_s,
                  r.cuda_cores_s / r.tensor_cores_s, r.large ? "yes" : "no");
    }
  }
#ifdef IRIS_HAVE_CUDA
  if (!decode_rotary_rows.empty()) {
    std::printf("\ndecode rotary: q and k rotated and the new k and v written to the cache inside the paged "
                "attention (fused), and as the qkv GEMV's epilogue (gemv: batches it takes, up to %d rows; past "
                "them the step is the separate one), each against a launch of their own (separate, the default), "
                "decode steps issued op by op, alternating in pairs (median of %d each):\n"
                "| batch | fused ms/step | separate ms/step | separate / fused | gemv ms/step | separate ms/step | "
                "separate / gemv |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
                kernels::cuda::kGemvRotaryKvMaxRows, steps);
    for (const DecodeRotaryRow& r : decode_rotary_rows) {
      std::printf("| %d | %.3f | %.3f | %.3fx | %.3f | %.3f | %.3fx |\n", r.batch, 1e3 * r.fused_s, 1e3 * r.separate_s,
                  r.separate_s / r.fused_s, 1e3 * r.gemv_s, 1e3 * r.gemv_separate_s, r.gemv_separate_s / r.gemv_s);
    }
  }
#endif
  if (!lean_rows.empty()) {
    std::printf("\npaged attention, the lean kernel (at most 128 registers: two blocks an SM, V rows 8 at a time; "
                "taken where the step's grid holds more blocks than SMs) against the default kernel (one block an "
                "SM, V rows 16 at a time), decode steps issued op by op, alternating (median of %d each; the same "
                "output bit for bit):\n| batch | lean ms/step | default ms/step | default / lean |\n"
                "| ---: | ---: | ---: | ---: |\n", steps);
    for (const LeanRow& r : lean_rows) {
      std::printf("| %d | %.3f | %.3f | %.3fx |\n", r.batch, 1e3 * r.lean_s, 1e3 * r.default_s,
                  r.default_s / r.lean_s);
    }
  }
  if (absl::GetFlag(FLAGS_linears)) {
    std::printf("\nLinear alone at M = batch (%s, random weights read from DRAM; mean call of a run, best of 3 runs; "
                "load average %s; share = of that batch's median decode step; on a GPU, us/call is the path the "
                "device picks (a GEMV or cuBLASLt), and for rows a GEMV may take the last columns time the same call "
                "on each GEMV kernel and through cuBLASLt, f32 -> bf16 launch included, as GB/s):\n", gemm,
                linear_load.c_str());
    std::printf("| M | linear | out x in | MB | us/call | GB/s | of bandwidth | TFLOP/s | per step | ms/step | share of the step "
                "| CUDA-core GEMV | pipelined | streamed | tensor-core GEMV | cuBLASLt |\n");
    std::printf("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                "| ---: |\n");
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      double sum = 0;
      for (const LinearRow& r : linear_rows[bi]) {
        const double ms = 1e3 * r.sec * r.per_step;
        sum += ms;
        const std::string cublas =
            r.cublas_sec > 0 ? absl::StrFormat("%.0f | %.0f | %.0f | %.0f | %.0f", r.bytes / r.cuda_cores_sec / 1e9,
                                               r.bytes / r.pipelined_sec / 1e9, r.bytes / r.streamed_sec / 1e9, r.bytes / r.tensor_cores_sec / 1e9,
                                               r.bytes / r.cublas_sec / 1e9)
                             : " | | | | ";
        std::printf("| %d | %s | %s | %.1f | %.1f | %.1f | %.0f%% | %.3f | %d | %.2f | %.0f%% | %s |\n", r.m,
                    r.name.c_str(), r.shape.c_str(), r.bytes / 1e6, 1e6 * r.sec, r.bytes / r.sec / 1e9,
                    100.0 * r.bytes / r.sec / bw, r.flops / r.sec / 1e12, r.per_step, ms, 100.0 * ms / step_ms[bi],
                    cublas.c_str());
      }
      std::printf("| %d | all linears of a step | | %.1f | | %.1f | %.0f%% | %.3f | | %.2f | %.0f%% | | | | | |\n", batches[bi],
                  weight_bytes / 1e6, weight_bytes / (sum / 1e3) / 1e9, 100.0 * weight_bytes / (sum / 1e3) / bw,
                  dec.MatmulFlops(batches[bi], batches[bi]) / (sum / 1e3) / 1e12, sum, 100.0 * sum / step_ms[bi]);
    }
  }
  if (!kv_contexts.empty()) {
    std::fprintf(stderr, "decode_bench: bf16 vs f32 KV pages...\n");
    const std::string kv_load = iris::bench::LoadAverage();
    std::vector<KvCompareRow> rows;
    dec.PauseDecodeGraphs(true);  // a graph serves one cache; this comparison alternates two
    for (int c : kv_contexts) rows.push_back(CompareKvDTypes(dev, dec, max_batch, c, steps, kWarmup));
    dec.PauseDecodeGraphs(false);
    std::printf("\nbf16 vs f32 KV pages: decode at batch %d, compute %s (load average %s; median of %d steps of "
                "each, the two caches' steps interleaved; KV MB = the K and V bytes one step reads; the fastest "
                "steps' ratio beside the medians', as other load on a shared machine slows single steps):\n",
                max_batch, bf16 ? "bf16" : "f32", kv_load.c_str(), steps);
    std::printf("| context | f32 KV ms/step | best | f32 tokens/s | f32 KV MB | bf16 KV ms/step | best | bf16 tokens/s "
                "| bf16 KV MB | bf16 / f32 tokens/s | of the fastest steps |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const double f32_token_bytes = 2.0 * tc.num_hidden_layers * tc.num_key_value_heads * tc.head_dim() * 4;
    for (const KvCompareRow& r : rows) {
      const double kv_mb = f32_token_bytes * max_batch * (r.context + kWarmup + steps / 2.0) / 1e6;
      std::printf("| %d | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f | %.1f | %.0f | %.2fx | %.2fx |\n", r.context,
                  1e3 * r.f32_s, 1e3 * r.f32_best_s, max_batch / r.f32_s, kv_mb, 1e3 * r.bf16_s, 1e3 * r.bf16_best_s,
                  max_batch / r.bf16_s, kv_mb / 2, r.f32_s / r.bf16_s, r.f32_best_s / r.bf16_best_s);
    }
  }
  std::printf("\nload average at the end: %s\n", iris::bench::LoadAverage().c_str());
  return 0;
}
