// Rescale (1/255), normalize and flatten resized RGB8 rows into the reference's pixel_values
// rows, one strip of merge*patch image rows (one row of merge groups) at a time. Bit-exact with
// the reference's float32 arithmetic. Not a public interface.
#pragma once

#include <array>
#include <cstdint>

namespace iris::vision::internal {

class Patchifier {
 public:
  Patchifier(int patch, int temporal, int merge, const std::array<float, 3>& mean,
             const std::array<float, 3>& std);

  int row_length() const { return 3 * temporal_ * patch_ * patch_; }
  int strip_rows() const { return merge_ * patch_; }
  // Output rows produced by one strip of an image `width` pixels wide.
  int64_t rows_per_strip(int width) const {
    return static_cast<int64_t>(width / patch_) * merge_;
  }

  // rows[i] is resized image row (strip * strip_rows() + i), `width` pixels (a multiple of
  // patch * merge); `readable` bytes may be read from each row pointer (>= width * 3; 64 more
  // saves masked loads). Writes rows_per_strip(width) rows of row_length() floats at `out`
  // (with non-temporal stores where `out` is 64-byte aligned).
  void Strip(const uint8_t* const* rows, int width, int64_t readable, float* out) const;

  // The normalized value of byte `v` in channel `c`.
  float Value(int c, uint8_t v) const { return lut_[c][v]; }

 private:
  void StripScalar(const uint8_t* const* rows, int width, float* out) const;
  // AVX-512 with VBMI (patch <= 16), chosen at run time.
  void StripAvx512(const uint8_t* const* rows, int width, int64_t readable, float* out) const;

  int patch_, temporal_, merge_;
  std::array<float, 3> mean_, std_;
  alignas(64) float lut_[3][256];
};

}  // namespace iris::vision::internal
