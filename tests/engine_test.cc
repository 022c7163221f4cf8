// The engine on the tiny model: many concurrent requests give what each gives alone (with and
// without preemption), cancellation frees every KV block, repeated images are encoded once, the
// golden prompts give the reference's greedy tokens, bf16 KV pages give the greedy tokens of f32
// pages, and bad requests are refused with clear errors.
#include "engine/engine.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/model.h"
#include "engine/prompt_builder.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace iris::engine {
namespace {

using testing::DataPath;
using testing::Int64Values;
using testing::LoadGolden;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::unique_ptr<Engine> MakeEngine(const EngineOptions& options,
                                   kernels::ComputeType compute = kernels::ComputeType::kF32) {
  auto model = LoadModel(testing::ModelPath("tiny"), ModelOptions{compute, {}, {}});
  EXPECT_TRUE(model.ok()) << model.status();
  auto engine = Engine::Create(std::move(*model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

ChatInputPart Text(std::string s) {
  ChatInputPart p;
  p.text = std::move(s);
  return p;
}

ChatInputPart Image(const std::string& file) {
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
};

std::vector<Spec> MixedWorkload(int n) {
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

Request MakeRequest(const Engine& engine, const Spec& spec, int i) {
  std::vector<ChatInputMessage> messages = {{"user", spec.parts}};
  auto prompt = BuildPrompt(engine.model(), messages);
  EXPECT_TRUE(prompt.ok()) << prompt.status();
  Request r;
  r.id = absl::StrCat("req-", i);
  r.prompt = std::move(*prompt);
  r.sampling.max_tokens = spec.max_tokens;
  r.sampling.ignore_eos = true;
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
std::vector<std::vector<int32_t>> RunAlone(const std::vector<Spec>& specs) {
  auto engine = MakeEngine(EngineOptions{});
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

void RunConcurrent(const std::vector<Spec>& specs, const EngineOptions& options,
                   const std::vector<std::vector<int32_t>>& alone, EngineStats* stats_out) {
  auto engine = MakeEngine(options);
  const int n = static_cast<int>(specs.size());
  Collector col(n);
  std::vector<Request> requests;
  for (int i = 0; i < n; ++i) {
    requests.push_back(MakeRequest(*engine, specs[i], i));
    requests.back().on_output = col.Callback(i);
  }
  for (Request& r : requests) ASSERT_TRUE(engine->Submit(std::move(r)).ok());
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

class EngineMixedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    specs_ = new std::vector<Spec>(MixedWorkload(32));
    alone_ = new std::vector<std::vector<int32_t>>(RunAlone(*specs_));
  }
  static void TearDownTestSuite() {
    delete specs_;
    delete alone_;
  }
  static std::vector<Spec>* specs_;
  static std::vector<std::vector<int32_t>>* alone_;
};
std::vector<Spec>* EngineMixedTest::specs_ = nullptr;
std::vector<std::vector<int32_t>>* EngineMixedTest::alone_ = nullptr;

TEST_F(EngineMixedTest, ConcurrentEqualsAlone) {
  EngineOptions o;
  o.max_num_batched_tokens = 256;  // long prompts are prefilled in chunks beside the decodes
  EngineStats stats;
  RunConcurrent(*specs_, o, *alone_, &stats);
  EXPECT_EQ(stats.preemptions, 0);
  EXPECT_EQ(stats.requests_finished, 32);
  // 4 distinct images among 32 requests: each encoded once, the rest are cache hits.
  EXPECT_EQ(stats.images_encoded, 4);
  EXPECT_EQ(stats.encoder_cache_misses, 4);
  EXPECT_GT(stats.encoder_cache_hits, 10);
}

TEST_F(EngineMixedTest, ConcurrentWithPreemptionEqualsAlone) {
  EngineOptions o;
  o.max_num_batched_tokens = 512;
  o.kv_block_size = 16;
  // 40 blocks of 16 tokens: the largest request fits alone, 32 at once never do.
  o.kv_cache_bytes = 40 * 16 * 2 /*layers*/ * 2 /*k,v*/ * 2 /*kv heads*/ * 16 /*head_dim*/ * 4;
  EngineStats stats;
  RunConcurrent(*specs_, o, *alone_, &stats);
  EXPECT_EQ(stats.kv_blocks_total, 40);
  EXPECT_GT(stats.preemptions, 0) << "the cache was meant to be too small";
  EXPECT_EQ(stats.requests_finished, 32);
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
  std::vector<Request> requests;
  for (int i = 0; i < n; ++i) {
    requests.push_back(MakeRequest(*engine, specs[i], i));
    requests.back().on_output = col.Callback(i);
  }
  for (Request& r : requests) ASSERT_TRUE(engine->Submit(std::move(r)).ok());
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
  for (int i = 0; i < n; ++i) {
    specs[i].max_tokens = 1000;
    Request r = MakeRequest(*engine, specs[i], i);
    r.on_output = col.Callback(i);
    ASSERT_TRUE(engine->Submit(std::move(r)).ok());
  }
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

TEST(EngineTest, SeededSamplingIsReproducible) {
  auto engine = MakeEngine(EngineOptions{});
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
  for (int i = 0; i < n; ++i) {
    specs[i].max_tokens = 2000;
    Request r = MakeRequest(*engine, specs[i], i);
    r.on_output = col.Callback(i);
    ASSERT_TRUE(engine->Submit(std::move(r)).ok());
  }
  engine->Shutdown();
  col.WaitAll();
  for (int i = 0; i < n; ++i) EXPECT_EQ(col.Get(i).finish_reason, llm::FinishReason::kCancelled);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  Request late = MakeRequest(*engine, specs[0], 99);
  EXPECT_EQ(engine->Submit(std::move(late)).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace iris::engine
