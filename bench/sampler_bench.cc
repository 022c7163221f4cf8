// Sampled picks over a full vocabulary: how long Sampler::Sample takes per row for the usual
// settings, as a multiple of one read pass over the row measured in the same run (RowMax: the
// floor any pick pays), and a batch of rows picked one after another against the same rows
// picked in parallel (core::ParallelFor, as the engine picks a step's sampled rows).
// Logits: a normal spread (sigma --sigma) with a few dominant tokens, as a trained model's rows
// look (--sigma 0.5 gives the flat rows of a model with random weights).
//   sampler_bench [--vocab 151936] [--batch 64] [--rows 40] [--sigma 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_machine.h"
#include "core/parallel_for.h"
#include "kernels/logit_scan.h"
#include "llm/sampler.h"

ABSL_FLAG(int64_t, vocab, 151936, "row length (Qwen2's vocabulary)");
ABSL_FLAG(int, batch, 64, "rows of a step, for the one-after-another vs parallel table");
ABSL_FLAG(int, rows, 40, "rows timed per setting (the median is printed)");
ABSL_FLAG(double, sigma, 3.0, "spread of the logits");

namespace {

using namespace iris;
using Clock = std::chrono::steady_clock;

double Us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

std::vector<float> Row(int64_t vocab, uint32_t seed, double sigma) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, static_cast<float>(sigma));
  std::vector<float> row(static_cast<size_t>(vocab));
  for (float& v : row) v = nd(g);
  row[seed % vocab] += 12.f;
  row[(seed * 7919u) % vocab] += 11.f;
  return row;
}

struct Setting {
  const char* name;
  float temperature;
  int top_k;
  float top_p;
};

llm::SamplingParams Params(const Setting& s, uint64_t seed) {
  llm::SamplingParams p;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.seed = seed;
  p.max_tokens = 1 << 20;
  return p;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t vocab = absl::GetFlag(FLAGS_vocab);
  const int rows = std::max(1, absl::GetFlag(FLAGS_rows)), batch = std::max(1, absl::GetFlag(FLAGS_batch));
  const double sigma = absl::GetFlag(FLAGS_sigma);
  std::printf("sampler_bench: %s (load %s), vocab %lld, logits sigma %.2f, %d threads for the parallel column\n",
              bench::CpuName().c_str(), bench::LoadAverage().c_str(), static_cast<long long>(vocab), sigma,
              core::ParallelWorkers());

  std::vector<std::vector<float>> base;
  for (int r = 0; r < std::max(rows, batch); ++r) base.push_back(Row(vocab, 1000u + static_cast<uint32_t>(r), sigma));
  // The floor: one read pass over a row.
  std::vector<double> pass;
  volatile float sink = 0.f;
  for (int r = 0; r < rows; ++r) {
    const auto t0 = Clock::now();
    sink = kernels::RowMax(base[static_cast<size_t>(r)].data(), vocab);
    pass.push_back(Us(t0, Clock::now()));
  }
  (void)sink;
  const double pass_us = Median(pass);
  std::printf("one read pass over a row (RowMax): %.1f us\n\n", pass_us);

  const Setting settings[] = {{"greedy", 0.f, 0, 1.f},           {"temperature 1", 1.f, 0, 1.f},
                              {"t 0.7, top-p 0.9", 0.7f, 0, 0.9f}, {"t 1, top-k 50", 1.f, 50, 1.f},
                              {"t 0.7, top-k 50, top-p 0.95", 0.7f, 50, 0.95f}, {"t 1, top-p 0.99", 1.f, 0, 0.99f},
                              {"t 1, top-k 2000", 1.f, 2000, 1.f}};
  std::printf("| setting | us a row | read passes | batch of %d, one after another ms | in parallel ms | ratio |\n",
              batch);
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Setting& s : settings) {
    // Per row, one thread.
    llm::Sampler one(Params(s, 1), {});
    std::vector<double> per_row;
    std::vector<float> work;
    for (int r = 0; r < rows; ++r) {
      work = base[static_cast<size_t>(r)];
      const auto t0 = Clock::now();
      one.Sample(work.data(), vocab);
      per_row.push_back(Us(t0, Clock::now()));
    }
    // A step's batch: each row its own sampler, as each request has its own.
    std::vector<llm::Sampler> samplers;
    for (int b = 0; b < batch; ++b) samplers.emplace_back(Params(s, static_cast<uint64_t>(b)), absl::Span<const int32_t>{});
    std::vector<std::vector<float>> step(base.begin(), base.begin() + batch);
    double serial_ms = 1e30, parallel_ms = 1e30;
    for (int round = 0; round < 3; ++round) {
      auto copy = step;
      auto t0 = Clock::now();
      for (int b = 0; b < batch; ++b) samplers[static_cast<size_t>(b)].Sample(copy[static_cast<size_t>(b)].data(), vocab);
      serial_ms = std::min(serial_ms, Us(t0, Clock::now()) / 1e3);
      copy = step;
      t0 = Clock::now();
      core::ParallelFor(batch, [&](int b, int) { samplers[static_cast<size_t>(b)].Sample(copy[static_cast<size_t>(b)].data(), vocab); });
      parallel_ms = std::min(parallel_ms, Us(t0, Clock::now()) / 1e3);
    }
    const double us = Median(per_row);
    std::printf("| %s | %.0f | %.1f | %.2f | %.2f | %.2fx |\n", s.name, us, us / pass_us, serial_ms, parallel_ms,
                serial_ms / parallel_ms);
  }
  return 0;
}
