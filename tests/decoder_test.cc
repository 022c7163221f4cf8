// The decoder against the reference (tiny model, full-model goldens): layer outputs, last-position
// logits, teacher-forced decode through the paged cache, greedy tokens; chunked prefill and batched
// steps against the single-shot path.
#include "llm/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/model_config.h"
#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/logit_edits.h"
#include "kernels/row_draw.h"
#include "kernels/sample_rows.h"
#include "llm/kv_cache.h"
#include "tests/test_util.h"

namespace iris::llm {
namespace {

using core::Tensor;
using testing::Int64Values;
using testing::LoadGolden;
using testing::RelativeL2;

constexpr const char* kCases[] = {"text_only", "one_image", "two_images"};

std::string GoldenFile(const std::string& c) { return "model/tiny-" + c + ".safetensors"; }

struct Model {
  core::ModelConfig config;
  std::unique_ptr<Decoder> decoder;
};

Model LoadTiny(kernels::ComputeType compute) {
  Model m;
  auto config = core::LoadModelConfig(testing::ModelPath("tiny"));
  EXPECT_TRUE(config.ok()) << config.status();
  m.config = *config;
  auto ckpt = core::Checkpoint::Open(testing::ModelPath("tiny"));
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  auto dec = Decoder::Load(kernels::DefaultCpuDevice(), *ckpt, m.config.text, DecoderOptions{compute});
  EXPECT_TRUE(dec.ok()) << dec.status();
  m.decoder = std::move(*dec);
  return m;
}

// Elementwise |a - b| <= 1e-4 + 1e-4 |b| (the golden README's suggested acceptance).
void ExpectClose(const float* a, const float* b, int64_t n, const std::string& what) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(std::fabs(a[i] - b[i]) <= 1e-4f + 1e-4f * std::fabs(b[i]))) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " values off";
}

std::vector<int64_t> PromptPositions(const std::string& c) {
  return Int64Values(LoadGolden(GoldenFile(c), "position_ids"));  // [3, 1, L] axis-major
}

// Positions of `n` text tokens all at `pos..pos+n-1` on the three axes.
std::vector<int64_t> TextPositions(int64_t pos, int64_t n) {
  std::vector<int64_t> p(3 * n);
  for (int a = 0; a < 3; ++a)
    for (int64_t i = 0; i < n; ++i) p[a * n + i] = pos + i;
  return p;
}

