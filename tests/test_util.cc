#include "tests/test_util.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/model_config.h"
#include "gtest/gtest.h"

namespace iris::testing {

// The environment may point elsewhere (scripts/gpu_check.sh runs bundled test binaries on another
// machine, where the build's paths do not exist).
std::string DataPath(const std::string& relative) {
  const char* dir = std::getenv("IRIS_TEST_DATA");
  return std::string(dir != nullptr && *dir != 0 ? dir : IRIS_TEST_DATA) + "/" + relative;
}
std::string ModelPath(const std::string& name) {
  const char* dir = std::getenv("IRIS_TEST_MODELS");
  return std::string(dir != nullptr && *dir != 0 ? dir : IRIS_TEST_MODELS) + "/" + name;
}

core::Tensor LoadGolden(const std::string& relative_file, const std::string& tensor) {
  auto file = core::SafetensorsFile::Open(DataPath(relative_file));
  if (!file.ok()) {
    ADD_FAILURE() << file.status();
    return {};
  }
  auto t = (*file)->Get(tensor);
  if (!t.ok()) {
    ADD_FAILURE() << t.status();
    return {};
  }
  return t->Clone();
}

nlohmann::json LoadDataJson(const std::string& relative) {
  auto j = core::ReadJsonFile(DataPath(relative));
  if (!j.ok()) {
    ADD_FAILURE() << j.status();
    return nullptr;
  }
  return *std::move(j);
}

std::vector<int64_t> Int64Values(const core::Tensor& t) {
  const int64_t* p = t.data<int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

double RelativeL2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

::testing::AssertionResult SameUnderRowSplits(const float* got, const float* want, int64_t n, bool split_invariant,
                                              double tolerance) {
  if (split_invariant) {
    if (std::memcmp(got, want, static_cast<size_t>(n) * sizeof(float)) == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "not bit-identical (relative L2 " << RelativeL2(got, want, n)
                                         << ") on a device whose matmuls are split-invariant";
  }
  const double err = RelativeL2(got, want, n);
  if (err <= tolerance) return ::testing::AssertionSuccess() << "relative L2 " << err;
  return ::testing::AssertionFailure() << "relative L2 " << err << " > " << tolerance
                                       << " (matmuls not split-invariant here: compared to rounding)";
}

double MaxAbsDiff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

std::vector<float> RandomFloats(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> RandomNormal(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

vision::RgbImage ImageFromTensor(const core::Tensor& t) {
  vision::RgbImage img;
  if (t.rank() != 3 || t.dim(2) != 3 || t.dtype() != core::DType::kU8) {
    ADD_FAILURE() << "not a uint8 HxWx3 array: " << t.ShapeString();
    return img;
  }
  img.height = static_cast<int>(t.dim(0));
  img.width = static_cast<int>(t.dim(1));
  img.pixels.assign(t.data<uint8_t>(), t.data<uint8_t>() + t.nbytes());
  return img;
}

}  // namespace iris::testing
