// The text-only Qwen2 family (tiny-qwen2-text, tied and untied LM head) against the reference:
// config parsing and its refusals, the presets' files and weights (every tensor's SHA-256 and the
// whole file's), the chat template's default system prompt, prompt ids and 1-D positions, prompt
// logits (f32 and bf16), greedy tokens, a teacher-forced continuation through the paged cache, and
// the engine's batched == sequential property on this family. Images are refused naming the part.
// Qwen2-VL (tiny-qwen2-vl): prompt ids, M-RoPE positions, logits and greedy tokens of the whole
// model, and batched == sequential with images.
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/prompt_builder.h"
#include "gtest/gtest.h"
#include "llm/chat_template.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "tools/iris-make-model/presets.h"

namespace iris {
namespace {

using json = nlohmann::json;
using testing::Int64Values;
using testing::LoadGolden;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const json& Cases() {
  static const json cases = testing::LoadDataJson("model/manifest_qwen2text.json")["cases"];
  return cases;
}

std::string GoldenFile(const json& c) { return c["arrays"]["file"].get<std::string>().substr(0); }

std::vector<engine::ChatInputMessage> Messages(const json& c) {
  std::vector<engine::ChatInputMessage> out;
  for (const auto& m : c["messages"]) {
    engine::ChatInputPart part;
    part.text = m["content"].get<std::string>();
    out.push_back({m["role"].get<std::string>(), {part}});
  }
  return out;
}

std::unique_ptr<engine::Model> Load(const std::string& name, kernels::ComputeType compute) {
  auto model = engine::LoadModel(testing::ModelPath(name), engine::ModelOptions{compute, {}, {}, {}});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

std::unique_ptr<engine::Engine> MakeEngine(const std::string& name, kernels::ComputeType compute,
                                           const engine::EngineOptions& options = {}) {
  auto engine = engine::Engine::Create(Load(name, compute), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

// --- config.json ---

json TextConfig() { return testing::LoadDataJson("tiny-qwen2-text/config.json"); }

TEST(Qwen2TextConfig, ParsesBothGoldenConfigs) {
  for (const char* dir : {"tiny-qwen2-text", "tiny-qwen2-text-untied"}) {
    SCOPED_TRACE(dir);
    auto c = core::LoadModelConfig(testing::DataPath(dir));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->family, core::ModelFamily::kQwen2Text);
    EXPECT_FALSE(c->has_vision());
    EXPECT_TRUE(c->has_text);
    EXPECT_FALSE(c->text.mrope);
    EXPECT_EQ(c->text.mrope_section, (std::vector<int>{8, 0, 0}));
    EXPECT_EQ(c->text.rope_theta, 1e6);
    EXPECT_EQ(c->text.max_position_embeddings, 32768);
    EXPECT_EQ(c->text.sliding_window, 32768);
    EXPECT_EQ(c->text.num_key_value_heads, 2);
    EXPECT_EQ(c->text.tie_word_embeddings, std::string(dir) == "tiny-qwen2-text");
  }
  // Without model_type, the architecture says it.
  json j = TextConfig();
  j.erase("model_type");
  auto c = core::ParseModelConfig(j, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, core::ModelFamily::kQwen2Text);
}

TEST(Qwen2TextConfig, RefusesWhatIsNotImplementedNamingTheField) {
  struct Case {
    std::function<void(json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["use_sliding_window"] = true; }, "\"use_sliding_window\" is true: sliding-window attention"},
      {[](json& j) { j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}}; }, "\"rope_scaling\" is set"},
      {[](json& j) { j["model_type"] = "llama"; }, "\"model_type\" is \"llama\", not one iris serves"},
      {[](json& j) { j["vision_config"] = json::object(); }, "\"vision_config\" is present in a text-only"},
      {[](json& j) { j["use_sliding_window"] = "no"; }, "\"use_sliding_window\" must be a boolean"},
  };
  for (const Case& c : cases) {
    json j = TextConfig();
    c.edit(j);
    auto parsed = core::ParseModelConfig(j, "config.json");
    ASSERT_FALSE(parsed.ok()) << c.message;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos) << parsed.status();
  }
  // The reference's own setting (false, with a window as long as the context) loads.
  json j = TextConfig();
  j["use_sliding_window"] = false;
  EXPECT_TRUE(core::ParseModelConfig(j, "config.json").ok());
}