// One step over `seqs` (table, new rows; tables already reserved) whose every row's input
// embedding is given (as the reference's inputs_embeds), positions axis-major [3, rows]. Returns
// a copy of the logits (the decoder's own buffer is reused by the next step).
absl::StatusOr<Tensor> Step(Decoder& dec, KvCache& cache, const std::vector<std::pair<BlockTable*, int64_t>>& seqs,
                            const float* embeds, const std::vector<int64_t>& pos, bool picks_only = false,
                            const kernels::LogitEdits* edits = nullptr,
                            const std::vector<kernels::RowDraw>* draws = nullptr) {
  DecoderBatch batch;
  size_t max_blocks = 0;
  for (const auto& [t, n] : seqs) max_blocks = std::max(max_blocks, t->blocks.size());
  batch.Clear(static_cast<int>(max_blocks));
  for (const auto& [t, n] : seqs) {
    absl::Status added = batch.AddSequence(*t, cache.shape().block_size, n, true);
    if (!added.ok()) return added;
  }
  const int64_t rows = batch.query_start.back();
  batch.token_ids.assign(rows, 0);
  for (int a = 0; a < 3; ++a) {
    for (int64_t i = 0; i < rows && a * rows + i < static_cast<int64_t>(pos.size()); ++i) {
      batch.positions[a].push_back(pos[a * rows + i]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) batch.embed_rows.push_back(static_cast<int32_t>(r));
  batch.embeds.assign(embeds, embeds + rows * dec.hidden_size());
  batch.picks_only = picks_only;
  if (edits != nullptr) batch.logit_edits = *edits;
  if (draws != nullptr) batch.draws = *draws;
  auto logits = dec.Forward(batch, &cache);
  if (!logits.ok()) return logits.status();
  return logits->Clone();
}

// Runs one sequence's rows [begin, end) of `embeds`/`positions` (prompt of length L) as one step.
Tensor RunChunk(Decoder& dec, KvCache& cache, BlockTable& table, const float* embeds,
                const std::vector<int64_t>& positions, int64_t L, int64_t begin, int64_t end) {
  const int64_t n = end - begin, h = dec.hidden_size();
  EXPECT_TRUE(cache.Reserve(&table, table.num_tokens + n).ok());
  std::vector<int64_t> pos(3 * n);
  for (int a = 0; a < 3; ++a)
    for (int64_t i = 0; i < n; ++i) pos[a * n + i] = positions[a * L + begin + i];
  auto logits = Step(dec, cache, {{&table, n}}, embeds + begin * h, pos);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : Tensor();
}

KvCache MakeCache(const Decoder& dec, int64_t blocks, int block_size) {
  auto cache = KvCache::Create(dec.CacheShape(blocks, block_size));
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(*cache);
}

TEST(DecoderTest, EmbedMatchesReferenceTextRows) {
  Model m = LoadTiny(kernels::ComputeType::kF32);
  for (const char* c : kCases) {
    const std::vector<int64_t> ids64 = Int64Values(LoadGolden(GoldenFile(c), "input_ids"));
    Tensor ref = LoadGolden(GoldenFile(c), "inputs_embeds");
    std::vector<int32_t> ids(ids64.begin(), ids64.end());
    std::vector<float> out(ids.size() * m.decoder->hidden_size());
    ASSERT_TRUE(m.decoder->Embed(ids, out.data()).ok());
    const int64_t h = m.decoder->hidden_size();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == m.config.image_token_id) continue;  // image rows come from the encoder
      ASSERT_EQ(0, std::memcmp(out.data() + i * h, ref.data<float>() + i * h, h * sizeof(float)))
          << c << " row " << i;
    }
  }
  std::vector<float> row(m.decoder->hidden_size());
  const int32_t bad[] = {151936};
  absl::Status s = m.decoder->Embed(bad, row.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("151936"), std::string::npos) << s;
}

class DecoderGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DecoderGoldenTest, PrefillLayersAndLogitsF32) {
  const std::string c = GetParam();
  Model m = LoadTiny(kernels::ComputeType::kF32);
  Tensor embeds = LoadGolden(GoldenFile(c), "inputs_embeds");
  const int64_t L = embeds.dim(0), h = embeds.dim(1);
  std::vector<std::vector<float>> layers(3);
  m.decoder->set_layer_observer([&](int layer, const float* x, int64_t rows) {
    layers[layer].assign(x, x + rows * h);
  });
  KvCache cache = MakeCache(*m.decoder, 64, 16);
  BlockTable table;
  Tensor logits = RunChunk(*m.decoder, cache, table, embeds.data<float>(), PromptPositions(c), L, 0, L);
  ASSERT_EQ(logits.dim(0), 1);
  const char* names[] = {"layer0_out", "layer1_out", "final_norm_out"};
  for (int i = 0; i < 3; ++i) {
    Tensor ref = LoadGolden(GoldenFile(c), names[i]);
    ASSERT_EQ(static_cast<int64_t>(layers[i].size()), ref.numel()) << names[i];
    ExpectClose(layers[i].data(), ref.data<float>(), ref.numel(), c + " " + names[i]);
  }
  Tensor ref = LoadGolden(GoldenFile(c), "logits_last");
  const double rel = RelativeL2(logits.data<float>(), ref.data<float>(), ref.numel());
  EXPECT_LE(rel, 1e-4) << c;
  ExpectClose(logits.data<float>(), ref.data<float>(), ref.numel(), c + " logits_last");
}

