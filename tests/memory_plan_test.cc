// Checks before loading (core/memory_plan.h, engine/memory_check.h): every preset's config, read
// back as iris reads it, implies exactly the preset's tensor list (the real 7B/32B/72B shapes
// included, whose weights are never written here); a header-only 72B checkpoint is accepted
// without reading a weight; a checkpoint that disagrees with its config is refused naming the
// tensor; the memory estimate adds up and a model that does not fit is refused naming the flag,
// with a --kv-cache-bytes suggestion that does fit.
#include "core/memory_plan.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/memory_check.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "tools/iris-make-model/presets.h"
#include "vision/encoder_plan.h"

namespace iris {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() / ("iris_memory_plan_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string path() const { return path_.string(); }
  fs::path operator/(const std::string& f) const { return path_ / f; }

 private:
  fs::path path_;
};

core::ModelConfig ConfigOf(const tools::Preset& p) {
  TempDir dir("config_" + p.name);
  std::ofstream(dir / "config.json") << tools::ConfigJson(p);
  auto c = core::LoadModelConfig(dir.path());
  EXPECT_TRUE(c.ok()) << p.name << ": " << c.status();
  return c.ok() ? *c : core::ModelConfig{};
}

std::vector<std::pair<std::string, std::vector<int64_t>>> Sorted(const std::vector<core::TensorShape>& v) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& t : v) out.emplace_back(t.name, t.shape);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> Sorted(const std::vector<tools::TensorSpec>& v) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& t : v) out.emplace_back(t.name, t.shape);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ConfigOnly, EveryPresetsConfigImpliesItsTensorList) {
  int config_only = 0;
  for (const tools::Preset& p : tools::AllPresets()) {
    SCOPED_TRACE(p.name);
    const core::ModelConfig c = ConfigOf(p);
    EXPECT_EQ(c.family, p.family);
    EXPECT_EQ(Sorted(core::ExpectedTensors(c)), Sorted(tools::PresetTensors(p, false)));
    EXPECT_EQ(core::CountParameters(c), tools::ParameterCount(tools::PresetTensors(p, false)));
    config_only += p.config_only ? 1 : 0;
  }
  EXPECT_EQ(config_only, 2);
  // The published sizes.
  EXPECT_EQ(core::CountParameters(ConfigOf(*tools::FindPreset("qwen2.5-72b"))), 72706203648);
  EXPECT_EQ(core::CountParameters(ConfigOf(*tools::FindPreset("qwen2.5-32b"))), 32763876352);
  EXPECT_EQ(core::CountParameters(ConfigOf(*tools::FindPreset("qwen2.5-7b"))), 7615616512);
  EXPECT_EQ(core::CountParameters(ConfigOf(*tools::FindPreset("7b"))), 8292166656);
}

