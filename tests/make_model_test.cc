// iris-make-model: the WEIGHTS.md generator (known answers), the presets' tensor lists and
// JSON files, the fixture checkpoints against the golden manifests, sharding, and bad arguments.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "tools/iris-make-model/checkpoint_writer.h"
#include "tools/iris-make-model/presets.h"
#include "tools/iris-make-model/synthetic_weights.h"

namespace iris::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Hex16(uint16_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04x", v);
  return buf;
}

std::string Hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh, empty directory under the system temp dir, removed when the test ends.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = fs::temp_directory_path() / ("iris_mm_" + std::to_string(::getpid()) + "_" + tag);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

RunResult RunTool(const std::string& args) {
  RunResult r;
  const std::string cmd = std::string(IRIS_MAKE_MODEL_BIN) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Compares every tensor of the checkpoint in `dir` with a golden manifest: the same set of
// names, BF16, shapes, the first 8 values and the SHA-256 of all values.
void ExpectCheckpointMatchesManifest(const std::string& dir, const std::string& manifest_file,
                                     size_t expected_count) {
  const nlohmann::json manifest = iris::testing::LoadDataJson(manifest_file);
  auto ckpt = core::Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status() << " (the make_model_* ctest fixtures write " << dir << ")";
  const std::vector<std::string> names = ckpt->Names();
  std::set<std::string> have(names.begin(), names.end());
  std::set<std::string> want;
  for (const auto& t : manifest["tensors"]) want.insert(t["name"].get<std::string>());
  EXPECT_EQ(want.size(), expected_count);
  EXPECT_EQ(have, want);
  for (const auto& t : manifest["tensors"]) {
    const std::string name = t["name"].get<std::string>();
    SCOPED_TRACE(name);
    auto tensor = ckpt->Get(name);
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    EXPECT_EQ(tensor->dtype(), core::DType::kBF16);
    EXPECT_EQ(tensor->shape(), t["shape"].get<std::vector<int64_t>>());
    const uint16_t* v = tensor->data<uint16_t>();
    const auto first8 = t["first8_bf16_hex"].get<std::vector<std::string>>();
    const auto first8_values = t["first8_values"].get<std::vector<double>>();
    for (size_t i = 0; i < first8.size() && static_cast<int64_t>(i) < tensor->numel(); ++i) {
      EXPECT_EQ(Hex16(v[i]), first8[i]) << "element " << i;
      EXPECT_EQ(static_cast<double>(core::Bf16ToFloat(v[i])), first8_values[i]) << "element " << i;
    }
    EXPECT_EQ(core::Sha256Hex(tensor->raw(), tensor->nbytes()), t["sha256_bf16_le"].get<std::string>());
  }
}

// --- The generator (WEIGHTS.md known answers) ---

TEST(SyntheticWeights, Fnv1a64KnownAnswers) {
  EXPECT_EQ(Hex64(Fnv1a64("")), "cbf29ce484222325");
  EXPECT_EQ(Hex64(Fnv1a64("a")), "af63dc4c8601ec8c");
}

TEST(SyntheticWeights, SplitMix64FromStateZero) {
  EXPECT_EQ(Hex64(SplitMix64At(0, 1)), "e220a8397b1dcdaf");
  EXPECT_EQ(Hex64(SplitMix64At(0, 2)), "6e789e6aa1b965f4");
  EXPECT_EQ(Hex64(SplitMix64At(0, 3)), "06c45d188009454f");
}

TEST(SyntheticWeights, TinyKnownAnswers) {
  constexpr uint64_t kSeed = 0x5EED000000000001ull;
  const TensorGenerator embed(kSeed, "model.embed_tokens.weight", {151936, 64});
  EXPECT_EQ(embed.kind(), WeightKind::kMatrix);
  EXPECT_EQ(Hex64(embed.base()), "f662d795d5c6d157");
  const std::vector<uint16_t> embed_hex = {0x3d90, 0x3dba, 0xbd6f, 0x3cd1};
  const std::vector<float> embed_values = {0.0703125f, 0.0908203125f, -0.058349609375f, 0.0255126953125f};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(embed.At(i), embed_hex[i]) << i;
    EXPECT_EQ(core::Bf16ToFloat(embed.At(i)), embed_values[i]) << i;
  }
  const TensorGenerator norm(kSeed, "visual.blocks.0.norm1.weight", {64});
  EXPECT_EQ(norm.kind(), WeightKind::kNorm);
  const std::vector<float> norm_values = {1.0f, 1.0625f, 0.9296875f, 0.9296875f};
  const std::vector<uint16_t> norm_hex = {0x3f80, 0x3f88, 0x3f6e, 0x3f6e};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(norm.At(i), norm_hex[i]) << i;
    EXPECT_EQ(core::Bf16ToFloat(norm.At(i)), norm_values[i]) << i;
  }
  const TensorGenerator bias(kSeed, "visual.blocks.0.attn.qkv.bias", {192});
  EXPECT_EQ(bias.kind(), WeightKind::kBias);
  const std::vector<uint16_t> bias_hex = {0x3bcc, 0xba88, 0x3c3e, 0x3c88};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bias.At(i), bias_hex[i]) << i;
}