TEST(Qwen2VlConfig, ParsesTheTowerAndRefusesWhatItCannotRun) {
  auto c = core::LoadModelConfig(testing::DataPath("tiny-qwen2-vl"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, core::ModelFamily::kQwen2_VL);
  EXPECT_TRUE(c->has_vision());
  EXPECT_EQ(c->vision.hidden_size, 64);        // embed_dim
  EXPECT_EQ(c->vision.intermediate_size, 128);  // embed_dim * mlp_ratio
  EXPECT_EQ(c->vision.out_hidden_size, 64);     // hidden_size
  EXPECT_EQ(c->vision.norm, core::VisionNorm::kLayerNorm);
  EXPECT_EQ(c->vision.mlp, core::VisionMlp::kQuickGelu);
  EXPECT_FALSE(c->vision.windowed);
  for (int b = 0; b < c->vision.depth; ++b) EXPECT_TRUE(c->vision.IsFullAttention(b)) << b;
  EXPECT_TRUE(c->text.mrope);
  EXPECT_EQ(c->text.mrope_section, (std::vector<int>{2, 3, 3}));
  const json base = testing::LoadDataJson("tiny-qwen2-vl/config.json");
  struct Case {
    std::function<void(json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["vision_config"]["mlp_ratio"] = 2.01; }, "\"vision_config.mlp_ratio\" times embed_dim 64"},
      {[](json& j) { j["vision_config"]["hidden_act"] = "silu"; }, "must be \"quick_gelu\" (Qwen2-VL)"},
      {[](json& j) { j["vision_config"].erase("embed_dim"); }, "\"vision_config.embed_dim\" is missing"},
      {[](json& j) { j.erase("rope_scaling"); }, "rope_scaling.mrope_section\" is missing"},
      {[](json& j) { j["use_sliding_window"] = true; }, "sliding-window attention is not implemented"},
  };
  for (const Case& k : cases) {
    json j = base;
    k.edit(j);
    auto parsed = core::ParseModelConfig(j, "config.json");
    ASSERT_FALSE(parsed.ok()) << k.message;
    EXPECT_NE(parsed.status().message().find(k.message), std::string::npos) << parsed.status();
  }
}

// --- The chat template ---

TEST(ChatStyle, DefaultSystemPromptComesFromTheTemplate) {
  auto text = llm::LoadChatStyle(testing::DataPath("tiny-qwen2-text"));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->default_system_prompt, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  auto vl = llm::LoadChatStyle(testing::DataPath("tiny-qwen2.5-vl"));
  ASSERT_TRUE(vl.ok()) << vl.status();
  EXPECT_EQ(vl->default_system_prompt, "You are a helpful assistant.");
  // A ChatML template without a default system turn inserts none; a non-ChatML one is refused.
  auto none = llm::ChatStyleFromTemplate(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>\\n'}}{% endfor %}");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->default_system_prompt.has_value());
  auto other = llm::ChatStyleFromTemplate("{{ bos_token }}{% for m in messages %}<｜User｜>{{ m.content }}{% endfor %}");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("ChatML"), std::string::npos) << other.status();
}

// --- iris-make-model presets (ctest fixtures make_model_tiny_qwen2_text*) ---

