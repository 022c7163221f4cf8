#include "core/cpu_affinity.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace iris::core {
namespace {

absl::StatusOr<int> ParseCpu(absl::string_view digits, absl::string_view item, absl::string_view flag) {
  if (digits.empty() || digits.size() > 6 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", item, "\" is not a CPU number or range N-M"));
  }
  int cpu = 0;
  for (char c : digits) cpu = cpu * 10 + (c - '0');
  if (cpu >= CPU_SETSIZE) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": CPU ", cpu, " is beyond the largest CPU number ",
                                                   CPU_SETSIZE - 1));
  }
  return cpu;
}

}  // namespace

absl::StatusOr<CpuList> ParseCpuList(absl::string_view text, absl::string_view flag) {
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": empty CPU list (expected e.g. 0-3,8)"));
  }
  CpuList cpus;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    if (item.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": empty item in the CPU list \"", text, "\""));
    }
    const size_t dash = item.find('-');
    absl::StatusOr<int> lo = ParseCpu(item.substr(0, dash), item, flag);
    if (!lo.ok()) return lo.status();
    int hi = *lo;
    if (dash != absl::string_view::npos) {
      absl::StatusOr<int> parsed = ParseCpu(item.substr(dash + 1), item, flag);
      if (!parsed.ok()) return parsed.status();
      hi = *parsed;
      if (hi < *lo) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": range \"", item, "\" ends before it starts"));
      }
    }
    for (int cpu = *lo; cpu <= hi; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(const CpuList& cpus) {
  std::vector<std::string> items;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    items.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(items, ",");
}

absl::StatusOr<CpuList> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  CpuList cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

absl::Status CheckCpusAllowed(const CpuList& cpus, const CpuList& allowed, absl::string_view flag) {
  CpuList missing;
  std::set_difference(cpus.begin(), cpus.end(), allowed.begin(), allowed.end(), std::back_inserter(missing));
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": CPU", missing.size() > 1 ? "s " : " ",
                                                   FormatCpuList(missing),
                                                   " not among the CPUs this process may run on (",
                                                   FormatCpuList(allowed), ")"));
  }
  return absl::OkStatus();
}

absl::Status PinThread(pthread_t thread, const CpuList& cpus, absl::string_view name) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  if (const int err = pthread_setaffinity_np(thread, sizeof(set), &set); err != 0) {
    return absl::InternalError(absl::StrCat("pinning the ", name, " to CPUs ", FormatCpuList(cpus), ": ",
                                            std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace iris::core
