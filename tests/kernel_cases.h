// Inputs, references and checks shared by the suites that run iris's CUDA kernels: on the SIMT
// harness (simt_kernels_test), on a GPU through the launches (cuda_kernels_test) and through the
// ops' dispatch points (cuda_ops_test).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/paged_decode_rotary.h"
#include "kernels/device.h"
#include "kernels/paged_attention.h"
#include "kernels/patch_rows.h"
#include "llm/sampler.h"
#include "tests/test_util.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace iris::testing {

// |got - want| <= rel * max(1, |want|), element by element; where want is NaN or infinite, got
// must be NaN or the same infinity.
inline void ExpectCloseRel(const std::vector<float>& got, const std::vector<float>& want, float rel, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << what << " at " << i << ": " << got[i] << ", want NaN";
    } else if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " at " << i;
    } else {
      ASSERT_NEAR(got[i], want[i], rel * std::max(1.f, std::fabs(want[i]))) << what << " at " << i;
    }
  }
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The same bits, element by element (NaN payloads and the sign of zero included).
template <typename T>
void ExpectSameBits(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0) << what << " at " << i << ": " << got[i] << " vs " << want[i];
  }
}

// The same bits, except that any NaN equals any NaN: a GPU's arithmetic returns its canonical NaN
// (0x7fffffff) where the CPU's keeps the operand's payload, so bits match only for copies.
inline void ExpectSameValues(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    ASSERT_EQ(Bits(got[i]), Bits(want[i])) << what << " at " << i << ": " << got[i] << " vs " << want[i];
  }
}

// n activation inputs: N(0, 3^2) with the edge cases first (signed zeros, a tiny and a subnormal
// value, where exp saturates, infinities, NaN).
inline std::vector<float> ActivationInputs(int64_t n, uint32_t seed) {
  std::vector<float> x = RandomNormal(n, seed, 3.f);
  const float inf = std::numeric_limits<float>::infinity();
  const float special[] = {0.f, -0.f, 1e-30f, -1e-40f, 20.f, -20.f, 88.5f, -88.5f, 100.f, -100.f, inf, -inf, NAN};
  for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) x[i] = special[i];
  return x;
}

// Floats that test f32 -> bf16 rounding: random values, then exact ties (low half 0x8000) with an
// even and an odd bf16 below, values a bit either side of a tie, quiet and signalling NaNs (one
// whose payload sits only in the low half), infinities, the largest float (rounds to inf),
// signed zeros and subnormals.
inline std::vector<float> Bf16RoundingInputs(int64_t n, uint32_t seed) {
  std::vector<float> x = RandomNormal(n, seed);
  const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0xBF808000u, 0xBF818000u, 0x3F807FFFu, 0x3F808001u,
                              0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7FA00000u, 0x7F800000u, 0xFF800000u,
                              0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F7F8000u, 0x00000000u, 0x80000000u, 0x00000001u,
                              0x807FFFFFu, 0x00008000u, 0x00018000u};
  for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) x[i] = FromBits(special[i]);
  return x;
}

// A permutation of 0 .. n-1 (seeded).
inline std::vector<int32_t> Shuffled(int32_t n, uint32_t seed) {
  std::vector<int32_t> index(n);
  std::iota(index.begin(), index.end(), 0);
  std::shuffle(index.begin(), index.end(), std::mt19937(seed));
  return index;
}

// Every 16-bit pattern once, as a [256, 256] table (all halves and bf16s: subnormals, infinities,
// NaNs), and ids that read its rows shuffled, some twice.
inline std::vector<uint16_t> AllHalfBits() {
  std::vector<uint16_t> t(1 << 16);
  std::iota(t.begin(), t.end(), uint16_t{0});
  return t;
}
inline std::vector<int32_t> AllHalfBitsIds() {
  std::vector<int32_t> ids = Shuffled(256, 21);
  ids.insert(ids.end(), {0, 255, 124, 124, 3});
  return ids;
}

