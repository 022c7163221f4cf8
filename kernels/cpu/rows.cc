// Row copies (gather, scatter, the paged KV cache's writes), the embedding lookup and the greedy
// argmax on the CPU: memcpy, conversion and scan loops, parallel over rows when there are enough
// bytes to share.
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/bf16.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/paged_sequences.h"
#include "kernels/logit_scan.h"

namespace iris::kernels::cpu {
namespace {

// Below this many bytes copied, one thread is faster than waking the team.
constexpr int64_t kParallelBytes = 1 << 16;

// The first index of the largest value (NaN never wins; 0 when every value is NaN or -inf), in
// two passes the compiler vectorizes, the largest value (kernels::RowMax) then its first place,
// where one pass that tracked both branched on every value (~0.1 ms over a 152k vocabulary).
int32_t RowArgmax(const float* row, int64_t n) {
  constexpr int kLanes = 16;
  const float best = RowMax(row, n);
  if (best == -std::numeric_limits<float>::infinity()) return 0;  // nothing beats -inf: index 0
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    bool any = false;
    for (int j = 0; j < kLanes; ++j) any |= row[i + j] == best;
    if (any) break;
  }
  for (; i < n; ++i) {
    if (row[i] == best) return static_cast<int32_t>(i);
  }
  return 0;  // unreachable: best is one of the values
}

}  // namespace

void GatherRows(CpuDevice& dev, const float* src, int64_t width, std::span<const int32_t> index, float* dst) {
  const int64_t n = static_cast<int64_t>(index.size());
  const size_t row_bytes = static_cast<size_t>(width) * sizeof(float);
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (n * width * 4 > kParallelBytes)
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * width, src + int64_t{index[i]} * width, row_bytes);
}

void ArgmaxRows(CpuDevice& dev, const float* logits, int64_t rows, int64_t vocab, int32_t* out) {
// Parallel over rows only: one row (a batch-1 pick) would wake the team for nothing.
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (rows > 1 && rows * vocab * 4 > kParallelBytes)
  for (int64_t r = 0; r < rows; ++r) out[r] = RowArgmax(logits + r * vocab, vocab);
}

void EditLogitRows(float* logits, int64_t rows, int64_t vocab, const PackedLogitEdits& e) {
  for (int64_t r = 0; r < rows && r < e.rows; ++r) {
    float* row = logits + r * vocab;
    // The sampler's order: the masks, then the penalty (on a masked id: -inf either way).
    for (int32_t k = e.masked_begin[r]; k < e.masked_begin[r + 1]; ++k) {
      if (e.masked[k] >= 0 && e.masked[k] < vocab) row[e.masked[k]] = -std::numeric_limits<float>::infinity();
    }
    float penalty;
    std::memcpy(&penalty, &e.penalty_bits[r], sizeof penalty);
    for (int32_t k = e.penalized_begin[r]; k < e.penalized_begin[r + 1]; ++k) {
      if (e.penalized[k] < 0 || e.penalized[k] >= vocab) continue;
      float& s = row[e.penalized[k]];
      s = s < 0.f ? s * penalty : s / penalty;
    }
  }
}

void ScatterRows(CpuDevice& dev, const float* src, int64_t width, std::span<const int32_t> index, float* dst) {
  const int64_t n = static_cast<int64_t>(index.size());
  const size_t row_bytes = static_cast<size_t>(width) * sizeof(float);
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (n * width * 4 > kParallelBytes)
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + int64_t{index[i]} * width, src + i * width, row_bytes);
}