// A checkpoint whose header lists every tensor but whose data is a hole: the file is 145 GB long
// and takes no disk; the check reads headers only.
TEST(ConfigOnly, HeaderOnly72bCheckpointIsAccepted) {
  const tools::Preset& p = *tools::FindPreset("qwen2.5-72b");
  const core::ModelConfig c = ConfigOf(p);
  TempDir dir("72b");
  std::vector<tools::TensorSpec> specs = tools::PresetTensors(p, false);
  std::sort(specs.begin(), specs.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& s : specs) {
    uint64_t bytes = 2;
    for (int64_t d : s.shape) bytes *= static_cast<uint64_t>(d);
    header[s.name] = {{"dtype", "BF16"}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const std::string file = (dir / "model.safetensors").string();
  {
    std::ofstream out(file, std::ios::binary);
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(8 + text.size() + offset)), 0);
  auto ckpt = core::Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(core::CheckCheckpointTensors(c, *ckpt).ok());
  EXPECT_GT(offset, uint64_t{145'000'000'000});

  // The same config with a different intermediate size names the first tensor that disagrees.
  core::ModelConfig wrong = c;
  wrong.text.intermediate_size += 64;
  const absl::Status s = core::CheckCheckpointTensors(wrong, *ckpt);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.layers.0.mlp.gate_proj.weight has shape [29568, 8192]"), std::string::npos) << s;
}

TEST(ConfigOnly, CheckpointThatDisagreesWithItsConfigIsRefused) {
  // The tied text checkpoint read with an untied config: lm_head.weight is missing.
  auto c = core::LoadModelConfig(testing::ModelPath("tiny-qwen2-text"));
  ASSERT_TRUE(c.ok()) << c.status();
  auto ckpt = core::Checkpoint::Open(testing::ModelPath("tiny-qwen2-text"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(core::CheckCheckpointTensors(*c, *ckpt).ok());
  c->text.tie_word_embeddings = false;
  const absl::Status s = core::CheckCheckpointTensors(*c, *ckpt);
  EXPECT_NE(s.message().find("lm_head.weight is missing"), std::string::npos) << s;
  for (const char* name : {"tiny", "tiny-qwen2-text-untied", "tiny-qwen2-vl"}) {
    auto cc = core::LoadModelConfig(testing::ModelPath(name));
    auto ck = core::Checkpoint::Open(testing::ModelPath(name));
    ASSERT_TRUE(cc.ok() && ck.ok()) << name;
    EXPECT_TRUE(core::CheckCheckpointTensors(*cc, *ck).ok()) << name;
  }
}

TEST(MemoryPlan, EstimateAddsUp) {
  const core::ModelConfig c = ConfigOf(*tools::FindPreset("qwen2.5-72b"));
  core::MemoryBudgets b;
  b.kv_cache_bytes = int64_t{1} << 30;
  const core::MemoryEstimate bf16 = core::EstimateMemory(c, b);
  EXPECT_EQ(bf16.parameters, 72706203648);
  EXPECT_EQ(bf16.weight_bytes, 2 * bf16.parameters);  // untied: every tensor once, in bf16
  EXPECT_EQ(bf16.kv_cache_bytes, int64_t{1} << 30);
  EXPECT_EQ(bf16.encoder_activation_bytes, 0);
  EXPECT_GT(bf16.decoder_activation_bytes, 4 * 256 * c.text.vocab_size);  // the logits rows at least
  EXPECT_EQ(bf16.total(), bf16.weight_bytes + bf16.kv_cache_bytes + bf16.decoder_activation_bytes);
  b.f32_compute = true;
  const core::MemoryEstimate f32 = core::EstimateMemory(c, b);
  const int64_t embed = c.text.vocab_size * c.text.hidden_size;
  EXPECT_EQ(f32.weight_bytes, 4 * (bf16.parameters - embed) + 2 * embed);  // the table stays mapped
  // A VL model has encoder buffers too.
  const core::MemoryEstimate vl = core::EstimateMemory(ConfigOf(*tools::FindPreset("7b")), core::MemoryBudgets{});
  EXPECT_GT(vl.encoder_activation_bytes, 0);
  EXPECT_EQ(vl.gpu_workspace_bytes, 0) << "the CPU's matmuls read the f32 rows";
}

// EncoderPlanBytes bounds the arrays of any plan of that many patches, and is reached by the
// list that has the most sequences: images of one merged token each (a frame and a window apiece).
TEST(MemoryPlan, EncoderPlanBytesBoundsEveryGridListOfThatManyPatches) {
  const core::VisionConfig v = ConfigOf(*tools::FindPreset("3b")).vision;
  const auto bytes = [](const vision::EncoderPlan& p) {
    return static_cast<int64_t>(4 * (p.window_index.size() + p.cu_seqlens.size() + p.cu_window_seqlens.size())) +
           static_cast<int64_t>(p.cos.nbytes() + p.sin.nbytes());
  };
  const int64_t patches = 4096;
  const std::vector<std::vector<vision::GridThw>> lists = {
      {{1, 64, 64}},                          // one image, many windows
      {{4, 32, 32}},                          // a video's frames
      {{1, 2, 2048}},                         // one row of windows
      std::vector<vision::GridThw>(1024, {1, 2, 2}),  // the most sequences
      {{1, 30, 30}, {2, 2, 26}, {1, 14, 20}, {1, 2, 2}},  // mixed, fewer patches than the budget
  };
  for (const auto& grids : lists) {
    absl::StatusOr<std::shared_ptr<const vision::EncoderPlan>> plan = vision::BuildEncoderPlan(v, grids);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_LE((*plan)->num_patches, patches);
    EXPECT_LE(bytes(**plan), core::EncoderPlanBytes(v, patches)) << grids.size() << " grids";
    if (grids.size() == 1024) {
      EXPECT_EQ(bytes(**plan), core::EncoderPlanBytes(v, patches)) << "the bound is reached";
    }
  }
}

// On a GPU a bf16 matmul's input rows are converted into a scratch buffer that grows by doubling
// (up to twice the largest input at the budgets), beside cuBLASLt's workspace.
TEST(MemoryPlan, GpuCountsTheMatmulScratchAndWorkspace) {
  const core::ModelConfig c = ConfigOf(*tools::FindPreset("7b"));
  core::MemoryBudgets b;
  b.gpu = true;
  b.max_num_batched_tokens = 2048;
  b.max_encoder_patches = 1000;  // the decoder's down projection input is the widest: 2048 x 18944
  core::MemoryEstimate e = core::EstimateMemory(c, b);
  EXPECT_EQ(e.gpu_workspace_bytes, core::kGpuMatmulWorkspaceBytes + 2 * 2 * 2048 * int64_t{c.text.intermediate_size});
  EXPECT_EQ(e.total(), e.weight_bytes + e.kv_cache_bytes + e.decoder_activation_bytes + e.encoder_activation_bytes +
                           e.gpu_workspace_bytes);
  EXPECT_NE(core::DescribeMemory(e, b).find("GPU workspace"), std::string::npos) << core::DescribeMemory(e, b);
  // The largest image's patches: the encoder's padded MLP input is the widest.
  b.max_encoder_patches = 65536;
  e = core::EstimateMemory(c, b);
  const int64_t ip = (int64_t{c.vision.intermediate_size} + 63) / 64 * 64;
  EXPECT_EQ(e.gpu_workspace_bytes, core::kGpuMatmulWorkspaceBytes + 2 * 2 * 65536 * ip);
  // The encoder's output in raster order is kept on the GPU before it is copied back, and its
  // graphs' input buffer holds the patches' bytes.
  core::MemoryBudgets on_cpu = b;
  on_cpu.gpu = false;
  // And (bf16, RMSNorm blocks) the norm hand-off's bf16 rows and a partial sum per 128 columns.
  ASSERT_EQ(c.vision.norm, core::VisionNorm::kRmsNorm);
  EXPECT_EQ(e.encoder_activation_bytes, core::EstimateMemory(c, on_cpu).encoder_activation_bytes +
                                            4 * 65536 / 4 * int64_t{c.vision.out_hidden_size} +
                                            65536 * int64_t{c.vision.patch_size} * c.vision.patch_size * 3 +
                                            65536 * (2 * int64_t{c.vision.hidden_size} +
                                                     4 * ((int64_t{c.vision.hidden_size} + 127) / 128)));
  const absl::Status s = core::CheckMemoryFits(e, b, e.total() - 1);
  EXPECT_NE(s.message().find("GPU matmul workspace"), std::string::npos) << s;
  // The encoder on a device object of its own (its own stream): its scratch and workspace beside
  // the decoder's.
  b.encoder_device_apart = true;
  EXPECT_EQ(core::EstimateMemory(c, b).gpu_workspace_bytes,
            2 * core::kGpuMatmulWorkspaceBytes + 2 * 2 * 65536 * ip + 2 * 2 * 2048 * int64_t{c.text.intermediate_size});
  b.encoder_device_apart = false;
  // Matmul tuning's scratch output: the largest f32 output at the budgets, here the encoder's
  // padded gate_up (65536 patches x 2 ip) against the decoder's lm_head logits (256 x vocab) and
  // its gate_up at 2048 tokens.
  b.gpu_matmul_tuning = true;
  const int64_t tuned_out = std::max({int64_t{65536} * 2 * ip, int64_t{256} * c.text.vocab_size,
                                      int64_t{2048} * 2 * c.text.intermediate_size});
  EXPECT_EQ(core::EstimateMemory(c, b).gpu_workspace_bytes,
            core::kGpuMatmulWorkspaceBytes + 2 * 2 * 65536 * ip + 4 * tuned_out);
  EXPECT_EQ(tuned_out, int64_t{65536} * 2 * ip);
  b.max_encoder_patches = 1000;  // now the decoder's largest output counts
  EXPECT_EQ(core::EstimateMemory(c, b).gpu_workspace_bytes,
            core::kGpuMatmulWorkspaceBytes + 2 * 2 * 2048 * int64_t{c.text.intermediate_size} +
                4 * std::max(int64_t{256} * c.text.vocab_size, int64_t{2048} * 2 * c.text.intermediate_size));
  b.max_encoder_patches = 65536;
  b.gpu_matmul_tuning = false;
  // The encoder's kept graphs hold a plan each, sized at the patch budget.
  const int64_t without_graphs = core::EstimateMemory(c, b).encoder_activation_bytes;
  b.encoder_graphs = 16;
  EXPECT_EQ(core::EstimateMemory(c, b).encoder_activation_bytes,
            without_graphs + 16 * core::EncoderPlanBytes(c.vision, 65536));
  EXPECT_EQ(core::EstimateMemory(c, on_cpu).encoder_activation_bytes,
            core::EstimateMemory(c, [&] { core::MemoryBudgets cpu = on_cpu; cpu.encoder_graphs = 16; return cpu; }())
                .encoder_activation_bytes)
      << "the CPU records no graphs";
  b.encoder_graphs = 0;
  // f32 compute converts nothing.
  b.f32_compute = true;
  EXPECT_EQ(core::EstimateMemory(c, b).gpu_workspace_bytes, core::kGpuMatmulWorkspaceBytes);
}

TEST(MemoryPlan, RefusalNamesTheFlagAndItsSuggestionFits) {
  const core::ModelConfig c = ConfigOf(*tools::FindPreset("qwen2.5-7b"));
  core::MemoryBudgets b;
  b.kv_cache_bytes = int64_t{64} << 30;
  const core::MemoryEstimate e = core::EstimateMemory(c, b);
  const int64_t available = int64_t{24} << 30;  // room for the weights, not for 64 GiB of KV
  const absl::Status s = core::CheckMemoryFits(e, b, available);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("(--kv-cache-bytes)"), std::string::npos) << s;
  const std::string key = "lower --kv-cache-bytes to at most ";
  const size_t at = s.message().find(key);
  ASSERT_NE(at, std::string::npos) << s;
  const int64_t suggested = std::stoll(std::string(s.message().substr(at + key.size())));
  b.kv_cache_bytes = suggested;
  EXPECT_TRUE(core::CheckMemoryFits(core::EstimateMemory(c, b), b, available).ok());
  b.kv_cache_bytes = suggested + 1;
  EXPECT_FALSE(core::CheckMemoryFits(core::EstimateMemory(c, b), b, available).ok());
  // Weights that cannot fit at all say so.
  const core::ModelConfig big = ConfigOf(*tools::FindPreset("qwen2.5-72b"));
  const absl::Status w = core::CheckMemoryFits(core::EstimateMemory(big, b), b, available);
  EXPECT_NE(w.message().find("the weights alone do not fit"), std::string::npos) << w;
}

TEST(MemoryPlan, CheckBeforeLoadOnTheFixtures) {
  engine::EngineOptions o;
  auto ok = engine::CheckMemoryBeforeLoad(testing::ModelPath("tiny-qwen2-text"), engine::ModelOptions{}, o);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_GT(ok->available, 0);
  EXPECT_EQ(ok->estimate.encoder_activation_bytes, 0);
  EXPECT_NE(ok->Describe().find("GB available"), std::string::npos) << ok->Describe();
  // The VL model's encoder buffers hold the largest image the preprocessor makes.
  auto vl = engine::CheckMemoryBeforeLoad(testing::ModelPath("tiny-qwen2-vl"), engine::ModelOptions{}, o);
  ASSERT_TRUE(vl.ok()) << vl.status();
  EXPECT_EQ(vl->budgets.max_encoder_patches, 12845056 / 196);
  // 1 PiB of KV cache, against the given (or the machine's) memory.
  o.kv_cache_bytes = int64_t{1} << 50;
  auto refused = engine::CheckMemoryBeforeLoad(testing::ModelPath("tiny-qwen2-text"), engine::ModelOptions{}, o);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("lower --kv-cache-bytes to at most"), std::string::npos)
      << refused.status();
}

// --gpu-memory-fraction: the cache gets the fraction's share after the weights and activations,
// never more than is free, and a share too small for the rest is refused naming what took it.
TEST(MemoryPlan, KvCacheFromAFractionOfTheDevice) {
  const core::ModelConfig c = ConfigOf(*tools::FindPreset("qwen2.5-7b"));
  core::MemoryBudgets b;
  b.kv_cache_bytes = 12345;  // ignored
  const core::MemoryEstimate e = core::EstimateMemory(c, b);
  const int64_t rest = e.total() - e.kv_cache_bytes;
  const int64_t total = int64_t{80} << 30;
  auto kv = core::KvCacheBytesForFraction(0.9, total, total, e);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(*kv, static_cast<int64_t>(0.9 * static_cast<double>(total)) - rest);
  b.kv_cache_bytes = *kv;
  EXPECT_TRUE(core::CheckMemoryFits(core::EstimateMemory(c, b), b, total).ok());
  // Another process holds part of the device: what is free bounds it.
  auto busy = core::KvCacheBytesForFraction(0.9, total, int64_t{40} << 30, e);
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_EQ(*busy, (int64_t{40} << 30) - rest);
  const absl::Status small = core::KvCacheBytesForFraction(0.05, total, total, e).status();
  EXPECT_EQ(small.code(), absl::StatusCode::kResourceExhausted) << small;
  EXPECT_NE(small.message().find("weights"), std::string::npos) << small;
  for (const double bad : {0.0, -0.5, 1.5}) {
    EXPECT_EQ(core::KvCacheBytesForFraction(bad, total, total, e).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  // On the CPU the flag is refused; a GPU that is not there fails before anything is loaded.
  engine::ModelOptions cpu;
  EXPECT_EQ(engine::CheckMemoryBeforeLoad(testing::ModelPath("tiny-qwen2-text"), cpu, engine::EngineOptions{}, -1,
                                          "--kv-cache-bytes", 0.9)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace iris
