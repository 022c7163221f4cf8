// Sampled picks over a full vocabulary: how long Sampler::Sample takes per row for the usual
// settings, as a multiple of one read pass over the row measured in the same run (RowMax: the
// floor any pick pays), and a batch of rows picked one after another against the same rows
// picked in parallel (core::ParallelFor, as the engine picks a step's sampled rows).
// Logits: a normal spread (sigma --sigma) with a few dominant tokens, as a trained model's rows
// look (--sigma 0.5 gives the flat rows of a model with random weights).
// Then, with the logits on --device: a step's rows brought back to the host and picked there in
// parallel (the engine's path with sample_on_device off) against the same rows drawn where they
// are (kernels::SampleRows, only the ids coming back), and whether both picked the same tokens.
// On a GPU that is the choice sample_on_device makes; on the CPU the device op is the plain
// reference (a sort for top-p), which is why the engine keeps the host's picks there.
//   sampler_bench [--vocab 151936] [--batch 64] [--rows 40] [--sigma 3] [--device cpu|cuda]
//                 [--draw_batches 1,8,64]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_machine.h"
#include "core/parallel_for.h"
#include "kernels/device.h"
#include "kernels/logit_scan.h"
#include "kernels/row_draw.h"
#include "kernels/sample_rows.h"
#include "llm/sampler.h"

ABSL_FLAG(int64_t, vocab, 151936, "row length (Qwen2's vocabulary)");
ABSL_FLAG(int, batch, 64, "rows of a step, for the one-after-another vs parallel table");
ABSL_FLAG(int, rows, 40, "rows timed per setting (the median is printed)");
ABSL_FLAG(double, sigma, 3.0, "spread of the logits");
ABSL_FLAG(std::string, device, "cpu", "where the logits are for the last table: cpu, or cuda / cuda:N");
ABSL_FLAG(std::string, draw_batches, "1,8,64", "rows of a step for the last table");

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

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "sampler_bench: %s\n", why.c_str());
  std::exit(1);
}

// A step of `batch` rows on `dev`: brought back and picked by the host samplers in parallel, then
// drawn where they are by twin samplers (same seeds). Best of `rounds` each; the rows are put back
// on the device before each (untimed).
void DeviceDrawRow(kernels::Device& dev, const Setting& s, int batch, int64_t vocab, const std::vector<float>& rows,
                   int rounds) {
  const size_t n = static_cast<size_t>(batch) * vocab;
  auto work = dev.Allocate(core::DType::kF32, {static_cast<int64_t>(n)});
  auto host = dev.AllocateStaging(core::DType::kF32, {static_cast<int64_t>(n)});
  const int64_t draw_words = batch * static_cast<int64_t>(sizeof(kernels::RowDraw) / 4);
  auto draws_host = dev.AllocateStaging(core::DType::kI32, {draw_words});
  auto draws_dev = dev.Allocate(core::DType::kI32, {draw_words});
  auto picks_dev = dev.Allocate(core::DType::kI32, {batch});
  auto picks_host = dev.AllocateStaging(core::DType::kI32, {batch});
  if (!work.ok() || !host.ok() || !draws_host.ok() || !draws_dev.ok() || !picks_dev.ok() || !picks_host.ok()) {
    Die("cannot allocate the step's buffers on " + dev.Describe());
  }
  std::vector<llm::Sampler> on_host, on_device;
  for (int b = 0; b < batch; ++b) {
    on_host.emplace_back(Params(s, static_cast<uint64_t>(b)), absl::Span<const int32_t>{});
    on_device.emplace_back(Params(s, static_cast<uint64_t>(b)), absl::Span<const int32_t>{});
  }
  double back_ms = 1e30, copy_ms = 1e30, draw_ms = 1e30;
  int same = 0, picks = 0;
  std::vector<int32_t> host_ids(static_cast<size_t>(batch));
  for (int round = 0; round < rounds; ++round) {
    dev.CopyToDevice(rows.data(), work->data<float>(), n * sizeof(float));
    dev.Synchronize();
    auto t0 = Clock::now();
    dev.CopyToHost(work->data<float>(), host->data<float>(), n * sizeof(float));
    dev.Synchronize();
    const auto t1 = Clock::now();
    core::ParallelFor(batch, [&](int b, int) {
      host_ids[static_cast<size_t>(b)] = on_host[static_cast<size_t>(b)].Sample(host->data<float>() + b * vocab, vocab);
    });
    const auto t2 = Clock::now();
    copy_ms = std::min(copy_ms, Us(t0, t1) / 1e3);
    back_ms = std::min(back_ms, Us(t0, t2) / 1e3);

    dev.CopyToDevice(rows.data(), work->data<float>(), n * sizeof(float));
    dev.Synchronize();
    t0 = Clock::now();
    auto* staged = reinterpret_cast<kernels::RowDraw*>(draws_host->data<int32_t>());
    for (int b = 0; b < batch; ++b) staged[b] = on_device[static_cast<size_t>(b)].NextDraw();
    dev.CopyToDevice(staged, draws_dev->data<int32_t>(), static_cast<size_t>(batch) * sizeof(kernels::RowDraw));
    kernels::SampleRows(dev, work->data<float>(), batch, vocab,
                        reinterpret_cast<const kernels::RowDraw*>(draws_dev->data<int32_t>()), picks_dev->data<int32_t>());
    dev.CopyToHost(picks_dev->data<int32_t>(), picks_host->data<int32_t>(), static_cast<size_t>(batch) * 4);
    dev.Synchronize();
    draw_ms = std::min(draw_ms, Us(t0, Clock::now()) / 1e3);
    if (!dev.status().ok()) Die(std::string(dev.status().message()));
    for (int b = 0; b < batch; ++b) {
      on_device[static_cast<size_t>(b)].Accept(picks_host->data<int32_t>()[b]);
      same += picks_host->data<int32_t>()[b] == host_ids[static_cast<size_t>(b)] ? 1 : 0;
      ++picks;
    }
  }
  std::printf("| %s | %d | %.3f (%.3f) | %.3f | %.2fx | %d/%d |\n", s.name, batch, back_ms, copy_ms, draw_ms,
              back_ms / draw_ms, same, picks);
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

  kernels::DeviceOptions device_options;
  device_options.name = absl::GetFlag(FLAGS_device);
  auto dev = kernels::CreateDevice(device_options);
  if (!dev.ok()) Die("--device " + device_options.name + ": " + std::string(dev.status().message()));
  std::vector<int> draw_batches;
  for (const absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_draw_batches), ',', absl::SkipEmpty())) {
    int b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 1) Die("--draw_batches: positive integers, got " + std::string(part));
    draw_batches.push_back(b);
  }
  const int max_batch = draw_batches.empty() ? 0 : *std::max_element(draw_batches.begin(), draw_batches.end());
  std::vector<float> step_rows;
  for (int r = 0; r < max_batch; ++r) {
    const std::vector<float> row = Row(vocab, 5000u + static_cast<uint32_t>(r), sigma);
    step_rows.insert(step_rows.end(), row.begin(), row.end());
  }
  std::printf("\nlogits on %s: a step's rows brought back and picked by the host in parallel (the copy alone in "
              "brackets) vs drawn there (kernels::SampleRows; only ids come back), best of 5, ms\n",
              (*dev)->Describe().c_str());
  std::printf("| setting | rows | back + host picks (copy) | drawn there | back / there | same tokens |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Setting& s : settings) {
    if (s.temperature == 0.f || s.top_k == 2000) continue;
    for (const int b : draw_batches) DeviceDrawRow(**dev, s, b, vocab, step_rows, 5);
  }
  return 0;
}