void WritePagedKv(CpuDevice& dev, const PagedKvLayer& layer, const float* k, int64_t k_row_stride, const float* v,
                  int64_t v_row_stride, std::span<const int64_t> slots) {
  if (slots.empty()) return;
  CheckWritableKvLayer(layer);
  const bool bf16 = layer.dtype == core::DType::kBF16;
  const int64_t num_slots = layer.num_blocks * layer.block_size;
  const int64_t row = static_cast<int64_t>(layer.num_kv_heads) * layer.head_dim;
  const int64_t n = static_cast<int64_t>(slots.size());
  for (int64_t r = 0; r < n; ++r) {
    if ((slots[r] < 0 && slots[r] != kPadSlot) || slots[r] >= num_slots) {
      std::fprintf(stderr, "iris WritePagedKv: slot %lld out of range [0, %lld)\n", static_cast<long long>(slots[r]),
                   static_cast<long long>(num_slots));
      std::abort();
    }
  }
  // A prefill writes ~1 MB per layer; small writes stay on the calling thread.
  if (bf16) {
    // Rounded to nearest even (core::FloatToBf16, as the checkpoints' bf16), whatever the tier.
    uint16_t* kp = static_cast<uint16_t*>(layer.k);
    uint16_t* vp = static_cast<uint16_t*>(layer.v);
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (n * row >= (1 << 16))
    for (int64_t r = 0; r < n; ++r) {
      if (slots[r] == kPadSlot) continue;
      uint16_t* kd = kp + slots[r] * row;
      uint16_t* vd = vp + slots[r] * row;
      const float* ks = k + r * k_row_stride;
      const float* vs = v + r * v_row_stride;
#pragma omp simd
      for (int64_t i = 0; i < row; ++i) kd[i] = core::FloatToBf16(ks[i]);
#pragma omp simd
      for (int64_t i = 0; i < row; ++i) vd[i] = core::FloatToBf16(vs[i]);
    }
    return;
  }
  float* kp = static_cast<float*>(layer.k);
  float* vp = static_cast<float*>(layer.v);
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (n * row >= (1 << 16))
  for (int64_t r = 0; r < n; ++r) {
    if (slots[r] == kPadSlot) continue;
    std::memcpy(kp + slots[r] * row, k + r * k_row_stride, static_cast<size_t>(row) * sizeof(float));
    std::memcpy(vp + slots[r] * row, v + r * v_row_stride, static_cast<size_t>(row) * sizeof(float));
  }
}

void EmbeddingLookup(CpuDevice& dev, const core::Tensor& table, std::span<const int32_t> ids, float* out) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t width = table.dim(1), vocab = table.dim(0);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      std::fprintf(stderr, "iris EmbeddingLookup: id %d at %lld outside [0, %lld)\n", ids[i],
                   static_cast<long long>(i), static_cast<long long>(vocab));
      std::abort();
    }
  }
  const core::DType dt = table.dtype();
#pragma omp parallel for num_threads(dev.threads()) schedule(static) if (n * width * 4 > kParallelBytes)
  for (int64_t i = 0; i < n; ++i) {
    float* row = out + i * width;
    const int64_t at = int64_t{ids[i]} * width;
    if (dt == core::DType::kF32) {
      std::memcpy(row, table.data<float>() + at, static_cast<size_t>(width) * sizeof(float));
    } else if (dt == core::DType::kBF16) {
      const uint16_t* src = table.data<uint16_t>() + at;
      for (int64_t j = 0; j < width; ++j) row[j] = core::Bf16ToFloat(src[j]);
    } else {
      const uint16_t* src = table.data<uint16_t>() + at;
      for (int64_t j = 0; j < width; ++j) row[j] = core::F16ToFloat(src[j]);
    }
  }
}

void UnpadHeads(CpuDevice& dev, const float* padded, int64_t rows, int num_heads, int head_dim, int padded_dim,
                float* out) {
  const int64_t in_row = int64_t{num_heads} * padded_dim, out_row = int64_t{num_heads} * head_dim;
#pragma omp parallel for num_threads(dev.threads()) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int h = 0; h < num_heads; ++h) {
      std::memcpy(out + r * out_row + int64_t{h} * head_dim, padded + r * in_row + int64_t{h} * padded_dim,
                  static_cast<size_t>(head_dim) * sizeof(float));
    }
  }
}

}  // namespace iris::kernels::cpu
