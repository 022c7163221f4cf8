// The engine on the tiny model: many concurrent requests give what each gives alone (with and
// without preemption, with and without prefix caching), cancellation frees every KV block,
// repeated images are encoded once, a chat's next turn hits the prefix cache (and a different
// image does not), the golden prompts give the reference's greedy tokens, bf16 KV pages give the
// greedy tokens of f32 pages, and bad requests are refused with clear errors.
#include "engine/engine.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/model.h"
#include "engine/prompt_builder.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/linear.h"
#include "tests/engine_cases.h"
#include "tests/test_util.h"

namespace iris::engine {
namespace {

using testing::DataPath;
using testing::Int64Values;
using testing::LoadGolden;
using namespace testing_engine;  // NOLINT: the shared workload and drivers

class EngineMixedTest : public MixedWorkloadTest<kCpuDevice> {};

// A CPU device of one thread (for an encoder beside the engine's team).
const kernels::DeviceOptions kOneThreadCpu = [] {
  kernels::DeviceOptions d;
  d.threads = 1;
  return d;
}();

TEST_F(EngineMixedTest, ConcurrentEqualsAlone) {
  EngineOptions o;
  o.max_num_batched_tokens = 256;  // long prompts are prefilled in chunks beside the decodes
  EngineStats stats;
  RunConcurrent(*specs_, o, *alone_, &stats);
  EXPECT_EQ(stats.preemptions, 0);
  EXPECT_EQ(stats.requests_finished, 32);
  EXPECT_EQ(stats.decode_graph_steps, 0) << "off by default on the CPU";
  // 4 distinct images among 32 requests: each encoded once, the rest are encoder cache hits or
  // lie inside a prefix-cache hit (then not looked up at all).
  EXPECT_EQ(stats.images_encoded, 4);
  EXPECT_EQ(stats.encoder_cache_misses, 4);
  EXPECT_GT(stats.encoder_cache_hits, 5);
  EXPECT_GT(stats.prefix_cache_hits, 0);
}

TEST_F(EngineMixedTest, ConcurrentWithPreemptionEqualsAlone) {
  EngineStats stats;
  RunConcurrent(*specs_, TooSmallCacheOptions(), *alone_, &stats);
  EXPECT_EQ(stats.kv_blocks_total, kTooSmallCacheBlocks);
  EXPECT_GT(stats.preemptions, 0) << "the cache was meant to be too small";
  EXPECT_EQ(stats.requests_finished, 32);
}

// Interleaved encoding at the smallest slices (one encoder piece and a 32-token prefill chunk per
// step while anything decodes; all submitted at once, the first jobs run whole) and with
// interleaving off: the same tokens as alone.
TEST_F(EngineMixedTest, ConcurrentInTinyStepsEqualsAlone) {
  EngineOptions o;
  o.step_budget_ms = 1e-3;
  EngineStats stats;
  RunConcurrent(*specs_, o, *alone_, &stats);
  EXPECT_EQ(stats.requests_finished, 32);
  EXPECT_EQ(stats.images_encoded, 4);
}

// Decode steps padded to the decode graphs' sizes (a GPU replays them from graphs; the CPU runs the
// padded steps directly): the tokens of the steps as given.
TEST_F(EngineMixedTest, ConcurrentWithDecodeStepsPaddedForGraphsEqualsAlone) {
  EngineOptions o;
  o.decode_graphs = true;
  EngineStats stats;
  RunConcurrent(*specs_, o, *alone_, &stats);
  EXPECT_EQ(stats.requests_finished, 32);
  EXPECT_GT(stats.decode_graph_steps, 0);
  EXPECT_LT(stats.decode_graph_steps, stats.steps);
}

// The encoder on a CPU device of its own, its jobs run by the encoder worker beside the engine's
// steps (as a GPU runs it on a stream of its own): the same tokens as alone, every image encoded
// once by the worker and no encoder slice run on the engine thread.
TEST_F(EngineMixedTest, ConcurrentWithTheEncoderBesideTheStepsEqualsAlone) {
  for (const bool interleave : {true, false}) {
    SCOPED_TRACE(interleave ? "prefill sized by the step budget" : "prefill unbounded");
    EngineOptions o;
    o.max_num_batched_tokens = 256;
    o.interleave_encoder = interleave;
    EngineStats stats;
    RunConcurrent(*specs_, o, *alone_, &stats, kCpuDevice, kOneThreadCpu);
    ExpectEveryImageEncodedByTheWorker(stats);
    EXPECT_GE(stats.encoder_forwards, 1);
    EXPECT_LE(stats.encoder_forwards, 4);
    EXPECT_EQ(stats.shared_core_steps, 0) << "cores apart: nothing shared";
  }
}

TEST_F(EngineMixedTest, ConcurrentWithPreemptionAndTheEncoderBesideTheStepsEqualsAlone) {
  EngineStats stats;
  RunConcurrent(*specs_, TooSmallCacheOptions(), *alone_, &stats, kCpuDevice, kOneThreadCpu);
  EXPECT_GT(stats.preemptions, 0) << "the cache was meant to be too small";
  EXPECT_EQ(stats.requests_finished, 32);
}

// The encoder's device as large as the decoder's, on the same cores, the two splitting them while
// both have work (EngineOptions::share_encoder_cores): the same tokens as alone, every image
// encoded by the worker.
TEST_F(EngineMixedTest, ConcurrentWithTheEncoderSharingTheCoresEqualsAlone) {
  EngineOptions o;
  o.max_num_batched_tokens = 256;
  o.share_encoder_cores = true;
  EngineStats stats;
  RunConcurrent(*specs_, o, *alone_, &stats, kCpuDevice, kCpuDevice);
  ExpectEveryImageEncodedByTheWorker(stats);
  // Text-only requests decode while the images are encoded: those steps ran on the decoder's part.
  EXPECT_GT(stats.shared_core_steps, 0);
  EXPECT_LT(stats.shared_core_steps, stats.steps);
}

// Sharing needs an encoder device of its own, of the decoder's size.
// Rows that pick from f32 logits (here greedy with a repetition penalty, each request its own
// penalty set) are picked in parallel after the step: each must still give what it gives alone.
TEST(EngineTest, RowsPickedFromLogitsInParallelEqualAlone) {
  std::vector<Spec> specs = MixedWorkload(12);
  for (size_t i = 0; i < specs.size(); ++i) specs[i].repetition_penalty = i % 3 == 2 ? 1.f : 1.3f + 0.1f * static_cast<float>(i % 4);
  const auto alone = RunAlone(specs);
  EngineStats stats;
  RunConcurrent(specs, EngineOptions{}, alone, &stats);
  EXPECT_EQ(stats.requests_finished, 12);
}

// Sampled requests drawn where the logits are (EngineOptions::sample_on_device: the decoder's
// kernels::SampleRows from each sampler's NextDraw, only ids coming back, as on a GPU) pick what
// the host samplers pick: one by one (the same logits bit for bit) and all at once.
TEST(EngineTest, SampledRowsDrawnWhereTheLogitsAreEqualTheHostSamplers) {
  const std::vector<Spec> specs = SampledWorkload(12);
  const auto host = RunAlone(specs);
  EngineOptions o;
  o.sample_on_device = true;
  EXPECT_EQ(RunAlone(specs, {}, o), host);
  std::set<int32_t> distinct;
  for (const auto& tokens : host) distinct.insert(tokens.begin(), tokens.end());
  EXPECT_GT(distinct.size(), 40u) << "sampled, not one repeated token";
  EngineStats stats;
  RunConcurrent(specs, o, host, &stats);
  EXPECT_EQ(stats.requests_finished, 12);
}

TEST(EngineTest, SharingTheCoresNeedsAnEncoderDeviceOfTheDecodersSize) {
  EngineOptions o;
  o.share_encoder_cores = true;
  kernels::DeviceOptions other = kOneThreadCpu;
  other.threads = kernels::cpu::AsCpu(kernels::DefaultCpuDevice()).max_threads() + 1;
  for (const std::optional<kernels::DeviceOptions>& encoder : {std::optional<kernels::DeviceOptions>(), std::optional(other)}) {
    auto model = LoadModel(testing::ModelPath("tiny"), ModelOptions{kernels::ComputeType::kF32, {}, {}, encoder});
    ASSERT_TRUE(model.ok()) << model.status();
    auto engine = Engine::Create(std::move(*model), o);
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
  }
}

// While the worker encodes the only request's image the engine has nothing to run: it sleeps until
// the worker's result wakes it, instead of stepping (and, on the CPU, taking cores) in the
// meantime. Steps: the job's start, its end, the prefill, one per further token.
TEST(EngineTest, WaitsForTheEncoderWorkerWithoutStepping) {
  EngineOptions o;
  auto engine = MakeEngine(o, kernels::ComputeType::kF32, {}, kOneThreadCpu);
  ASSERT_NE(engine, nullptr);
  Spec spec;
  spec.parts = {Image("rgb_300x200.png"), Text("What is this?")};
  spec.max_tokens = 4;
  for (int i = 0; i < 3; ++i) {  // a new image each time (none cached)
    if (i > 0) spec.parts[0] = Image(i == 1 ? "rgb_448x448.png" : "jpeg444_q90_640x480.jpg");
    const int64_t steps_before = engine->stats().steps;
    auto r = GenerateBlocking(*engine, MakeRequest(*engine, spec, i));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(static_cast<int64_t>(r->token_ids.size()), spec.max_tokens);
    EXPECT_LE(engine->stats().steps - steps_before, spec.max_tokens + 3);
  }
  EXPECT_EQ(engine->stats().images_encoded, 3);
}

TEST_F(EngineMixedTest, ConcurrentWithWholeImagesEqualsAlone) {
  EngineOptions o;
  o.interleave_encoder = false;
  EngineStats stats;
  RunConcurrent(*specs_, o, *alone_, &stats);
  EXPECT_EQ(stats.requests_finished, 32);
  EXPECT_EQ(stats.images_encoded, 4);
  EXPECT_EQ(stats.encoder_slices, 0);
}

// Bit for bit (where the matmuls are split-invariant; else to rounding): an image request's prompt
// logits when its image is encoded in pieces and its prompt prefilled in small chunks beside a
// decoding request equal those of the unsplit forward and the unchunked prefill (the request
// alone, nothing decoding: one step).
TEST(EngineTest, SlicedEncodeAndChunkedPrefillGiveTheSameLogits) {
  const std::vector<Spec> specs = {
      {{Image("jpeg444_q90_640x480.jpg"), Text("What is shown in this image?")}, 4},
      {{Image("rgb_300x200.png"), Image("gray_56x56.png"), Text("Compare them.")}, 4}};
  std::vector<std::vector<float>> alone;
  {
    EngineOptions o;
    o.max_num_batched_tokens = 8192;  // each prompt in one chunk
    auto engine = MakeEngine(o);
    for (size_t i = 0; i < specs.size(); ++i) {
      Request r = MakeRequest(*engine, specs[i], static_cast<int>(i));
      r.capture_prompt_logits = true;
      auto out = GenerateBlocking(*engine, std::move(r));
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_FALSE(out->prompt_logits.empty());
      alone.push_back(out->prompt_logits);
    }
    EXPECT_EQ(engine->stats().encoder_slices, 2) << "alone, each image job was meant to run in one step";
  }
  EngineOptions o;
  o.step_budget_ms = 1e-3;
  auto engine = MakeEngine(o);
  Collector col(3);
  Request busy = MakeRequest(*engine, {{Text("Keep talking.")}, 400}, 99);
  busy.on_output = col.Callback(2);
  ASSERT_TRUE(engine->Submit(std::move(busy)).ok());
  std::vector<Request> requests;
  for (size_t i = 0; i < specs.size(); ++i) {
    requests.push_back(MakeRequest(*engine, specs[i], static_cast<int>(i)));
    requests.back().capture_prompt_logits = true;
    requests.back().on_output = col.Callback(static_cast<int>(i));
  }
  for (Request& r : requests) ASSERT_TRUE(engine->Submit(std::move(r)).ok());
  col.WaitAll();
  for (size_t i = 0; i < specs.size(); ++i) {
    const RequestOutput out = col.Get(static_cast<int>(i));
    ASSERT_TRUE(out.status.ok()) << out.status;
    ASSERT_EQ(out.prompt_logits.size(), alone[i].size());
    EXPECT_TRUE(testing::SameUnderRowSplits(out.prompt_logits.data(), alone[i].data(),
                                            static_cast<int64_t>(alone[i].size()),
                                            kernels::MatmulRowsSplitInvariant(kernels::DefaultCpuDevice()), 1e-5))
        << "request " << i << ": sliced and chunked logits differ";
  }
  const EngineStats stats = engine->stats();
  EXPECT_GT(stats.encoder_slices, 10);
  EXPECT_GT(stats.steps, 20);
}

// --step-trace: one JSON line per step, whose rows add up to the work done; a path that cannot be
// written is refused at start, naming the flag.
TEST(EngineTest, StepTraceHasOneLinePerStep) {
  const std::string path = ::testing::TempDir() + "/iris-step-trace.jsonl";
  {
    EngineOptions o;
    o.step_trace_path = path;
    auto engine = MakeEngine(o);
    auto out = GenerateBlocking(*engine, MakeRequest(*engine, {{Image("rgb_300x200.png"), Text("Hi")}, 5}, 0));
    ASSERT_TRUE(out.ok()) << out.status();
    const EngineStats stats = engine->stats();
    std::ifstream f(path);
    std::string line;
    int64_t lines = 0, decode_rows = 0, prefill_rows = 0, images = 0;
    while (std::getline(f, line)) {
      const nlohmann::json j = nlohmann::json::parse(line);
      ++lines;
      decode_rows += j["decode_rows"].get<int64_t>();
      prefill_rows += j["prefill_rows"].get<int64_t>();
      images += j["images_encoded"].get<int64_t>();
      EXPECT_GE(j["step_ms"].get<double>(), j["decoder_ms"].get<double>());
    }
    EXPECT_EQ(lines, stats.steps);
    EXPECT_EQ(images, 1);
    EXPECT_EQ(decode_rows, 4);  // 5 tokens: the first sampled by the prefill
    EXPECT_EQ(prefill_rows, out->usage.prompt_tokens);
  }
  auto model = LoadModel(testing::ModelPath("tiny"), ModelOptions{kernels::ComputeType::kF32, {}, {}, {}});
  ASSERT_TRUE(model.ok());
  EngineOptions bad;
  bad.step_trace_path = "/nonexistent-dir/trace.jsonl";
  auto engine = Engine::Create(std::move(*model), bad);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("--step-trace"), std::string::npos) << engine.status();
}

// Alone and concurrent above run with prefix caching (the default); here without it.
TEST_F(EngineMixedTest, ConcurrentWithoutPrefixCachingEqualsAlone) {
  EngineOptions o;
  o.max_num_batched_tokens = 256;
  o.enable_prefix_caching = false;
  EngineStats stats;
  RunConcurrent(*specs_, o, *alone_, &stats);
  EXPECT_EQ(stats.prefix_cache_hits, 0);
  EXPECT_EQ(stats.kv_blocks_cached, 0);
  EXPECT_EQ(stats.requests_finished, 32);
  // Every image after the first of its kind is an encoder cache hit.
  EXPECT_EQ(stats.images_encoded, 4);
  EXPECT_GT(stats.encoder_cache_hits, 10);
}

TEST_F(EngineMixedTest, CancellingHalfFreesEveryBlock) {
  auto engine = MakeEngine(EngineOptions{});
  const int n = 32;
  Collector col(n);
  std::vector<Spec> specs = *specs_;
  for (Spec& s : specs) s.max_tokens = 60;
  std::vector<char> cancelled(n, 0);
  Engine* e = engine.get();
  col.on_tokens_ = [&](int i, int64_t tokens) {
    if (i % 2 == 0 && tokens >= 2 && !cancelled[i]) {
      cancelled[i] = 1;
      e->Cancel(absl::StrCat("req-", i));
    }
  };
  SubmitAll(*engine, specs, col);
  col.WaitAll();
  for (int i = 0; i < n; ++i) {
    RequestOutput out = col.Get(i);
    if (i % 2 == 0) {
      EXPECT_EQ(out.finish_reason, llm::FinishReason::kCancelled) << i;
      EXPECT_LT(out.token_ids.size(), 60u) << i;
    } else {
      EXPECT_EQ(out.finish_reason, llm::FinishReason::kLength) << i;
      EXPECT_EQ(out.token_ids.size(), 60u) << i;
    }
  }
  EngineStats stats = engine->stats();
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_EQ(stats.running + stats.waiting, 0);
}

// Cancelling everything mid-flight: the blocks are back as soon as the last cancel is delivered.
TEST(EngineTest, CancelAllReturnsBlocksAtOnce) {
  auto engine = MakeEngine(EngineOptions{});
  const int n = 8;
  Collector col(n);
  std::vector<Spec> specs = MixedWorkload(n);
  for (Spec& spec : specs) spec.max_tokens = 1000;
  SubmitAll(*engine, specs, col);
  // Wait until every request has produced a token, then cancel them all.
  for (;;) {
    bool all = true;
    for (int i = 0; i < n; ++i) all = all && !col.Get(i).token_ids.empty();
    if (all) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GT(engine->stats().kv_blocks_used, 0);
  for (int i = 0; i < n; ++i) engine->Cancel(absl::StrCat("req-", i));
  col.WaitAll();
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  for (int i = 0; i < n; ++i) EXPECT_EQ(col.Get(i).finish_reason, llm::FinishReason::kCancelled);
}

// Prefix caching through the engine, against a second engine with it switched off.
class EnginePrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    on_ = MakeEngine(EngineOptions{});
    EngineOptions off;
    off.enable_prefix_caching = false;
    off_ = MakeEngine(off);
  }

