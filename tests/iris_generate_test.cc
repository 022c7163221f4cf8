// iris-generate end to end, as a user runs it: a subprocess on the tiny model with the golden chats
// (tests/data/model), its --dump checked against the reference (ids and positions exactly, logits
// to 1e-4 in f32 and 2e-2 in bf16), its greedy text against the reference's, and its errors
// checked for a message and a non-zero exit.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace iris {
namespace {

using json = nlohmann::json;

struct Result {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("iris_generate_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result RunGenerate(const std::string& args) {
  Result r;
  const std::string err_file = TempPath("stderr.txt");
  const std::string cmd = std::string(IRIS_GENERATE_BIN) + " " + args + " 2>" + err_file;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = ReadText(err_file);
  std::filesystem::remove(err_file);
  return r;
}

std::string Model() { return "--model " + testing::ModelPath("tiny"); }

const json& Cases() {
  static const json cases = testing::LoadDataJson("model/manifest_tiny.json")["cases"];
  return cases;
}

// The case's messages as a --messages file: image parts get the case's files, in order.
std::string WriteMessages(const json& c, const std::string& name) {
  json messages = c["messages"];
  size_t next = 0;
  for (json& m : messages) {
    if (!m["content"].is_array()) continue;
    for (json& part : m["content"]) {
      if (part["type"] == "image") part["image"] = testing::DataPath(c["images"].at(next++).get<std::string>());
    }
  }
  EXPECT_EQ(next, c.contains("images") ? c["images"].size() : 0u);
  const std::string path = TempPath(name + ".json");
  std::ofstream(path) << messages.dump(2);
  return path;
}

struct Dump {
  std::vector<int64_t> input_ids, position_ids;
  core::Tensor logits;
};

Dump ReadDump(const std::string& path, int64_t position_rows = 3) {
  Dump d;
  auto file = core::SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return d;
  auto ids = (*file)->Get("input_ids");
  auto pos = (*file)->Get("position_ids");
  auto logits = (*file)->Get("logits");
  EXPECT_TRUE(ids.ok() && pos.ok() && logits.ok());
  if (!ids.ok() || !pos.ok() || !logits.ok()) return d;
  EXPECT_EQ(ids->rank(), 1);
  EXPECT_EQ(pos->shape(), (std::vector<int64_t>{position_rows, ids->dim(0)}));
  EXPECT_EQ(logits->dtype(), core::DType::kF32);
  d.input_ids = testing::Int64Values(*ids);
  d.position_ids = testing::Int64Values(*pos);
  d.logits = core::Tensor::Empty(core::DType::kF32, logits->shape());
  std::copy(logits->data<float>(), logits->data<float>() + logits->numel(), d.logits.data<float>());
  return d;
}

// Runs each golden case; checks the dump and returns nothing. `max_rel` bounds the logits' error.
void CheckGoldenCases(const std::string& dtype, double max_rel, bool check_text) {
  ASSERT_EQ(Cases().size(), 3u);
  for (const json& c : Cases()) {
    const std::string name = c["case"].get<std::string>();
    SCOPED_TRACE(name + " " + dtype);
    const std::string file = c["arrays"]["file"].get<std::string>();
    const std::string messages = WriteMessages(c, name);
    const std::string dump = TempPath(name + ".safetensors");
    const Result r = RunGenerate(Model() + " --messages " + messages + " --dtype " + dtype +
                                 " --greedy --max-tokens 20 --dump " + dump);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("20 tokens, finish length"), std::string::npos) << r.err;
    if (check_text) {
      EXPECT_EQ(r.out, c["greedy"]["text"].get<std::string>() + "\n");
    }

    const Dump d = ReadDump(dump);
    EXPECT_EQ(d.input_ids, testing::Int64Values(testing::LoadGolden(file, "input_ids")));
    EXPECT_EQ(d.position_ids, testing::Int64Values(testing::LoadGolden(file, "position_ids")));
    const core::Tensor ref = testing::LoadGolden(file, "logits_last");
    ASSERT_EQ(d.logits.shape(), ref.shape());
    const double rel = testing::RelativeL2(d.logits.data<float>(), ref.data<float>(), ref.numel());
    EXPECT_LE(rel, max_rel);
    std::printf("%s %s: logits rel L2 %.3g\n", name.c_str(), dtype.c_str(), rel);
    std::filesystem::remove(messages);
    std::filesystem::remove(dump);
  }
}

TEST(IrisGenerate, GoldenCasesF32) { CheckGoldenCases("f32", 1e-4, /*check_text=*/true); }

TEST(IrisGenerate, GoldenCasesBf16) { CheckGoldenCases("bf16", 2e-2, /*check_text=*/false); }

// Qwen2-VL (tests/data/model/manifest_qwen2vl.json): ids, [3, L] M-RoPE positions, logits, text.
TEST(IrisGenerate, Qwen2VlGoldenCases) {
  const json cases = testing::LoadDataJson("model/manifest_qwen2vl.json")["cases"];
  ASSERT_EQ(cases.size(), 3u);
  for (const json& c : cases) {
    const std::string name = c["case"].get<std::string>();
    SCOPED_TRACE(name);
    const std::string file = c["arrays"]["file"].get<std::string>();
    const std::string messages = WriteMessages(c, name);
    const std::string dump = TempPath(name + ".safetensors");
    const Result r = RunGenerate("--model " + testing::ModelPath("tiny-qwen2-vl") + " --messages " + messages +
                                 " --dtype f32 --max-tokens 20 --dump " + dump);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, c["greedy"]["text"].get<std::string>() + "\n");
    const Dump d = ReadDump(dump, /*position_rows=*/3);
    EXPECT_EQ(d.input_ids, testing::Int64Values(testing::LoadGolden(file, "input_ids")));
    EXPECT_EQ(d.position_ids, testing::Int64Values(testing::LoadGolden(file, "position_ids")));
    const core::Tensor ref = testing::LoadGolden(file, "logits_last");
    ASSERT_EQ(d.logits.shape(), ref.shape());
    EXPECT_LE(testing::RelativeL2(d.logits.data<float>(), ref.data<float>(), ref.numel()), 1e-4);
    std::filesystem::remove(messages);
    std::filesystem::remove(dump);
  }
}

