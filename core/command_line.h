// Command-line helpers shared by iris's tools.
#pragma once

#include <string>
#include <vector>

namespace iris::core {

// Abseil spells flag names with underscores; iris documents dashes (--min-pixels). Returns the
// arguments with dashes inside flag names (before any '=') turned into underscores, up to "--".
std::vector<std::string> NormalizeFlagNames(int argc, char** argv);

// Pointers into `args` for APIs that take argc/argv (valid while `args` lives).
std::vector<char*> ArgvOf(std::vector<std::string>& args);

}  // namespace iris::core
