// The deterministic synthetic-weight generator of tests/data/WEIGHTS.md: every bf16 value is a
// pure function of (seed, tensor name, element index), so any range can be produced in parallel.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace iris::tools {

// FNV-1a 64 of the name's bytes.
uint64_t Fnv1a64(std::string_view bytes);

// SplitMix64's output function (the "mix" of WEIGHTS.md).
inline uint64_t SplitMix64Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ull;

// The k-th output (k >= 1) of a SplitMix64 generator whose state starts at `state`.
inline uint64_t SplitMix64At(uint64_t state, uint64_t k) {
  return SplitMix64Mix(state + k * kSplitMix64Gamma);
}

enum class WeightKind { kBias, kNorm, kMatrix };

// bias: name ends with ".bias"; norm: any other 1-D tensor; matrix: everything else.
WeightKind KindOf(std::string_view name, const std::vector<int64_t>& shape);
const char* KindName(WeightKind kind);
// prod(shape[1:]) (1 for a 1-D tensor).
int64_t FanIn(const std::vector<int64_t>& shape);

// Generates one tensor's values.
class TensorGenerator {
 public:
  TensorGenerator(uint64_t seed, std::string name, std::vector<int64_t> shape);

  const std::string& name() const { return name_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  WeightKind kind() const { return kind_; }
  uint64_t base() const { return base_; }

  // bf16 bit pattern of element i.
  uint16_t At(int64_t i) const;
  // Elements [begin, begin + count) into out, with OpenMP across elements for large ranges
  // (`threads` OpenMP threads; 0 for the OpenMP default).
  void Fill(int64_t begin, int64_t count, uint16_t* out, int threads = 0) const;

 private:
  std::string name_;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  WeightKind kind_ = WeightKind::kMatrix;
  uint64_t base_ = 0;
  double scale_ = 1.0;   // 1/sqrt(fan_in) for matrices
};

}  // namespace iris::tools
