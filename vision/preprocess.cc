#include "vision/preprocess.h"

#include <sys/mman.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "vision/parallel_for.h"
#include "vision/patchify.h"
#include "vision/resize_bicubic_internal.h"
#include "vision/smart_resize.h"

namespace iris::vision {
namespace {

absl::Status ValidateConfig(const core::PreprocessorConfig& c) {
  if (c.patch_size <= 0 || c.merge_size <= 0 || c.temporal_patch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("preprocessor config: patch_size ", c.patch_size, ", merge_size ",
                     c.merge_size, " and temporal_patch_size ", c.temporal_patch_size,
                     " must be positive"));
  }
  for (int i = 0; i < 3; ++i) {
    if (!(c.image_std[i] != 0.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("preprocessor config: image_std[", i, "] must be non-zero"));
    }
  }
  return absl::OkStatus();
}

// pixel_values is large (75 MB for a 2044x1540 image) and freshly mapped on every call; with
// 4 KiB pages its first touch costs more than computing it. Transparent huge pages (where the
// system leaves them to madvise) cut the page faults 512-fold. Advisory only: errors are ignored.
void AdviseHugePages(void* data, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// Bytes of slack after every row of the scratch buffers, so the patchifier and the horizontal
// pass can use full 64-byte loads.
constexpr int64_t kRowPad = 64;

// Pillow's resize to H x W fused with normalization and patch flattening, one strip of merge
// groups (merge*patch image rows) at a time, so the resized image never exists in full: each
// thread keeps a ring of horizontally resampled rows (reused between consecutive strips) and
// the strip's vertically resampled rows, both cache-resident.
void ResizeAndPatchify(const RgbImage& image, int H, int W, const internal::Patchifier& patchifier,
                       float* out) {
  const bool need_h = W != image.width;
  const bool need_v = H != image.height;
  const int strip_rows = patchifier.strip_rows();
  const int strips = H / strip_rows;
  const int64_t rows_per_strip = patchifier.rows_per_strip(W);
  const int64_t row_len = patchifier.row_length();
  const int64_t out_row_bytes = static_cast<int64_t>(W) * 3;
  const int64_t stride = out_row_bytes + kRowPad;

  internal::AxisCoeffs vert;
  if (need_v) vert = internal::ComputeAxisCoeffs(image.height, H);
  std::optional<internal::HorizontalPlan> hplan;
  if (need_h) hplan.emplace(internal::ComputeAxisCoeffs(image.width, W));
  // Input rows [first, end) that strip s reads.
  auto strip_input = [&](int s) -> std::pair<int, int> {
    if (!need_v) return {s * strip_rows, (s + 1) * strip_rows};
    const int y0 = s * strip_rows, y1 = y0 + strip_rows - 1;
    return {vert.start[y0], vert.start[y1] + vert.count[y1]};
  };
  int ring_rows = 0;
  for (int s = 0; s < strips; ++s) {
    const auto [a, b] = strip_input(s);
    ring_rows = std::max(ring_rows, b - a);
  }

  // Consecutive strips share input rows: hand them out in runs so that a worker mostly
  // continues where it left off, yet small enough to balance the workers.
  const int workers = internal::ParallelWorkers();
  const int run = std::max(1, std::min(8, strips / (4 * workers)));
  const int items = (strips + run - 1) / run;

  struct Scratch {
    std::unique_ptr<uint8_t[]> ring;   // horizontally resampled input rows, by row % ring_rows
    std::unique_ptr<uint8_t[]> strip;  // the strip's vertically resampled rows
    std::vector<const uint8_t*> hrows;  // by input row
    std::vector<const uint8_t*> rows;
    std::vector<const uint8_t*> in_rows;
    std::vector<uint8_t*> out_rows;
    int have_begin = 0, have_end = 0;  // input rows resampled into the ring
  };
  std::vector<std::unique_ptr<Scratch>> scratch(workers);

  internal::ParallelFor(items, [&](int item, int worker) {
    if (scratch[worker] == nullptr) {
      auto sc = std::make_unique<Scratch>();
      if (need_h) sc->ring.reset(new uint8_t[static_cast<size_t>(ring_rows) * stride]);
      if (need_v) sc->strip.reset(new uint8_t[static_cast<size_t>(strip_rows) * stride]);
      sc->hrows.assign(image.height, nullptr);
      sc->rows.resize(strip_rows);
      scratch[worker] = std::move(sc);
    }
    Scratch& sc = *scratch[worker];
    const int s_end = std::min(strips, (item + 1) * run);
    for (int s = item * run; s < s_end; ++s) {
      const auto [a, b] = strip_input(s);
      if (need_h) {
        if (a < sc.have_begin || a > sc.have_end) sc.have_begin = sc.have_end = a;
        sc.in_rows.clear();
        sc.out_rows.clear();
        for (int y = std::max(a, sc.have_end); y < b; ++y) {
          uint8_t* slot = sc.ring.get() + static_cast<size_t>(y % ring_rows) * stride;
          sc.in_rows.push_back(image.row(y));
          sc.out_rows.push_back(slot);
          sc.hrows[y] = slot;
        }
        hplan->Run(sc.in_rows.data(), sc.out_rows.data(), static_cast<int>(sc.in_rows.size()));
        sc.have_end = b;
        sc.have_begin = std::max(sc.have_begin, b - ring_rows);
      } else {
        for (int y = a; y < b; ++y) sc.hrows[y] = image.row(y);
      }
      // Readable bytes per row: scratch rows are padded; the caller's rows are not (the last
      // image row ends the buffer).
      const int64_t readable = need_v || need_h ? stride : out_row_bytes;
      for (int i = 0; i < strip_rows; ++i) {
        const int yy = s * strip_rows + i;
        if (need_v) {
          uint8_t* dst = sc.strip.get() + static_cast<size_t>(i) * stride;
          internal::VerticalRow(vert, yy, sc.hrows.data(), out_row_bytes, dst);
          sc.rows[i] = dst;
        } else {
          sc.rows[i] = sc.hrows[yy];
        }
      }
      patchifier.Strip(sc.rows.data(), W, readable, out + s * rows_per_strip * row_len);
    }
  });
}

}  // namespace

absl::StatusOr<PreprocessedImage> Preprocess(const RgbImage& image,
                                             const core::PreprocessorConfig& config,
                                             const PixelBounds& bounds) {
  IRIS_RETURN_IF_ERROR(ValidateConfig(config));
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return absl::InvalidArgumentError(absl::StrCat("image ", image.width, "x", image.height,
                                                   " has ", image.pixels.size(),
                                                   " bytes; expected width*height*3"));
  }
  const int P = config.patch_size;
  const int M = config.merge_size;
  const int factor = config.factor();
  if (image.height < factor || image.width < factor) {
    const bool h = image.height < factor;
    return absl::InvalidArgumentError(absl::StrCat(
        "image ", h ? "height " : "width ", h ? image.height : image.width,
        " is below the minimum ", factor, " (patch ", P, " x merge ", M, ")"));
  }
  const int64_t min_pixels = bounds.min_pixels.value_or(config.min_pixels);
  const int64_t max_pixels = bounds.max_pixels.value_or(config.max_pixels);
  IRIS_ASSIGN_OR_RETURN(const ResizedSize size,
                        SmartResize(image.height, image.width, factor, min_pixels, max_pixels));
  const int H = size.height;
  const int W = size.width;

  const internal::Patchifier patchifier(P, config.temporal_patch_size, M, config.image_mean,
                                        config.image_std);
  const int64_t grid_h = H / P;
  const int64_t grid_w = W / P;
  PreprocessedImage result;
  result.grid_thw = {1, grid_h, grid_w};
  result.resized_height = H;
  result.resized_width = W;
  result.pixel_values = core::Tensor::Empty(core::DType::kF32, {grid_h * grid_w, patchifier.row_length()});
  float* out = result.pixel_values.data<float>();
  AdviseHugePages(out, result.pixel_values.nbytes());

  ResizeAndPatchify(image, H, W, patchifier, out);
  return result;
}

}  // namespace iris::vision
