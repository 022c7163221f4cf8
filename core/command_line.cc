#include "core/command_line.h"

#include <algorithm>

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

std::vector<char*> ArgvOf(std::vector<std::string>& args) {
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  return ptrs;
}

}  // namespace iris::core
