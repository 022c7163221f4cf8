// Inputs, references and checks shared by the two suites that run iris's CUDA kernels: on the
// SIMT harness (simt_kernels_test) and on a GPU (cuda_kernels_test).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "kernels/device.h"
#include "kernels/paged_attention.h"
#include "llm/sampler.h"
#include "tests/test_util.h"

namespace iris::testing {

// |got - want| <= rel * max(1, |want|), element by element.
inline void ExpectCloseRel(const std::vector<float>& got, const std::vector<float>& want, float rel, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * std::max(1.f, std::fabs(want[i]))) << what << " at " << i;
  }
}

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

  // The CPU kernel's output over the f32 or the bf16 pools.
  std::vector<float> Reference(bool bf16) const {
    std::vector<float> out(q.size(), NAN);
    kernels::PagedAttentionArgs a;
    a.q = q.data();
    a.q_row_stride = row_stride();
    a.out = out.data();
    a.out_row_stride = row_stride();
    a.num_heads = heads;
    a.scale = scale();
    a.layer = kernels::PagedKvLayer{const_cast<void*>(k(bf16)), const_cast<void*>(v(bf16)), num_blocks, block_size,
                                    kv_heads, head_dim, bf16 ? core::DType::kBF16 : core::DType::kF32};
    a.metadata = meta;
    kernels::PagedAttention(kernels::DefaultCpuDevice(), a);
    return out;
  }
};

}  // namespace iris::testing
