// iris-tokenize: a checkpoint's tokenizer on the command line, one JSON value per line.
//   iris-tokenize --model DIR            stdin: JSON strings      stdout: JSON arrays of ids
//   iris-tokenize --model DIR --decode   stdin: JSON id arrays    stdout: JSON strings
//                 [--skip-special-tokens] [--stats]
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "core/command_line.h"
#include "core/status_macros.h"
#include "llm/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "model folder with tokenizer.json (and tokenizer_config.json)");
ABSL_FLAG(bool, decode, false, "read JSON arrays of ids and print JSON strings (default: encode)");
ABSL_FLAG(bool, skip_special_tokens, false, "with --decode: leave special tokens out of the text");
ABSL_FLAG(bool, stats, false, "print load time and throughput to stderr at the end");

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

absl::Status LineError(int64_t line_no, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", message));
}

absl::Status Run() {
  using iris::llm::Tokenizer;
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  const bool decode = absl::GetFlag(FLAGS_decode);
  const bool skip_special = absl::GetFlag(FLAGS_skip_special_tokens);

  const auto t0 = Clock::now();
  IRIS_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(dir));
  const auto t1 = Clock::now();

  std::string line, out;
  int64_t line_no = 0, text_bytes = 0, tokens = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const json value = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) return LineError(line_no, "not valid JSON");
    if (!decode) {
      if (!value.is_string()) return LineError(line_no, "expected a JSON string");
      const std::string& text = value.get_ref<const std::string&>();
      auto ids = tokenizer.Encode(text);
      if (!ids.ok()) return LineError(line_no, ids.status().message());
      out = json(*ids).dump();
      text_bytes += static_cast<int64_t>(text.size());
      tokens += static_cast<int64_t>(ids->size());
    } else {
      if (!value.is_array()) return LineError(line_no, "expected a JSON array of token ids");
      std::vector<int32_t> ids;
      ids.reserve(value.size());
      for (const json& v : value) {
        if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
          return LineError(line_no, absl::StrCat("not a token id: ", v.dump()));
        }
        ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
      }
      auto text = tokenizer.Decode(ids, skip_special);
      if (!text.ok()) return LineError(line_no, text.status().message());
      out = json(*text).dump(-1, ' ', false, json::error_handler_t::replace);
      text_bytes += static_cast<int64_t>(text->size());
      tokens += static_cast<int64_t>(ids.size());
    }
    out.push_back('\n');
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  if (absl::GetFlag(FLAGS_stats)) {
    const auto t2 = Clock::now();
    std::fprintf(stderr,
                 "iris-tokenize: loaded %lld tokens + %zu added, %lld merges in %.1f ms; %lld lines, %lld bytes, "
                 "%lld tokens in %.1f ms (%.2f MB/s)\n",
                 static_cast<long long>(tokenizer.num_vocab_tokens()), tokenizer.added_tokens().size(),
                 static_cast<long long>(tokenizer.num_merges()), Seconds(t0, t1) * 1e3,
                 static_cast<long long>(line_no), static_cast<long long>(text_bytes), static_cast<long long>(tokens),
                 Seconds(t1, t2) * 1e3, text_bytes / std::max(Seconds(t1, t2), 1e-9) / 1e6);
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "encodes or decodes text with a checkpoint's tokenizer, one JSON value per line\n"
      "  iris-tokenize --model DIR < strings.jsonl        (each line a JSON string; prints id arrays)\n"
      "  iris-tokenize --model DIR --decode < ids.jsonl   (each line a JSON id array; prints strings)\n"
      "  [--skip-special-tokens] [--stats]");
  // --skip-special-tokens as well as Abseil's --skip_special_tokens spelling.
  if (absl::Status parsed = iris::core::ParseFlags(argc, argv); !parsed.ok()) {
    std::fprintf(stderr, "iris-tokenize: %s\n", std::string(parsed.message()).c_str());
    return 2;
  }
  absl::Status status = Run();
  if (!status.ok()) {
    std::fprintf(stderr, "iris-tokenize: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
