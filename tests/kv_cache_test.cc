// The KV cache's block allocator (allocation, LIFO reuse, exhaustion that takes nothing; prefix
// caching: reference counts, cached blocks found by key, LRU eviction that never touches a held
// block), block tables (all-or-nothing growth, release, slot mapping), sizing, shape validation and the
// per-layer pool views, in f32 and bf16.
#include "llm/kv_cache.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace iris::llm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(BlockAllocatorTest, AllocatesDistinctBlocksAndFreesThem) {
  BlockAllocator a(8);
  EXPECT_EQ(a.num_blocks(), 8);
  EXPECT_EQ(a.num_free(), 8);
  std::vector<int32_t> got;
  ASSERT_TRUE(a.Allocate(3, &got).ok());
  ASSERT_TRUE(a.Allocate(5, &got).ok());  // appends
  ASSERT_EQ(got.size(), 8u);
  EXPECT_EQ(std::set<int32_t>(got.begin(), got.end()), (std::set<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_EQ(a.num_used(), 8);
  a.Free(got);
  EXPECT_EQ(a.num_free(), 8);
  EXPECT_EQ(a.num_used(), 0);
  std::vector<int32_t> none;
  EXPECT_TRUE(a.Allocate(0, &none).ok());
  EXPECT_TRUE(none.empty());
}

TEST(BlockAllocatorTest, ReusesFreedBlocksFirst) {
  BlockAllocator a(10);
  std::vector<int32_t> x, y;
  ASSERT_TRUE(a.Allocate(4, &x).ok());
  ASSERT_TRUE(a.Allocate(2, &y).ok());
  a.Free({x[1], x[3]});
  std::vector<int32_t> z;
  ASSERT_TRUE(a.Allocate(2, &z).ok());
  EXPECT_THAT(z, ElementsAre(x[1], x[3]));  // the freed ones, in the order they were freed
  std::vector<int32_t> w;
  a.Free({y[0]});
  ASSERT_TRUE(a.Allocate(1, &w).ok());
  EXPECT_THAT(w, ElementsAre(y[0]));  // last freed, first reused
}

TEST(BlockAllocatorTest, ExhaustionTakesNothing) {
  BlockAllocator a(5);
  std::vector<int32_t> got = {99};  // existing contents are kept
  ASSERT_TRUE(a.Allocate(3, &got).ok());
  const std::vector<int32_t> before = got;
  const absl::Status s = a.Allocate(3, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(got, before);
  EXPECT_EQ(a.num_free(), 2);
  std::vector<int32_t> rest;
  EXPECT_TRUE(a.Allocate(2, &rest).ok());
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_EQ(a.Allocate(1, &rest).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.Allocate(-1, &rest).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockAllocatorDeathTest, FreeingABlockNotInUseAborts) {
  BlockAllocator a(4);
  std::vector<int32_t> got;
  ASSERT_TRUE(a.Allocate(1, &got).ok());
  a.Free(got);
  EXPECT_DEATH(a.Free(got), "not in use");           // double free
  EXPECT_DEATH(a.Free({3}), "not in use");           // never allocated
  EXPECT_DEATH(a.Free({4}), "not in use");           // out of range
}

BlockHash Key(uint8_t k) {
  BlockHash h{};
  h[0] = k;
  h[31] = static_cast<uint8_t>(255 - k);
  return h;
}

TEST(BlockAllocatorTest, SharedBlocksAreCountedAndFreedByTheirLastHolder) {
  BlockAllocator a(4);
  std::vector<int32_t> got;
  ASSERT_TRUE(a.Allocate(2, &got).ok());
  ASSERT_TRUE(a.Register(got[0], Key(1)));
  EXPECT_FALSE(a.Register(got[1], Key(1))) << "a key names one block";
  EXPECT_FALSE(a.Register(got[0], Key(2))) << "a block has one key";
  EXPECT_EQ(a.Find(Key(1)), got[0]);
  EXPECT_EQ(a.Find(Key(2)), -1);
  a.Share(got[0]);
  EXPECT_EQ(a.ref_count(got[0]), 2);
  a.Free({got[0]});
  EXPECT_EQ(a.ref_count(got[0]), 1);
  EXPECT_EQ(a.num_used(), 2);
  a.Free(got);
  EXPECT_EQ(a.num_used(), 0);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(a.num_evictable(), 1);
  EXPECT_EQ(a.Find(Key(1)), got[0]) << "a cached block outlives its holders";
  a.Share(got[0]);  // found again: held, no longer evictable
  EXPECT_EQ(a.num_evictable(), 0);
  EXPECT_EQ(a.num_used(), 1);
  a.Free({got[0]});
}

// Fresh blocks come from never-cached ones first, then cached ones least recently freed first;
// an evicted block's key finds nothing.
TEST(BlockAllocatorTest, EvictsCachedBlocksLeastRecentlyFreedFirst) {
  BlockAllocator a(6);
  std::vector<int32_t> x;
  ASSERT_TRUE(a.Allocate(6, &x).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a.Register(x[i], Key(static_cast<uint8_t>(i))));
  a.Free({x[2]});
  a.Free({x[0], x[1]});  // a table's last block is freed (and evicted) before its first
  a.Free({x[4], x[5]});  // never cached
  a.Free({x[3]});
  std::vector<int32_t> y;
  ASSERT_TRUE(a.Allocate(2, &y).ok());
  EXPECT_THAT(y, ElementsAre(x[4], x[5]));
  EXPECT_EQ(a.evictions(), 0);
  std::vector<int32_t> z;
  ASSERT_TRUE(a.Allocate(3, &z).ok());
  EXPECT_THAT(z, ElementsAre(x[2], x[1], x[0]));
  EXPECT_EQ(a.evictions(), 3);
  EXPECT_EQ(a.Find(Key(0)), -1);
  EXPECT_EQ(a.Find(Key(1)), -1);
  EXPECT_EQ(a.Find(Key(2)), -1);
  EXPECT_EQ(a.Find(Key(3)), x[3]);
  EXPECT_EQ(a.num_cached(), 1);
  // A freed, evicted and reallocated block can be registered under a new key.
  EXPECT_TRUE(a.Register(z[0], Key(9)));
}

TEST(BlockAllocatorTest, NeverEvictsAHeldBlock) {
  BlockAllocator a(3);
  std::vector<int32_t> held, rest;
  ASSERT_TRUE(a.Allocate(1, &held).ok());
  ASSERT_TRUE(a.Register(held[0], Key(7)));
  ASSERT_TRUE(a.Allocate(2, &rest).ok());
  a.Free(rest);
  std::vector<int32_t> more;
  ASSERT_TRUE(a.Allocate(2, &more).ok());
  EXPECT_EQ(a.Allocate(1, &more).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.Find(Key(7)), held[0]);
  EXPECT_EQ(a.ref_count(held[0]), 1);
  EXPECT_EQ(a.evictions(), 0);
}

TEST(BlockAllocatorDeathTest, SharingABlockNeitherHeldNorCachedAborts) {
  BlockAllocator a(2);
  EXPECT_DEATH(a.Share(0), "neither held nor cached");
  EXPECT_DEATH(a.Register(1, Key(1)), "not in use");
}

KvCacheShape SmallShape(int64_t num_blocks = 10) {
  KvCacheShape s;
  s.num_layers = 3;
  s.num_kv_heads = 2;
  s.head_dim = 16;
  s.block_size = 4;
  s.num_blocks = num_blocks;
  return s;
}

TEST(KvCacheTest, CreateRejectsBadShapesNamingTheField) {
  struct Case {
    const char* field;
    void (*mutate)(KvCacheShape*);
  };
  const Case cases[] = {
      {"num_layers", [](KvCacheShape* s) { s->num_layers = 0; }},
      {"num_kv_heads", [](KvCacheShape* s) { s->num_kv_heads = -1; }},
      {"head_dim", [](KvCacheShape* s) { s->head_dim = 0; }},
      {"block_size", [](KvCacheShape* s) { s->block_size = 0; }},
      {"num_blocks", [](KvCacheShape* s) { s->num_blocks = 0; }},
      {"num_blocks", [](KvCacheShape* s) { s->num_blocks = int64_t{1} << 33; }},  // beyond int32 ids
  };
  for (const Case& c : cases) {
    KvCacheShape s = SmallShape();
    c.mutate(&s);
    const auto cache = KvCache::Create(s);
    ASSERT_FALSE(cache.ok()) << c.field;
    EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(cache.status().message(), HasSubstr(c.field));
  }
  KvCacheShape huge = SmallShape();
  huge.num_layers = 1 << 30;
  huge.num_kv_heads = 1 << 30;
  huge.head_dim = 1 << 30;
  EXPECT_EQ(KvCache::Create(huge).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvCacheTest, PoolsAndLayerViews) {
  auto cache = KvCache::Create(SmallShape());
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ(cache->allocator().num_blocks(), 10);
  EXPECT_EQ(cache->allocator().num_free(), 10);
  const int64_t per_layer = 10 * 4 * 2 * 16;
  const kernels::PagedKvLayer l0 = cache->layer(0), l2 = cache->layer(2);
  EXPECT_EQ(l0.num_blocks, 10);
  EXPECT_EQ(l0.block_size, 4);
  EXPECT_EQ(l0.num_kv_heads, 2);
  EXPECT_EQ(l0.head_dim, 16);
  EXPECT_EQ(l0.dtype, core::DType::kF32);
  EXPECT_EQ(static_cast<float*>(l2.k) - static_cast<float*>(l0.k), 2 * per_layer);
  EXPECT_EQ(static_cast<float*>(l2.v) - static_cast<float*>(l0.v), 2 * per_layer);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(l0.k) % 64, 0u);
  // The whole of each pool is writable and K and V do not overlap.
  for (int l = 0; l < 3; ++l) {
    const kernels::PagedKvLayer pl = cache->layer(l);
    for (int64_t i = 0; i < per_layer; ++i) {
      static_cast<float*>(pl.k)[i] = static_cast<float>(l);
      static_cast<float*>(pl.v)[i] = -static_cast<float>(l) - 1;
    }
  }
  for (int l = 0; l < 3; ++l) {
    const kernels::PagedKvLayer pl = cache->layer(l);
    EXPECT_EQ(static_cast<float*>(pl.k)[0], static_cast<float>(l));
    EXPECT_EQ(static_cast<float*>(pl.k)[per_layer - 1], static_cast<float>(l));
    EXPECT_EQ(static_cast<float*>(pl.v)[per_layer - 1], -static_cast<float>(l) - 1);
  }
  EXPECT_EQ(cache->shape().BytesPerBlock(), 2 * 3 * 4 * 2 * 16 * 4);
}

TEST(KvCacheTest, Bf16PoolsAndLayerViews) {
  KvCacheShape shape = SmallShape();
  shape.dtype = core::DType::kBF16;
  auto cache = KvCache::Create(shape);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ(cache->shape().BytesPerBlock(), 2 * 3 * 4 * 2 * 16 * 2);  // half of f32's
  const int64_t per_layer = 10 * 4 * 2 * 16;
  const kernels::PagedKvLayer l0 = cache->layer(0), l2 = cache->layer(2);
  EXPECT_EQ(l0.dtype, core::DType::kBF16);
  EXPECT_EQ(l2.dtype, core::DType::kBF16);
  EXPECT_EQ(static_cast<uint16_t*>(l2.k) - static_cast<uint16_t*>(l0.k), 2 * per_layer);
  EXPECT_EQ(static_cast<uint16_t*>(l2.v) - static_cast<uint16_t*>(l0.v), 2 * per_layer);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(l0.k) % 64, 0u);
  // Each layer's bf16 pool is its own: written whole, none overlaps another or K overlaps V.
  for (int l = 0; l < 3; ++l) {
    const kernels::PagedKvLayer pl = cache->layer(l);
    std::fill_n(static_cast<uint16_t*>(pl.k), per_layer, static_cast<uint16_t>(2 * l));
    std::fill_n(static_cast<uint16_t*>(pl.v), per_layer, static_cast<uint16_t>(2 * l + 1));
  }
  for (int l = 0; l < 3; ++l) {
    const kernels::PagedKvLayer pl = cache->layer(l);
    for (int64_t i : {int64_t{0}, per_layer - 1}) {
      EXPECT_EQ(static_cast<uint16_t*>(pl.k)[i], 2 * l);
      EXPECT_EQ(static_cast<uint16_t*>(pl.v)[i], 2 * l + 1);
    }
  }
}

TEST(KvCacheTest, CreateRejectsOtherDTypes) {
  KvCacheShape shape = SmallShape();
  shape.dtype = core::DType::kF16;
  const auto cache = KvCache::Create(shape);
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cache.status().message(), HasSubstr("dtype"));
}

TEST(KvCacheTest, ReserveGrowsAllOrNothing) {
  auto cache = KvCache::Create(SmallShape(5));  // 5 blocks of 4 tokens
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->BlocksFor(0), 0);
  EXPECT_EQ(cache->BlocksFor(1), 1);
  EXPECT_EQ(cache->BlocksFor(4), 1);
  EXPECT_EQ(cache->BlocksFor(5), 2);

  BlockTable a;
  ASSERT_TRUE(cache->Reserve(&a, 3).ok());
  EXPECT_EQ(a.blocks.size(), 1u);
  EXPECT_EQ(a.num_tokens, 3);
  ASSERT_TRUE(cache->Reserve(&a, 4).ok());  // still fits in the first block
  EXPECT_EQ(a.blocks.size(), 1u);
  ASSERT_TRUE(cache->Reserve(&a, 9).ok());  // two more
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(a.num_tokens, 9);
  EXPECT_EQ(cache->allocator().num_free(), 2);

  BlockTable b;
  ASSERT_TRUE(cache->Reserve(&b, 4).ok());
  const BlockTable b_before = b;
  const absl::Status s = cache->Reserve(&b, 13);  // needs 3 more blocks, 1 free
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.blocks, b_before.blocks);
  EXPECT_EQ(b.num_tokens, 4);
  EXPECT_EQ(cache->allocator().num_free(), 1);
  EXPECT_TRUE(cache->Reserve(&b, 8).ok());  // exactly the last block
  EXPECT_EQ(cache->allocator().num_free(), 0);
  EXPECT_EQ(cache->Reserve(&a, 13).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(a.num_tokens, 9);

  std::set<int32_t> all(a.blocks.begin(), a.blocks.end());
  all.insert(b.blocks.begin(), b.blocks.end());
  EXPECT_EQ(all.size(), 5u) << "two tables share a block";
}