std::vector<std::pair<std::string, std::vector<int64_t>>> Sorted(std::vector<std::pair<std::string, std::vector<int64_t>>> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(FamilyPresets, TensorListsMatchTheManifests) {
  struct Case {
    const char* preset;
    const char* manifest;
    size_t count;
  };
  for (const Case& c : {Case{"tiny-qwen2-text", "weights/qwen2text_tensors.json", 26},
                        Case{"tiny-qwen2-text-untied", "weights/qwen2text_tensors.json", 27},
                        Case{"tiny-qwen2-vl", "weights/qwen2vl_tensors.json", 81}}) {
    SCOPED_TRACE(c.preset);
    const tools::Preset* p = tools::FindPreset(c.preset);
    ASSERT_NE(p, nullptr);
    std::vector<std::pair<std::string, std::vector<int64_t>>> want, have;
    const json manifest = testing::LoadDataJson(c.manifest);
    for (const auto& t : manifest["tensors"]) {
      const std::string name = t["name"].get<std::string>();
      if (name == "lm_head.weight" && p->text.tie_word_embeddings) continue;
      want.emplace_back(name, t["shape"].get<std::vector<int64_t>>());
    }
    for (const tools::TensorSpec& s : tools::PresetTensors(*p, false)) have.emplace_back(s.name, s.shape);
    EXPECT_EQ(have.size(), c.count);
    EXPECT_EQ(Sorted(have), Sorted(want));
  }
}

TEST(FamilyPresets, FoldersEqualTheGoldenFolders) {
  struct Case {
    const char* preset;
    const char* weights;
  };
  for (const Case& c : {Case{"tiny-qwen2-text", "weights/qwen2text_tensors.json"},
                        Case{"tiny-qwen2-text-untied", "weights/qwen2text_tensors.json"},
                        Case{"tiny-qwen2-vl", "weights/qwen2vl_tensors.json"}}) {
    SCOPED_TRACE(c.preset);
    const std::string dir = testing::ModelPath(c.preset);
    // Every JSON file of the golden folder, byte for byte (tokenizer_config.json included: the
    // text presets carry Qwen2.5-Instruct's text template).
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(testing::DataPath(c.preset))) {
      const std::string name = entry.path().filename().string();
      EXPECT_EQ(ReadFile(dir + "/" + name), ReadFile(entry.path().string())) << name;
      ++files;
    }
    EXPECT_GE(files, 3);
    EXPECT_EQ(std::filesystem::exists(dir + "/chat_template.json"), std::string(c.preset) == "tiny-qwen2-vl");
    // Every tensor's SHA-256, then the whole file's (the reference layout).
    auto ckpt = core::Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    const json manifest = testing::LoadDataJson(c.weights);
    for (const auto& t : manifest["tensors"]) {
      const std::string name = t["name"].get<std::string>();
      if (!ckpt->Has(name)) {
        EXPECT_EQ(name, "lm_head.weight");
        continue;
      }
      auto tensor = ckpt->Get(name);
      ASSERT_TRUE(tensor.ok()) << tensor.status();
      EXPECT_EQ(core::Sha256Hex(tensor->raw(), tensor->nbytes()), t["sha256_bf16_le"].get<std::string>()) << name;
    }
    const std::string file = ReadFile(dir + "/model.safetensors");
    EXPECT_EQ(core::Sha256Hex(file.data(), file.size()),
              manifest["reference_model_safetensors_sha256"][c.preset]["sha256"].get<std::string>());
  }
}

// --- Prompts, logits and greedy tokens against the reference ---

TEST(Qwen2TextGolden, PromptIdsAndOneDimensionalPositions) {
  auto model = Load("tiny-qwen2-text", kernels::ComputeType::kF32);
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(Cases().size(), 6u);
  for (const json& c : Cases()) {
    SCOPED_TRACE(c["case"].get<std::string>());
    auto prompt = engine::BuildPrompt(*model, Messages(c));
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    EXPECT_EQ(std::vector<int64_t>(prompt->ids.begin(), prompt->ids.end()),
              Int64Values(LoadGolden(GoldenFile(c), "input_ids")));
    const std::vector<int64_t> pos = Int64Values(LoadGolden(GoldenFile(c), "position_ids"));  // [1, L]
    for (const auto& axis : prompt->positions.positions) EXPECT_EQ(axis, pos);
    EXPECT_EQ(prompt->positions.rope_delta, 0);
    EXPECT_EQ(static_cast<int64_t>(prompt->ids.size()), c["prompt_len"].get<int64_t>());
  }
}