// A WritePagedKv step: `rows` tokens' k and v rows (strided, as in a qkv projection's output:
// k_row_stride = v_row_stride = 3 * row), written into slots handed out shuffled over a pool of
// num_blocks x block_size slots, pools pre-filled with a marker.
struct PagedWriteCase {
  int block_size = 4, kv_heads = 2, head_dim = 7;
  int64_t num_blocks = 6, rows = 17;
  std::vector<float> qkv;
  std::vector<int64_t> slots;

  explicit PagedWriteCase(uint32_t seed) {
    qkv = RandomNormal(rows * stride(), seed);
    // The rounding cases in the first two rows of both k and v.
    const std::vector<float> special = Bf16RoundingInputs(2 * row(), seed);
    for (int64_t i = 0; i < 2 * row(); ++i) {
      qkv[(i / row()) * stride() + row() + i % row()] = special[i];
      qkv[(i / row()) * stride() + 2 * row() + i % row()] = special[i];
    }
    const std::vector<int32_t> order = Shuffled(static_cast<int32_t>(num_slots()), seed + 1);
    slots.assign(order.begin(), order.begin() + rows);
    slots[5] = slots[rows - 1] = kernels::kPadSlot;  // padding rows: written nowhere
  }
  int64_t row() const { return int64_t{kv_heads} * head_dim; }
  int64_t stride() const { return 3 * row(); }
  int64_t num_slots() const { return num_blocks * block_size; }
  int64_t pool_elems() const { return num_slots() * row(); }
  const float* k() const { return qkv.data() + row(); }
  const float* v() const { return qkv.data() + 2 * row(); }
  kernels::PagedKvLayer Layer(void* k_pool, void* v_pool, bool bf16) const {
    return kernels::PagedKvLayer{k_pool, v_pool, num_blocks, block_size, kv_heads, head_dim,
                                 bf16 ? core::DType::kBF16 : core::DType::kF32};
  }
  // The CPU op's pools (element type T: float, or uint16_t for bf16), from pools filled with `marker`.
  template <typename T>
  std::pair<std::vector<T>, std::vector<T>> Reference(T marker) const {
    std::vector<T> kp(pool_elems(), marker), vp(pool_elems(), marker);
    kernels::WritePagedKv(kernels::DefaultCpuDevice(), Layer(kp.data(), vp.data(), sizeof(T) == 2), k(), stride(), v(),
                          stride(), slots);
    return {kp, vp};
  }
};

// The CPU engine's greedy token for a row of logits (llm::Sampler, temperature 0).
inline int32_t CpuGreedyToken(const float* logits, int64_t vocab) {
  std::vector<float> copy(logits, logits + vocab);
  return llm::Sampler(llm::SamplingParams{}, {}).Sample(copy.data(), vocab);
}

// A paged-attention step: random K/V pools (f32, and the same values as bf16 bits), sequences
// (context, new rows) whose blocks are handed out in the order (i * block_step + block_offset) %
// num_blocks, their metadata and random queries.
struct PagedCase {
  int block_size = 16, kv_heads = 0, heads = 0, head_dim = 0;
  int64_t num_blocks = 0;
  std::vector<float> kf, vf;
  std::vector<uint16_t> kb, vb;
  kernels::PagedMetadataBuilder builder;  // meta views its arrays: a case is neither copied nor moved
  kernels::PagedMetadata meta;
  int rows = 0;
  std::vector<float> q;

