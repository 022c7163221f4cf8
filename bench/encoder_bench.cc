// Vision-encoder benchmark: decode/preprocess ms, encoder ms, achieved TFLOP/s and the ratio to
// the matmul peak measured by this binary in the same run, for several shapes; then the same with
// each encoder technique switched off.
//   encoder_bench --model DIR [--images DIR] [--dtype bf16|f32] [--min-seconds S]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/bench_device.h"
#include "bench/bench_machine.h"
#include "bench/bench_stats.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/bf16.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "kernels/gated_mlp.h"
#include "kernels/linear.h"
#include "kernels/qkv_bf16.h"
#include "kernels/qkv_pad.h"
#include "kernels/rotary.h"
#include "vision/encoder_plan.h"
#include "vision/preprocess.h"
#include "vision/smart_resize.h"
#include "vision/vision_encoder.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_linear.h"
#include "kernels/cuda/stream_timer.h"
#endif

ABSL_FLAG(std::string, model, "build/models/vision-3b", "model folder (the 3b preset's vision tower)");
ABSL_FLAG(std::string, device, "cpu", "where the encoder runs: cpu, or cuda / cuda:N (the peak is then cuBLASLt's)");
ABSL_FLAG(std::string, dtype, "bf16", "compute mode: bf16 or f32");
ABSL_FLAG(double, min_seconds, 2.0, "time each measurement at least this long (after one warm-up)");
ABSL_FLAG(bool, switches, true, "also measure with each technique switched off");
ABSL_FLAG(int, rounds, 3, "alternating rounds for the technique-switch table and the input table");
ABSL_FLAG(std::string, profile_input, "",
          "for a profiler (Nsight Compute): encode only this input (a label of the table, e.g. \"448x448 x8\"), "
          "once to warm up and once more, and measure nothing else");
ABSL_FLAG(int, padded_head_dim, 0,
          "attention at this head dim, q/k/v padded to it (EncoderOptions::padded_head_dim; 0: the model's own, no "
          "padding where attention takes it). E.g. 96 on a GPU: the switch table then times the one-launch padding "
          "(all on) against three launches (qkv padding off) on the path that pads");
ABSL_FLAG(bool, flash_pipeline, true,
          "GPU, bf16: iris's flash attention on the qkv chain's bf16 rows runs its pipelined kernel (the next K/V "
          "tile copied to shared memory while the warps compute; CudaDevice::SetFlashPipeline, the default). The "
          "switch table also times the other setting");
ABSL_FLAG(int, flash_heads_per_block, 1,
          "GPU, bf16, pipelined flash kernel: consecutive q heads a block walks, 1 or 2 "
          "(CudaDevice::SetFlashHeadsPerBlock). The switch table also times the other setting");
ABSL_FLAG(bool, matmul_tuning, false,
          "GPU: the matmuls run the fastest of cuBLASLt's candidates, timed on the first forward of each shape "
          "(CudaDevice::SetMatmulTuning, off by default until timed). The switch table also times the other "
          "setting, and the run ends with the tuned shapes' table (each kept candidate against the heuristic's "
          "first pick)");
ABSL_FLAG(bool, hopper_gemm, true,
          "GPU, compute capability 9.0: time iris's own Hopper GEMM against cuBLASLt (the switch table's two "
          "\"hopper GEMM\" columns and the matmul table; CudaDevice::SetHopperGemm, off in every other row)");
ABSL_FLAG(std::string, slice_gflop, "1,4,16",
          "also time the resumable forward in slices of these GFLOP (as the engine interleaves it), "
          "against the one-call forward; empty: skip");

