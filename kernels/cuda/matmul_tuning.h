// Matmul algorithm tuning, the host side (no CUDA types: the CPU tests check it).
//
// cuBLASLt's heuristic ranks the kernels it has for a matmul by a model of the GPU, not by a
// run; its first pick is what iris ran until now. For the encoder's and a prefill's shapes (8192
// rows by 1280, 3420 or 3840) the rank misses tile shapes whose last wave fills the GPU better,
// and the matmuls were 1.37x the GEMM floor on their own at the last profile. With tuning on
// (CudaDevice::SetMatmulTuning), a matmul of at least kMatmulTuneMinRows rows times the
// heuristic's first kMatmulTuneCandidates candidates once on its real operands, outside any graph
// capture, and keeps the fastest; the heuristic's first pick is one of those timed, so what is
// kept is never slower by the same run's clock. The choice is the device's, per shape and row
// bucket (MatmulRowBucket): every Linear of that shape (every encoder layer's qkv, say) and every
// row count in the bucket reuses it, and each reuse is checked by cuBLASLt against the call's own
// descriptors (cublasLtMatmulAlgoCheck) before it runs.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace iris::kernels::cuda {

// Fewer rows run the heuristic's pick untimed: a decode batch runs iris's GEMVs, and a short
// prefill chunk's matmul is too quick for the timing to repay its host wait.
constexpr int64_t kMatmulTuneMinRows = 256;
constexpr int kMatmulTuneCandidates = 8;
// Rounds per candidate (interleaved: round r times every candidate before round r + 1, so drift
// of the clocks hits all of them alike), and runs per round (one event pair around them).
constexpr int kMatmulTuneRounds = 3;
constexpr int kMatmulTuneRunsPerRound = 4;

// The smallest power of two >= m (m >= 1): row counts that share one tuned algorithm.
int64_t MatmulRowBucket(int64_t m);

// The row counts an engine's warm-up runs so that every bucket up to max_rows is tuned at start:
// kMatmulTuneMinRows, twice that, ... below max_rows, then max_rows (whose bucket is the last).
// Just {max_rows} where that is below kMatmulTuneMinRows.
std::vector<int64_t> MatmulTuneWarmUpRows(int64_t max_rows);

// The fastest of `n` candidates: each is timed `rounds` times, interleaved (candidate 0..n-1 in
// round 0, then again in round 1, ...), `time(i)` returning seconds or nullopt where candidate
// i failed to run (it is then dropped, and timed no more). The fastest by its median over the
// rounds; ties go to the earlier candidate (the heuristic's order). Nullopt where none ran.
struct TunedChoice {
  int index = 0;
  std::vector<double> medians;  // per candidate, seconds; +inf for one that failed
};
std::optional<TunedChoice> PickFastestCandidate(int n, int rounds, const std::function<std::optional<double>(int)>& time);

// What a tuned algorithm is keyed by: the matmul's types, shape and strides (M = out features, K
// = in, as in cuda_linear.cc), whether the bias epilogue is on, the operands' alignments, and
// the row bucket (N, the activation rows, rounded by MatmulRowBucket).
struct MatmulTuneKey {
  int a_type = 0, d_type = 0;  // cudaDataType_t values
  int64_t m = 0, k = 0, lda = 0, ldb = 0, ldd = 0, row_bucket = 0;
  bool bias = false;
  uint32_t align_a = 0, align_b = 0, align_d = 0;
  auto operator<=>(const MatmulTuneKey&) const = default;
};

// cublasLtMatmulAlgo_t's bytes (an opaque struct of 8 uint64_t; cuda_linear.cc asserts the size).
using MatmulAlgoBits = std::array<uint64_t, 8>;

// One tuned shape: the algorithm kept, and what the run measured (for the benches' report).
struct TunedMatmul {
  MatmulTuneKey key;
  MatmulAlgoBits algo{};
  int rows = 0;          // the row count it was timed at
  int candidates = 0;    // how many the heuristic offered
  int chosen = 0;        // the index kept, in the heuristic's order (0: its own first pick)
  double first_s = 0;    // the heuristic's first pick, median seconds a run
  double chosen_s = 0;   // the kept one's
  // False where the scratch output could not be had: the heuristic's pick is kept untimed (and
  // the shape is not tried again).
  bool timed = true;
};

// The device's tuned algorithms, shared by its Linears (thread-safe).
class MatmulAlgoTable {
 public:
  std::optional<MatmulAlgoBits> Find(const MatmulTuneKey& key) const;
  void Store(const TunedMatmul& tuned);
  std::vector<TunedMatmul> Entries() const;  // in key order

 private:
  mutable std::mutex mu_;
  std::map<MatmulTuneKey, TunedMatmul> entries_;
};

}  // namespace iris::kernels::cuda