  Request Chat(const Engine& engine, const std::vector<ChatInputMessage>& messages, const std::string& id) {
    auto prompt = BuildPrompt(engine.model(), messages);
    EXPECT_TRUE(prompt.ok()) << prompt.status();
    Request r;
    r.id = id;
    r.prompt = std::move(*prompt);
    r.sampling.max_tokens = 12;
    r.sampling.ignore_eos = true;
    return r;
  }

  // Runs `messages` on both engines: the same greedy tokens. Returns the output with caching on.
  RequestOutput RunBoth(const std::vector<ChatInputMessage>& messages, const std::string& id) {
    auto on = GenerateBlocking(*on_, Chat(*on_, messages, id));
    auto off = GenerateBlocking(*off_, Chat(*off_, messages, id));
    EXPECT_TRUE(on.ok() && off.ok());
    if (!on.ok() || !off.ok()) return {};
    EXPECT_EQ(on->token_ids, off->token_ids) << id << ": prefix caching changed the output";
    EXPECT_EQ(on->token_ids.size(), 12u);
    return std::move(*on);
  }

  // The tokens a cached run of `computed` gives a prompt `next`: the full blocks of their common
  // prefix, leaving `next`'s last token.
  static int64_t ExpectedHit(const std::vector<int32_t>& computed, const std::vector<int32_t>& next) {
    size_t common = 0;
    while (common < computed.size() && common + 1 < next.size() && computed[common] == next[common]) ++common;
    return static_cast<int64_t>(common / 16 * 16);
  }

