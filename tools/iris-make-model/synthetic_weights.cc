// Built with -ffp-contract=off: the spec's double arithmetic (1.0 + 0.1*s, ...) must not be
// fused into FMAs, or a few values would round differently from the reference generator.
#include "tools/iris-make-model/synthetic_weights.h"

#include <omp.h>

#include <bit>
#include <cmath>
#include <utility>

namespace iris::tools {
namespace {

// Below this many elements a range is generated on the calling thread.
constexpr int64_t kParallelThreshold = 1 << 15;

template <WeightKind kKind>
inline uint16_t Value(uint64_t base, int64_t i, double scale) {
  const uint64_t z = SplitMix64At(base, static_cast<uint64_t>(i) + 1);
  // z >> 11 < 2^53, so the signed conversion is exact (and vectorizes).
  const double x = static_cast<double>(static_cast<int64_t>(z >> 11)) * 0x1p-53;
  const double s = 2.0 * x - 1.0;
  double v;
  if constexpr (kKind == WeightKind::kBias) {
    v = 0.02 * s;
  } else if constexpr (kKind == WeightKind::kNorm) {
    v = 1.0 + 0.1 * s;
  } else {
    v = s * scale;
  }
  const uint32_t u = std::bit_cast<uint32_t>(static_cast<float>(v));
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

template <WeightKind kKind>
void FillKind(uint64_t base, double scale, int64_t begin, int64_t count, uint16_t* out, int threads) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelThreshold) num_threads(threads)
  for (int64_t j = 0; j < count; ++j) out[j] = Value<kKind>(base, begin + j, scale);
}

}  // namespace

uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char b : bytes) {
    h ^= b;
    h *= 0x100000001B3ull;
  }
  return h;
}

WeightKind KindOf(std::string_view name, const std::vector<int64_t>& shape) {
  if (name.size() >= 5 && name.substr(name.size() - 5) == ".bias") return WeightKind::kBias;
  if (shape.size() == 1) return WeightKind::kNorm;
  return WeightKind::kMatrix;
}

const char* KindName(WeightKind kind) {
  switch (kind) {
    case WeightKind::kBias: return "bias";
    case WeightKind::kNorm: return "norm";
    case WeightKind::kMatrix: return "matrix";
  }
  return "?";
}

int64_t FanIn(const std::vector<int64_t>& shape) {
  int64_t f = 1;
  for (size_t d = 1; d < shape.size(); ++d) f *= shape[d];
  return f;
}

TensorGenerator::TensorGenerator(uint64_t seed, std::string name, std::vector<int64_t> shape)
    : name_(std::move(name)), shape_(std::move(shape)) {
  numel_ = 1;
  for (int64_t d : shape_) numel_ *= d;
  kind_ = KindOf(name_, shape_);
  base_ = seed ^ Fnv1a64(name_);
  scale_ = 1.0 / std::sqrt(static_cast<double>(FanIn(shape_)));
}

uint16_t TensorGenerator::At(int64_t i) const {
  switch (kind_) {
    case WeightKind::kBias: return Value<WeightKind::kBias>(base_, i, scale_);
    case WeightKind::kNorm: return Value<WeightKind::kNorm>(base_, i, scale_);
    case WeightKind::kMatrix: break;
  }
  return Value<WeightKind::kMatrix>(base_, i, scale_);
}

void TensorGenerator::Fill(int64_t begin, int64_t count, uint16_t* out, int threads) const {
  if (threads <= 0) threads = omp_get_max_threads();
  switch (kind_) {
    case WeightKind::kBias: return FillKind<WeightKind::kBias>(base_, scale_, begin, count, out, threads);
    case WeightKind::kNorm: return FillKind<WeightKind::kNorm>(base_, scale_, begin, count, out, threads);
    case WeightKind::kMatrix: return FillKind<WeightKind::kMatrix>(base_, scale_, begin, count, out, threads);
  }
}

}  // namespace iris::tools
