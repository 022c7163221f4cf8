// What every benchmark prints beside its figures: the CPU's name (the machine changes between
// runs, and figures mean nothing without it) and the load average (other work on a shared box).
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

namespace iris::bench {

// The first "model name" of /proc/cpuinfo, e.g. "AMD EPYC 9454P 48-Core Processor".
inline std::string CpuName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

// The 1, 5 and 15 minute load averages, "1.99 1.82 1.90".
inline std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  in >> a >> b >> c;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f", a, b, c);
  return buf;
}

}  // namespace iris::bench