  std::unique_ptr<Engine> on_, off_;
};

// Turn 2 of a chat repeating turn 1's image hits every block turn 1 computed, needs no image
// embeddings (not even a cache lookup), and gives the same tokens as without caching.
TEST_F(EnginePrefixCacheTest, NextTurnOfAChatWithAnImageHits) {
  const std::vector<ChatInputMessage> turn1 = {{"user", {Image("rgb_300x200.png"), Text("Describe this picture.")}}};
  const RequestOutput out1 = RunBoth(turn1, "turn-1");
  const std::vector<int32_t> prompt1 = Chat(*on_, turn1, "x").prompt.ids;
  std::vector<int32_t> computed1 = prompt1;  // its k/v: the prompt and every reply token but the last
  computed1.insert(computed1.end(), out1.token_ids.begin(), out1.token_ids.end() - 1);

  std::vector<ChatInputMessage> turn2 = turn1;
  turn2.push_back({"assistant", {Text(out1.text)}});
  turn2.push_back({"user", {Text("And which colours does it have?")}});
  const std::vector<int32_t> prompt2 = Chat(*on_, turn2, "x").prompt.ids;
  const int64_t expected = ExpectedHit(computed1, prompt2);
  EXPECT_GE(expected, static_cast<int64_t>(prompt1.size()) / 16 * 16) << "turn 2 repeats turn 1's prompt";

  const EngineStats before = on_->stats();
  EXPECT_EQ(before.prefix_cache_hits, 0);
  EXPECT_EQ(before.prefix_cache_queries, static_cast<int64_t>(prompt1.size()));
  RunBoth(turn2, "turn-2");
  const EngineStats after = on_->stats();
  EXPECT_EQ(after.prefix_cache_hits - before.prefix_cache_hits, expected);
  EXPECT_EQ(after.prefix_cache_queries - before.prefix_cache_queries, static_cast<int64_t>(prompt2.size()));
  EXPECT_GT(after.prefix_cache_hit_rate(), 0.4);
  EXPECT_EQ(after.images_encoded, before.images_encoded);
  EXPECT_EQ(after.encoder_cache_hits + after.encoder_cache_misses,
            before.encoder_cache_hits + before.encoder_cache_misses)
      << "the image lies inside the cached prefix: its embeddings are not wanted";
  EXPECT_EQ(after.kv_blocks_used, 0);
  EXPECT_GT(after.kv_blocks_cached, 0);
  // Without caching turn 2 computes everything.
  EXPECT_EQ(off_->stats().prefix_cache_hits, 0);
}