TEST(KvCacheTest, ReleaseReturnsAllBlocks) {
  auto cache = KvCache::Create(SmallShape(6));
  ASSERT_TRUE(cache.ok());
  BlockTable a, b;
  ASSERT_TRUE(cache->Reserve(&a, 10).ok());  // 3 blocks
  ASSERT_TRUE(cache->Reserve(&b, 12).ok());  // 3 blocks
  EXPECT_EQ(cache->allocator().num_free(), 0);
  const std::vector<int32_t> a_blocks = a.blocks;
  cache->Release(&a);
  EXPECT_TRUE(a.blocks.empty());
  EXPECT_EQ(a.num_tokens, 0);
  EXPECT_EQ(cache->allocator().num_free(), 3);
  BlockTable c;
  ASSERT_TRUE(cache->Reserve(&c, 12).ok());
  EXPECT_EQ(c.blocks, a_blocks);  // the freed blocks, reused in the same order
  cache->Release(&b);
  cache->Release(&c);
  EXPECT_EQ(cache->allocator().num_free(), 6);
  BlockTable empty;
  cache->Release(&empty);  // nothing to free
  EXPECT_EQ(cache->allocator().num_free(), 6);
}

// AttachCached takes the leading run of found keys and stops at the first miss.
TEST(KvCacheTest, AttachCachedTakesTheLeadingRunOfCachedBlocks) {
  auto cache = KvCache::Create(SmallShape(8));
  ASSERT_TRUE(cache.ok());
  BlockTable a;
  ASSERT_TRUE(cache->Reserve(&a, 16).ok());  // 4 blocks
  for (int i : {0, 1, 3}) ASSERT_TRUE(cache->allocator().Register(a.blocks[i], Key(static_cast<uint8_t>(i))));
  const std::vector<int32_t> a_blocks = a.blocks;
  cache->Release(&a);
  BlockTable b;
  const std::vector<BlockHash> keys = {Key(0), Key(1), Key(2), Key(3)};
  EXPECT_EQ(cache->AttachCached(&b, keys), 2);
  EXPECT_THAT(b.blocks, ElementsAre(a_blocks[0], a_blocks[1]));
  EXPECT_EQ(cache->allocator().ref_count(a_blocks[0]), 1);
  EXPECT_EQ(cache->allocator().num_used(), 2);
  cache->Release(&b);
  EXPECT_EQ(cache->allocator().num_used(), 0);
}

