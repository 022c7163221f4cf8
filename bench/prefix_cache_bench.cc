// Prefix-caching benchmark: multi-turn chats that repeat their image. Each round is a new chat:
// turn 1 = [text, image, question] and its reply; turn 2 = turn 1 + the reply + a new question.
// Two engines over the same model folder — prefix caching on and off, the encoder cache on in
// both (so "off" re-runs the prefill of the image and text tokens, not the encoder) — run each
// round in turn, idle while the other runs. Prints each round's turn-2 time to first token
// (arrival → first token, from the engine's timings) and the median ratio off / on, measured in
// this run.
//   prefix_cache_bench --model DIR [--image FILE] [--rounds 4] [--reply_tokens 16] [--dtype bf16]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_machine.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/prompt_builder.h"

ABSL_FLAG(std::string, model, "/work/bench-models/small", "model folder (iris-make-model --preset small)");
ABSL_FLAG(std::string, image, IRIS_BENCH_DATA "/images/jpeg444_q90_640x480.jpg", "the chats' image");
ABSL_FLAG(int, rounds, 4, "chats per engine (the first is a warm-up and not counted)");
ABSL_FLAG(int, reply_tokens, 16, "tokens of turn 1's reply (greedy, end-of-sequence ignored)");
ABSL_FLAG(std::string, dtype, "bf16", "compute mode: bf16 or f32");

namespace {

using namespace iris;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "prefix_cache_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Die("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

engine::ChatInputPart Text(std::string s) {
  engine::ChatInputPart p;
  p.text = std::move(s);
  return p;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::unique_ptr<engine::Engine> MakeEngine(bool prefix_caching) {
  engine::ModelOptions mo;
  mo.compute = absl::GetFlag(FLAGS_dtype) == "f32" ? kernels::ComputeType::kF32 : kernels::ComputeType::kBF16;
  auto model = engine::LoadModel(absl::GetFlag(FLAGS_model), mo);
  if (!model.ok()) Die(absl::StrCat("cannot load ", absl::GetFlag(FLAGS_model), ": ", model.status().message()));
  engine::EngineOptions eo;
  eo.enable_prefix_caching = prefix_caching;
  eo.kv_cache_bytes = 256ll << 20;
  auto e = engine::Engine::Create(std::move(*model), eo);
  if (!e.ok()) Die(std::string(e.status().message()));
  return std::move(*e);
}

engine::RequestOutput Run(engine::Engine& e, const std::vector<engine::ChatInputMessage>& messages,
                          const std::string& id, int max_tokens) {
  auto prompt = engine::BuildPrompt(e.model(), messages);
  if (!prompt.ok()) Die(std::string(prompt.status().message()));
  engine::Request r;
  r.id = id;
  r.prompt = std::move(*prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  auto out = engine::GenerateBlocking(e, std::move(r));
  if (!out.ok()) Die(std::string(out.status().message()));
  return std::move(*out);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rounds = std::max(2, absl::GetFlag(FLAGS_rounds));
  const std::string image = ReadFile(absl::GetFlag(FLAGS_image));
  std::unique_ptr<engine::Engine> engines[2] = {MakeEngine(true), MakeEngine(false)};
  std::printf("prefix_cache_bench: %s (%s), CPU %s\n", absl::GetFlag(FLAGS_model).c_str(),
              absl::GetFlag(FLAGS_dtype).c_str(), iris::bench::CpuName().c_str());
  std::printf("%-6s %-8s %14s %14s %16s %12s\n", "round", "caching", "turn-2 prompt", "cached tokens",
              "turn-2 TTFT ms", "turn-1 TTFT");
  std::vector<double> ttft[2];
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      engine::Engine& e = *engines[k];
      engine::ChatInputPart img;
      img.kind = engine::ChatInputPart::Kind::kImage;
      img.image_bytes = image;
      // A new chat per round (its first words differ), so rounds do not hit each other.
      std::vector<engine::ChatInputMessage> chat = {
          {"user", {Text(absl::StrCat("Chat number ", round, ".")), img, Text("What is shown in this picture?")}}};
      const engine::RequestOutput t1 = Run(e, chat, absl::StrCat("r", round, "-1"), absl::GetFlag(FLAGS_reply_tokens));
      chat.push_back({"assistant", {Text(t1.text)}});
      chat.push_back({"user", {Text("Which colours are the largest areas?")}});
      const int64_t hits_before = e.stats().prefix_cache_hits;
      const engine::RequestOutput t2 = Run(e, chat, absl::StrCat("r", round, "-2"), 1);
      const int64_t cached = e.stats().prefix_cache_hits - hits_before;
      std::printf("%-6d %-8s %14lld %14lld %16.1f %10.1f ms%s\n", round, k == 0 ? "on" : "off",
                  static_cast<long long>(t2.usage.prompt_tokens), static_cast<long long>(cached),
                  t2.timings.first_token_ms, t1.timings.first_token_ms, round == 0 ? "  (warm-up)" : "");
      std::fflush(stdout);
      if (round > 0) ttft[k].push_back(t2.timings.first_token_ms);
    }
  }
  const double on = Median(ttft[0]), off = Median(ttft[1]);
  std::printf("turn-2 TTFT median: prefix caching on %.1f ms, off %.1f ms: %.1fx lower with it on\n", on, off,
              off / on);
  return 0;
}