namespace {

using namespace iris;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

// Median seconds of fn() over at least min_seconds (and at least 1 run) after one warm-up.
template <typename Fn>
double TimeIt(Fn&& fn, double min_seconds, int max_runs = 50) {
  fn();
  std::vector<double> runs;
  const auto start = Clock::now();
  while (runs.empty() || (Seconds(start) < min_seconds && static_cast<int>(runs.size()) < max_runs)) {
    const auto t = Clock::now();
    fn();
    runs.push_back(Seconds(t));
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// An input as images of these sizes (width x height) would reach the encoder: the grids the
// processor's smart resize gives, and random bytes for the resized images (the encoder's time does
// not depend on them; decoding and resizing are preprocess_bench's), with the pixel values the
// host makes of them for the forward from pixel values. No image codec is linked, so the binary
// travels to a GPU machine without OpenCV.
struct Shape {
  std::string label;
  std::vector<std::pair<int, int>> sizes;
};

struct Prepared {
  core::Tensor rgb;           // the resized images' bytes, packed: what the engine hands the encoder
  core::Tensor pixel_values;  // the same images as the host's pixel_values rows
  std::vector<vision::GridThw> grids;
  int64_t patches() const { return pixel_values.dim(0); }
};

absl::StatusOr<Prepared> Prepare(const Shape& shape, const core::PreprocessorConfig& pp, uint32_t seed) {
  Prepared p;
  std::vector<vision::PreprocessedImage> images;
  int64_t rows = 0, bytes = 0;
  std::mt19937 rng(seed);
  for (const auto& [w, h] : shape.sizes) {
    auto r = vision::SmartResize(h, w, pp.factor(), pp.min_pixels, pp.max_pixels);
    if (!r.ok()) return r.status();
    vision::PreprocessedImage im;
    im.grid_thw = {1, r->height / pp.patch_size, r->width / pp.patch_size};
    im.resized_height = r->height;
    im.resized_width = r->width;
    im.rgb = core::Tensor::Empty(core::DType::kU8, {r->height, r->width, 3});
    for (int64_t i = 0; i < im.rgb.numel(); ++i) im.rgb.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
    p.grids.push_back(im.grid_thw);
    rows += im.grid_thw[1] * im.grid_thw[2];
    bytes += im.rgb.nbytes();
    images.push_back(std::move(im));
  }
  const int64_t patch_dim = int64_t{3} * pp.temporal_patch_size * pp.patch_size * pp.patch_size;
  p.rgb = core::Tensor::Empty(core::DType::kU8, {bytes});
  p.pixel_values = core::Tensor::Empty(core::DType::kF32, {rows, patch_dim});
  int64_t at_byte = 0, at_row = 0;
  for (const vision::PreprocessedImage& im : images) {
    std::memcpy(p.rgb.data<uint8_t>() + at_byte, im.rgb.raw(), im.rgb.nbytes());
    at_byte += im.rgb.nbytes();
    absl::StatusOr<core::Tensor> values = vision::PixelValues(im, pp);
    if (!values.ok()) return values.status();
    std::memcpy(p.pixel_values.data<float>() + at_row * patch_dim, values->raw(), values->nbytes());
    at_row += values->dim(0);
  }
  return p;
}

#ifdef IRIS_HAVE_CUDA
// The tower's matmuls as its layers run them, at `rows` rows (the folded RMSNorm writing the bf16
// input rows, the bias and residual add in the matmul): cuBLASLt against iris's Hopper GEMM
// (CudaDevice::SetHopperGemm), alternating within each round, GPU time by events, medians. Only
// where the Hopper GEMM runs (compute capability 9.0).
void PrintHopperGemmTable(kernels::Device& dev, const core::VisionConfig& v, int64_t rows, int rounds, double peak) {
  using Use = kernels::cuda::CudaDevice::HopperGemmUse;
  kernels::cuda::CudaDevice& cuda = kernels::cuda::AsCuda(dev);
  if (!cuda.SetHopperGemm(Use::kAll).ok()) return;
  (void)cuda.SetHopperGemm(Use::kOff);
  const int64_t h = v.hidden_size, inter = v.intermediate_size;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 0.02f);
  const auto linear = [&](int64_t out, int64_t in) {
    core::Tensor w = core::Tensor::Empty(core::DType::kBF16, {out, in});
    for (int64_t i = 0; i < out * in; ++i) w.data<uint16_t>()[i] = core::FloatToBf16(normal(rng));
    core::Tensor b = core::Tensor::Zeros(core::DType::kF32, {out});
    return kernels::Linear::Create(dev, w, &b, kernels::ComputeType::kBF16);
  };
  auto qkv = linear(3 * h, h), proj = linear(h, h), gate_up = linear(2 * inter, h), down = linear(h, inter);
  const auto buffer = [&](int64_t floats) { return dev.Allocate(core::DType::kF32, {floats}); };
  auto x = buffer(rows * h), norm = buffer(h), staging = buffer(rows * h), y = buffer(rows * h),
       qkv_out = buffer(rows * 3 * h), gu_out = buffer(rows * 2 * inter), act = buffer(rows * inter),
       table = buffer(rows * v.head_dim() / 2);
  for (const auto* t : {&x, &norm, &staging, &y, &qkv_out, &gu_out, &act, &table}) {
    if (!t->ok()) return;
  }
  if (!qkv.ok() || !proj.ok() || !gate_up.ok() || !down.ok()) return;
  std::vector<float> ones(static_cast<size_t>(rows * h), 0.5f);
  dev.CopyToDevice(ones.data(), x->raw(), ones.size() * sizeof(float));
  dev.CopyToDevice(ones.data(), norm->raw(), static_cast<size_t>(h) * sizeof(float));
  dev.CopyToDevice(ones.data(), y->raw(), ones.size() * sizeof(float));
  dev.CopyToDevice(ones.data(), table->raw(), static_cast<size_t>(rows * v.head_dim() / 2) * sizeof(float));
  const kernels::LinearInput normed =
      kernels::LinearInput::RmsNorm(x->data<float>(), norm->data<float>(), 1e-6f, staging->data<float>());
  // cos = sin = 0.5 for every angle: the rotary's work does not depend on them.
  const kernels::QkvRotary rotary{v.num_heads, v.head_dim(), table->data<float>(), table->data<float>()};
  struct Op {
    const char* name;
    double flops;
    std::function<void()> run;
  };
  const double r = static_cast<double>(rows), hd = static_cast<double>(h), id = static_cast<double>(inter);
  const std::vector<Op> ops = {
      {"qkv (norm folded) -> bf16", 2 * r * hd * 3 * hd,
       [&] { kernels::LinearForwardToBf16(dev, **qkv, normed, rows, static_cast<uint16_t*>(qkv_out->raw()), 3 * h); }},
      // cuBLASLt and the fused rotary's launch, against the rotary in the Hopper GEMM's epilogue
      // ("all", on tiles of three heads whichever width the others use).
      {"qkv (norm folded) + rotary -> bf16", 2 * r * hd * 3 * hd,
       [&] { kernels::LinearForwardToBf16Rotary(dev, **qkv, normed, rows, static_cast<uint16_t*>(qkv_out->raw()),
                                                3 * h, rotary); }},
      {"o + residual", 2 * r * hd * hd,
       [&] { kernels::LinearForward(dev, **proj, kernels::LinearInput::Plain(x->data<float>()), rows, y->data<float>(),
                                    kernels::Epilogue::kAccumulate); }},
      {"gated MLP (norm folded)", 2 * r * hd * 3 * id,
       [&] { kernels::GatedMlp(dev, **gate_up, **down, normed, rows, {gu_out->data<float>(), act->data<float>()},
                               y->data<float>()); }},
  };
  constexpr int kRepeats = 10;
  kernels::cuda::StreamTimer timer(cuda.stream());
  struct Setting {
    Use use;
    int tile_n;
    bool persistent = true;
  };
  constexpr Setting kSettings[] = {{Use::kOff, 128},    {Use::kSwiGlu, 128}, {Use::kAll, 128},
                                   {Use::kSwiGlu, 256}, {Use::kAll, 256},    {Use::kAll, 256, false}};
  constexpr int kCount = sizeof(kSettings) / sizeof(kSettings[0]);
  std::printf("\nthe tower's matmuls at %lld rows, cuBLASLt vs iris's Hopper GEMM (GPU ms by events, median of %d "
              "alternating rounds of %d; the same-run peak %.0f TFLOP/s):\n",
              static_cast<long long>(rows), rounds, kRepeats, peak / 1e12);
  std::printf("| op | cuBLASLt ms | Hopper SwiGLU ms (128, ping-pong) | Hopper all ms (128, ping-pong) | "
              "SwiGLU, 256-row tiles | all, 256-row tiles | "
              "all, 256, a block per tile | cuBLASLt / best Hopper | best Hopper of peak |\n"
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Op& op : ops) {
    std::vector<double> ms[kCount];
    for (int round = 0; round < rounds; ++round) {
      for (int u = 0; u < kCount; ++u) {
        (void)cuda.SetHopperGemm(kSettings[u].use);
        (void)cuda.SetHopperGemmTileN(kSettings[u].tile_n);
        cuda.SetHopperGemmPersistent(kSettings[u].persistent);
        op.run();  // warm: plans, tensor-map encoder, shared-memory opt-in
        const std::optional<double> s = timer.Time([&] {
          for (int i = 0; i < kRepeats; ++i) op.run();
          return cuda.status().ok();
        });
        if (s.has_value()) ms[u].push_back(1e3 * *s / kRepeats);
      }
    }
    (void)cuda.SetHopperGemm(Use::kOff);
    (void)cuda.SetHopperGemmTileN(128);
    cuda.SetHopperGemmPersistent(true);
    double med[kCount];
    for (int u = 0; u < kCount; ++u) {
      if (ms[u].empty()) {
        std::printf("| %s | failed: %s |\n", op.name, std::string(cuda.status().message()).c_str());
        return;
      }
      med[u] = iris::bench::Median(ms[u]);
    }
    const double best = *std::min_element(med + 1, med + kCount);
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2fx | %.0f%% |\n", op.name, med[0], med[1], med[2],
                med[3], med[4], med[5], med[0] / best, 100.0 * op.flops / (best * 1e-3) / peak);
    std::fflush(stdout);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_model);
  const double min_s = absl::GetFlag(FLAGS_min_seconds);
  const bool bf16 = absl::GetFlag(FLAGS_dtype) != "f32";
  auto config = core::LoadModelConfig(dir);
  auto pp = core::LoadPreprocessorConfig(dir);
  auto ckpt = core::Checkpoint::Open(dir);
  if (!config.ok() || !pp.ok() || !ckpt.ok()) {
    std::fprintf(stderr, "encoder_bench: cannot load %s (%s). Make it with:\n"
                 "  iris-make-model --preset 3b --vision-only --out %s\n", dir.c_str(),
                 std::string((!config.ok() ? config.status() : !pp.ok() ? pp.status() : ckpt.status()).message()).c_str(),
                 dir.c_str());
    return 1;
  }
  vision::EncoderOptions options;
  options.compute = bf16 ? kernels::ComputeType::kBF16 : kernels::ComputeType::kF32;
  // Room for the largest batched forward below (the buffers are virtual memory until touched).
  options.max_patches = int64_t{1} << 16;
  options.padded_head_dim = absl::GetFlag(FLAGS_padded_head_dim);
  if (const int hd = config->vision.head_dim(), p = options.padded_head_dim; p != 0 && (p <= hd || p > 128)) {
    std::fprintf(stderr, "encoder_bench: --padded_head_dim must be 0 or in (%d, 128] (the head dim is %d), got %d\n", hd,
                 hd, p);
    return 1;
  }
  std::unique_ptr<kernels::Device> own_device;
  absl::StatusOr<kernels::Device*> device = bench::DeviceNamed(absl::GetFlag(FLAGS_device), &own_device);
  if (!device.ok()) {
    std::fprintf(stderr, "encoder_bench: %s\n", std::string(device.status().message()).c_str());
    return 1;
  }
  kernels::Device& dev = **device;
  const bool gpu = dev.kind() == kernels::DeviceKind::kCuda;
  const bool flash_pipeline = absl::GetFlag(FLAGS_flash_pipeline);
  const bool matmul_tuning = absl::GetFlag(FLAGS_matmul_tuning);
  const int flash_heads = absl::GetFlag(FLAGS_flash_heads_per_block);
#ifdef IRIS_HAVE_CUDA
  if (gpu) {
    kernels::cuda::AsCuda(dev).SetFlashPipeline(flash_pipeline);
    kernels::cuda::AsCuda(dev).SetMatmulTuning(matmul_tuning);
    if (const absl::Status s = kernels::cuda::AsCuda(dev).SetFlashHeadsPerBlock(flash_heads); !s.ok()) {
      std::fprintf(stderr, "encoder_bench: --flash_heads_per_block: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
#endif
  auto encoder = vision::VisionEncoder::Load(dev, *ckpt, config->vision, options);
  const vision::PixelNormalization normalization{pp->image_mean, pp->image_std};
  // A forward as the engine runs one: from the images' bytes.
  auto forward = [&](const auto& p) { return (*encoder)->ForwardRgb(p.rgb, p.grids, normalization); };
  if (!encoder.ok()) {
    std::fprintf(stderr, "encoder_bench: %s\n", std::string(encoder.status().message()).c_str());
    return 1;
  }

  const std::vector<Shape> shapes = {
      {"448x448", {{448, 448}}},
      {"1000x667", {{1000, 667}}},
      {"1344x1008", {{1344, 1008}}},
      {"batch of 8 mixed",
       {{448, 448}, {1000, 667}, {640, 480}, {300, 200}, {640, 480}, {56, 56}, {350, 70}, {800, 600}}},
      {"448x448 x8", std::vector<std::pair<int, int>>(8, {448, 448})},
  };
  if (const std::string only = absl::GetFlag(FLAGS_profile_input); !only.empty()) {
    // Two forwards and nothing else: a profile's second half is one warm forward.
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (shapes[i].label != only) continue;
      auto p = Prepare(shapes[i], *pp, 7 + static_cast<uint32_t>(i));
      if (!p.ok()) {
        std::fprintf(stderr, "encoder_bench: %s\n", std::string(p.status().message()).c_str());
        return 1;
      }
      for (int run = 0; run < 2; ++run) {
        absl::StatusOr<core::Tensor> out = forward(*p);
        if (out.ok()) dev.Synchronize();
        if (!out.ok() || !dev.status().ok()) {
          std::fprintf(stderr, "encoder_bench: %s\n",
                       std::string((out.ok() ? dev.status() : out.status()).message()).c_str());
          return 1;
        }
      }
      std::printf("encoder_bench: %s encoded twice\n", only.c_str());
      return 0;
    }
    std::fprintf(stderr, "encoder_bench: --profile_input: no input is labelled \"%s\"\n", only.c_str());
    return 2;
  }

  std::printf("machine: %s, %u hardware threads\n", iris::bench::CpuName().c_str(), std::thread::hardware_concurrency());
  std::printf("device: %s\n", dev.Describe().c_str());
  std::printf("model: %s (vision depth %d, hidden %d, heads %d x %d), compute %s\n", dir.c_str(),
              config->vision.depth, config->vision.hidden_size, config->vision.num_heads,
              config->vision.head_dim(), bf16 ? "bf16" : "f32");
  // The peak is measured again before every row, so that a row's ratio compares numbers taken
  // under the same conditions (a shared machine drifts).
  // A GPU's peak needs a larger product than the CPU's to fill the machine.
  const int kPeakSize = gpu ? 8192 : 2048;
  auto measure_peak = [&] { return kernels::MeasureMatmulPeakFlops(dev, options.compute, kPeakSize, gpu ? 20 : 5); };
  const double peak = measure_peak();
  std::printf("matmul peak (%s %s, %dx%dx%d, same run): %.2f TFLOP/s\n\n", gpu ? "cuBLASLt" : "oneDNN",
              bf16 ? "bf16" : "f32", kPeakSize, kPeakSize, kPeakSize, peak / 1e12);

  std::vector<Prepared> inputs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto p = Prepare(shapes[i], *pp, 7 + static_cast<uint32_t>(i));
    if (!p.ok()) {
      std::fprintf(stderr, "encoder_bench: %s\n", std::string(p.status().message()).c_str());
      return 1;
    }
    inputs.push_back(std::move(*p));
  }

  auto encode_ms = [&](const Prepared& p) {
    return 1e3 * TimeIt([&] { (void)*forward(p); }, min_s, 20);
  };

  std::printf("| input | patches | encoder ms | TFLOP/s | matmul peak TFLOP/s | of peak | GEMM floor ms | / floor |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::vector<double> forward_ms;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Prepared& p = inputs[i];
    const double peak_before = measure_peak();
    const double ms = encode_ms(p);
    const double row_peak = std::max(peak_before, measure_peak());  // the better of before/after
    forward_ms.push_back(ms);
    const double tflops = (*encoder)->CountFlops(p.grids) / (ms * 1e9);
    // The floor: the forward's FLOPs at the same-run GEMM rate (what it would take if it were one
    // large matmul).
    const double floor_ms = (*encoder)->CountFlops(p.grids) / row_peak * 1e3;
    std::printf("| %s | %lld | %.2f | %.2f | %.2f | %.0f%% | %.2f | %.2fx |\n", shapes[i].label.c_str(),
                static_cast<long long>(p.patches()), ms, tflops, row_peak / 1e12,
                100.0 * tflops * 1e12 / row_peak, floor_ms, ms / floor_ms);
    std::fflush(stdout);
  }

  // Where a forward's wall time goes: its three calls timed apart, the device waited on after each
  // (BeginRgb: the bytes' upload and the plan; AdvanceToEnd: the device's work; Finish: the
  // embeddings back to host memory), medians over the runs, against the whole forward above. The
  // device's own time is the middle one; the rest is what a forward pays outside its kernels.
  std::printf("\nencoder forward by phase (each call timed apart, the device waited on after it; medians):\n"
              "| input | begin ms (upload, plan) | advance ms (device work) | finish ms (embeddings to host) | "
              "sum ms | whole forward ms |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Prepared& p = inputs[i];
    std::vector<double> phase[3];
    const auto start = Clock::now();
    for (int run = 0; run < 21 && (run < 3 || Seconds(start) < min_s); ++run) {
      auto t = Clock::now();
      absl::Status st = (*encoder)->BeginRgb(p.rgb, p.grids, normalization);
      dev.Synchronize();
      const double begin_s = Seconds(t);
      t = Clock::now();
      if (st.ok()) st = (*encoder)->AdvanceToEnd();
      dev.Synchronize();
      const double advance_s = Seconds(t);
      t = Clock::now();
      absl::StatusOr<core::Tensor> out = st.ok() ? (*encoder)->Finish() : absl::StatusOr<core::Tensor>(st);
      const double finish_s = Seconds(t);
      if (!out.ok() || !dev.status().ok()) {
        std::fprintf(stderr, "encoder_bench: %s\n",
                     std::string((out.ok() ? dev.status() : out.status()).message()).c_str());
        return 1;
      }
      if (run == 0) continue;  // a warm-up
      phase[0].push_back(begin_s);
      phase[1].push_back(advance_s);
      phase[2].push_back(finish_s);
    }
    double med[3];
    for (int k = 0; k < 3; ++k) med[k] = 1e3 * iris::bench::Median(phase[k]);
    std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", shapes[i].label.c_str(), med[0], med[1], med[2],
                med[0] + med[1] + med[2], forward_ms[i]);
    std::fflush(stdout);
  }

  // What the engine hands the encoder: the images' bytes, from which the encoder makes the pixel
  // values where it runs (kernels::PatchRows), against the host's pixel values handed over (what
  // crossed to a GPU before): the two forwards alternating, in the same run.
  std::printf("\nencoder input, the images' bytes vs their pixel values (same run, alternating; the forward "
              "from upload to embeddings in host memory):\n| input | bytes MB | pixel values MB | from bytes ms | "
              "from pixel values ms | pixel values / bytes |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Prepared& p = inputs[i];
    std::vector<double> ms[2];
    for (int round = 0; round < std::max(1, absl::GetFlag(FLAGS_rounds)); ++round) {
      ms[0].push_back(encode_ms(p));
      ms[1].push_back(1e3 * TimeIt([&] { (void)*(*encoder)->Forward(p.pixel_values, p.grids); }, min_s, 20));
    }
    for (auto& v : ms) std::sort(v.begin(), v.end());
    const double bytes_ms = ms[0][ms[0].size() / 2], values_ms = ms[1][ms[1].size() / 2];  // medians
    std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.3f |\n", shapes[i].label.c_str(), p.rgb.nbytes() / 1e6,
                p.pixel_values.nbytes() / 1e6, bytes_ms, values_ms, values_ms / bytes_ms);
    std::fflush(stdout);
  }

