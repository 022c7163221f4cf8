// What an encode job costs the engine thread and the request workers outside the encoder, for N
// images of one size on a tower's shapes (default: eight 448x448 images on the 3b: 1024 patches and
// 256 tokens of 2048 each), the way iris hands images over now against the way it did before, in
// the same run (medians):
//   - a job's start (engine thread): its images gathered into one input, as the resized images'
//     bytes (3 a pixel) vs as pixel_values rows (1176 floats a patch);
//   - a job's end (engine thread): the images' embeddings filed as the tensors the encoder made one
//     per image (VisionEncoder::FinishImages) vs copied out of the job's whole output;
//   - a request (its worker): one image's SHA-256, over its bytes vs over its pixel values.
//
//   encode_handoff_bench [--images N] [--width W] [--height H] [--out_hidden D] [--runs R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_machine.h"
#include "core/sha256.h"
#include "core/tensor.h"

ABSL_FLAG(int, images, 8, "images in the job");
ABSL_FLAG(int, width, 448, "resized width (a multiple of 28)");
ABSL_FLAG(int, height, 448, "resized height (a multiple of 28)");
ABSL_FLAG(int, out_hidden, 2048, "the merger's output width (the 3b's 2048)");
ABSL_FLAG(int, runs, 15, "runs per measurement (median)");

namespace {

using iris::core::DType;
using iris::core::Tensor;

double MedianMs(int runs, const std::function<void()>& fn) {
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The parts packed into one fresh tensor, as a job's input is.
Tensor Gather(const std::vector<Tensor>& parts) {
  int64_t bytes = 0;
  for (const Tensor& p : parts) bytes += static_cast<int64_t>(p.nbytes());
  Tensor all = Tensor::Empty(DType::kU8, {bytes});
  int64_t at = 0;
  for (const Tensor& p : parts) {
    std::memcpy(all.data<uint8_t>() + at, p.raw(), p.nbytes());
    at += static_cast<int64_t>(p.nbytes());
  }
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_images), w = absl::GetFlag(FLAGS_width), h = absl::GetFlag(FLAGS_height);
  const int64_t out_hidden = absl::GetFlag(FLAGS_out_hidden);
  const int runs = std::max(1, absl::GetFlag(FLAGS_runs));
  if (n < 1 || w < 28 || h < 28 || w % 28 != 0 || h % 28 != 0 || out_hidden < 1) {
    std::fprintf(stderr, "encode_handoff_bench: --images >= 1, --width and --height multiples of 28, --out_hidden >= 1\n");
    return 2;
  }
  const int64_t patches = int64_t{w / 14} * (h / 14), tokens = patches / 4;
  std::vector<Tensor> bytes, values;
  for (int i = 0; i < n; ++i) {
    bytes.push_back(Tensor::Empty(DType::kU8, {h, w, 3}));
    std::memset(bytes.back().raw(), 17 + i, bytes.back().nbytes());
    values.push_back(Tensor::Empty(DType::kF32, {patches, 1176}));
    std::memset(values.back().raw(), 17 + i, values.back().nbytes());
  }
  std::printf("machine: %s, %u hardware threads\n", iris::bench::CpuName().c_str(), std::thread::hardware_concurrency());
  std::printf("a job of %d images of %dx%d (%lld patches, %lld tokens of %lld each); medians of %d\n\n", n, w, h,
              static_cast<long long>(patches), static_cast<long long>(tokens), static_cast<long long>(out_hidden), runs);

  const double gather_bytes = MedianMs(runs, [&] { (void)Gather(bytes); });
  const double gather_values = MedianMs(runs, [&] { (void)Gather(values); });
  // The job's end: the encoder's output, whole (before) or already one tensor per image (now).
  Tensor whole = Tensor::Empty(DType::kF32, {n * tokens, out_hidden});
  std::memset(whole.raw(), 3, whole.nbytes());
  const double split_copy = MedianMs(runs, [&] {
    std::vector<std::shared_ptr<const Tensor>> kept;
    for (int i = 0; i < n; ++i) {
      kept.push_back(std::make_shared<const Tensor>(whole.Rows(i * tokens, (i + 1) * tokens).Clone()));
    }
  });
  std::vector<Tensor> per_image;
  for (int i = 0; i < n; ++i) per_image.push_back(whole.Rows(i * tokens, (i + 1) * tokens).Clone());
  const double split_moved = MedianMs(runs, [&] {
    std::vector<Tensor> made = per_image;  // shares the storage: what moving the worker's tensors costs
    std::vector<std::shared_ptr<const Tensor>> kept;
    for (Tensor& t : made) kept.push_back(std::make_shared<const Tensor>(std::move(t)));
  });
  const double hash_bytes = MedianMs(runs, [&] { (void)iris::core::Sha256Hex(bytes[0].raw(), bytes[0].nbytes()); });
  const double hash_values = MedianMs(runs, [&] { (void)iris::core::Sha256Hex(values[0].raw(), values[0].nbytes()); });

  std::printf("| where | now ms | before ms | before / now |\n| --- | ---: | ---: | ---: |\n");
  std::printf("| job start, engine thread: gather %.1f MB of bytes (before: %.1f MB of pixel values) | %.3f | %.3f | %.1f |\n",
              n * bytes[0].nbytes() / 1e6, n * values[0].nbytes() / 1e6, gather_bytes, gather_values,
              gather_values / gather_bytes);
  std::printf("| job end, engine thread: file the images' embeddings (before: copy %.1f MB out of the whole output) | %.3f | %.3f | %s |\n",
              whole.nbytes() / 1e6, split_moved, split_copy,
              split_moved < 1e-3 ? "(no copy now)" : std::to_string(split_copy / split_moved).c_str());
  std::printf("| request worker: one image's SHA-256 over %.2f MB (before: %.2f MB) | %.3f | %.3f | %.1f |\n",
              bytes[0].nbytes() / 1e6, values[0].nbytes() / 1e6, hash_bytes, hash_values, hash_values / hash_bytes);
  return 0;
}
