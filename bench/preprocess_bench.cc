// Image decode and Qwen2.5-VL preprocessing times (median of N runs) for the two JPEGs users
// quote: decode, the resize, the whole Preprocess call (the resize into the bytes a request keeps
// and the encoder takes), and the host's normalize + patchify into pixel_values rows (PixelValues:
// the tools' path; the server's encoder makes those rows where it runs), with the write bandwidth
// of this machine (measured here) as the floor for the pixel_values output.
//
//   preprocess_bench [--runs N] [--data DIR] [--max-pixels P]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_machine.h"
#include "core/model_config.h"
#include "core/tensor.h"
#include "vision/image_decode.h"
#include "core/parallel_for.h"
#include "vision/preprocess.h"
#include "vision/resize_bicubic.h"
#include "vision/smart_resize.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Timing {
  double median_ms;
  double min_ms;
};

Timing Time(int runs, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

void Print(const char* label, Timing t, const char* extra = "") {
  std::printf("  %-30s %8.2f ms  (min %7.2f)%s\n", label, t.median_ms, t.min_ms, extra);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 21;
  std::string data = IRIS_BENCH_DATA;
  int64_t max_pixels = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (a == "--data" && i + 1 < argc) {
      data = argv[++i];
    } else if (a == "--max-pixels" && i + 1 < argc) {
      max_pixels = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--runs N] [--data DIR] [--max-pixels P]\n", argv[0]);
      return 2;
    }
  }
  iris::core::PreprocessorConfig config;  // the published checkpoints' values
  if (max_pixels > 0) config.max_pixels = max_pixels;

  std::printf("preprocess_bench: %s, %u hardware threads, %d workers (OMP_NUM_THREADS); median of %d "
              "runs; max_pixels %lld\n",
              iris::bench::CpuName().c_str(), std::thread::hardware_concurrency(),
              iris::core::ParallelWorkers(), runs,
              static_cast<long long>(config.max_pixels));

  for (const char* name : {"jpeg420_q90_1000x667.jpg", "jpeg420_q90_2048x1536.jpg"}) {
    const std::string path = data + "/images/" + name;
    auto decoded = iris::vision::DecodeImageFile(path);
    if (!decoded.ok()) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(), decoded.status().ToString().c_str());
      return 1;
    }
    const iris::vision::RgbImage& img = *decoded;
    auto size = iris::vision::SmartResize(img.height, img.width, config.factor(), config.min_pixels,
                                          config.max_pixels);
    if (!size.ok()) {
      std::fprintf(stderr, "%s\n", size.status().ToString().c_str());
      return 1;
    }
    const iris::vision::RgbImage resized = iris::vision::ResizeBicubic(img, size->height, size->width);
    const int64_t patches = static_cast<int64_t>(size->height / 14) * (size->width / 14);
    const size_t out_bytes = static_cast<size_t>(patches) * 1176 * sizeof(float);

    const Timing decode_ms = Time(runs, [&] {
      auto d = iris::vision::DecodeImageFile(path);
      if (!d.ok()) std::abort();
    });
    const Timing resize_ms = Time(runs, [&] {
      auto r = iris::vision::ResizeBicubic(img, size->height, size->width);
      if (r.pixels.empty()) std::abort();
    });
    auto at_size = iris::vision::Preprocess(resized, config);  // already at size: the bytes as they are
    if (!at_size.ok()) std::abort();
    const Timing patchify_ms = Time(runs, [&] {
      auto v = iris::vision::PixelValues(*at_size, config);
      if (!v.ok()) std::abort();
    });
    const Timing preprocess_ms = Time(runs, [&] {
      auto p = iris::vision::Preprocess(img, config);
      if (!p.ok()) std::abort();
    });
    const Timing total_ms = Time(runs, [&] {
      auto d = iris::vision::DecodeImageFile(path);
      if (!d.ok()) std::abort();
      auto p = iris::vision::Preprocess(*d, config);
      if (!p.ok()) std::abort();
    });
    // The floor for the output: writing a fresh buffer of the same size, page faults included,
    // on the same workers and advised to huge pages as Preprocess does.
    const Timing write_ms = Time(runs, [&] {
      auto t = iris::core::Tensor::Empty(iris::core::DType::kF32, {patches, 1176});
      char* p = static_cast<char*>(t.raw());
      const int64_t n = static_cast<int64_t>(out_bytes);
      const uintptr_t huge = uintptr_t{1} << 21;
      const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + huge - 1) & ~(huge - 1);
      const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n) & ~(huge - 1);
      if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
      constexpr int64_t kChunk = 1 << 20;
      iris::core::ParallelFor(static_cast<int>((n + kChunk - 1) / kChunk), [&](int i, int) {
        std::memset(p + i * kChunk, 1, std::min<int64_t>(kChunk, n - i * kChunk));
      });
    });

    std::printf("\n%s (%dx%d -> %dx%d, %lld patches, pixel_values %.1f MB)\n", name, img.width,
                img.height, size->width, size->height, static_cast<long long>(patches),
                out_bytes / 1e6);
    char ratio[96];
    std::snprintf(ratio, sizeof(ratio), "   (fresh-buffer write %.2f ms; ratio %.2f)", write_ms.median_ms,
                  patchify_ms.median_ms / write_ms.median_ms);
    Print("decode (DecodeImageFile)", decode_ms);
    Print("resize (ResizeBicubic)", resize_ms);
    Print("host normalize + patchify", patchify_ms, ratio);
    Print("Preprocess (resize to bytes)", preprocess_ms);
    Print("decode + Preprocess", total_ms);
  }
  return 0;
}