  // Forwards replayed from the graph recorded for their grid list (VisionEncoder::EnableGraphs, on
  // in the engine where the device records graphs) against the same forwards issued op by op,
  // alternating in the same run.
  if ((*encoder)->EnableGraphs().ok()) {
    std::printf("\nencoder forwards from a graph vs op by op (same run, alternating):\n| input | op by op ms | "
                "graph ms | op by op / graph |\n| --- | ---: | ---: | ---: |\n");
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Prepared& p = inputs[i];
      for (int k = 0; k < 2; ++k) (void)*forward(p);  // the second forward of a grid list records its graph
      std::vector<double> ms[2];
      for (int round = 0; round < std::max(1, absl::GetFlag(FLAGS_rounds)); ++round) {
        for (int g = 0; g < 2; ++g) {
          (*encoder)->PauseGraphs(g == 0);
          ms[g].push_back(encode_ms(p));
        }
      }
      (*encoder)->PauseGraphs(false);
      for (auto& v : ms) std::sort(v.begin(), v.end());
      const double eager = ms[0][ms[0].size() / 2], graph = ms[1][ms[1].size() / 2];
      std::printf("| %s | %.2f | %.2f | %.3f |\n", shapes[i].label.c_str(), eager, graph, eager / graph);
      std::fflush(stdout);
    }
    std::printf("(%lld forwards replayed from %d graphs)\n", static_cast<long long>((*encoder)->graph_replays()),
                (*encoder)->graphs());
    (*encoder)->DisableGraphs();  // the tables below switch device settings a graph would not see
  }