  PagedCase(int kv_heads_, int heads_, int head_dim_, int64_t num_blocks_,
            const std::vector<std::pair<int, int>>& seqs, int block_step, int block_offset)
      : kv_heads(kv_heads_), heads(heads_), head_dim(head_dim_), num_blocks(num_blocks_) {
    const int64_t elems = num_blocks * block_size * kv_heads * head_dim;
    kf = RandomNormal(elems, 11);
    vf = RandomNormal(elems, 12);
    kb.resize(elems);
    vb.resize(elems);
    for (int64_t i = 0; i < elems; ++i) {
      kb[i] = core::FloatToBf16(kf[i]);
      vb[i] = core::FloatToBf16(vf[i]);
    }
    int next = 0;
    for (const auto& [context, q_len] : seqs) {
      std::vector<int32_t> t;
      for (int b = 0; b < (context + block_size - 1) / block_size; ++b) {
        t.push_back(static_cast<int32_t>((next++ * block_step + block_offset) % num_blocks));
      }
      builder.Add(t, context, rows, q_len);
      rows += q_len;
    }
    meta = builder.Build();
    q = RandomNormal(static_cast<int64_t>(rows) * heads * head_dim, 13);
  }

  PagedCase(const PagedCase&) = delete;
  PagedCase& operator=(const PagedCase&) = delete;

  int64_t row_stride() const { return static_cast<int64_t>(heads) * head_dim; }
  float scale() const { return 1.f / std::sqrt(static_cast<float>(head_dim)); }
  const void* k(bool bf16) const { return bf16 ? static_cast<const void*>(kb.data()) : kf.data(); }
  const void* v(bool bf16) const { return bf16 ? static_cast<const void*>(vb.data()) : vf.data(); }

  // The case's op arguments over q rows `q_rows` into `out` (both [rows, heads * head_dim]) and the
  // pools k_pool, v_pool (f32 or bf16 pages), with the case's host metadata (f32 products).
  kernels::PagedAttentionArgs Args(const float* q_rows, float* out, const void* k_pool, const void* v_pool,
                                   bool bf16_pool) const {
    kernels::PagedAttentionArgs a;
    a.q = q_rows;
    a.q_row_stride = row_stride();
    a.out = out;
    a.out_row_stride = row_stride();
    a.num_heads = heads;
    a.scale = scale();
    a.layer = kernels::PagedKvLayer{const_cast<void*>(k_pool), const_cast<void*>(v_pool), num_blocks, block_size,
                                    kv_heads, head_dim, bf16_pool ? core::DType::kBF16 : core::DType::kF32};
    a.metadata = meta;
    return a;
  }

  // The CPU kernel's output over the f32 or the bf16 pools.
  std::vector<float> Reference(bool bf16) const {
    std::vector<float> out(q.size(), NAN);
    kernels::PagedAttention(kernels::DefaultCpuDevice(), Args(q.data(), out.data(), k(bf16), v(bf16), bf16));
    return out;
  }

  // The tensor-core prefill's definition (kernels/cuda/paged_flash_mma.cuh) in double precision:
  // each row's attention of its q rounded to bf16 over the bf16 pages, causal at its position;
  // abs_mean gets each element's sum of p|v| / sum of p (the scale of the probabilities' rounding).
  std::vector<double> Bf16QReference(std::vector<double>* abs_mean) const {
    std::vector<double> out(q.size(), 0.0);
    abs_mean->assign(q.size(), 0.0);
    const int64_t row_elems = int64_t{kv_heads} * head_dim;
    const auto bf = [](uint16_t b) { return static_cast<double>(core::Bf16ToFloat(b)); };
    for (int s = 0; s < meta.num_seqs; ++s) {
      const int q0 = meta.query_start[s], q_len = meta.query_start[s + 1] - q0;
      const int32_t* table = meta.block_tables.data() + int64_t{s} * meta.max_blocks_per_seq;
      const auto slot = [&](int64_t j) { return int64_t{table[j / block_size]} * block_size + j % block_size; };
      for (int i = 0; i < q_len; ++i) {
        const int64_t row = q0 + i, keys = meta.context_lens[s] - q_len + i + 1;
        for (int h = 0; h < heads; ++h) {
          const int64_t g = h / (heads / kv_heads), at = row * row_stride() + int64_t{h} * head_dim;
          std::vector<double> scores(static_cast<size_t>(keys));
          double top = -INFINITY;
          for (int64_t j = 0; j < keys; ++j) {
            double dot = 0;
            for (int d = 0; d < head_dim; ++d) {
              dot += static_cast<double>(core::Bf16ToFloat(core::FloatToBf16(q[at + d]))) *
                     bf(kb[slot(j) * row_elems + g * head_dim + d]);
            }
            scores[j] = dot * scale();
            top = std::max(top, scores[j]);
          }
          double sum = 0;
          for (int64_t j = 0; j < keys; ++j) {
            const double p = std::exp(scores[j] - top);
            sum += p;
            for (int d = 0; d < head_dim; ++d) {
              const double v = bf(vb[slot(j) * row_elems + g * head_dim + d]);
              out[at + d] += p * v;
              (*abs_mean)[at + d] += p * std::fabs(v);
            }
          }
          for (int d = 0; d < head_dim; ++d) {
            out[at + d] /= sum;
            (*abs_mean)[at + d] /= sum;
          }
        }
      }
    }
    return out;
  }
};