TEST(SyntheticWeights, KindFanInAndBaseMatchManifests) {
  for (const char* file : {"weights/tiny_tensors.json", "weights/vision3b_tensors.json"}) {
    const nlohmann::json m = iris::testing::LoadDataJson(file);
    const uint64_t seed = std::stoull(m["seed"].get<std::string>(), nullptr, 16);
    for (const auto& t : m["tensors"]) {
      const std::string name = t["name"].get<std::string>();
      const auto shape = t["shape"].get<std::vector<int64_t>>();
      SCOPED_TRACE(name);
      EXPECT_STREQ(KindName(KindOf(name, shape)), t["kind"].get<std::string>().c_str());
      if (!t["fan_in"].is_null()) {
        EXPECT_EQ(FanIn(shape), t["fan_in"].get<int64_t>());
      }
      EXPECT_EQ(Hex64(Fnv1a64(name)), t["fnv1a64"].get<std::string>());
      const TensorGenerator gen(seed, name, shape);
      EXPECT_EQ(Hex64(gen.base()), t["base"].get<std::string>());
      const auto first8 = t["first8_bf16_hex"].get<std::vector<std::string>>();
      for (size_t i = 0; i < first8.size(); ++i) EXPECT_EQ(Hex16(gen.At(static_cast<int64_t>(i))), first8[i]);
    }
  }
}

TEST(SyntheticWeights, ParallelFillEqualsElementwise) {
  for (const char* name : {"model.embed_tokens.weight", "model.norm.weight", "x.bias"}) {
    const std::vector<int64_t> shape =
        std::string(name) == "model.embed_tokens.weight" ? std::vector<int64_t>{151936, 2048}
                                                          : std::vector<int64_t>{1 << 22};
    const TensorGenerator gen(0x5EED000000000003ull, name, shape);
    const int64_t begin = 1234567, count = 300001;  // odd sizes, the OpenMP path
    std::vector<uint16_t> out(count);
    gen.Fill(begin, count, out.data());
    for (int64_t j = 0; j < count; ++j) {
      if (out[j] != gen.At(begin + j)) {
        ADD_FAILURE() << name << " element " << begin + j;
        break;
      }
    }
  }
}

// --- Presets ---

std::vector<std::pair<std::string, std::vector<int64_t>>> ManifestList(const std::string& file) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const nlohmann::json manifest = iris::testing::LoadDataJson(file);
  for (const auto& t : manifest["tensors"]) {
    out.emplace_back(t["name"].get<std::string>(), t["shape"].get<std::vector<int64_t>>());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> SpecList(const std::vector<TensorSpec>& specs) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const TensorSpec& s : specs) out.emplace_back(s.name, s.shape);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Presets, TensorListsMatchManifests) {
  ASSERT_NE(FindPreset("tiny"), nullptr);
  ASSERT_NE(FindPreset("3b"), nullptr);
  EXPECT_EQ(SpecList(PresetTensors(*FindPreset("tiny"), false)), ManifestList("weights/tiny_tensors.json"));
  EXPECT_EQ(SpecList(PresetTensors(*FindPreset("3b"), true)), ManifestList("weights/vision3b_tensors.json"));
  EXPECT_EQ(FindPreset("nope"), nullptr);
}

TEST(Presets, ParameterCounts) {
  EXPECT_EQ(ParameterCount(PresetTensors(*FindPreset("tiny"), false)), 10122432);
  EXPECT_EQ(ParameterCount(PresetTensors(*FindPreset("3b"), true)), 668684288);
  // Qwen2.5-VL-3B-Instruct: 3.75 B parameters with tied embeddings.
  EXPECT_EQ(ParameterCount(PresetTensors(*FindPreset("3b"), false)), 3754622976);
  EXPECT_EQ(ParameterCount(PresetTensors(*FindPreset("small"), false)), 295157600);
  for (const Preset& p : AllPresets()) {
    bool has_lm_head = false;
    for (const TensorSpec& s : PresetTensors(p, false)) has_lm_head |= s.name == "lm_head.weight";
    EXPECT_EQ(has_lm_head, !p.text.tie_word_embeddings) << p.name;
  }
}