// The same text with another image of the same size (the same placeholder ids): only the blocks
// before the image's first token are shared, and the tokens are those without caching.
TEST_F(EnginePrefixCacheTest, DifferentImagesWithTheSameTextDoNotShareTheirBlocks) {
  const std::vector<ChatInputMessage> first = {{"user", {Image("rgb_300x200.png"), Text("Describe this picture.")}}};
  const std::vector<ChatInputMessage> second = {
      {"user", {Image("palette_300x200.png"), Text("Describe this picture.")}}};
  RunBoth(first, "first");
  const Request r = Chat(*on_, second, "x");
  ASSERT_EQ(r.prompt.ids, Chat(*on_, first, "y").prompt.ids) << "the test needs equal placeholder ids";
  ASSERT_EQ(r.prompt.images.size(), 1u);
  const int64_t before = on_->stats().prefix_cache_hits;
  RunBoth(second, "second");
  EXPECT_EQ(on_->stats().prefix_cache_hits - before, r.prompt.images[0].pad_begin / 16 * 16);
  EXPECT_EQ(on_->stats().images_encoded, 2);
}

// The golden prompts through the whole engine (prompt builder, encoder, decoder, sampler): the
// reference's greedy tokens and text.
TEST(EngineTest, GoldenGreedyTokens) {
  auto engine = MakeEngine(EngineOptions{});
  nlohmann::json manifest = testing::LoadDataJson("model/manifest_tiny.json");
  for (const auto& c : manifest["cases"]) {
    const std::string name = c["case"].get<std::string>().substr(std::string("model-tiny-").size());
    std::vector<ChatInputMessage> messages;
    size_t image = 0;
    for (const auto& m : c["messages"]) {
      ChatInputMessage msg{m["role"].get<std::string>(), {}};
      if (m["content"].is_string()) {
        msg.parts.push_back(Text(m["content"].get<std::string>()));
      } else {
        for (const auto& part : m["content"]) {
          if (part["type"] == "image") {
            msg.parts.push_back(Image(c["images"][image++].get<std::string>().substr(std::string("images/").size())));
          } else {
            msg.parts.push_back(Text(part["text"].get<std::string>()));
          }
        }
      }
      messages.push_back(std::move(msg));
    }
    auto prompt = BuildPrompt(engine->model(), messages);
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    const std::vector<int64_t> ids = Int64Values(LoadGolden("model/tiny-" + name + ".safetensors", "input_ids"));
    ASSERT_EQ(std::vector<int64_t>(prompt->ids.begin(), prompt->ids.end()), ids) << name;
    Request r;
    r.id = name;
    r.prompt = std::move(*prompt);
    r.sampling.max_tokens = 20;
    r.capture_prompt_logits = true;
    auto out = GenerateBlocking(*engine, std::move(r));
    ASSERT_TRUE(out.ok()) << out.status();
    const std::vector<int64_t> want = Int64Values(LoadGolden("model/tiny-" + name + ".safetensors", "greedy_tokens"));
    EXPECT_EQ(std::vector<int64_t>(out->token_ids.begin(), out->token_ids.end()), want) << name;
    EXPECT_EQ(out->text, c["greedy"]["text"].get<std::string>()) << name;
    EXPECT_EQ(out->finish_reason, llm::FinishReason::kLength);
    EXPECT_EQ(out->usage.prompt_tokens, static_cast<int64_t>(ids.size()));
    EXPECT_EQ(out->usage.image_tokens, c["num_image_tokens"].get<int64_t>());
    EXPECT_EQ(out->usage.completion_tokens, 20);
    core::Tensor ref = LoadGolden("model/tiny-" + name + ".safetensors", "logits_last");
    ASSERT_EQ(static_cast<int64_t>(out->prompt_logits.size()), ref.numel());
    EXPECT_LE(testing::RelativeL2(out->prompt_logits.data(), ref.data<float>(), ref.numel()), 1e-4) << name;
  }
}

