// Helpers shared by the test suites: paths to test data and generated models, loading golden
// safetensors, comparing arrays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "core/tensor.h"
#include "vision/image.h"

namespace iris::testing {

// tests/data/<relative>
std::string DataPath(const std::string& relative);
// <build>/test-models/<name> (made by the make_model_* ctest fixtures)
std::string ModelPath(const std::string& name);

// Loads a tensor from a golden safetensors file (aborts the test on failure via ADD_FAILURE).
core::Tensor LoadGolden(const std::string& relative_file, const std::string& tensor);

// tests/data/<relative> parsed as JSON (ADD_FAILURE and null when missing or invalid).
nlohmann::json LoadDataJson(const std::string& relative);

// The elements of an I64 tensor.
std::vector<int64_t> Int64Values(const core::Tensor& t);

// ||a - b||_2 / ||b||_2 over float32 arrays of equal size.
double RelativeL2(const float* a, const float* b, int64_t n);
double MaxAbsDiff(const float* a, const float* b, int64_t n);

// `got` against `want`, the same computation with its matmul rows split between calls in another
// way (pieces, chunks): bit for bit where the device's matmuls are split-invariant
// (kernels::MatmulRowsSplitInvariant), else within `tolerance` relative L2, and never bit-equal
// by accident of a sloppy check: the message says which was asked.
::testing::AssertionResult SameUnderRowSplits(const float* got, const float* want, int64_t n, bool split_invariant,
                                              double tolerance);

// n floats uniform in [lo, hi) from a seeded generator (the same seed gives the same values).
std::vector<float> RandomFloats(int64_t n, uint32_t seed, float lo = -1.f, float hi = 1.f);

// n floats from N(0, scale²), seeded the same way.
std::vector<float> RandomNormal(int64_t n, uint32_t seed, float scale = 1.f);

// A uint8 [H, W, 3] golden array as an RgbImage (ADD_FAILURE and empty on another shape/dtype).
vision::RgbImage ImageFromTensor(const core::Tensor& t);

}  // namespace iris::testing