TEST(KvCacheTest, SlotMapping) {
  auto cache = KvCache::Create(SmallShape(8));
  ASSERT_TRUE(cache.ok());
  BlockTable t;
  t.blocks = {5, 2, 7};
  t.num_tokens = 10;
  EXPECT_EQ(cache->Slot(t, 0), 20);
  EXPECT_EQ(cache->Slot(t, 3), 23);
  EXPECT_EQ(cache->Slot(t, 4), 8);
  EXPECT_EQ(cache->Slot(t, 7), 11);
  EXPECT_EQ(cache->Slot(t, 8), 28);
  EXPECT_EQ(cache->Slot(t, 11), 31);  // within the reserved blocks
}

TEST(KvCacheDeathTest, SlotBeyondTheTableAborts) {
  auto cache = KvCache::Create(SmallShape(8));
  ASSERT_TRUE(cache.ok());
  BlockTable t;
  t.blocks = {1};
  EXPECT_DEATH(cache->Slot(t, 4), "beyond");
}

TEST(KvCacheShapeTest, BlocksForBytes) {
  // 2 layers, 2 kv heads, 128 dims, 16 tokens: 2 * 2 * 16 * 2 * 128 * 4 = 65536 bytes per block.
  KvCacheShape s;
  s.num_layers = 2;
  s.num_kv_heads = 2;
  s.head_dim = 128;
  s.block_size = 16;
  EXPECT_EQ(s.BytesPerBlock(), 65536);
  EXPECT_EQ(KvCacheShape::BlocksForBytes(65536 * 10, 2, 2, 128, 16), 10);
  EXPECT_EQ(KvCacheShape::BlocksForBytes(65536 * 10 + 65535, 2, 2, 128, 16), 10);
  EXPECT_EQ(KvCacheShape::BlocksForBytes(65535, 2, 2, 128, 16), 0);
  EXPECT_EQ(KvCacheShape::BlocksForBytes(0, 2, 2, 128, 16), 0);
  EXPECT_EQ(KvCacheShape::BlocksForBytes(-5, 2, 2, 128, 16), 0);
  EXPECT_EQ(KvCacheShape::BlocksForBytes(1 << 20, 0, 2, 128, 16), 0);
  // Qwen2.5-VL-3B: 36 layers, 2 kv heads x 128, 16 tokens: 1 GiB holds 910 blocks of 1.125 MiB.
  EXPECT_EQ(KvCacheShape::BlocksForBytes(int64_t{1} << 30, 36, 2, 128, 16), 910);
}

