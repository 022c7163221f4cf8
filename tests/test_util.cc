#include "tests/test_util.h"

#include <cmath>

#include "gtest/gtest.h"

namespace iris::testing {

std::string DataPath(const std::string& relative) { return std::string(IRIS_TEST_DATA) + "/" + relative; }
std::string ModelPath(const std::string& name) { return std::string(IRIS_TEST_MODELS) + "/" + name; }

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

double RelativeL2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

double MaxAbsDiff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace iris::testing
