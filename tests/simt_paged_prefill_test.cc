// iris's tensor-core paged prefill (kernels/cuda/paged_flash_mma.cuh) on the SIMT harness: a
// step's prefill chunks attend causally over their keys in a paged bf16 KV cache through the
// block tables, against a double-precision reference on the same bf16-rounded q and the pages'
// values (within the bound of the kernel's one bf16 rounding of the probabilities), and the rows
// it must leave alone stay untouched. Chunks longer than a block's 64 rows, chunks after a cached
// prefix (positions past the chunk's start) and whole prompts, a one-row sequence after them,
// GQA, shuffled pages, the models' head dims. Runs in CI without a GPU.
#include "kernels/cuda/paged_flash_mma.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/paged_prefill_args.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "tests/kernel_cases.h"
#include "tests/simt_sanitized.h"

namespace iris::kernels::cuda {
namespace {

void CheckPagedPrefill(int head_dim) {
  SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim);
  // (context, new rows): two decodes first (left to the decode kernel), then a whole 150-token
  // prompt, a 70-row chunk after 130 cached tokens, a 2-row chunk, and a decode after them.
  const testing::PagedCase c(/*kv_heads=*/2, /*heads=*/4, head_dim, /*num_blocks=*/40,
                             {{5, 1}, {40, 1}, {150, 150}, {200, 70}, {33, 2}, {97, 1}}, /*block_step=*/17,
                             /*block_offset=*/5);
  ASSERT_EQ(c.meta.prefill_seq_begin, 2);
  ASSERT_EQ(c.meta.prefill_row_begin, 2);
  ASSERT_TRUE(PagedPrefillMmaTakes(head_dim, c.kb.data(), c.vb.data()));
  std::vector<float> got(c.q.size(), NAN);
  const PagedPrefillParams p =
      PagedPrefillParamsOf(c.Args(c.q.data(), got.data(), c.kb.data(), c.vb.data(), /*bf16_pool=*/true));
  const Dim3 grid(p.seq_end - p.seq_begin, (p.max_query_len + kMmaFlashRows - 1) / kMmaFlashRows, p.num_heads);
  WithMmaFlashDim(head_dim, [&](auto dim) {
    Launch(grid, Dim3(kMmaFlashThreads), PagedPrefillMmaKernel<decltype(dim)::value>, p);
  });