// A step's rotary inputs over a PagedCase: its rows' q, k, v before rotary (heads + 2 kv heads a
// row, random), random cos/sin rows, and each row's slot (its position through its sequence's
// block table, as the engine maps it), row pad_row padding (kernels::kPadSlot). For the
// attentions that do a decode step's rotary and KV write themselves (PagedDecodeRotary), checked
// against the rotary + KV write launch and the plain attention.
struct DecodeRotaryCase {
  const PagedCase& c;
  int pad_row;
  int64_t stride;
  std::vector<float> qkv, cos, sin;
  std::vector<int64_t> slots;

  DecodeRotaryCase(const PagedCase& c_, int pad_row_, int seed)
      : c(c_),
        pad_row(pad_row_),
        stride(int64_t{c_.heads + 2 * c_.kv_heads} * c_.head_dim),
        qkv(RandomNormal(c_.rows * stride, seed)),
        cos(RandomNormal(c_.rows * (c_.head_dim / 2), seed + 1)),
        sin(RandomNormal(c_.rows * (c_.head_dim / 2), seed + 2)),
        slots(static_cast<size_t>(c_.rows)) {
    for (int s = 0; s < c.meta.num_seqs; ++s) {
      const int q0 = c.meta.query_start[s], q_len = c.meta.query_start[s + 1] - q0;
      for (int i = 0; i < q_len; ++i) {
        const int pos = c.meta.context_lens[s] - q_len + i;
        slots[q0 + i] = int64_t{c.meta.block_tables[int64_t{s} * c.meta.max_blocks_per_seq + pos / c.block_size]} *
                            c.block_size +
                        pos % c.block_size;
      }
    }
    slots[pad_row] = kernels::kPadSlot;
  }

  int64_t num_slots() const { return c.num_blocks * c.block_size; }
  int64_t k_offset() const { return int64_t{c.heads} * c.head_dim; }
  int64_t v_offset() const { return int64_t{c.heads + c.kv_heads} * c.head_dim; }

  // The fused launch's rotary over qkv rows at `rows` (host or device copies of qkv, cos, sin and
  // slots), storing into k_pool and v_pool.
  kernels::cuda::PagedDecodeRotary Rotary(const float* rows, const float* cos_rows, const float* sin_rows,
                                          const int64_t* slot_rows, void* k_pool, void* v_pool) const {
    kernels::cuda::PagedDecodeRotary r;
    r.k = rows + k_offset();
    r.k_stride = stride;
    r.v = rows + v_offset();
    r.v_stride = stride;
    r.cos = cos_rows;
    r.sin = sin_rows;
    r.slots = slot_rows;
    r.num_slots = num_slots();
    r.k_pool = k_pool;
    r.v_pool = v_pool;
    return r;
  }

