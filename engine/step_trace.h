// One JSON line per engine step (--step-trace): what the step ran and how long each part took, to
// see where a slow step's time went (an encoder slice, a prefill chunk, the decode rows).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace iris::engine {

struct StepTraceRecord {
  double t_ms = 0;            // step start, since the trace was opened
  double step_ms = 0;         // the whole step (scheduling and output processing included)
  double target_ms = 0;       // the step budget's target (0: unbounded)
  int64_t decode_rows = 0;    // decoder rows that are one decode token
  int64_t prefill_rows = 0;   // the other decoder rows (prefill chunks, recomputes)
  double decoder_ms = 0;
  double encoder_gflop = 0;   // encoder work run (interleaved slices)
  double encoder_ms = 0;      // its time (interleaved), or the whole forward's (off)
  int64_t images_encoded = 0; // by a forward that ended this step
  int64_t running = 0;
  int64_t waiting = 0;
};

class StepTrace {
 public:
  // Truncates `path`; INVALID_ARGUMENT naming the flag when it cannot be written.
  static absl::StatusOr<std::unique_ptr<StepTrace>> Open(const std::string& path);
  ~StepTrace();

  void Write(const StepTraceRecord& r);

 private:
  explicit StepTrace(std::FILE* f) : file_(f) {}
  std::FILE* file_;
};

}  // namespace iris::engine