TEST_P(DecoderGoldenTest, PrefillLogitsBf16) {
  const std::string c = GetParam();
  Model m = LoadTiny(kernels::ComputeType::kBF16);
  Tensor embeds = LoadGolden(GoldenFile(c), "inputs_embeds");
  const int64_t L = embeds.dim(0);
  KvCache cache = MakeCache(*m.decoder, 64, 16);
  BlockTable table;
  Tensor logits = RunChunk(*m.decoder, cache, table, embeds.data<float>(), PromptPositions(c), L, 0, L);
  Tensor ref = LoadGolden(GoldenFile(c), "logits_last");
  const double rel = RelativeL2(logits.data<float>(), ref.data<float>(), ref.numel());
  EXPECT_LE(rel, 2e-2) << c;
  EXPECT_GT(rel, 0.0) << c << ": bf16 path gave f32-identical logits (is it really bf16?)";
}

// Teacher forcing through the cache: the prompt as one prefill, then the 16 forced tokens one
// decode step at a time; logits at the 512 sampled ids and the top-5 ids at every position.
TEST_P(DecoderGoldenTest, ForcedDecodeThroughPagedCache) {
  const std::string c = GetParam();
  Model m = LoadTiny(kernels::ComputeType::kF32);
  Tensor embeds = LoadGolden(GoldenFile(c), "inputs_embeds");
  const int64_t L = embeds.dim(0), h = embeds.dim(1), vocab = m.decoder->vocab_size();
  const std::vector<int64_t> forced = Int64Values(LoadGolden(GoldenFile(c), "forced_tokens"));
  const std::vector<int64_t> sample_ids = Int64Values(LoadGolden(GoldenFile(c), "sample_ids"));
  const std::vector<int64_t> forced_pos = Int64Values(LoadGolden(GoldenFile(c), "forced_position_ids"));
  const std::vector<int64_t> top5 = Int64Values(LoadGolden(GoldenFile(c), "forced_top5_ids"));
  Tensor sample = LoadGolden(GoldenFile(c), "forced_logits_sample");
  // Block size 5: pages boundaries fall everywhere.
  KvCache cache = MakeCache(*m.decoder, 200, 5);
  BlockTable table;
  Tensor logits = RunChunk(*m.decoder, cache, table, embeds.data<float>(), PromptPositions(c), L, 0, L);
  std::vector<float> row(h);
  for (size_t k = 0; k <= forced.size(); ++k) {
    const float* lg = logits.data<float>();
    std::vector<float> got(sample_ids.size());
    for (size_t j = 0; j < sample_ids.size(); ++j) got[j] = lg[sample_ids[j]];
    ExpectClose(got.data(), sample.data<float>() + k * sample_ids.size(), sample_ids.size(),
                c + " forced position " + std::to_string(k));
    std::vector<int32_t> order(vocab);
    for (int64_t i = 0; i < vocab; ++i) order[i] = static_cast<int32_t>(i);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                      [&](int32_t a, int32_t b) { return lg[a] > lg[b]; });
    EXPECT_EQ(order[0], top5[k * 5]) << c << " forced position " << k;
    if (k == forced.size()) break;
    const int32_t id = static_cast<int32_t>(forced[k]);
    ASSERT_TRUE(m.decoder->Embed({&id, 1}, row.data()).ok());
    std::vector<int64_t> pos = {forced_pos[k], forced_pos[16 + k], forced_pos[32 + k]};
    ASSERT_TRUE(cache.Reserve(&table, table.num_tokens + 1).ok());
    auto next = Step(*m.decoder, cache, {{&table, 1}}, row.data(), pos);
    ASSERT_TRUE(next.ok()) << next.status();
    logits = *next;
  }
}

