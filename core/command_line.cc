#include "core/command_line.h"

#include <algorithm>
#include <string_view>

#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"

namespace iris::core {

std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-') continue;
    const size_t start = a[1] == '-' ? 2 : 1;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t k = start; k < end; ++k) {
      if (a[k] == '-') a[k] = '_';
    }
  }
  return args;
}

std::vector<std::string> TakeRepeatedFlag(int* argc, char** argv, const std::string& name) {
  const std::string bare = "--" + name, with_value = bare + "=";
  std::vector<std::string> values;
  int w = 1;
  for (int r = 1; r < *argc; ++r) {
    const std::string_view a = argv[r];
    if (a == "--") {
      while (r < *argc) argv[w++] = argv[r++];
      break;
    }
    if (a == bare && r + 1 < *argc) {
      values.push_back(argv[++r]);
    } else if (a.starts_with(with_value)) {
      values.emplace_back(a.substr(with_value.size()));
    } else {
      argv[w++] = argv[r];
    }
  }
  *argc = w;
  return values;
}

std::vector<char*> ArgvOf(std::vector<std::string>& args) {
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  return ptrs;
}

absl::Status ParseFlags(int argc, char** argv) {
  std::vector<std::string> normalized = NormalizeFlagNames(argc, argv);
  std::vector<char*> args = ArgvOf(normalized);
  const std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (rest.size() > 1) return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", rest[1], "\""));
  return absl::OkStatus();
}

}  // namespace iris::core