TEST(EngineKvCacheDTypeTest, AutoFollowsTheComputeDTypeAndBf16HoldsTwiceTheBlocks) {
  using kernels::ComputeType;
  EngineOptions o;
  o.kv_cache_bytes = 1 << 20;  // tiny: 2 layers x 2 kv heads x 16 dims, blocks of 16 tokens
  struct Case {
    ComputeType compute;
    KvCacheDType kv;
    core::DType want;
    int64_t blocks;
  };
  for (const Case& c : {Case{ComputeType::kF32, KvCacheDType::kAuto, core::DType::kF32, 128},
                        Case{ComputeType::kBF16, KvCacheDType::kAuto, core::DType::kBF16, 256},
                        Case{ComputeType::kBF16, KvCacheDType::kF32, core::DType::kF32, 128},
                        Case{ComputeType::kF32, KvCacheDType::kBF16, core::DType::kBF16, 256}}) {
    o.kv_cache_dtype = c.kv;
    auto engine = MakeEngine(o, c.compute);
    EXPECT_EQ(engine->kv_cache_shape().dtype, c.want) << static_cast<int>(c.kv);
    EXPECT_EQ(engine->stats().kv_blocks_total, c.blocks) << static_cast<int>(c.kv);
    EXPECT_EQ(engine->kv_cache_shape().BytesPerBlock() * c.blocks, o.kv_cache_bytes);
  }
  EXPECT_EQ(*KvCacheDTypeFromName("auto"), KvCacheDType::kAuto);
  EXPECT_EQ(*KvCacheDTypeFromName("bf16"), KvCacheDType::kBF16);
  EXPECT_EQ(*KvCacheDTypeFromName("f32"), KvCacheDType::kF32);
  EXPECT_EQ(KvCacheDTypeFromName("fp16").status().code(), absl::StatusCode::kInvalidArgument);
}