// Greedy decoding: the reference's 20 tokens, with decode positions L + k + rope_delta.
TEST_P(DecoderGoldenTest, GreedyTokens) {
  const std::string c = GetParam();
  for (auto compute : {kernels::ComputeType::kF32, kernels::ComputeType::kBF16}) {
    Model m = LoadTiny(compute);
    Tensor embeds = LoadGolden(GoldenFile(c), "inputs_embeds");
    const int64_t L = embeds.dim(0), h = embeds.dim(1), vocab = m.decoder->vocab_size();
    const std::vector<int64_t> want = Int64Values(LoadGolden(GoldenFile(c), "greedy_tokens"));
    // The smallest recorded top-2 gap is 0.07 (golden README), so every step must match.
    const int64_t delta = Int64Values(LoadGolden(GoldenFile(c), "rope_deltas"))[0];
    KvCache cache = MakeCache(*m.decoder, 64, 16);
    BlockTable table;
    Tensor logits = RunChunk(*m.decoder, cache, table, embeds.data<float>(), PromptPositions(c), L, 0, L);
    std::vector<float> row(h);
    for (size_t k = 0; k < want.size(); ++k) {
      const float* lg = logits.data<float>();
      const int32_t id = static_cast<int32_t>(std::max_element(lg, lg + vocab) - lg);
      ASSERT_EQ(id, want[k]) << c << " step " << k << (compute == kernels::ComputeType::kBF16 ? " bf16" : " f32");
      ASSERT_TRUE(m.decoder->Embed({&id, 1}, row.data()).ok());
      const std::vector<int64_t> pos = TextPositions(L + static_cast<int64_t>(k) + delta, 1);
      ASSERT_TRUE(cache.Reserve(&table, table.num_tokens + 1).ok());
      auto next = Step(*m.decoder, cache, {{&table, 1}}, row.data(), pos);
      ASSERT_TRUE(next.ok()) << next.status();
      logits = *next;
    }
  }
}

// Chunked prefill (chunks of 13 over the cached prefix) gives the one-shot logits.
TEST_P(DecoderGoldenTest, ChunkedPrefillEqualsOneShot) {
  const std::string c = GetParam();
  Model m = LoadTiny(kernels::ComputeType::kF32);
  Tensor embeds = LoadGolden(GoldenFile(c), "inputs_embeds");
  const int64_t L = embeds.dim(0), vocab = m.decoder->vocab_size();
  const std::vector<int64_t> positions = PromptPositions(c);
  KvCache cache = MakeCache(*m.decoder, 128, 16);
  BlockTable one, chunked;
  Tensor ref = RunChunk(*m.decoder, cache, one, embeds.data<float>(), positions, L, 0, L);
  Tensor last;
  for (int64_t b = 0; b < L; b += 13) {
    last = RunChunk(*m.decoder, cache, chunked, embeds.data<float>(), positions, L, b, std::min(L, b + 13));
  }
  EXPECT_LE(RelativeL2(last.data<float>(), ref.data<float>(), vocab), 1e-5) << c;
}

INSTANTIATE_TEST_SUITE_P(Cases, DecoderGoldenTest, ::testing::ValuesIn(kCases));