TEST(Presets, TinyJsonFilesEqualTheGoldenFixture) {
  const Preset& tiny = *FindPreset("tiny");
  EXPECT_EQ(ConfigJson(tiny), ReadFile(iris::testing::DataPath("tiny-qwen2.5-vl/config.json")));
  EXPECT_EQ(GenerationConfigJson(tiny), ReadFile(iris::testing::DataPath("tiny-qwen2.5-vl/generation_config.json")));
  EXPECT_EQ(PreprocessorConfigJson(tiny),
            ReadFile(iris::testing::DataPath("tiny-qwen2.5-vl/preprocessor_config.json")));
}

TEST(Presets, ThreeBVisionConfigEqualsGoldenVisionConfig) {
  const nlohmann::json config = nlohmann::json::parse(ConfigJson(*FindPreset("3b")));
  EXPECT_EQ(config["vision_config"], iris::testing::LoadDataJson("vision-3b/vision_config.json"));
}

TEST(Presets, ConfigsRoundTripThroughLoadModelConfig) {
  for (const Preset& p : AllPresets()) {
    if (p.family != core::ModelFamily::kQwen2_5_VL) continue;  // FamilyPresets below
    SCOPED_TRACE(p.name);
    TempDir dir("config_" + p.name);
    std::ofstream(dir / "config.json") << ConfigJson(p);
    std::ofstream(dir / "preprocessor_config.json") << PreprocessorConfigJson(p);
    auto c = core::LoadModelConfig(dir.path());
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->model_type, "qwen2_5_vl");
    EXPECT_EQ(c->torch_dtype, "bfloat16");
    ASSERT_TRUE(c->has_text);
    EXPECT_EQ(c->vision.depth, p.vision.depth);
    EXPECT_EQ(c->vision.hidden_size, p.vision.hidden_size);
    EXPECT_EQ(c->vision.intermediate_size, p.vision.intermediate_size);
    EXPECT_EQ(c->vision.num_heads, p.vision.num_heads);
    EXPECT_EQ(c->vision.out_hidden_size, p.vision.out_hidden_size);
    EXPECT_EQ(c->vision.fullatt_block_indexes, p.vision.fullatt_block_indexes);
    EXPECT_EQ(c->vision.patch_size, 14);
    EXPECT_EQ(c->vision.spatial_merge_size, 2);
    EXPECT_EQ(c->vision.temporal_patch_size, 2);
    EXPECT_EQ(c->vision.window_size, 112);
    EXPECT_EQ(c->text.hidden_size, p.text.hidden_size);
    EXPECT_EQ(c->text.intermediate_size, p.text.intermediate_size);
    EXPECT_EQ(c->text.num_hidden_layers, p.text.num_hidden_layers);
    EXPECT_EQ(c->text.num_attention_heads, p.text.num_attention_heads);
    EXPECT_EQ(c->text.num_key_value_heads, p.text.num_key_value_heads);
    EXPECT_EQ(c->text.vocab_size, p.text.vocab_size);
    EXPECT_EQ(c->text.max_position_embeddings, p.text.max_position_embeddings);
    EXPECT_EQ(c->text.rope_theta, 1e6);
    EXPECT_EQ(c->text.rms_norm_eps, 1e-6f);
    EXPECT_EQ(c->text.tie_word_embeddings, p.text.tie_word_embeddings);
    EXPECT_EQ(c->text.mrope_section, p.text.mrope_section);
    EXPECT_EQ(c->image_token_id, 151655);
    EXPECT_EQ(c->video_token_id, 151656);
    EXPECT_EQ(c->vision_start_token_id, 151652);
    EXPECT_EQ(c->vision_end_token_id, 151653);
    EXPECT_EQ(c->bos_token_id, 151643);
    EXPECT_EQ(c->eos_token_id, 151645);
    auto pp = core::LoadPreprocessorConfig(dir.path());
    ASSERT_TRUE(pp.ok()) << pp.status();
    EXPECT_EQ(pp->min_pixels, 3136);
    EXPECT_EQ(pp->max_pixels, 12845056);

    const nlohmann::json gen = nlohmann::json::parse(GenerationConfigJson(p));
    EXPECT_EQ(gen["bos_token_id"], 151643);
    EXPECT_EQ(gen["pad_token_id"], 151643);
    EXPECT_EQ(gen["eos_token_id"], nlohmann::json({151645, 151643}));
  }
  // The shapes the presets promise.
  const Preset& b = *FindPreset("3b");
  EXPECT_EQ(b.text.head_dim(), 128);
  EXPECT_EQ(b.vision.hidden_size / b.vision.num_heads, 80);
  const Preset& s = *FindPreset("small");
  EXPECT_EQ(s.text.head_dim(), 128);
  EXPECT_EQ(s.vision.hidden_size / s.vision.num_heads, 80);
}