// Greedy tokens and prompt logits of each spec, one request at a time.
struct Generated {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;
};

Generated GenerateEach(kernels::ComputeType compute, KvCacheDType kv, const std::vector<Spec>& specs) {
  EngineOptions o;
  o.kv_cache_dtype = kv;
  auto engine = MakeEngine(o, compute);
  Generated g;
  for (size_t i = 0; i < specs.size(); ++i) {
    Request r = MakeRequest(*engine, specs[i], static_cast<int>(i));
    r.capture_prompt_logits = true;
    auto out = GenerateBlocking(*engine, std::move(r));
    EXPECT_TRUE(out.ok()) << out.status();
    g.tokens.push_back(out->token_ids);
    g.logits.push_back(out->prompt_logits);
  }
  return g;
}

// bf16 KV pages against f32 pages, every prompt of the mixed workload (text, images, long
// prompts) and 3..40 greedy tokens each. With bf16 compute the attention rounds K and V to bf16
// either way, so the pages change nothing the products see; with f32 compute the rounding of K/V
// (2^-9 relative) moves the logits by about 1e-3 of their size, below the tiny model's greedy
// margins on these prompts.
TEST(EngineKvCacheDTypeTest, Bf16PagesGiveTheGreedyTokensOfF32Pages) {
  using kernels::ComputeType;
  const std::vector<Spec> specs = MixedWorkload(12);
  for (ComputeType compute : {ComputeType::kBF16, ComputeType::kF32}) {
    const Generated f32 = GenerateEach(compute, KvCacheDType::kF32, specs);
    const Generated bf16 = GenerateEach(compute, KvCacheDType::kBF16, specs);
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(bf16.tokens[i], f32.tokens[i]) << "compute " << static_cast<int>(compute) << " request " << i;
      ASSERT_EQ(bf16.logits[i].size(), f32.logits[i].size());
      const double rel = testing::RelativeL2(bf16.logits[i].data(), f32.logits[i].data(),
                                             static_cast<int64_t>(f32.logits[i].size()));
      EXPECT_LE(rel, 1e-2) << "compute " << static_cast<int>(compute) << " request " << i;
      if (compute == ComputeType::kF32) {
        EXPECT_GT(rel, 0) << "the pages were not bf16";
      }
    }
  }
}