TEST(Qwen2TextGolden, AnImageIsRefusedNamingThePart) {
  auto model = Load("tiny-qwen2-text", kernels::ComputeType::kF32);
  ASSERT_NE(model, nullptr);
  engine::ChatInputPart text, image;
  text.text = "What is this?";
  image.kind = engine::ChatInputPart::Kind::kImage;
  image.image_bytes = ReadFile(testing::DataPath("images/rgb_300x200.png"));
  auto prompt = engine::BuildPrompt(*model, {{"user", {text, image}}});
  ASSERT_FALSE(prompt.ok());
  EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(prompt.status().message().find("messages[0].content[1].image"), std::string::npos) << prompt.status();
  EXPECT_NE(prompt.status().message().find("text-only"), std::string::npos) << prompt.status();
  // Text that spells image tokens is just text for a text-only model (the reference tokenizes it).
  engine::ChatInputPart spelled;
  spelled.text = "<|vision_start|><|image_pad|><|vision_end|>";
  auto ok = engine::BuildPrompt(*model, {{"user", {spelled}}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->images.empty());
}

// One request per case on its model: prompt logits against logits_last, and 20 greedy tokens.
void CheckGreedyCases(kernels::ComputeType compute, double max_rel) {
  std::unique_ptr<engine::Engine> tied = MakeEngine("tiny-qwen2-text", compute);
  std::unique_ptr<engine::Engine> untied = MakeEngine("tiny-qwen2-text-untied", compute);
  for (const json& c : Cases()) {
    const std::string name = c["case"].get<std::string>();
    SCOPED_TRACE(name);
    engine::Engine& eng = c["tie_word_embeddings"].get<bool>() ? *tied : *untied;
    auto prompt = engine::BuildPrompt(eng.model(), Messages(c));
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    engine::Request r;
    r.id = name;
    r.prompt = std::move(*prompt);
    r.sampling.max_tokens = 20;
    r.sampling.ignore_eos = !c["greedy"]["stopped_on_eos"].get<bool>();
    r.capture_prompt_logits = true;
    auto out = engine::GenerateBlocking(eng, std::move(r));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(out->status.ok()) << out->status;
    const core::Tensor ref = LoadGolden(GoldenFile(c), "logits_last");
    ASSERT_EQ(static_cast<int64_t>(out->prompt_logits.size()), ref.numel());
    const double rel = testing::RelativeL2(out->prompt_logits.data(), ref.data<float>(), ref.numel());
    EXPECT_LE(rel, max_rel);
    if (compute == kernels::ComputeType::kF32) {
      // Elementwise too, as the golden README suggests; every greedy gap is >= 0.012.
      int64_t bad = 0;
      for (int64_t i = 0; i < ref.numel(); ++i) {
        const float a = out->prompt_logits[i], b = ref.data<float>()[i];
        if (!(std::fabs(a - b) <= 1e-4f + 1e-4f * std::fabs(b))) ++bad;
      }
      EXPECT_EQ(bad, 0);
      const std::vector<int64_t> want = c["greedy"]["tokens"].get<std::vector<int64_t>>();
      EXPECT_EQ(std::vector<int64_t>(out->token_ids.begin(), out->token_ids.end()), want);
      EXPECT_EQ(out->text, c["greedy"]["text"].get<std::string>());
    } else {
      EXPECT_GT(rel, 0.0) << "bf16 gave f32-identical logits";
    }
  }
}

TEST(Qwen2TextGolden, PromptLogitsAndGreedyTokensF32) { CheckGreedyCases(kernels::ComputeType::kF32, 1e-4); }

TEST(Qwen2TextGolden, PromptLogitsBf16) { CheckGreedyCases(kernels::ComputeType::kBF16, 2e-2); }

// The untied model's 20 greedy tokens are 19 different ones: decode positions and the cache are
// checked by the previous test; here the forced continuation's argmax at every position, with a
// prompt that starts at the end of the forced text (prefill of prompt + forced tokens).
TEST(Qwen2TextGolden, ForcedContinuationArgmax) {
  auto eng = MakeEngine("tiny-qwen2-text", kernels::ComputeType::kF32);
  for (const json& c : Cases()) {
    if (!c["tie_word_embeddings"].get<bool>()) continue;
    SCOPED_TRACE(c["case"].get<std::string>());
    auto prompt = engine::BuildPrompt(eng->model(), Messages(c));
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    const std::vector<int64_t> forced = c["forced"]["tokens"].get<std::vector<int64_t>>();
    const std::vector<int64_t> argmax = c["forced"]["argmax_per_position"].get<std::vector<int64_t>>();
    ASSERT_EQ(argmax.size(), forced.size() + 1);
    // Prompt + the first k forced tokens: the last position's argmax is argmax[k].
    for (size_t k : {size_t{0}, size_t{5}, forced.size()}) {
      engine::Prompt p = *prompt;
      for (size_t i = 0; i < k; ++i) p.ids.push_back(static_cast<int32_t>(forced[i]));
      p.positions = llm::TextPositions(static_cast<int64_t>(p.ids.size()));
      engine::Request r;
      r.id = "forced";
      r.prompt = std::move(p);
      r.sampling.max_tokens = 1;
      r.sampling.ignore_eos = true;
      auto out = engine::GenerateBlocking(*eng, std::move(r));
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->token_ids.size(), 1u);
      EXPECT_EQ(out->token_ids[0], argmax[k]) << "after " << k << " forced tokens";
    }
  }
}