// --- The fixtures' checkpoints (ctest fixtures make_model_tiny and make_model_3b) ---

TEST(MakeModelFixture, TinyEqualsGoldenManifest) {
  ExpectCheckpointMatchesManifest(iris::testing::ModelPath("tiny"), "weights/tiny_tensors.json", 80);
}

TEST(MakeModelFixture, TinyFolderHasTheFixtureJsonFiles) {
  const std::string dir = iris::testing::ModelPath("tiny");
  for (const char* f : {"config.json", "generation_config.json", "preprocessor_config.json"}) {
    EXPECT_EQ(ReadFile(dir + "/" + f), ReadFile(iris::testing::DataPath(std::string("tiny-qwen2.5-vl/") + f))) << f;
  }
  auto file = core::SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
}

TEST(MakeModelFixture, Vision3bEqualsGoldenManifest) {
  ExpectCheckpointMatchesManifest(iris::testing::ModelPath("vision-3b"), "weights/vision3b_tensors.json", 390);
  auto c = core::LoadModelConfig(iris::testing::ModelPath("vision-3b"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vision.depth, 32);
  EXPECT_EQ(c->text.num_hidden_layers, 36);
}

// --- Writing: sharding, vision-only, tokenizer copies ---

TEST(MakeModelWriter, ShardsReadBackIdentical) {
  const Preset& tiny = *FindPreset("tiny");
  TempDir dir("shards");
  WriteOptions options;
  options.out_dir = dir.path();
  options.max_shard_bytes = 256 << 10;  // the 19 MB embedding gets a shard of its own
  auto summary = WriteSyntheticModel(tiny, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->tensors, 80);
  EXPECT_EQ(summary->parameters, 10122432);
  EXPECT_EQ(summary->bytes, 2u * 10122432);
  EXPECT_GT(summary->files, 2);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));

  std::ifstream in(dir / "model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), summary->bytes);
  EXPECT_EQ(index["weight_map"].size(), 80u);
  std::set<std::string> shard_names;
  for (const auto& [name, file] : index["weight_map"].items()) shard_names.insert(file.get<std::string>());
  EXPECT_EQ(static_cast<int>(shard_names.size()), summary->files);
  char expected[64];
  std::snprintf(expected, sizeof expected, "model-00001-of-%05d.safetensors", summary->files);
  EXPECT_TRUE(shard_names.count(expected)) << expected;
  for (const std::string& f : shard_names) {
    EXPECT_TRUE(fs::exists(dir / f)) << f;
    auto st = core::SafetensorsFile::Open(dir / f);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ((*st)->metadata().at("format"), "pt");
    // Only the embedding may exceed the limit, and then alone.
    uint64_t bytes = 0;
    for (const auto& e : (*st)->entries()) bytes += e.end - e.begin;
    if (bytes > options.max_shard_bytes) {
      EXPECT_EQ((*st)->entries().size(), 1u) << f;
    }
  }

  auto ckpt = core::Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->Names().size(), 80u);
  for (const TensorSpec& s : PresetTensors(tiny, false)) {
    auto t = ckpt->Get(s.name);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->shape(), s.shape) << s.name;
    const TensorGenerator gen(tiny.seed, s.name, s.shape);
    std::vector<uint16_t> want(gen.numel());
    gen.Fill(0, gen.numel(), want.data());
    EXPECT_EQ(std::memcmp(t->raw(), want.data(), t->nbytes()), 0) << s.name;
  }
  ExpectCheckpointMatchesManifest(dir.path(), "weights/tiny_tensors.json", 80);

  // Writing a single file into the same folder removes the old shards and index.
  options.max_shard_bytes = kDefaultMaxShardBytes;
  ASSERT_TRUE(WriteSyntheticModel(tiny, options).ok());
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / expected));
  ExpectCheckpointMatchesManifest(dir.path(), "weights/tiny_tensors.json", 80);
}