TEST(KvCacheShapeTest, Bf16BlocksAreHalfTheBytes) {
  KvCacheShape s;
  s.num_layers = 2;
  s.num_kv_heads = 2;
  s.head_dim = 128;
  s.block_size = 16;
  s.dtype = core::DType::kBF16;
  EXPECT_EQ(s.BytesPerBlock(), 32768);
  const core::DType bf16 = core::DType::kBF16, f32 = core::DType::kF32;
  EXPECT_EQ(KvCacheShape::BlocksForBytes(65536 * 10, 2, 2, 128, 16, bf16), 20);
  EXPECT_EQ(KvCacheShape::BlocksForBytes(65536 * 10, 2, 2, 128, 16, f32), 10);
  EXPECT_EQ(KvCacheShape::BlocksForBytes(32767, 2, 2, 128, 16, bf16), 0);
  EXPECT_EQ(KvCacheShape::BlocksForBytes(32768, 2, 2, 128, 16, bf16), 1);
  EXPECT_EQ(KvCacheShape::BlocksForBytes(1 << 20, 2, 2, 128, 16, core::DType::kF16), 0);  // not a pool dtype
  // The same 1 GiB on Qwen2.5-VL-3B: twice the f32 blocks.
  EXPECT_EQ(KvCacheShape::BlocksForBytes(int64_t{1} << 30, 36, 2, 128, 16, bf16), 1820);
}

}  // namespace
}  // namespace iris::llm