#ifdef IRIS_HAVE_CUDA
  // A GPU's two varlen attentions for the bf16 mode, in the same run: iris's tensor-core flash
  // kernel (the default) and cuDNN's SDPA, alternating per input; and how far apart their
  // embeddings are (the same bf16-rounded inputs, different accumulation orders).
  if (gpu && bf16) {
    auto& cuda_dev = kernels::cuda::AsCuda(dev);
    using Attention = kernels::cuda::CudaDevice::Attention;
    if (absl::Status s = cuda_dev.SetAttention(Attention::kCudnn); !s.ok()) {
      std::printf("\nattention, flash vs cudnn: not measured: %s\n", std::string(s.message()).c_str());
    } else {
      std::printf("\nencoder ms by attention (same run, alternating; max |cudnn - flash| / max |flash| of the "
                  "embeddings):\n| input | flash ms | cudnn ms | cudnn / flash | embeddings apart |\n"
                  "| --- | ---: | ---: | ---: | ---: |\n");
      for (size_t i = 0; i < shapes.size(); ++i) {
        const Prepared& p = inputs[i];
        double ms[2];
        core::Tensor out[2];
        for (int a = 0; a < 2; ++a) {
          (void)cuda_dev.SetAttention(a == 0 ? Attention::kFlash : Attention::kCudnn);
          ms[a] = encode_ms(p);
          absl::StatusOr<core::Tensor> o = forward(p);
          if (o.ok()) out[a] = *o;
        }
        double diff = 0, scale = 0;
        if (out[0].numel() > 0 && out[0].numel() == out[1].numel()) {
          for (int64_t e = 0; e < out[0].numel(); ++e) {
            diff = std::max(diff, static_cast<double>(std::fabs(out[1].data<float>()[e] - out[0].data<float>()[e])));
            scale = std::max(scale, static_cast<double>(std::fabs(out[0].data<float>()[e])));
          }
        }
        const absl::Status st = dev.status();
        std::printf("| %s | %.2f | %.2f | %.2fx | %s |\n", shapes[i].label.c_str(), ms[0], ms[1], ms[1] / ms[0],
                    st.ok() ? absl::StrFormat("%.2e", scale > 0 ? diff / scale : 0.0).c_str()
                            : std::string(st.message()).c_str());
        std::fflush(stdout);
      }
      (void)cuda_dev.SetAttention(Attention::kFlash);
    }
  }
