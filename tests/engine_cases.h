// The engine suites' shared workload and drivers (engine_test on the CPU, cuda_engine_test on a
// GPU): the tiny model behind an engine, the 32-request mixed workload (text only, one and two
// images, repeated images, short and long prompts), and running it request by request or all at
// once.
#pragma once

#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/prompt_builder.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "tests/test_util.h"

namespace iris::engine::testing_engine {

using iris::testing::DataPath;

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The tiny model on `device` (the CPU unless named) behind an engine; its encoder on a device of
// its own when `encoder_device` is set.
inline std::unique_ptr<Engine> MakeEngine(const EngineOptions& options,
                                          kernels::ComputeType compute = kernels::ComputeType::kF32,
                                          const kernels::DeviceOptions& device = {},
                                          std::optional<kernels::DeviceOptions> encoder_device = std::nullopt) {
  auto model = LoadModel(testing::ModelPath("tiny"), ModelOptions{compute, {}, device, encoder_device});
  EXPECT_TRUE(model.ok()) << model.status();
  auto engine = Engine::Create(std::move(*model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

inline ChatInputPart Text(std::string s) {
  ChatInputPart p;
  p.text = std::move(s);
  return p;
}

inline ChatInputPart Image(const std::string& file) {
  ChatInputPart p;
  p.kind = ChatInputPart::Kind::kImage;
  p.image_bytes = ReadFile(DataPath("images/" + file));
  return p;
}

// The mixed workload: text only, one image, two images, the same image again, short and long
// prompts, max_tokens from 3 to 40.
struct Spec {
  std::vector<ChatInputPart> parts;
  int64_t max_tokens;
  // Greedy either way; with a penalty the engine picks from f32 logits (Sampler::Sample), not on
  // the decoder (ArgmaxRows).
  float repetition_penalty = 1.f;
  // Sampled when temperature > 0 (seeded: the same tokens alone and in a batch).
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;
};

inline std::vector<Spec> MixedWorkload(int n) {
  const char* images[] = {"rgb_300x200.png", "gray_56x56.png", "jpeg444_q90_640x480.jpg", "rgb_350x70.png"};
  std::string long_text;
  for (int i = 0; i < 25; ++i) long_text += absl::StrCat("Sentence number ", i, " of a rather long prompt. ");
  std::vector<Spec> out;
  for (int i = 0; i < n; ++i) {
    Spec s;
    s.max_tokens = 3 + (i * 7) % 38;
    switch (i % 6) {
      case 0: s.parts = {Text(absl::StrCat("Tell me a story, number ", i, "."))}; break;
      case 1: s.parts = {Image(images[i % 4]), Text("What is shown in this image?")}; break;
      case 2: s.parts = {Image(images[(i + 1) % 4]), Image(images[(i + 2) % 4]), Text("Compare them.")}; break;
      case 3: s.parts = {Text(long_text)}; break;
      case 4: s.parts = {Image("rgb_300x200.png"), Text(absl::StrCat("Again the same picture ", i))}; break;
      default: s.parts = {Image(images[i % 4]), Text(long_text)}; break;
    }
    out.push_back(std::move(s));
  }
  return out;
}

// MixedWorkload's requests sampled: temperature with top-p, top-k, both, plain, a penalty, and a
// greedy one among them (each seeded).
inline std::vector<Spec> SampledWorkload(int n) {
  std::vector<Spec> out = MixedWorkload(n);
  for (int i = 0; i < n; ++i) {
    Spec& s = out[static_cast<size_t>(i)];
    s.seed = 100 + static_cast<uint64_t>(i);
    switch (i % 6) {
      case 0: s.temperature = 0.8f; s.top_p = 0.9f; break;
      case 1: s.temperature = 1.f; s.top_k = 40; break;
      case 2: s.temperature = 1.2f; s.top_k = 20; s.top_p = 0.8f; s.repetition_penalty = 1.1f; break;
      case 3: s.temperature = 0.6f; break;
      case 4: s.repetition_penalty = 1.3f; break;  // greedy
      default: s.temperature = 1.5f; s.top_p = 0.5f; break;
    }
  }
  return out;
}

inline Request MakeRequest(const Engine& engine, const Spec& spec, int i) {
  std::vector<ChatInputMessage> messages = {{"user", spec.parts}};
  auto prompt = BuildPrompt(engine.model(), messages);
  EXPECT_TRUE(prompt.ok()) << prompt.status();
  Request r;
  r.id = absl::StrCat("req-", i);
  r.prompt = std::move(*prompt);
  r.sampling.max_tokens = spec.max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.repetition_penalty = spec.repetition_penalty;
  r.sampling.temperature = spec.temperature;
  r.sampling.top_k = spec.top_k;
  r.sampling.top_p = spec.top_p;
  r.sampling.seed = spec.seed;
  return r;
}

// Collects outputs of many requests submitted at once.
class Collector {
 public:
  explicit Collector(int n) : outputs_(n) {}
  OutputCallback Callback(int i) {
    return [this, i](RequestOutput out) {
      absl::MutexLock lock(&mu_);
      RequestOutput& m = outputs_[i];
      m.token_ids.insert(m.token_ids.end(), out.token_ids.begin(), out.token_ids.end());
      m.text += out.text;
      if (!out.prompt_logits.empty()) m.prompt_logits = out.prompt_logits;
      if (out.finished) {
        m.finished = true;
        m.finish_reason = out.finish_reason;
        m.status = out.status;
        m.usage = out.usage;
        ++finished_;
      }
      if (on_tokens_) on_tokens_(i, static_cast<int64_t>(m.token_ids.size()));
    };
  }
  void WaitAll() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](Collector* c) { return c->finished_ == static_cast<int>(c->outputs_.size()); }, this));
  }
  RequestOutput Get(int i) {
    absl::MutexLock lock(&mu_);
    return outputs_[i];
  }
  std::function<void(int, int64_t)> on_tokens_;

