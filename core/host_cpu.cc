#include "core/host_cpu.h"

#include <cstdlib>
#include <cstring>

namespace iris::core {

bool HostHasAvx512Vbmi() {
  static const bool has = [] {
    const char* cap = std::getenv("IRIS_CPU_ISA");
    if (cap != nullptr && std::strcmp(cap, "avx2") == 0) return false;
    __builtin_cpu_init();
    // __builtin_cpu_supports checks the OS's XSAVE state too.
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vbmi");
  }();
  return has;
}

}  // namespace iris::core