#endif

  if (absl::GetFlag(FLAGS_switches)) {
    struct Config {
      const char* name;
      vision::EncoderTechniques t;
      // GPU: the norms and SiLU·mul folded into the Linears after them (off: the gate_up and qkv
      // hand-offs, which ride on folding, are off too).
      bool fold_inputs = true;
      // GPU: gate_up's output and the attention's handed to the next op in bf16, and q, k, v kept
      // in bf16 from the qkv matmul to the attention (kernels/qkv_bf16.h).
      bool bf16_handoff = true;
      // GPU: the flash attention's pipelined kernel (--flash_pipeline).
      bool flash_pipeline = absl::GetFlag(FLAGS_flash_pipeline);
      // GPU: cuBLASLt's candidates timed per shape (--matmul_tuning).
      bool matmul_tuning = absl::GetFlag(FLAGS_matmul_tuning);
      // GPU: q heads a pipelined flash block walks (--flash_heads_per_block).
      int flash_heads = absl::GetFlag(FLAGS_flash_heads_per_block);
#ifdef IRIS_HAVE_CUDA
      // GPU: which matmuls run iris's own Hopper GEMM (CudaDevice::SetHopperGemm; off by default).
      kernels::cuda::CudaDevice::HopperGemmUse hopper = kernels::cuda::CudaDevice::HopperGemmUse::kOff;
      int hopper_tile_n = 128;
      // GPU, under the Hopper GEMM's kAll: the RMSNorms handed on between its GEMMs.
      bool norm_handoff = true;
#endif
    };
    std::vector<Config> configs = {
        {"fused rotary off", {false, true, true}},
        {"qkv padding off", {true, false, true}},
        {"cached cu_seqlens off", {true, true, false}},
        {"all off", {false, false, false}},
    };
#ifdef IRIS_HAVE_CUDA
    if (gpu && bf16) {
      configs.push_back({"input ops unfolded", {}, false});
      configs.push_back({"bf16 hand-off off", {}, true, false});
      configs.push_back({flash_pipeline ? "flash unpipelined" : "flash pipelined", {}, true, true, !flash_pipeline});
      configs.push_back(
          {matmul_tuning ? "matmul untuned" : "matmul tuned", {}, true, true, flash_pipeline, !matmul_tuning});
      if (flash_pipeline) {
        const int other = flash_heads == 1 ? 2 : 1;
        configs.push_back({other == 2 ? "flash 2 heads a block" : "flash 1 head a block", {}, true, true, true,
                           matmul_tuning, other});
      }
      // iris's Hopper GEMM: gate_up with the SiLU·mul fused, then every matmul (sm_90 only).
      using HopperGemmUse = kernels::cuda::CudaDevice::HopperGemmUse;
      if (absl::GetFlag(FLAGS_hopper_gemm) && kernels::cuda::AsCuda(dev).SetHopperGemm(HopperGemmUse::kOff).ok() &&
          kernels::cuda::AsCuda(dev).SetHopperGemm(HopperGemmUse::kAll).ok()) {
        (void)kernels::cuda::AsCuda(dev).SetHopperGemm(HopperGemmUse::kOff);
        struct HopperColumn {
          const char* name;
          HopperGemmUse use;
          int tile_n;
          bool norm_handoff = true;
        };
        for (const HopperColumn& h :
             {HopperColumn{"hopper GEMM SwiGLU", HopperGemmUse::kSwiGlu, 128},
              HopperColumn{"hopper GEMM all", HopperGemmUse::kAll, 128},
              HopperColumn{"hopper GEMM all, 256-row tiles", HopperGemmUse::kAll, 256},
              HopperColumn{"hopper GEMM all, the norm kernel (hand-off off)", HopperGemmUse::kAll, 128, false}}) {
          Config c{h.name, {}, true, true, flash_pipeline, matmul_tuning, flash_heads};
          c.hopper = h.use;
          c.hopper_tile_n = h.tile_n;
          c.norm_handoff = h.norm_handoff;
          configs.push_back(c);
        }
      }
    }
#endif
    // Configurations alternate within each round, so machine drift hits them alike; the table
    // shows each configuration's median over the rounds.
    const int rounds = absl::GetFlag(FLAGS_rounds);
    std::printf("\nencoder ms with each technique switched off (median of %d alternating rounds; change vs all on):\n", rounds);
    std::printf("| input | all on |");
    for (const auto& c : configs) std::printf(" %s |", c.name);
    std::printf("\n| --- | ---: |");
    for (size_t i = 0; i < configs.size(); ++i) std::printf(" ---: |");
    std::printf("\n");
    configs.insert(configs.begin(), Config{"all on", {}});
    for (size_t i = 0; i < shapes.size(); ++i) {
      std::vector<std::vector<double>> ms(configs.size());
      for (int r = 0; r < rounds; ++r) {
        for (size_t c = 0; c < configs.size(); ++c) {
          (*encoder)->set_techniques(configs[c].t);
#ifdef IRIS_HAVE_CUDA
          if (gpu) {
            kernels::cuda::AsCuda(dev).SetFoldLinearInputs(configs[c].fold_inputs);
            kernels::cuda::AsCuda(dev).SetBf16Handoff(configs[c].bf16_handoff);
            kernels::cuda::AsCuda(dev).SetFlashPipeline(configs[c].flash_pipeline);
            kernels::cuda::AsCuda(dev).SetMatmulTuning(configs[c].matmul_tuning);
            (void)kernels::cuda::AsCuda(dev).SetFlashHeadsPerBlock(configs[c].flash_heads);
            (void)kernels::cuda::AsCuda(dev).SetHopperGemm(configs[c].hopper);
            (void)kernels::cuda::AsCuda(dev).SetHopperGemmTileN(configs[c].hopper_tile_n);
            kernels::cuda::AsCuda(dev).SetRmsNormHandoff(configs[c].norm_handoff);
            // The tuning's own timing (once per shape) stays out of the table: a first forward
            // with tuning on runs untimed.
            if (r == 0 && configs[c].matmul_tuning != matmul_tuning) {
              (void)*forward(inputs[i]);
            }
          }
#endif
          const auto t = Clock::now();
          (void)*forward(inputs[i]);
          ms[c].push_back(1e3 * Seconds(t));
        }
      }
      std::vector<double> med;
      for (const auto& v : ms) med.push_back(iris::bench::Median(v));
      std::printf("| %s | %.1f |", shapes[i].label.c_str(), med[0]);
      for (size_t c = 1; c < configs.size(); ++c) {
        std::printf(" %.1f (%+.1f%%) |", med[c], 100.0 * (med[c] - med[0]) / med[0]);
      }
      std::printf("\n");
      std::fflush(stdout);
      (*encoder)->set_techniques({});
#ifdef IRIS_HAVE_CUDA
      if (gpu) {
        kernels::cuda::AsCuda(dev).SetFoldLinearInputs(true);
        kernels::cuda::AsCuda(dev).SetBf16Handoff(true);
        kernels::cuda::AsCuda(dev).SetFlashPipeline(flash_pipeline);
        kernels::cuda::AsCuda(dev).SetMatmulTuning(matmul_tuning);
        (void)kernels::cuda::AsCuda(dev).SetFlashHeadsPerBlock(flash_heads);
        (void)kernels::cuda::AsCuda(dev).SetHopperGemm(kernels::cuda::CudaDevice::HopperGemmUse::kOff);
        (void)kernels::cuda::AsCuda(dev).SetHopperGemmTileN(128);
        kernels::cuda::AsCuda(dev).SetRmsNormHandoff(true);
      }
#endif
    }
  }