// Three prompts in one step (two of them in the middle of their prefill, one decoding) give the
// same logits as each run alone.
TEST(DecoderTest, BatchedStepEqualsSequential) {
  Model m = LoadTiny(kernels::ComputeType::kF32);
  const int64_t h = m.decoder->hidden_size(), vocab = m.decoder->vocab_size();
  KvCache cache = MakeCache(*m.decoder, 256, 16);
  std::vector<Tensor> alone;
  std::vector<Tensor> embeds;
  std::vector<std::vector<int64_t>> positions;
  for (const char* c : kCases) {
    embeds.push_back(LoadGolden(GoldenFile(c), "inputs_embeds"));
    positions.push_back(PromptPositions(c));
    BlockTable t;
    const int64_t L = embeds.back().dim(0);
    alone.push_back(RunChunk(*m.decoder, cache, t, embeds.back().data<float>(), positions.back(), L, 0, L));
    cache.Release(&t);
  }
  // Each sequence first gets all but its last 1, 9 and 30 tokens alone, then one step finishes all.
  const int64_t tail[] = {1, 9, 30};
  std::vector<BlockTable> tables(3);
  std::vector<float> packed;
  std::vector<int64_t> pos_axes[3];
  std::vector<std::pair<BlockTable*, int64_t>> seqs;
  for (int s = 0; s < 3; ++s) {
    const int64_t L = embeds[s].dim(0), split = L - tail[s];
    RunChunk(*m.decoder, cache, tables[s], embeds[s].data<float>(), positions[s], L, 0, split);
    ASSERT_TRUE(cache.Reserve(&tables[s], L).ok());
    packed.insert(packed.end(), embeds[s].data<float>() + split * h, embeds[s].data<float>() + L * h);
    for (int a = 0; a < 3; ++a)
      pos_axes[a].insert(pos_axes[a].end(), positions[s].begin() + a * L + split, positions[s].begin() + a * L + L);
    seqs.push_back({&tables[s], tail[s]});
  }
  std::vector<int64_t> pos;
  for (int a = 0; a < 3; ++a) pos.insert(pos.end(), pos_axes[a].begin(), pos_axes[a].end());
  auto logits = Step(*m.decoder, cache, seqs, packed.data(), pos);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->dim(0), 3);
  for (int s = 0; s < 3; ++s) {
    EXPECT_LE(RelativeL2(logits->data<float>() + s * vocab, alone[s].data<float>(), vocab), 1e-5) << kCases[s];
  }
  // The same step again (it writes the same k/v to the same slots) with the greedy picks made by
  // the decoder: each is the argmax of its row of logits.
  auto picks = Step(*m.decoder, cache, seqs, packed.data(), pos, /*picks_only=*/true);
  ASSERT_TRUE(picks.ok()) << picks.status();
  ASSERT_EQ(picks->dtype(), core::DType::kI32);
  ASSERT_EQ(picks->numel(), 3);
  for (int s = 0; s < 3; ++s) {
    const float* row = logits->data<float>() + s * vocab;
    EXPECT_EQ(picks->data<int32_t>()[s], std::max_element(row, row + vocab) - row) << kCases[s];
  }
  // And with each row's edits (llm::Sampler::AddEdits: a penalty on its argmax and others, an end
  // id masked): the argmax of that row edited, row by row in the step's order.
  kernels::LogitEdits edits;
  std::vector<float> edited(logits->data<float>(), logits->data<float>() + 3 * vocab);
  for (int s = 0; s < 3; ++s) {
    const int32_t top = picks->data<int32_t>()[s];
    const std::vector<int32_t> seen = {top, (top + 1) % static_cast<int32_t>(vocab), 3};
    edits.AddRow(s == 1 ? 1.f : 10.f, seen, s == 2 ? std::vector<int32_t>{(top + 7) % static_cast<int32_t>(vocab)}
                                                  : std::vector<int32_t>{});
  }
  std::vector<int32_t> packed_edits(static_cast<size_t>(edits.PackedSize()));
  edits.Pack(packed_edits.data());
  kernels::EditLogitRows(kernels::DefaultCpuDevice(), edited.data(), 3, vocab, edits.View(packed_edits.data()));
  auto edited_picks = Step(*m.decoder, cache, seqs, packed.data(), pos, /*picks_only=*/true, &edits);
  ASSERT_TRUE(edited_picks.ok()) << edited_picks.status();
  for (int s = 0; s < 3; ++s) {
    const float* row = edited.data() + s * vocab;
    EXPECT_EQ(edited_picks->data<int32_t>()[s], std::max_element(row, row + vocab) - row) << kCases[s];
  }
  EXPECT_NE(edited_picks->data<int32_t>()[0], picks->data<int32_t>()[0]) << "a penalty of 10 moves the pick";
  EXPECT_EQ(edited_picks->data<int32_t>()[1], picks->data<int32_t>()[1]) << "a row without edits keeps it";
  // And drawn (llm::Sampler::NextDraw's settings and uniforms; a greedy row among them) after the
  // same edits: each row's pick is the CPU op's draw from that row edited.
  std::vector<kernels::RowDraw> draws(3);
  draws[0].temperature = 0.8f;
  draws[0].top_p = 0.9f;
  draws[0].uniform = 0.3;
  draws[2].temperature = 1.2f;
  draws[2].top_k = 20;
  draws[2].uniform = 0.7;
  std::vector<int32_t> want_drawn(3);
  std::vector<float> drawn_rows = edited;
  kernels::SampleRows(kernels::DefaultCpuDevice(), drawn_rows.data(), 3, vocab, draws.data(), want_drawn.data());
  auto drawn = Step(*m.decoder, cache, seqs, packed.data(), pos, /*picks_only=*/true, &edits, &draws);
  ASSERT_TRUE(drawn.ok()) << drawn.status();
  ASSERT_EQ(drawn->dtype(), core::DType::kI32);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(drawn->data<int32_t>()[s], want_drawn[s]) << kCases[s];
  EXPECT_EQ(drawn->data<int32_t>()[1], edited_picks->data<int32_t>()[1]) << "a greedy row's draw is its argmax";
  // Draws for another number of rows, or out of range: refused.
  std::vector<kernels::RowDraw> short_draws(2);
  auto refused_draws = Step(*m.decoder, cache, seqs, packed.data(), pos, /*picks_only=*/true, &edits, &short_draws);
  ASSERT_FALSE(refused_draws.ok());
  EXPECT_NE(refused_draws.status().message().find("2 draws for 3 logit rows"), std::string::npos) << refused_draws.status();
  std::vector<kernels::RowDraw> bad = draws;
  bad[2].uniform = 1.0;
  auto refused_bad = Step(*m.decoder, cache, seqs, packed.data(), pos, /*picks_only=*/true, &edits, &bad);
  ASSERT_FALSE(refused_bad.ok());
  EXPECT_NE(refused_bad.status().message().find("draws[2]"), std::string::npos) << refused_bad.status();
  // Edits for another number of rows than the logit rows: refused.
  kernels::LogitEdits two = edits;
  two.Clear();
  two.AddRow(2.f, std::vector<int32_t>{1}, {});
  two.AddRow(2.f, std::vector<int32_t>{1}, {});
  auto refused = Step(*m.decoder, cache, seqs, packed.data(), pos, /*picks_only=*/true, &two);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("logit edits"), std::string::npos) << refused.status();
}

