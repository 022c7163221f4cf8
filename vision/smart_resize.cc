#include "vision/smart_resize.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace iris::vision {
namespace {

constexpr double kMaxAspectRatio = 200.0;

// Python's round(): to nearest, ties to even (the default FP rounding mode does exactly this).
double RoundHalfEven(double x) { return std::nearbyint(x); }

// Enough digits that a ratio just above the limit never prints as the limit itself.
std::string FormatRatio(double ratio) {
  std::string s = absl::StrFormat("%.1f", ratio);
  if (std::stod(s) <= kMaxAspectRatio) s = absl::StrFormat("%.6g", ratio);
  return s;
}

}  // namespace

absl::StatusOr<ResizedSize> SmartResize(int height, int width, int factor, int64_t min_pixels,
                                        int64_t max_pixels) {
  if (factor <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("resize factor ", factor, " must be positive"));
  }
  if (min_pixels <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_pixels ", min_pixels, " must be positive"));
  }
  if (max_pixels <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_pixels ", max_pixels, " must be positive"));
  }
  if (min_pixels > max_pixels) {
    return absl::InvalidArgumentError(absl::StrCat("min_pixels ", min_pixels,
                                                   " exceeds max_pixels ", max_pixels));
  }
  if (height < factor) {
    return absl::InvalidArgumentError(absl::StrCat("image height ", height,
                                                   " is below the minimum ", factor,
                                                   " (the resize factor)"));
  }
  if (width < factor) {
    return absl::InvalidArgumentError(absl::StrCat("image width ", width,
                                                   " is below the minimum ", factor,
                                                   " (the resize factor)"));
  }
  const double h = height;
  const double w = width;
  const double ratio = std::max(h, w) / std::min(h, w);
  if (ratio > kMaxAspectRatio) {
    return absl::InvalidArgumentError(absl::StrCat("aspect ratio ", FormatRatio(ratio),
                                                   " exceeds the limit 200 (image ", width, "x",
                                                   height, ")"));
  }

  // Exactly the reference's arithmetic, in double precision. h*w and the pixel limits are
  // exact in double (< 2^53), so the true divisions below round the same way as Python's.
  const double f = factor;
  const double area = h * w;
  double h_bar = RoundHalfEven(h / f) * f;
  double w_bar = RoundHalfEven(w / f) * f;
  if (h_bar * w_bar > static_cast<double>(max_pixels)) {
    const double beta = std::sqrt(area / static_cast<double>(max_pixels));
    h_bar = std::floor(h / beta / f) * f;
    w_bar = std::floor(w / beta / f) * f;
  } else if (h_bar * w_bar < static_cast<double>(min_pixels)) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / area);
    h_bar = std::ceil(h * beta / f) * f;
    w_bar = std::ceil(w * beta / f) * f;
  }
  if (h_bar < f || w_bar < f) {
    // Only reachable with a very elongated image and a small max_pixels: the reference would go
    // on to resize to an empty image.
    return absl::InvalidArgumentError(absl::StrCat(
        "image ", width, "x", height, " cannot be resized within max_pixels ", max_pixels,
        ": a side would shrink below ", factor));
  }
  if (h_bar > 1e9 || w_bar > 1e9) {
    return absl::InvalidArgumentError(
        absl::StrCat("image ", width, "x", height, " is too large to resize"));
  }
  return ResizedSize{static_cast<int>(h_bar), static_cast<int>(w_bar)};
}

}  // namespace iris::vision