TEST(MakeModelWriter, HiddenMaxShardBytesFlagShardsTheSameWeights) {
  TempDir dir("flag_shards");
  const RunResult r = RunTool("--preset tiny --max-shard-bytes=1000000 --out " + dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("80 tensors"));
  EXPECT_THAT(r.output, HasSubstr("10122432 parameters"));
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  ExpectCheckpointMatchesManifest(dir.path(), "weights/tiny_tensors.json", 80);
}

TEST(MakeModelWriter, VisionOnlyWritesOnlyVisualTensors) {
  TempDir dir("vision_only");
  const RunResult r = RunTool("--preset tiny --vision-only --out " + dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ckpt = core::Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const auto names = ckpt->Names();
  EXPECT_EQ(names.size(), 4u * 12 + 6);
  for (const std::string& n : names) EXPECT_EQ(n.rfind("visual.", 0), 0u) << n;
  auto c = core::LoadModelConfig(dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_text);
}

TEST(MakeModelWriter, TokenizerFromCopiesTheTokenizerFiles) {
  TempDir dir("tokenizer");
  const std::string src = iris::testing::DataPath("tiny-qwen2.5-vl");
  const RunResult r = RunTool("--preset tiny --vision-only --tokenizer-from " + src + " --out " + dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.json"}) {
    ASSERT_TRUE(fs::exists(dir / f)) << f;
    EXPECT_EQ(ReadFile(dir / f), ReadFile(src + "/" + f)) << f;
  }
  const RunResult bad = RunTool("--preset tiny --tokenizer-from /nonexistent/iris --out " + dir.path());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("/nonexistent/iris"));
}

// --- Bad arguments ---

TEST(MakeModelCli, BadArgumentsFailWithAMessage) {
  TempDir dir("bad_args");
  struct Case {
    std::string args;
    std::string message;
  };
  std::ofstream(dir / "a_file") << "x";
  const std::vector<Case> cases = {
      {"--preset huge --out " + dir.path(), "unknown preset \"huge\""},
      {"--out " + dir.path(), "--preset is required"},
      {"--preset tiny", "--out DIR is required"},
      {"--preset tiny --dtype f32 --out " + dir.path(), "only bf16"},
      {"--preset tiny --out " + (dir / "a_file") + "/sub", "cannot create output directory"},
      {"--preset tiny --out " + dir.path() + " extra", "unexpected argument"},
      {"--preset tiny --bogus-flag --out " + dir.path(), "bogus"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const RunResult r = RunTool(c.args);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message));
  }
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
}

TEST(MakeModelCli, HelpDocumentsThePresets) {
  const RunResult r = RunTool("--help");
  for (const char* s : {"tiny", "small", "3b", "--preset", "--vision-only", "--tokenizer-from", "0x5EED000000000003",
                        "tiny-qwen2-text", "tiny-qwen2-vl", "qwen2.5-72b", "Qwen2ForCausalLM", "--config-only"}) {
    EXPECT_THAT(r.output, HasSubstr(s));
  }
}

// The 32B/72B presets: only their JSON files, the tensor list and the memory estimate; asking for
// their weights is refused before anything is written.
TEST(MakeModelCli, ConfigOnlyPresetsPrintTheirMemoryEstimate) {
  TempDir dir("config_only");
  const RunResult refused = RunTool("--preset qwen2.5-72b --out " + dir.path());
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("is config-only (145 GB of weights): pass --config-only"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  const RunResult r = RunTool("--preset qwen2.5-72b --config-only --out " + dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("963 tensors, 72706203648 parameters (Qwen2ForCausalLM)"));
  EXPECT_THAT(r.output, HasSubstr("iris-server would need weights 145.41 GB (bf16, 72.71 B parameters)"));
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  EXPECT_TRUE(fs::exists(dir / "generation_config.json"));
  EXPECT_FALSE(fs::exists(dir / "preprocessor_config.json"));  // a text model
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  auto c = core::LoadModelConfig(dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->text.num_hidden_layers, 80);
  EXPECT_EQ(c->text.num_key_value_heads, 8);
  EXPECT_FALSE(c->text.tie_word_embeddings);
}

}  // namespace
}  // namespace iris::tools
