// Helpers shared by the test suites: paths to test data and generated models, loading golden
// safetensors, comparing arrays.
#pragma once

#include <string>

#include "core/safetensors.h"
#include "core/tensor.h"

namespace iris::testing {

// tests/data/<relative>
std::string DataPath(const std::string& relative);
// <build>/test-models/<name> (made by the make_model_* ctest fixtures)
std::string ModelPath(const std::string& name);

// Loads a tensor from a golden safetensors file (aborts the test on failure via ADD_FAILURE).
core::Tensor LoadGolden(const std::string& relative_file, const std::string& tensor);

// ||a - b||_2 / ||b||_2 over float32 arrays of equal size.
double RelativeL2(const float* a, const float* b, int64_t n);
double MaxAbsDiff(const float* a, const float* b, int64_t n);

}  // namespace iris::testing