// --- The engine: concurrent requests give what each gives alone, on each new family ---

struct Spec {
  std::string text;
  std::string image;  // a tests/data/images file, or none (text-only models get none)
  int64_t max_tokens;
};

void ExpectBatchedEqualsSequential(const std::string& name, const std::vector<Spec>& specs) {
  SCOPED_TRACE(name);
  auto make = [&](engine::Engine& eng, int i) {
    std::vector<engine::ChatInputPart> parts;
    if (!specs[i].image.empty()) {
      engine::ChatInputPart image;
      image.kind = engine::ChatInputPart::Kind::kImage;
      image.image_bytes = ReadFile(testing::DataPath("images/" + specs[i].image));
      parts.push_back(image);
    }
    engine::ChatInputPart text;
    text.text = specs[i].text;
    parts.push_back(text);
    auto prompt = engine::BuildPrompt(eng.model(), {{"user", parts}});
    EXPECT_TRUE(prompt.ok()) << prompt.status();
    engine::Request r;
    r.id = absl::StrCat("r", i);
    r.prompt = std::move(*prompt);
    r.sampling.max_tokens = specs[i].max_tokens;
    r.sampling.ignore_eos = true;
    return r;
  };
  std::vector<std::vector<int32_t>> alone;
  {
    auto eng = MakeEngine(name, kernels::ComputeType::kF32);
    for (size_t i = 0; i < specs.size(); ++i) {
      auto out = engine::GenerateBlocking(*eng, make(*eng, static_cast<int>(i)));
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(static_cast<int64_t>(out->token_ids.size()), specs[i].max_tokens);
      alone.push_back(out->token_ids);
    }
  }
  engine::EngineOptions o;
  o.max_num_batched_tokens = 128;  // the long prompts are prefilled in chunks beside decodes
  auto eng = MakeEngine(name, kernels::ComputeType::kF32, o);
  absl::Mutex mu;
  std::vector<std::vector<int32_t>> got(specs.size());
  int finished = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    engine::Request r = make(*eng, static_cast<int>(i));
    r.on_output = [&, i](engine::RequestOutput out) {
      absl::MutexLock lock(&mu);
      got[i].insert(got[i].end(), out.token_ids.begin(), out.token_ids.end());
      if (out.finished) ++finished;
    };
    ASSERT_TRUE(eng->Submit(std::move(r)).ok());
  }
  {
    absl::MutexLock lock(&mu);
    std::pair<int*, int> all{&finished, static_cast<int>(specs.size())};
    mu.Await(absl::Condition(+[](std::pair<int*, int>* f) { return *f->first == f->second; }, &all));
  }
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(got[i], alone[i]) << "request " << i;
  const engine::EngineStats stats = eng->stats();
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_GT(stats.steps, 0);
}

std::vector<Spec> Workload(bool images) {
  std::string long_text;
  for (int i = 0; i < 30; ++i) long_text += absl::StrCat("Line ", i, " of a long text prompt. ");
  const char* files[] = {"rgb_300x200.png", "gray_56x56.png", "rgb_350x70.png"};
  std::vector<Spec> specs;
  for (int i = 0; i < 12; ++i) {
    Spec s{i % 3 == 2 ? long_text : absl::StrCat("Tell me about number ", i, "."), "", 4 + (i * 5) % 23};
    if (images && i % 2 == 1) s.image = files[i % 3];
    specs.push_back(s);
  }
  return specs;
}

