// The one way a fuzz target reports a broken property: print what and where, then abort so that
// libFuzzer saves the input. (Bad input itself must never abort: only a broken invariant does.)
#pragma once
#include <cstdio>
#include <cstdlib>

#define IRIS_FUZZ_CHECK(cond, ...)                                              \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                        \
      std::fprintf(stderr, "\n");                                               \
      std::abort();                                                             \
    }                                                                           \
  } while (0)