  // Two attention outputs ([rows, heads * head_dim]) the same bits, row by row, but the padding
  // row's: its own key is its qkv row's in one launch and the pool's stale slot in two.
  void ExpectSameRowsButPadding(const std::vector<float>& got, const std::vector<float>& want) const {
    ASSERT_EQ(got.size(), want.size());
    for (int r = 0; r < c.rows; ++r) {
      if (r == pad_row) continue;
      const auto at = [&](const std::vector<float>& o) {
        return std::vector<float>(o.begin() + r * c.row_stride(), o.begin() + (r + 1) * c.row_stride());
      };
      ExpectSameBits(at(got), at(want), "attention output");
    }
  }
};

// `got`'s rows from first_row on within the tensor-core prefill's rounding of Bf16QReference: the
// probabilities rounded to bf16 (2u of each element's p-weighted |v| mean, u = 2^-8, the sum as
// much again), plus 1e-4 relative for the f32 sums.
inline void ExpectWithinPagedBf16Rounding(const std::vector<float>& got, const PagedCase& c, int64_t first_row,
                                          const char* what, int64_t end_row = -1) {
  std::vector<double> abs_mean;
  const std::vector<double> want = c.Bf16QReference(&abs_mean);
  ASSERT_EQ(got.size(), want.size()) << what;
  constexpr double kTwoU = 1.0 / 128;
  const size_t end = end_row < 0 ? got.size() : static_cast<size_t>(end_row * c.row_stride());
  for (size_t i = static_cast<size_t>(first_row * c.row_stride()); i < end; ++i) {
    const double bound = kTwoU * abs_mean[i] + 1e-4 * std::max(1.0, std::fabs(want[i]));
    ASSERT_NEAR(got[i], want[i], bound) << what << " at row " << i / c.row_stride() << ", element "
                                        << i % c.row_stride();
  }
}

// Rows [r0, r1) of a resized RGB8 image's patch rows (kernels::PatchRows): its layout, bytes that
// take every value, and a table of distinct values.
struct PatchRowsCase {
  kernels::PatchGrid grid;
  int64_t r0 = 0, r1 = 0;

  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> rgb(static_cast<size_t>(grid.height * grid.width * 3));
    for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    return rgb;
  }
  std::vector<float> Table() const { return RandomNormal(3 * 256, 41 + grid.patch); }
  size_t values() const { return static_cast<size_t>((r1 - r0) * grid.row_length()); }
};

#ifdef IRIS_HAVE_CUDA
// A GPU, and host vectors copied to and from it (cuda_kernels_test, cuda_ops_test).
struct Gpu {
  std::unique_ptr<kernels::Device> dev;
  std::vector<core::Tensor> keep;

  kernels::cuda::CudaDevice& cuda() { return static_cast<kernels::cuda::CudaDevice&>(*dev); }
  template <typename T>
  T* Up(const std::vector<T>& host) {
    auto t = dev->Allocate(core::DType::kU8, {static_cast<int64_t>(host.size() * sizeof(T))});
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return nullptr;
    dev->CopyToDevice(host.data(), t->raw(), host.size() * sizeof(T));
    keep.push_back(std::move(*t));
    return static_cast<T*>(keep.back().raw());
  }
  template <typename T>
  std::vector<T> Down(const T* d, size_t n) {
    std::vector<T> host(n);
    dev->CopyToHost(d, host.data(), n * sizeof(T));
    EXPECT_TRUE(cuda().status().ok()) << cuda().status();
    return host;
  }
};

// The machine's first GPU (ADD_FAILURE and null without one: a machine that runs label gpu has one).
inline std::unique_ptr<kernels::Device> MakeGpuDevice() {
  kernels::DeviceOptions options;
  options.name = "cuda:0";
  absl::StatusOr<std::unique_ptr<kernels::Device>> d = kernels::CreateDevice(options);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

// The same, with the host-vector helpers.
inline std::unique_ptr<Gpu> MakeGpu() {
  std::unique_ptr<kernels::Device> d = MakeGpuDevice();
  if (d == nullptr) return nullptr;
  auto g = std::make_unique<Gpu>();
  g->dev = std::move(d);
  return g;
}
#endif

}  // namespace iris::testing