// The activations are allocated for a row capacity: a step over it is refused (never grown), one
// within it runs; so is a step wanting more logit rows than allocated.
TEST(DecoderTest, RefusesStepsOverItsCapacity) {
  Model m = LoadTiny(kernels::ComputeType::kF32);
  ASSERT_TRUE(m.decoder->ReserveActivations(4, 1).ok());
  KvCache cache = MakeCache(*m.decoder, 8, 16);
  const int64_t h = m.decoder->hidden_size();
  std::vector<float> rows(5 * h, 0.01f);
  BlockTable five, four, other;
  ASSERT_TRUE(cache.Reserve(&five, 5).ok());
  auto over = Step(*m.decoder, cache, {{&five, 5}}, rows.data(), TextPositions(0, 5));
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("max_tokens"), std::string::npos) << over.status();
  ASSERT_TRUE(cache.Reserve(&four, 4).ok());
  EXPECT_TRUE(Step(*m.decoder, cache, {{&four, 4}}, rows.data(), TextPositions(0, 4)).ok());
  ASSERT_TRUE(cache.Reserve(&other, 1).ok());
  std::vector<int64_t> pos = TextPositions(0, 2);
  auto logits_over = Step(*m.decoder, cache, {{&four, 1}, {&other, 1}}, rows.data(), pos);
  ASSERT_FALSE(logits_over.ok());
  EXPECT_NE(logits_over.status().message().find("max_logit_rows"), std::string::npos) << logits_over.status();
}

TEST(DecoderTest, RejectsBadSteps) {
  Model m = LoadTiny(kernels::ComputeType::kF32);
  KvCache cache = MakeCache(*m.decoder, 8, 16);
  BlockTable table;
  std::vector<float> row(m.decoder->hidden_size());
  // Table not reserved for the new token.
  std::vector<int64_t> pos = TextPositions(0, 1);
  EXPECT_FALSE(Step(*m.decoder, cache, {{&table, 1}}, row.data(), pos).ok());
  // Wrong number of positions.
  ASSERT_TRUE(cache.Reserve(&table, 1).ok());
  std::vector<int64_t> short_pos = {0, 0};
  EXPECT_FALSE(Step(*m.decoder, cache, {{&table, 1}}, row.data(), short_pos).ok());
}

}  // namespace
}  // namespace iris::llm