// The text-only family (tests/data/model/manifest_qwen2text.json): position_ids are [1, L] as the
// reference's; an image is refused naming the part.
TEST(IrisGenerate, TextOnlyModelGoldenCases) {
  const json cases = testing::LoadDataJson("model/manifest_qwen2text.json")["cases"];
  int run = 0;
  for (const json& c : cases) {
    const std::string model = c["tie_word_embeddings"].get<bool>() ? "tiny-qwen2-text" : "tiny-qwen2-text-untied";
    const std::string name = c["case"].get<std::string>();
    const std::string file = c["arrays"]["file"].get<std::string>();
    const std::string messages = WriteMessages(c, name);
    for (const auto& [dtype, max_rel] : {std::pair<std::string, double>{"f32", 1e-4}, {"bf16", 2e-2}}) {
      SCOPED_TRACE(name + " " + dtype);
      const std::string dump = TempPath(name + ".safetensors");
      const Result r = RunGenerate("--model " + testing::ModelPath(model) + " --messages " + messages +
                                   " --dtype " + dtype + " --max-tokens 20 --dump " + dump);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      if (dtype == "f32") {
        EXPECT_EQ(r.out, c["greedy"]["text"].get<std::string>() + "\n");
      }
      const Dump d = ReadDump(dump, /*position_rows=*/1);
      EXPECT_EQ(d.input_ids, testing::Int64Values(testing::LoadGolden(file, "input_ids")));
      EXPECT_EQ(d.position_ids, testing::Int64Values(testing::LoadGolden(file, "position_ids")));
      const core::Tensor ref = testing::LoadGolden(file, "logits_last");
      ASSERT_EQ(d.logits.shape(), ref.shape());
      EXPECT_LE(testing::RelativeL2(d.logits.data<float>(), ref.data<float>(), ref.numel()), max_rel);
      std::filesystem::remove(dump);
    }
    std::filesystem::remove(messages);
    ++run;
  }
  EXPECT_EQ(run, 6);
  const Result image = RunGenerate("--model " + testing::ModelPath("tiny-qwen2-text") + " --prompt hi --image " +
                                   testing::DataPath("images/rgb_300x200.png"));
  EXPECT_NE(image.exit_code, 0);
  EXPECT_NE(image.err.find("is text-only and accepts no images"), std::string::npos) << image.err;
  EXPECT_NE(image.err.find("--image " + testing::DataPath("images/rgb_300x200.png")), std::string::npos) << image.err;
}

