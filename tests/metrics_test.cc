// Prometheus rendering: cumulative histogram buckets against a hand count, and the per-request
// counters the calls feed.
#include "server/metrics.h"

#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace iris::server {
namespace {

// name{labels} -> value, for every sample line.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST(HistogramTest, BucketsAreCumulativeWithSumAndCount) {
  Histogram h({1, 2, 5});
  for (double v : {0.5, 1.0, 1.5, 3.0, 7.0, 9.0}) h.Observe(v);
  std::string text;
  h.Render("x", &text);
  const auto s = Samples(text);
  EXPECT_EQ(s.at("x_bucket{le=\"1\"}"), 2);  // 0.5 and 1.0 (le is inclusive)
  EXPECT_EQ(s.at("x_bucket{le=\"2\"}"), 3);
  EXPECT_EQ(s.at("x_bucket{le=\"5\"}"), 4);
  EXPECT_EQ(s.at("x_bucket{le=\"+Inf\"}"), 6);
  EXPECT_EQ(s.at("x_count"), 6);
  EXPECT_DOUBLE_EQ(s.at("x_sum"), 22.0);
}

TEST(MetricsTest, RequestsTokensAndLatencies) {
  Metrics m;
  engine::Usage usage;
  usage.prompt_tokens = 100;
  usage.image_tokens = 64;
  usage.completion_tokens = 11;
  engine::Timings t;
  t.first_token_ms = 50;
  t.total_ms = 150;  // 10 more tokens in 100 ms: TPOT 10 ms
  t.queue_ms = 3;
  m.RequestEnded("OK", "length", usage, t, 2.0, 0.152);
  m.RequestEnded("INVALID_ARGUMENT", "", {}, {}, 0, 0);
  m.FirstToken(0.05);
  m.InterToken(0.01);
  m.StepRan(20, 8, 2, 0);  // a slice: no image finished yet
  m.StepRan(10, 4, 1, 2);  // two images finish: 12 ms between them
  ScrapeState state;
  state.engine.kv_blocks_total = 100;
  state.engine.kv_blocks_used = 25;
  const auto s = Samples(m.Render(state));
  EXPECT_EQ(s.at("iris:requests_total{status=\"OK\",finish_reason=\"length\"}"), 1);
  EXPECT_EQ(s.at("iris:requests_total{status=\"INVALID_ARGUMENT\",finish_reason=\"none\"}"), 1);
  EXPECT_EQ(s.at("iris:prompt_tokens_total"), 100);
  EXPECT_EQ(s.at("iris:image_tokens_total"), 64);
  EXPECT_EQ(s.at("iris:generation_tokens_total"), 11);
  EXPECT_DOUBLE_EQ(s.at("iris:time_per_output_token_seconds_sum"), 0.01);
  EXPECT_EQ(s.at("iris:e2e_request_latency_seconds_count"), 1);  // the refused one has no latency
  EXPECT_DOUBLE_EQ(s.at("iris:request_queue_time_seconds_sum"), 0.003);
  EXPECT_DOUBLE_EQ(s.at("iris:request_encoder_time_seconds_count"), 1);  // it had images
  EXPECT_DOUBLE_EQ(s.at("iris:engine_step_time_seconds_sum"), 0.03);
  EXPECT_DOUBLE_EQ(s.at("iris:encoder_forward_time_seconds_sum"), 0.008);  // 4 + 4 ms (8 ms over 2 forwards, then 4)
  EXPECT_EQ(s.at("iris:encoder_forward_time_seconds_count"), 2);
  EXPECT_EQ(s.at("iris:encoder_time_per_image_seconds_count"), 2);
  EXPECT_DOUBLE_EQ(s.at("iris:encoder_time_per_image_seconds_sum"), 0.012);
  EXPECT_DOUBLE_EQ(s.at("iris:kv_cache_usage_ratio"), 0.25);
  EXPECT_EQ(s.at("iris:kv_cache_blocks_capacity"), 100);
}

TEST(MetricsTest, EveryFamilyHasHelpAndType) {
  const std::string text = Metrics().Render({});
  std::regex type_line("^# TYPE (\\S+) (counter|gauge|histogram)$");
  std::istringstream in(text);
  std::string line, last_help;
  int families = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0) last_help = line.substr(7, line.find(' ', 7) - 7);
    std::smatch m;
    if (std::regex_match(line, m, type_line)) {
      EXPECT_EQ(m[1].str(), last_help);
      EXPECT_EQ(m[1].str().rfind("iris:", 0), 0u);
      ++families;
    }
  }
  EXPECT_GE(families, 35);
}

}  // namespace
}  // namespace iris::server
