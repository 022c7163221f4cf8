// LogitEdits' packing, and the dispatch point of EditLogitRows.
#include "kernels/logit_edits.h"

#include <algorithm>
#include <bit>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/device.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace iris::kernels {

void LogitEdits::Clear() {
  penalty.clear();
  penalized_begin.assign(1, 0);
  masked_begin.assign(1, 0);
  penalized.clear();
  masked.clear();
}

namespace {
// Appends ids to `to`, each once (sorted): an id given twice is edited once, as HF's penalty's
// gather/scatter does, and no two threads of a device's edit write one logit.
void AppendDistinct(std::vector<int32_t>& to, std::span<const int32_t> ids) {
  const auto first = static_cast<std::ptrdiff_t>(to.size());
  to.insert(to.end(), ids.begin(), ids.end());
  std::sort(to.begin() + first, to.end());
  to.erase(std::unique(to.begin() + first, to.end()), to.end());
}
}  // namespace

void LogitEdits::AddRow(float row_penalty, std::span<const int32_t> row_penalized, std::span<const int32_t> row_masked) {
  penalty.push_back(row_penalty);
  if (row_penalty != 1.f) AppendDistinct(penalized, row_penalized);
  AppendDistinct(masked, row_masked);
  penalized_begin.push_back(static_cast<int32_t>(penalized.size()));
  masked_begin.push_back(static_cast<int32_t>(masked.size()));
}

int64_t LogitEdits::PackedSize() const {
  return 3 * rows() + 2 + static_cast<int64_t>(penalized.size() + masked.size());
}

void LogitEdits::Pack(int32_t* out) const {
  for (const float p : penalty) *out++ = std::bit_cast<int32_t>(p);
  for (const int32_t b : penalized_begin) *out++ = b;
  for (const int32_t b : masked_begin) *out++ = b;
  for (const int32_t id : penalized) *out++ = id;
  for (const int32_t id : masked) *out++ = id;
}

PackedLogitEdits LogitEdits::View(const int32_t* packed) const {
  PackedLogitEdits v;
  v.rows = rows();
  v.penalty_bits = packed;
  v.penalized_begin = v.penalty_bits + v.rows;
  v.masked_begin = v.penalized_begin + v.rows + 1;
  v.penalized = v.masked_begin + v.rows + 1;
  v.masked = v.penalized + penalized.size();
  return v;
}

void EditLogitRows(Device& device, float* logits, int64_t rows, int64_t vocab, const PackedLogitEdits& edits) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::EditLogitRows(logits, rows, vocab, edits);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchEditLogitRows(gpu.stream(), logits, rows, vocab, edits), "EditLogitRows");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "EditLogitRows");
}

}  // namespace iris::kernels