// --prompt with --image is the one_image chat; --stream prints the same text; greedy is the
// default (the fixture's generation_config.json is greedy).
TEST(IrisGenerate, PromptAndImageFlagsAndStreaming) {
  const json* one = nullptr;
  for (const json& c : Cases()) {
    if (c["case"] == "model-tiny-one_image") one = &c;
  }
  ASSERT_NE(one, nullptr);
  const std::string dump = TempPath("prompt.safetensors");
  const std::string args = Model() + " --dtype f32 --max-tokens 20 --prompt 'What is shown in this image?' --image " +
                           testing::DataPath("images/rgb_300x200.png") + " --dump " + dump;
  const Result r = RunGenerate(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, (*one)["greedy"]["text"].get<std::string>() + "\n");
  EXPECT_NE(r.err.find("prompt 105 tokens (77 image)"), std::string::npos) << r.err;
  EXPECT_EQ(ReadDump(dump).input_ids,
            testing::Int64Values(testing::LoadGolden((*one)["arrays"]["file"].get<std::string>(), "input_ids")));
  std::filesystem::remove(dump);

  const Result streamed = RunGenerate(args + " --stream");
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  EXPECT_EQ(streamed.out, r.out);

  // Dashes and underscores both work; a tighter pixel bound gives fewer image tokens.
  const Result bounded = RunGenerate(Model() + " --max_tokens 2 --max-pixels 20000 --prompt hi --image " +
                                     testing::DataPath("images/rgb_300x200.png"));
  ASSERT_EQ(bounded.exit_code, 0) << bounded.err;
  EXPECT_NE(bounded.err.find("2 tokens, finish length"), std::string::npos) << bounded.err;
  EXPECT_EQ(bounded.err.find("(77 image)"), std::string::npos) << bounded.err;
}

TEST(IrisGenerate, SamplingWithASeedRepeats) {
  const std::string args =
      Model() + " --prompt 'Tell me a story.' --max-tokens 12 --temperature 1.5 --top-p 0.95 --top-k 100 --seed 7 "
                "--repetition-penalty 1.1";
  const Result a = RunGenerate(args);
  const Result b = RunGenerate(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("12 tokens"), std::string::npos) << a.err;
}

