// Command-line helpers shared by iris's tools.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace iris::core {

// Abseil spells flag names with underscores; iris documents dashes (--min-pixels). Returns the
// arguments with dashes inside flag names (before any '=') turned into underscores, up to "--".
std::vector<std::string> NormalizeFlagNames(int argc, char** argv);

// Removes every `--<name> VALUE` and `--<name>=VALUE` from argv (up to "--") and returns the values
// in order. For repeatable flags whose values may contain commas (file names), which an Abseil
// vector flag would split and a plain flag would overwrite.
std::vector<std::string> TakeRepeatedFlag(int* argc, char** argv, const std::string& name);

// Parses argv into the Abseil flags after NormalizeFlagNames (--help and friends as Abseil
// handles them). iris's programs take no positional arguments: INVALID_ARGUMENT
// `unexpected argument "X"` for the first one.
absl::Status ParseFlags(int argc, char** argv);

// Pointers into `args` for APIs that take argc/argv (valid while `args` lives).
std::vector<char*> ArgvOf(std::vector<std::string>& args);

}  // namespace iris::core