 private:
  absl::Mutex mu_;
  std::vector<RequestOutput> outputs_;
  int finished_ = 0;
};

// Each request alone, one after the other.
inline std::vector<std::vector<int32_t>> RunAlone(const std::vector<Spec>& specs,
                                                  const kernels::DeviceOptions& device = {},
                                                  const EngineOptions& options = {}) {
  auto engine = MakeEngine(options, kernels::ComputeType::kF32, device);
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto r = GenerateBlocking(*engine, MakeRequest(*engine, specs[i], static_cast<int>(i)));
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->finish_reason, llm::FinishReason::kLength);
    EXPECT_EQ(static_cast<int64_t>(r->token_ids.size()), specs[i].max_tokens);
    out.push_back(r->token_ids);
  }
  return out;
}

// Request i of `specs` (id "req-i") submitted with its outputs going to `col`, all at once.
inline void SubmitAll(Engine& engine, const std::vector<Spec>& specs, Collector& col) {
  std::vector<Request> requests;
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    requests.push_back(MakeRequest(engine, specs[i], i));
    requests.back().on_output = col.Callback(i);
  }
  for (Request& r : requests) ASSERT_TRUE(engine.Submit(std::move(r)).ok());
}

// All of them submitted at once: each must give what it gave alone.
inline void RunConcurrent(const std::vector<Spec>& specs, const EngineOptions& options,
                          const std::vector<std::vector<int32_t>>& alone, EngineStats* stats_out,
                          const kernels::DeviceOptions& device = {},
                          std::optional<kernels::DeviceOptions> encoder_device = std::nullopt) {
  auto engine = MakeEngine(options, kernels::ComputeType::kF32, device, encoder_device);
  const int n = static_cast<int>(specs.size());
  Collector col(n);
  SubmitAll(*engine, specs, col);
  col.WaitAll();
  for (int i = 0; i < n; ++i) {
    RequestOutput out = col.Get(i);
    EXPECT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.token_ids, alone[i]) << "request " << i;
  }
  *stats_out = engine->stats();
  EXPECT_EQ(stats_out->kv_blocks_used, 0);
  EXPECT_EQ(stats_out->running + stats_out->waiting, 0);
}

// The mixed workload run with an encoder worker (the encoder's device beside the decoder's, or
// sharing its cores): every request finished, each of the 4 distinct images encoded once, all by
// the worker and none on the engine thread.
inline void ExpectEveryImageEncodedByTheWorker(const EngineStats& stats) {
  EXPECT_TRUE(stats.concurrent_encoder);
  EXPECT_EQ(stats.requests_finished, 32);
  EXPECT_EQ(stats.images_encoded, 4);
  EXPECT_EQ(stats.encoder_slices, 0) << "the engine thread ran encoder work";
}

// Budgets under which the mixed workload preempts: 40 KV blocks of 16 tokens (the tiny model's f32
// pages) hold the largest request alone, never the 32 at once.
inline constexpr int64_t kTooSmallCacheBlocks = 40;
inline EngineOptions TooSmallCacheOptions() {
  EngineOptions o;
  o.max_num_batched_tokens = 512;
  o.kv_block_size = 16;
  o.kv_cache_bytes = kTooSmallCacheBlocks * 16 * 2 /*layers*/ * 2 /*k,v*/ * 2 /*kv heads*/ * 16 /*head_dim*/ * 4;
  return o;
}

inline const kernels::DeviceOptions kCpuDevice{};

// A suite over the 32-request mixed workload on `kDevice`: the workload and each request's tokens
// alone, made once for the suite. Where the device cannot be made, every test fails saying why.
template <const kernels::DeviceOptions& kDevice>
class MixedWorkloadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!kernels::CreateDevice(kDevice).ok()) return;
    specs_ = new std::vector<Spec>(MixedWorkload(32));
    alone_ = new std::vector<std::vector<int32_t>>(RunAlone(*specs_, kDevice));
  }
  static void TearDownTestSuite() {
    delete specs_;
    delete alone_;
    specs_ = nullptr;
    alone_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(alone_, nullptr) << "no usable device " << kDevice.name << ": " << kernels::CreateDevice(kDevice).status();
  }
  static inline std::vector<Spec>* specs_ = nullptr;
  static inline std::vector<std::vector<int32_t>>* alone_ = nullptr;
};

}  // namespace iris::engine::testing_engine