// Repetition penalty 1.05 as HF applies it (prompt ids, image pads included, and generated ids).
TEST(EngineTest, RepetitionPenaltyGolden) {
  auto engine = MakeEngine(EngineOptions{});
  for (const std::string name : {"text_only", "one_image"}) {
    std::vector<ChatInputMessage> messages;
    if (name == "text_only") {
      messages = {{"user", {Text("Hello! Can you tell me a short story about a robot who learns to paint?")}}};
    } else {
      messages = {{"user", {Image("rgb_300x200.png"), Text("What is shown in this image?")}}};
    }
    auto prompt = BuildPrompt(engine->model(), messages);
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    Request r;
    r.id = name;
    r.prompt = std::move(*prompt);
    r.sampling.max_tokens = 20;
    r.sampling.repetition_penalty = 1.05f;
    auto out = GenerateBlocking(*engine, std::move(r));
    ASSERT_TRUE(out.ok()) << out.status();
    const std::vector<int64_t> want = Int64Values(LoadGolden("model/tiny-" + name + ".safetensors", "reppen105_tokens"));
    EXPECT_EQ(std::vector<int64_t>(out->token_ids.begin(), out->token_ids.end()), want) << name;
  }
}

// Greedy with a strong penalty is picked where the logits are, after the penalty (the tiny model
// repeats one token without it): the penalty must reach the pick, and min_tokens' masked end id
// must never come out early.
TEST(EngineTest, GreedyPicksWithAPenaltyMoveOffRepeatedTokens) {
  auto engine = MakeEngine(EngineOptions{});
  std::vector<ChatInputMessage> messages = {{"user", {Text("Hello! Can you tell me a short story?")}}};
  auto run = [&](float penalty, const std::string& id) {
    auto prompt = BuildPrompt(engine->model(), messages);
    Request r;
    r.id = id;
    r.prompt = std::move(*prompt);
    r.sampling.max_tokens = 12;
    r.sampling.repetition_penalty = penalty;
    r.sampling.ignore_eos = true;
    auto out = GenerateBlocking(*engine, std::move(r));
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->token_ids : std::vector<int32_t>{};
  };
  const std::vector<int32_t> plain = run(1.f, "plain"), penalized = run(10.f, "penalized");
  EXPECT_EQ(std::set<int32_t>(plain.begin(), plain.end()).size(), 1u) << "the tiny model repeats its token";
  const std::set<int32_t> distinct(penalized.begin(), penalized.end());
  EXPECT_GE(distinct.size(), 6u) << "a penalty of 10 moves each pick off the tokens already seen";
}