  // The decode rows before the first prefill chunk are the decode kernel's: left untouched.
  for (int64_t i = 0; i < c.meta.prefill_row_begin * c.row_stride(); ++i) {
    ASSERT_TRUE(std::isnan(got[i])) << "decode row " << i / c.row_stride() << " was written";
  }
  testing::ExpectWithinPagedBf16Rounding(got, c, c.meta.prefill_row_begin, "paged prefill");
}

TEST(PagedPrefillMmaOnSimtTest, MatchesTheDefinitionThroughTheBlockTables) {
  CheckPagedPrefill(80);  // under a sanitizer only this one: the head dims share every path
  if (testing::kSimtSanitized) return;
  CheckPagedPrefill(128);  // the decoders' head dim
  CheckPagedPrefill(64);
}

// The decode kernel's partials and split counters (zeros) for p's decode rows, set into p with
// `splits` (none for one split).
struct DecodeSplitBuffers {
  std::vector<float> partials;
  std::vector<int> counters;
  DecodeSplitBuffers(PagedPrefillParams& p, int splits) {
    const int64_t rows = p.decode_row_end - p.decode_row_begin;
    partials.assign(static_cast<size_t>(rows * p.num_heads * splits * (p.head_dim + 2)), NAN);
    counters.assign(static_cast<size_t>(rows * p.num_kv_heads), 0);
    p.splits = splits;
    if (splits > 1) {
      p.partials = partials.data();
      p.split_counters = counters.data();
    }
  }
};

// The decode kernel with GQA packing (a block per (row, kv head), the kv head's q heads as the
// tile's rows): its rows against the same reference, the rows after them untouched, with the keys
// split over `splits` blocks (the last to arrive merges; the counters are left at zero). Once
// also every row of the step through it, prefill chunks included, which checks that a row sees
// exactly the keys up to its position.
void CheckPagedDecode(int kv_heads, int heads, int head_dim, int splits, bool also_every_row = false) {
  SCOPED_TRACE(::testing::Message() << kv_heads << " kv heads, " << heads << " heads, head_dim " << head_dim << ", "
                                    << splits << " splits");
  // Four decodes (one of a single key, one past two 64-key tiles), then a 70-row chunk after 130
  // cached tokens, a whole 20-token prompt and a decode after them.
  const testing::PagedCase c(kv_heads, heads, head_dim, /*num_blocks=*/48,
                             {{1, 1}, {40, 1}, {129, 1}, {300, 1}, {200, 70}, {20, 20}, {97, 1}}, /*block_step=*/17,
                             /*block_offset=*/5);
  ASSERT_EQ(c.meta.prefill_row_begin, 4);
  ASSERT_TRUE(PagedDecodeMmaTakes(heads, kv_heads, head_dim, c.kb.data(), c.vb.data()));
  // The launch's way to share a tile among the warps (key slices where the group fits a warp's
  // rows), and where it has two, the other one too.
  std::vector<int> key_slices = {PagedDecodeMmaKeySlices(heads, kv_heads)};
  if (key_slices[0] > 1) key_slices.push_back(1);
  for (const bool every_row : {false, true}) for (const int slices : key_slices) {
    if (every_row && !also_every_row) continue;
    SCOPED_TRACE(::testing::Message() << (every_row ? "every row, " : "decode rows, ") << slices << " key slices");
    std::vector<float> got(c.q.size(), NAN);
    PagedPrefillParams p =
        PagedPrefillParamsOf(c.Args(c.q.data(), got.data(), c.kb.data(), c.vb.data(), /*bf16_pool=*/true));
    ASSERT_EQ(p.decode_row_begin, 0);
    ASSERT_EQ(p.decode_row_end, 4);
    if (every_row) p.decode_row_end = c.rows;
    const int64_t rows = p.decode_row_end - p.decode_row_begin;
    DecodeSplitBuffers split_buffers(p, splits);
    const std::vector<int>& counters = split_buffers.counters;
    const Dim3 grid(static_cast<int>(rows), splits, kv_heads);
    WithPagedDecodeMmaKernel(head_dim, slices, /*rotary=*/false,
                             [&](auto kernel) { Launch(grid, Dim3(kMmaFlashThreads), kernel, p); });
    testing::ExpectWithinPagedBf16Rounding(got, c, 0, "paged decode", p.decode_row_end);
    for (int64_t i = p.decode_row_end * c.row_stride(); i < static_cast<int64_t>(got.size()); ++i) {
      ASSERT_TRUE(std::isnan(got[i])) << "row " << i / c.row_stride() << " was written";
    }
    for (const int n : counters) ASSERT_EQ(n, 0) << "a split counter was not left at zero";
  }
}

TEST(PagedDecodeMmaOnSimtTest, PacksAKvHeadsQHeadsIntoOneTile) {
  // Under a sanitizer these four: one split and several (the merge), key slices and none, a tile
  // of one row and one of three warps' rows.
  CheckPagedDecode(2, 16, 128, 4);  // the 3b decoder (8 q heads a kv head); a 1-key row's last 3 splits have no key
  CheckPagedDecode(2, 16, 80, 1);
  CheckPagedDecode(4, 4, 64, 7);    // no grouping: one row a tile
  CheckPagedDecode(1, 40, 64, 2);   // 40 q heads on one kv head: three warps' rows
  if (testing::kSimtSanitized) return;
  CheckPagedDecode(2, 16, 128, 1, /*also_every_row=*/true);
  CheckPagedDecode(4, 28, 128, 3);  // the 7b: 7
  CheckPagedDecode(2, 16, 64, kPagedDecodeMmaMaxSplits);  // the most: short rows' splits mostly empty
  CheckPagedDecode(1, 16, 64, 3);   // 16: a whole warp's rows, key slices still
}

// The host's choice of splits: about two blocks an SM, at most 16, none where the (row, kv head)
// pairs fill the GPU or outnumber its split counters; never by context (a decode graph replays at
// other contexts than it was recorded at).
// The packed kernel with the step's rotary and KV write (kRotary): the same output and pools, bit
// for bit, as RotaryQKWriteKvKernel then the kernel without it. The fused launch reads pools whose
// new slots still hold stale values and writes into copies, so a row's own key or value read back
// from the pool would show; a padding row (kPadSlot) stores nothing.
void CheckPackedDecodeRotary(int kv_heads, int heads, int head_dim, int splits) {
  SCOPED_TRACE(::testing::Message() << heads << "/" << kv_heads << " heads of " << head_dim << ", " << splits
                                    << " splits");
  const testing::PagedCase c(kv_heads, heads, head_dim, /*num_blocks=*/48, {{1, 1}, {40, 1}, {129, 1}, {300, 1}, {97, 1}},
                             /*block_step=*/17, /*block_offset=*/5);
  const testing::DecodeRotaryCase d(c, /*pad_row=*/2, 70 + head_dim);
  const int rows = c.rows;
  const int64_t stride = d.stride, width = static_cast<int64_t>(kv_heads) * head_dim, num_slots = d.num_slots();
  const std::vector<uint16_t> k_pool(c.kb.begin(), c.kb.begin() + num_slots * width);
  const std::vector<uint16_t> v_pool(c.vb.begin(), c.vb.begin() + num_slots * width);
  const auto attend = [&](const float* q, std::vector<float>* out, const std::vector<uint16_t>& kp,
                          const std::vector<uint16_t>& vp, const PagedDecodeRotary& rotary) {
    PagedPrefillParams p = PagedPrefillParamsOf(c.Args(q, out->data(), kp.data(), vp.data(), /*bf16_pool=*/true));
    p.q_row_stride = stride;
    p.decode_row_end = rows;
    p.rotary = rotary;
    DecodeSplitBuffers split_buffers(p, splits);
    WithPagedDecodeMmaKernel(head_dim, PagedDecodeMmaKeySlices(heads, kv_heads), rotary.slots != nullptr,
                             [&](auto kernel) { Launch(Dim3(rows, splits, kv_heads), Dim3(kMmaFlashThreads), kernel, p); });
    for (const int n : split_buffers.counters) ASSERT_EQ(n, 0) << "a split counter was not left at zero";
  };

  std::vector<float> qkv_a = d.qkv;
  std::vector<uint16_t> k_a = k_pool, v_a = v_pool;
  std::vector<float> want(static_cast<size_t>(rows) * c.row_stride(), NAN);
  float* qa = qkv_a.data();
  Launch(Dim3(rows, 2), Dim3(96), RotaryQKWriteKvKernel<uint16_t>, qa, stride, heads, qa + d.k_offset(), stride,
         kv_heads, head_dim, d.cos.data(), d.sin.data(), static_cast<const float*>(qa + d.v_offset()), stride,
         static_cast<const int64_t*>(d.slots.data()), num_slots, k_a.data(), v_a.data());
  attend(qa, &want, k_a, v_a, PagedDecodeRotary{});

  std::vector<uint16_t> k_b = k_pool, v_b = v_pool;
  std::vector<float> got(want.size(), NAN);
  attend(d.qkv.data(), &got, k_pool, v_pool,
         d.Rotary(d.qkv.data(), d.cos.data(), d.sin.data(), d.slots.data(), k_b.data(), v_b.data()));

  testing::ExpectSameBits(k_b, k_a, "k pool");
  testing::ExpectSameBits(v_b, v_a, "v pool");
  EXPECT_NE(k_b, k_pool);
  d.ExpectSameRowsButPadding(got, want);
}

TEST(PagedDecodeMmaOnSimtTest, WithTheRotaryAndKvWriteEqualsTheTwoLaunches) {
  CheckPackedDecodeRotary(2, 16, 128, 1);  // the 3b
  CheckPackedDecodeRotary(2, 16, 128, 4);
  CheckPackedDecodeRotary(4, 28, 80, 3);   // the 7b's group of 7
}

TEST(PagedDecodeMmaOnSimtTest, SlicesEachTilesKeysOverTheWarpsWhereTheGroupFitsOneWarp) {
  EXPECT_EQ(PagedDecodeMmaKeySlices(16, 2), 4);  // the 3b: 8 q heads a kv head
  EXPECT_EQ(PagedDecodeMmaKeySlices(28, 4), 4);  // the 7b: 7
  EXPECT_EQ(PagedDecodeMmaKeySlices(16, 1), 4);
  EXPECT_EQ(PagedDecodeMmaKeySlices(17, 1), 1);  // two warps' rows
  EXPECT_EQ(PagedDecodeMmaKeySlices(40, 1), 1);
}

TEST(PagedDecodeMmaOnSimtTest, SplitsFillTheGpuWhateverTheContext) {
  EXPECT_EQ(PagedDecodeMmaSplits(1, 2, 132), kPagedDecodeMmaMaxSplits);  // the cap
  EXPECT_EQ(PagedDecodeMmaSplits(50, 2, 132), 3);  // 100 pairs: ceil(264 / 100)
  EXPECT_EQ(PagedDecodeMmaSplits(66, 2, 132), 2);
  EXPECT_EQ(PagedDecodeMmaSplits(67, 2, 132), 1);  // 134 pairs: past the counters
  EXPECT_EQ(PagedDecodeMmaSplits(0, 2, 132), 1);
}

TEST(PagedDecodeMmaOnSimtTest, TakesAtMost64QHeadsAKvHead) {
  alignas(16) static uint16_t pool[64];
  EXPECT_TRUE(PagedDecodeMmaTakes(16, 2, 128, pool, pool));
  EXPECT_TRUE(PagedDecodeMmaTakes(64, 1, 128, pool, pool));
  EXPECT_FALSE(PagedDecodeMmaTakes(65, 1, 128, pool, pool));  // 65 rows do not fit a block's 64
  EXPECT_FALSE(PagedDecodeMmaTakes(16, 3, 128, pool, pool));  // not a whole group
  EXPECT_FALSE(PagedDecodeMmaTakes(16, 0, 128, pool, pool));
  EXPECT_FALSE(PagedDecodeMmaTakes(16, 2, 77, pool, pool));   // the prefill kernel's limits too
  EXPECT_FALSE(PagedDecodeMmaTakes(16, 2, 128, pool + 4, pool));
}

// What the launch refuses (the dispatch point then keeps the decode kernel for every row).
TEST(PagedPrefillMmaOnSimtTest, TakesWholeChunkRowsAtAlignedPools) {
  alignas(16) static uint16_t pool[64];
  EXPECT_TRUE(PagedPrefillMmaTakes(128, pool, pool));
  EXPECT_TRUE(PagedPrefillMmaTakes(8, pool, pool));
  EXPECT_FALSE(PagedPrefillMmaTakes(77, pool, pool));   // not a multiple of 8
  EXPECT_FALSE(PagedPrefillMmaTakes(136, pool, pool));  // past 128
  EXPECT_FALSE(PagedPrefillMmaTakes(0, pool, pool));
  EXPECT_FALSE(PagedPrefillMmaTakes(128, pool + 4, pool));  // 8 bytes off
  EXPECT_FALSE(PagedPrefillMmaTakes(128, pool, pool + 1));
}

}  // namespace
}  // namespace iris::kernels::cuda