// The sampling flags not given take the model's generation_config.json (as iris-server fills a
// request's unset fields); --generation-config none: greedy, no penalty. A copy of the tiny model
// whose file samples with top_k 1 (the argmax) and a strong repetition penalty.
TEST(IrisGenerate, UnsetSamplingFlagsTakeTheModelsGenerationConfig) {
  namespace fs = std::filesystem;
  const fs::path dir = TempPath("penalising_model");
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(testing::ModelPath("tiny"))) {
    if (entry.path().filename() != "generation_config.json") {
      fs::create_symlink(entry.path(), dir / entry.path().filename());
    }
  }
  std::ofstream(dir / "generation_config.json")
      << R"({"do_sample": true, "temperature": 0.5, "top_k": 1, "repetition_penalty": 1.8, "eos_token_id": [151645],
            "max_new_tokens": 5})";
  const std::string args = "--model " + dir.string() + " --dtype f32 --max-tokens 16 --prompt 'Tell me a story.'";
  const Result unset = RunGenerate(args);
  const Result penalised = RunGenerate(args + " --greedy --repetition-penalty 1.8");
  const Result plain = RunGenerate(args + " --greedy --repetition-penalty 1");
  const Result none = RunGenerate(args + " --generation-config none");
  for (const Result* r : {&unset, &penalised, &plain, &none}) ASSERT_EQ(r->exit_code, 0) << r->err;
  EXPECT_EQ(unset.out, penalised.out);
  EXPECT_NE(penalised.out, plain.out) << "the penalty should move this prompt's tokens";
  EXPECT_EQ(none.out, plain.out);
  EXPECT_NE(unset.err.find("iris-generate: 16 tokens, finish length"), std::string::npos) << unset.err;
  // Without --max-tokens, the file's max_new_tokens.
  const Result model_length = RunGenerate("--model " + dir.string() + " --dtype f32 --prompt 'Tell me a story.'");
  ASSERT_EQ(model_length.exit_code, 0) << model_length.err;
  EXPECT_NE(model_length.err.find("iris-generate: 5 tokens, finish length"), std::string::npos) << model_length.err;
  std::string five = model_length.out;
  if (!five.empty() && five.back() == '\n') five.pop_back();  // the tool's closing newline
  EXPECT_EQ(five, unset.out.substr(0, five.size())) << "the same tokens, stopped sooner";
  const Result bad = RunGenerate(args + " --generation-config vllm");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--generation-config must be auto or none"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}

TEST(IrisGenerate, ReportsBadInputsAndExitsNonZero) {
  const std::string image = testing::DataPath("images/rgb_300x200.png");
  const std::string messages = TempPath("bad_messages.json");
  std::ofstream(messages) << R"([{"role": "user", "content": [{"type": "image", "image": "/nonexistent/cat.png"}]}])";
  const std::string dump = TempPath("never.safetensors");
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--prompt hi", "--model is required"},
      {Model(), "one of --prompt or --messages is required"},
      {Model() + " --prompt hi --image /nonexistent/cat.jpg --dump " + dump, "/nonexistent/cat.jpg"},
      {Model() + " --messages " + messages + " --dump " + dump, "messages[0].content[0].image: cannot read /nonexistent/cat.png"},
      {Model() + " --messages /nonexistent/chat.json", "/nonexistent/chat.json"},
      {Model() + " --prompt hi --messages " + messages, "not both"},
      {Model() + " --prompt hi --dtype f16", "--dtype"},
      {Model() + " --prompt hi --greedy --temperature 0.7", "--greedy and --temperature"},
      {Model() + " --prompt hi --top-p 0", "top_p"},
      {Model() + " --prompt hi --max-tokens 0", "max_tokens"},
      {Model() + " --prompt hi --image " + image + " --max-pixels 99999999999",
       "max_pixels 99999999999 is outside the allowed range [3136, 12845056]"},
      {Model() + " --prompt hi --image " + testing::DataPath("images/rgb_20x300.png"), "rgb_20x300.png"},
      {"--model /nonexistent --prompt hi", "/nonexistent"},
      {Model() + " --prompt hi stray", "unexpected argument"},
      // The memory check before loading: a KV cache of 1 PiB does not fit; the flag is named.
      {Model() + " --prompt hi --kv-cache-mib 1073741824", "lower --kv-cache-mib to at most"},
  };
  for (const auto& c : cases) {
    const Result r = RunGenerate(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find("iris-generate: "), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.find("Aborted"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << "\n" << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(dump));
  std::filesystem::remove(messages);
}

}  // namespace
}  // namespace iris