TEST(FamilyEngine, Qwen2TextBatchedEqualsSequential) {
  ExpectBatchedEqualsSequential("tiny-qwen2-text", Workload(false));
  ExpectBatchedEqualsSequential("tiny-qwen2-text-untied", Workload(false));
}

TEST(FamilyEngine, Qwen2VlBatchedEqualsSequential) { ExpectBatchedEqualsSequential("tiny-qwen2-vl", Workload(true)); }

// --- Qwen2-VL: the whole model against model/manifest_qwen2vl.json ---

std::vector<engine::ChatInputMessage> VlMessages(const json& c) {
  std::vector<engine::ChatInputMessage> out;
  size_t image = 0;
  for (const auto& m : c["messages"]) {
    engine::ChatInputMessage msg{m["role"].get<std::string>(), {}};
    if (m["content"].is_string()) {
      engine::ChatInputPart part;
      part.text = m["content"].get<std::string>();
      msg.parts.push_back(part);
    } else {
      for (const auto& p : m["content"]) {
        engine::ChatInputPart part;
        if (p["type"] == "image") {
          part.kind = engine::ChatInputPart::Kind::kImage;
          part.image_bytes = ReadFile(testing::DataPath(c["images"][image++].get<std::string>()));
        } else {
          part.text = p["text"].get<std::string>();
        }
        msg.parts.push_back(part);
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

void CheckQwen2VlCases(kernels::ComputeType compute, double max_rel) {
  auto eng = MakeEngine("tiny-qwen2-vl", compute);
  EXPECT_EQ(eng->model().config.family, core::ModelFamily::kQwen2_VL);
  const json cases = testing::LoadDataJson("model/manifest_qwen2vl.json")["cases"];
  ASSERT_EQ(cases.size(), 3u);
  for (const json& c : cases) {
    const std::string name = c["case"].get<std::string>();
    SCOPED_TRACE(name);
    const std::string file = c["arrays"]["file"].get<std::string>();
    auto prompt = engine::BuildPrompt(eng->model(), VlMessages(c));
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    EXPECT_EQ(std::vector<int64_t>(prompt->ids.begin(), prompt->ids.end()), Int64Values(LoadGolden(file, "input_ids")));
    std::vector<int64_t> pos;  // [3, 1, L] axis-major
    for (const auto& axis : prompt->positions.positions) pos.insert(pos.end(), axis.begin(), axis.end());
    EXPECT_EQ(pos, Int64Values(LoadGolden(file, "position_ids")));
    engine::Request r;
    r.id = name;
    r.prompt = std::move(*prompt);
    r.sampling.max_tokens = 20;
    r.sampling.ignore_eos = !c["greedy"]["stopped_on_eos"].get<bool>();
    r.capture_prompt_logits = true;
    auto out = engine::GenerateBlocking(*eng, std::move(r));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(out->status.ok()) << out->status;
    const core::Tensor ref = LoadGolden(file, "logits_last");
    ASSERT_EQ(static_cast<int64_t>(out->prompt_logits.size()), ref.numel());
    const double rel = testing::RelativeL2(out->prompt_logits.data(), ref.data<float>(), ref.numel());
    EXPECT_LE(rel, max_rel);
    EXPECT_EQ(out->usage.image_tokens, c.value("num_image_tokens", int64_t{0}));
    if (compute == kernels::ComputeType::kF32) {
      EXPECT_EQ(std::vector<int64_t>(out->token_ids.begin(), out->token_ids.end()),
                Int64Values(LoadGolden(file, "greedy_tokens")));
      EXPECT_EQ(out->text, c["greedy"]["text"].get<std::string>());
    }
  }
}

TEST(Qwen2VlGolden, PromptsPositionsLogitsAndGreedyTokensF32) {
  CheckQwen2VlCases(kernels::ComputeType::kF32, 1e-4);
}

TEST(Qwen2VlGolden, PromptLogitsBf16) { CheckQwen2VlCases(kernels::ComputeType::kBF16, 2e-2); }

}  // namespace
}  // namespace iris