#ifdef IRIS_HAVE_CUDA
  // Last of the GPU tables: a kernel that has never run on a GPU before may fail it for the rest.
  if (gpu && bf16 && absl::GetFlag(FLAGS_hopper_gemm)) {
    PrintHopperGemmTable(dev, config->vision, inputs.back().patches(), absl::GetFlag(FLAGS_rounds), peak);
  }
  if (gpu) {
    if (const std::string tuned = kernels::cuda::TunedMatmulTable(kernels::cuda::AsCuda(dev)); !tuned.empty()) {
      std::printf("\nmatmuls tuned in this run (cuBLASLt's candidates timed on the forward's operands; median "
                  "of %d rounds of %d runs):\n%s",
                  kernels::cuda::kMatmulTuneRounds, kernels::cuda::kMatmulTuneRunsPerRound, tuned.c_str());
    }
  }
#endif

  // What each technique saves per forward, measured on its own (1000x667 shape, all layers), so
  // the whole-encoder table above can be read against it: on the CPU the matmuls dominate. (Host
  // buffers: on a GPU the whole-forward table above is the measure.)
  if (!gpu) {
    const Prepared& p = inputs[1];
    const auto& vc = config->vision;
    const int heads = vc.num_heads, d = vc.head_dim(), depth = vc.depth, dp = 96;
    const int64_t n = p.patches(), hv = vc.hidden_size;
    auto plan = *vision::BuildEncoderPlan(vc, p.grids);
    std::vector<float> qkv(n * 3 * hv, 0.25f), cos(n * d / 2), sin(n * d / 2);
    std::vector<float> q(heads * n * dp), k(heads * n * dp), v(heads * n * dp);
    const kernels::HeadsView qv{qkv.data(), 3 * hv, heads}, kv{qkv.data() + hv, 3 * hv, heads};
    const double fused = TimeIt([&] {
      for (int l = 0; l < depth; ++l) kernels::RotaryQK(dev, qv, kv, n, d, plan->cos.data<float>(), plan->sin.data<float>());
    }, min_s / 4);
    const double unfused = TimeIt([&] {
      for (int l = 0; l < depth; ++l) {
        vision::ComputeRotaryTables(vc, *plan, cos.data(), sin.data());
        kernels::Rotary(dev, qv, n, d, cos.data(), sin.data());
        kernels::Rotary(dev, kv, n, d, cos.data(), sin.data());
      }
    }, min_s / 4);
    vision::EncoderPlanCache cache(vc);
    (void)cache.Get(p.grids);
    const double cached = TimeIt([&] {
      for (int l = 0; l < depth; ++l) (void)cache.Get(p.grids);
    }, min_s / 4);
    const double rebuilt = TimeIt([&] {
      for (int l = 0; l < depth; ++l) (void)vision::BuildEncoderPlan(vc, p.grids);
    }, min_s / 4);
    const double pad_one = TimeIt([&] {
      for (int l = 0; l < depth; ++l) kernels::PadQkv(dev, qkv.data(), n, heads, d, dp, q.data(), k.data(), v.data());
    }, min_s / 4);
    const double pad_three = TimeIt([&] {
      for (int l = 0; l < depth; ++l) {
        kernels::PadOneOfQkv(dev, qkv.data(), n, heads, d, dp, 0, q.data());
        kernels::PadOneOfQkv(dev, qkv.data(), n, heads, d, dp, 1, k.data());
        kernels::PadOneOfQkv(dev, qkv.data(), n, heads, d, dp, 2, v.data());
      }
    }, min_s / 4);
    std::printf("\nper forward, %s (%lld patches, %d layers), the technique's own work:\n",
                shapes[1].label.c_str(), static_cast<long long>(n), depth);
    std::printf("| technique | on ms | off ms | saved ms | saved, share of the forward |\n| --- | ---: | ---: | ---: | ---: |\n");
    auto row = [&](const char* name, double on, double off) {
      std::printf("| %s | %.2f | %.2f | %.2f | %.2f%% |\n", name, on * 1e3, off * 1e3, (off - on) * 1e3,
                  100.0 * (off - on) * 1e3 / forward_ms[1]);
    };
    row("fused rotary q/k (tables once + one pass, vs per layer + two passes)", fused, unfused);
    row("cached cu_seqlens (plan lookup, vs rebuilt every layer)", cached, rebuilt);
    row("parallel q/k/v padding where a kernel needs 80->96 (one pass vs three)", pad_one, pad_three);
    std::printf("(on the CPU the attention kernel takes head_dim 80 as it is, so with the switch on no padding\n"
                " pass runs at all; the switch-off path pads in three passes and attends at 96)\n");
  }

  // The resumable forward as the engine runs it between decode steps: Advance by a FLOP allowance
  // until done. What slicing costs is the ratio to the one-call forward, measured alternately.
  std::vector<double> slices;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_slice_gflop), ',', absl::SkipEmpty())) {
    double g = 0;
    if (absl::SimpleAtod(part, &g) && g > 0) slices.push_back(g);
  }
  if (!slices.empty()) {
    std::printf("\nthe forward in slices (Begin, Advance(GFLOP) until done, Finish) against one call, alternating:\n");
    std::printf("| input | GFLOP | slice GFLOP | slices | one call ms | sliced ms | sliced / one call |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (size_t i : {size_t{1}, size_t{2}}) {
      const Prepared& p = inputs[i];
      const double gflop = (*encoder)->CountFlops(p.grids) * 1e-9;
      for (double g : slices) {
        int pieces = 0;
        auto sliced = [&] {
          pieces = 0;
          if (!(*encoder)->BeginRgb(p.rgb, p.grids, normalization).ok()) std::abort();
          while (!(*encoder)->done()) {
            (void)*(*encoder)->Advance(g * 1e9);
            ++pieces;
          }
          (void)*(*encoder)->Finish();
        };
        double whole = 0, cut = 0;
        for (int r = 0; r < 2; ++r) {  // alternate, keep the better of each
          const double w = encode_ms(p);
          const double c = 1e3 * TimeIt(sliced, min_s, 20);
          whole = r == 0 ? w : std::min(whole, w);
          cut = r == 0 ? c : std::min(cut, c);
        }
        std::printf("| %s | %.0f | %g | %d | %.1f | %.1f | %.3f |\n", shapes[i].label.c_str(), gflop, g, pieces,
                    whole, cut, cut / whole);
      }
    }
  }
  return 0;
}
