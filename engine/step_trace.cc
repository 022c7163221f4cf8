#include "engine/step_trace.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace iris::engine {

absl::StatusOr<std::unique_ptr<StepTrace>> StepTrace::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--step-trace: cannot write ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<StepTrace>(new StepTrace(f));
}

StepTrace::~StepTrace() { std::fclose(file_); }

void StepTrace::Write(const StepTraceRecord& r) {
  std::fprintf(file_,
               "{\"t_ms\":%.3f,\"step_ms\":%.3f,\"target_ms\":%.3f,\"decode_rows\":%lld,\"prefill_rows\":%lld,"
               "\"decoder_ms\":%.3f,\"encoder_gflop\":%.4f,\"encoder_ms\":%.3f,\"images_encoded\":%lld,"
               "\"running\":%lld,\"waiting\":%lld}\n",
               r.t_ms, r.step_ms, r.target_ms, static_cast<long long>(r.decode_rows),
               static_cast<long long>(r.prefill_rows), r.decoder_ms, r.encoder_gflop, r.encoder_ms,
               static_cast<long long>(r.images_encoded), static_cast<long long>(r.running),
               static_cast<long long>(r.waiting));
  std::fflush(file_);
}

}  // namespace iris::engine
