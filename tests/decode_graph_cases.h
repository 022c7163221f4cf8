// The decode-graph suites' workload (CPU: the padded steps run directly; GPU: recorded once and
// replayed): six sequences prefilled in one step, then decode steps whose batch shrinks and grows
// across the graph sizes 1/2/4/8, with sequences crossing block boundaries, one outgrowing the
// graphs' block-table width (its steps run without a graph) and a last greedy (picks_only) step.
// Every step's results and the KV pools afterwards come back to the host, so two decoders (graphs
// on and off, or recorded and direct) can be compared.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/bf16.h"
#include "core/dtype.h"
#include "kernels/device.h"
#include "llm/decoder.h"
#include "llm/kv_cache.h"

namespace iris::testing {

// Graph options of the workload: sizes 1/2/4/8 and tables 5 blocks wide (20 tokens of 4).
inline llm::DecodeGraphOptions WorkloadGraphOptions(bool capture) {
  llm::DecodeGraphOptions o;
  o.batch_sizes = {1, 2, 4, 8};
  o.max_blocks_per_seq = 5;
  o.capture = capture;
  return o;
}

// The decode steps' sequences (indices into the prompts), then the greedy step's.
inline const std::vector<std::vector<int>>& WorkloadDecodeSteps() {
  static const std::vector<std::vector<int>> steps = {
      {0, 1, 2, 3, 4, 5}, {0, 1, 3, 4, 5}, {1, 3}, {4}, {0, 2, 4},  // graph sizes 8, 8, 2, 1, 4
      {0, 1, 2, 3, 4, 5}, {3, 5},  // sequence 3 has 21 tokens, 6 blocks: no graph
      {0, 1, 2, 4, 5}};             // greedy, graph size 8
  return steps;
}
// Steps the workload runs padded to a graph size (those without sequence 3 past 20 tokens).
inline constexpr int64_t kWorkloadGraphSteps = 6;

struct DecodeRun {
  std::vector<std::vector<float>> logits;  // per decode step but the last: [seqs, vocab]
  std::vector<int32_t> picks;              // the greedy step's
  std::vector<uint8_t> k_pools, v_pools;   // every layer's pools, as stored
  core::DType kv_dtype = core::DType::kF32;
};

// Runs the workload on a fresh cache of `kv_dtype` pools on `device` (filled with 0x7F bytes first,
// so that a slot never written keeps that marker).
inline DecodeRun RunDecodeWorkload(llm::Decoder& dec, kernels::Device& device, core::DType kv_dtype) {
  DecodeRun run;
  run.kv_dtype = kv_dtype;
  const int block_size = 4;
  absl::StatusOr<llm::KvCache> made = llm::KvCache::Create(dec.CacheShape(64, block_size, kv_dtype), device);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return run;
  llm::KvCache& cache = *made;
  const llm::KvCacheShape& shape = cache.shape();
  const size_t pool_bytes = static_cast<size_t>(shape.num_layers) * shape.num_blocks * shape.block_size *
                            shape.num_kv_heads * shape.head_dim * core::DTypeSize(kv_dtype);
  {
    const std::vector<uint8_t> marker(pool_bytes, 0x7F);
    device.CopyToDevice(marker.data(), cache.layer(0).k, pool_bytes);
    device.CopyToDevice(marker.data(), cache.layer(0).v, pool_bytes);
    device.Synchronize();
  }
  const int vocab = static_cast<int>(dec.vocab_size());
  const std::vector<int64_t> prompt_lens = {3, 9, 4, 17, 1, 7};
  std::vector<llm::BlockTable> tables(prompt_lens.size());
  auto add_row = [](llm::DecoderBatch& b, int32_t id, int64_t pos) {
    b.token_ids.push_back(id);
    for (auto& axis : b.positions) axis.push_back(pos);
  };
  // Prefill: every prompt in one step (not a decode step: it runs without a graph).
  llm::DecoderBatch batch;
  batch.Clear(5);
  for (size_t s = 0; s < prompt_lens.size(); ++s) {
    EXPECT_TRUE(cache.Reserve(&tables[s], prompt_lens[s]).ok());
    EXPECT_TRUE(batch.AddSequence(tables[s], block_size, prompt_lens[s], true).ok());
    for (int64_t i = 0; i < prompt_lens[s]; ++i) add_row(batch, static_cast<int32_t>((i * 37 + s * 11 + 5) % vocab), i);
  }
  absl::StatusOr<core::Tensor> out = dec.Forward(batch, &cache);
  EXPECT_TRUE(out.ok()) << out.status();
  const auto& steps = WorkloadDecodeSteps();
  for (size_t k = 0; k < steps.size() && out.ok(); ++k) {
    size_t width = 0;
    for (int s : steps[k]) {
      EXPECT_TRUE(cache.Reserve(&tables[s], tables[s].num_tokens + 1).ok());
      width = std::max(width, tables[s].blocks.size());
    }
    batch.Clear(static_cast<int>(width));
    batch.picks_only = k + 1 == steps.size();
    for (int s : steps[k]) {
      EXPECT_TRUE(batch.AddSequence(tables[s], block_size, 1, true).ok());
      add_row(batch, static_cast<int32_t>((k * 13 + s * 7 + 1) % vocab), tables[s].num_tokens - 1);
    }
    out = dec.Forward(batch, &cache);
    EXPECT_TRUE(out.ok()) << "decode step " << k << ": " << out.status();
    if (!out.ok()) break;
    if (batch.picks_only) {
      run.picks.assign(out->data<int32_t>(), out->data<int32_t>() + out->numel());
    } else {
      run.logits.emplace_back(out->data<float>(), out->data<float>() + out->numel());
    }
  }
  run.k_pools.resize(pool_bytes);
  run.v_pools.resize(pool_bytes);
  device.CopyToHost(cache.layer(0).k, run.k_pools.data(), pool_bytes);
  device.CopyToHost(cache.layer(0).v, run.v_pools.data(), pool_bytes);
  return run;
}

// `got` against `want`: the same steps, logits within |a - b| <= tol (1 + |b|), the same greedy
// picks, and pools with the same slots written (marker bytes where `want` has them) holding
// values within the same bound. tol = 0: bit-equal everything.
inline void ExpectSameRun(const DecodeRun& got, const DecodeRun& want, float tol, const std::string& what) {
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t k = 0; k < want.logits.size(); ++k) {
    ASSERT_EQ(got.logits[k].size(), want.logits[k].size()) << what << " step " << k;
    int64_t bad = 0;
    for (size_t i = 0; i < want.logits[k].size(); ++i) {
      const float a = got.logits[k][i], b = want.logits[k][i];
      if (tol == 0 ? std::memcmp(&a, &b, sizeof a) != 0 : !(std::fabs(a - b) <= tol * (1 + std::fabs(b)))) ++bad;
    }
    EXPECT_EQ(bad, 0) << what << ": decode step " << k << " has " << bad << " logits off";
  }
  EXPECT_EQ(got.picks, want.picks) << what << ": greedy picks";
  ASSERT_EQ(got.k_pools.size(), want.k_pools.size()) << what;
  const size_t elem = core::DTypeSize(want.kv_dtype);
  for (const auto& [g, w, name] : {std::tuple(&got.k_pools, &want.k_pools, "k"), std::tuple(&got.v_pools, &want.v_pools, "v")}) {
    int64_t written_apart = 0, off = 0, written = 0;
    for (size_t at = 0; at < w->size(); at += elem) {
      const bool wm = std::all_of(w->begin() + at, w->begin() + at + elem, [](uint8_t b) { return b == 0x7F; });
      const bool gm = std::all_of(g->begin() + at, g->begin() + at + elem, [](uint8_t b) { return b == 0x7F; });
      if (wm != gm) {
        ++written_apart;
        continue;
      }
      if (wm) continue;
      ++written;
      float a, b;
      if (elem == 4) {
        std::memcpy(&a, g->data() + at, 4);
        std::memcpy(&b, w->data() + at, 4);
      } else {
        uint16_t ga, wb;
        std::memcpy(&ga, g->data() + at, 2);
        std::memcpy(&wb, w->data() + at, 2);
        a = core::Bf16ToFloat(ga);
        b = core::Bf16ToFloat(wb);
      }
      if (tol == 0 ? std::memcmp(&a, &b, sizeof a) != 0 : !(std::fabs(a - b) <= 8 * tol * (1 + std::fabs(b)))) ++off;
    }
    EXPECT_EQ(written_apart, 0) << what << ": " << name << " pool slots written by one run only";
    EXPECT_EQ(off, 0) << what << ": " << name << " pool values off";
    EXPECT_GT(written, 0) << what;
  }
}

}  // namespace iris::testing
