// Image decode and Qwen2.5-VL preprocessing times (median of N runs) for the two JPEGs users
// quote, split into resize, normalize+patchify and the whole Preprocess call, with the write
// bandwidth of this machine (measured here) as the floor for the pixel_values output.
//
//   preprocess_bench [--runs N] [--data DIR] [--max-pixels P]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/model_config.h"
#include "core/tensor.h"
#include "opencv2/imgcodecs.hpp"
#include "vision/preprocess.h"
#include "vision/resize_bicubic.h"
#include "vision/smart_resize.h"

namespace {

using Clock = std::chrono::steady_clock;

// Stand-in decoder until vision/image_decode lands: OpenCV's imread (libjpeg-turbo), BGR -> RGB.
// Its pixels may differ from the reference's load_image; the timings do not depend on them.
bool LoadRgb(const std::string& path, iris::vision::RgbImage* out) {
  cv::Mat m = cv::imread(path, cv::IMREAD_COLOR);
  if (m.empty() || !m.isContinuous()) return false;
  out->width = m.cols;
  out->height = m.rows;
  out->pixels.resize(static_cast<size_t>(m.cols) * m.rows * 3);
  const uint8_t* src = m.ptr<uint8_t>();
  for (size_t i = 0; i < out->pixels.size(); i += 3) {
    out->pixels[i] = src[i + 2];
    out->pixels[i + 1] = src[i + 1];
    out->pixels[i + 2] = src[i];
  }
  return true;
}

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

  std::printf("preprocess_bench: %d OpenMP threads, %u hardware threads, median of %d runs, "
              "max_pixels %lld\n",
              omp_get_max_threads(), std::thread::hardware_concurrency(), runs,
              static_cast<long long>(config.max_pixels));

  for (const char* name : {"jpeg420_q90_1000x667.jpg", "jpeg420_q90_2048x1536.jpg"}) {
    const std::string path = data + "/images/" + name;
    iris::vision::RgbImage img;
    if (!LoadRgb(path, &img)) {
      std::fprintf(stderr, "%s: cannot decode\n", path.c_str());
      return 1;
    }
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
      iris::vision::RgbImage d;
      if (!LoadRgb(path, &d)) std::abort();
    });
    const Timing resize_ms = Time(runs, [&] {
      auto r = iris::vision::ResizeBicubic(img, size->height, size->width);
      if (r.pixels.empty()) std::abort();
    });
    // Already at the target size: Preprocess only normalizes and flattens.
    const Timing patchify_ms = Time(runs, [&] {
      auto p = iris::vision::Preprocess(resized, config);
      if (!p.ok()) std::abort();
    });
    const Timing preprocess_ms = Time(runs, [&] {
      auto p = iris::vision::Preprocess(img, config);
      if (!p.ok()) std::abort();
    });
    const Timing total_ms = Time(runs, [&] {
      iris::vision::RgbImage d;
      if (!LoadRgb(path, &d)) std::abort();
      auto p = iris::vision::Preprocess(d, config);
      if (!p.ok()) std::abort();
    });
    // The floor for the output: writing a fresh buffer of the same size (page faults included),
    // on all threads, as Preprocess must.
    const Timing write_ms = Time(runs, [&] {
      auto t = iris::core::Tensor::Empty(iris::core::DType::kF32, {patches, 1176});
      char* p = static_cast<char*>(t.raw());
      const int64_t n = static_cast<int64_t>(out_bytes);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; i += 1 << 16) std::memset(p + i, 1, std::min<int64_t>(1 << 16, n - i));
    });

    std::printf("\n%s (%dx%d -> %dx%d, %lld patches, pixel_values %.1f MB)\n", name, img.width,
                img.height, size->width, size->height, static_cast<long long>(patches),
                out_bytes / 1e6);
    char ratio[96];
    std::snprintf(ratio, sizeof(ratio), "   fresh-buffer write floor %.2f ms, ratio %.2f", write_ms.median_ms,
                  patchify_ms.median_ms / write_ms.median_ms);
    Print("decode (OpenCV stand-in)", decode_ms);
    Print("resize (ResizeBicubic)", resize_ms);
    Print("normalize + patchify", patchify_ms, ratio);
    Print("Preprocess (fused, total)", preprocess_ms);
    Print("decode + Preprocess", total_ms);
  }
  return 0;
}