TEST(EngineTest, SeededSamplingIsReproducible) {
  // The second run of a prompt hits the prefix cache and prefills fewer rows: its logits are the
  // first run's bit for bit only where the matmuls are split-invariant (elsewhere to rounding,
  // which at temperature 1.5 can tip a near-tie sample: seen under AVX2). There caching is off,
  // so that both runs compute the same thing.
  EngineOptions options;
  options.enable_prefix_caching = kernels::MatmulRowsSplitInvariant(kernels::DefaultCpuDevice());
  auto engine = MakeEngine(options);
  auto run = [&](uint64_t seed, const std::string& id) {
    std::vector<ChatInputMessage> messages = {{"user", {Text("Write something random.")}}};
    auto prompt = BuildPrompt(engine->model(), messages);
    Request r;
    r.id = id;
    r.prompt = std::move(*prompt);
    r.sampling.max_tokens = 24;
    r.sampling.temperature = 1.5f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = seed;
    r.sampling.ignore_eos = true;
    auto out = GenerateBlocking(*engine, std::move(r));
    EXPECT_TRUE(out.ok()) << out.status();
    return out->token_ids;
  };
  EXPECT_EQ(run(7, "a"), run(7, "b"));
  EXPECT_NE(run(7, "c"), run(8, "d"));
}

TEST(EngineTest, RefusesBadRequests) {
  EngineOptions o;
  o.max_queue = 2;
  auto engine = MakeEngine(o);
  std::vector<ChatInputMessage> messages = {{"user", {Text("hi")}}};
  auto prompt = BuildPrompt(engine->model(), messages);
  ASSERT_TRUE(prompt.ok());
  auto make = [&](const std::string& id) {
    Request r;
    r.id = id;
    r.prompt = *prompt;
    r.sampling.max_tokens = 4;
    return r;
  };
  Request bad = make("bad-top-p");
  bad.sampling.top_p = 1.5f;
  absl::Status s = engine->Submit(std::move(bad));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("top_p"), std::string::npos) << s;

  Request too_long = make("too-long");
  too_long.sampling.max_tokens = 5000;  // max_position_embeddings is 4096
  s = engine->Submit(std::move(too_long));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_model_len 4096"), std::string::npos) << s;

  Request bad_id = make("bad-id");
  bad_id.prompt.ids[0] = 151936;
  s = engine->Submit(std::move(bad_id));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  Request empty = make("empty");
  empty.prompt = Prompt{};
  EXPECT_EQ(engine->Submit(std::move(empty)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineTest, ShutdownFinishesEverything) {
  auto engine = MakeEngine(EngineOptions{});
  const int n = 6;
  Collector col(n);
  std::vector<Spec> specs = MixedWorkload(n);
  for (Spec& spec : specs) spec.max_tokens = 2000;
  SubmitAll(*engine, specs, col);
  engine->Shutdown();
  col.WaitAll();
  for (int i = 0; i < n; ++i) EXPECT_EQ(col.Get(i).finish_reason, llm::FinishReason::kCancelled);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  Request late = MakeRequest(*engine, specs[0], 99);
  EXPECT_EQ(engine->Submit(std::move(late)).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace iris::engine
