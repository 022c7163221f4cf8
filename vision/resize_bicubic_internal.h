// The pieces of the Pillow BICUBIC resize, exposed so that preprocessing can fuse the vertical
// pass with patch flattening, and so that tests can check the vectorised passes against a plain
// scalar transcription of Pillow. Not a public interface.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "vision/image.h"

namespace iris::vision::internal {

// Fixed-point precision of Pillow's 8-bit resampling (32 - 8 - 2).
inline constexpr int kPrecisionBits = 22;

// One axis' filter taps, computed exactly as Pillow's precompute_coeffs + normalize_coeffs_8bpc.
struct AxisCoeffs {
  int in_size = 0;
  int out_size = 0;
  int ksize = 0;                 // taps stored per output index (zero padded)
  std::vector<int> start;        // first input index of output i
  std::vector<int> count;        // number of taps of output i
  std::vector<int32_t> weights;  // out_size * ksize, 22-bit fixed point
  const int32_t* w(int i) const { return weights.data() + static_cast<size_t>(i) * ksize; }
};

AxisCoeffs ComputeAxisCoeffs(int in_size, int out_size);

// A horizontal pass prepared for one of the vectorised kernels (built once per resize):
//  - kInterleaved: blocks of up to 16 output pixels whose taps lie in a 128-byte window of the
//    RGB row, gathered with vpermi2b; best near scale 1 (no layout change).
//  - kPlanarBlocks: the same on a row split into R, G and B planes, where the window spans 128
//    pixels; best for moderate downscaling.
//  - kPlanarDot: one output pixel at a time, 16 taps per step, on planes; best for large
//    downscaling (many taps per output).
//  - kScalar: Pillow's loop as written (tests, and sizes no kernel takes).
// The cheapest feasible kernel is chosen by counting vector operations per row.
class HorizontalPlan {
 public:
  enum class Mode { kScalar, kInterleaved, kPlanarBlocks, kPlanarDot };
  // `force` selects a kernel (falling back to kScalar if it cannot handle these coefficients).
  explicit HorizontalPlan(AxisCoeffs coeffs, std::optional<Mode> force = std::nullopt);
  const AxisCoeffs& coeffs() const { return c_; }
  Mode mode() const { return mode_; }
  // Resamples `n` rows: in_rows[i] (in_size pixels) -> out_rows[i] (out_size pixels). Reads
  // nothing beyond in_size*3 bytes of an input row.
  void Run(const uint8_t* const* in_rows, uint8_t* const* out_rows, int n) const;

 private:
  struct Block {
    int out0;      // first output pixel
    int npix;      // output pixels in the block (<= 16)
    int in0;       // window start in the input row: bytes (interleaved) or pixels (planar)
    int taps;      // taps used by the block
    size_t wofs;   // offset into weights_ (int32): 48 per tap (interleaved) or 16 (planar)
  };
  bool BuildInterleaved();
  bool BuildPlanarBlocks();
  void BuildPlanarDot();
  void RunInterleaved(const uint8_t* const* in_rows, uint8_t* const* out_rows, int n) const;
  void RunPlanar(const uint8_t* const* in_rows, uint8_t* const* out_rows, int n) const;

  AxisCoeffs c_;
  Mode mode_ = Mode::kScalar;
  std::vector<Block> blocks_;
  std::vector<uint8_t> index_;     // 64 bytes per block: window offset of each lane's tap 0
  std::vector<int32_t> weights_;   // per block and tap (blocks), or per pixel and 16-tap chunk (dot)
  std::vector<size_t> dot_wofs_;   // kPlanarDot: offset into weights_ per output pixel
};

// Output row `yy` of the vertical pass over `bytes` bytes: Σ_k w[yy][k] * rows[start[yy] + k],
// where rows[y] points at intermediate (horizontally resampled) row y.
// AVX-512 where the processor has it (VerticalRowAvx512), else Pillow's loop (VerticalRowScalar).
void VerticalRow(const AxisCoeffs& c, int yy, const uint8_t* const* rows, int64_t bytes,
                 uint8_t* out);
void VerticalRowAvx512(const AxisCoeffs& c, int yy, const uint8_t* const* rows, int64_t bytes, uint8_t* out);
void VerticalRowScalar(const AxisCoeffs& c, int yy, const uint8_t* const* rows, int64_t bytes, uint8_t* out);

// Bytes of slack after every row of the strip driver's scratch rows (full 64-byte loads).
inline constexpr int64_t kScratchRowPad = 64;

// Called with one strip of resized rows: rows[i] is output row strip * strip_rows + i, for i
// < count; `readable` bytes may be read from each row pointer (at least width * 3).
using StripFn = absl::FunctionRef<void(int strip, const uint8_t* const* rows, int count,
                                       int64_t readable)>;

// The resize to out_height x out_width, produced strip by strip (strip_rows output rows each;
// the last strip may be shorter) on core::ParallelFor's workers, so that the resized image need not
// exist in full: each worker keeps a ring of horizontally resampled input rows, reused between
// consecutive strips, and the strip's vertically resampled rows. With `dst` (out_height x
// out_width) the rows are written there instead of to scratch.
void ResizeStrips(const RgbImage& in, int out_height, int out_width, int strip_rows, RgbImage* dst,
                  StripFn emit);

// A direct transcription of Pillow's ImagingResample (BICUBIC, 8 bpc, 3 channels) for tests.
RgbImage ResizeBicubicReference(const RgbImage& in, int out_height, int out_width);

}  // namespace iris::vision::internal
